/* Functions only a trap entry can count (2-3 byte bodies packed together
 * at -Os), called wherever a blocked or taken-over SIGTRAP would kill a
 * careless profiler: in a thread that blocks every signal (by its own
 * mask and by its attributes), in handlers whose mask blocks every signal
 * (also while sigsuspend and ppoll wait with every other signal blocked),
 * under sigprocmask, sigsetmask, sigblock and sighold, in a context whose
 * mask blocks everything, and in the program's own SIGTRAP handler, which
 * must still see the program's own traps (installed by sigaction, which
 * may read and write one struct, and by sigset; a vfork child resetting
 * its own does not take the parent's), and after sigignore. ppoll is the
 * fortified one. Every call of zero() is counted by the program too. */
#undef _FORTIFY_SOURCE
#define _FORTIFY_SOURCE 2
#define _GNU_SOURCE
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#define NOINLINE __attribute__((noipa))

NOINLINE int zero(void) { return 0; }
NOINLINE int same(int x) { return x; }
/* Called by a child that shares the counters (no count expected). */
NOINLINE int twice(int x) { return x + x; }

static volatile int sink, zeros, usr1, traps_seen;
#define ZERO() (zeros++, zero())

static void *blocked_thread(void *arg) {
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    for (int i = 0; i < 1000; i++) sink += same(i) + ZERO();
    return NULL;
}

static void *plain_thread(void *arg) {
    (void)arg;
    sink += ZERO();
    return NULL;
}

static void on_usr1(int sig) {
    (void)sig;
    usr1 += 1 + ZERO();
}

static void on_trap(int sig, siginfo_t *si, void *uc) {
    (void)sig;
    (void)si;
    (void)uc;
    traps_seen++;
    sink += ZERO();
}

static void on_trap_plain(int sig) {
    (void)sig;
    traps_seen++;
    sink += ZERO();
}

static ucontext_t main_ctx, co_ctx;
static void in_context(void) { sink += ZERO(); }

/* USR1 pending, then a wait that lets only USR1 in. */
static void wait_for_usr1(int with_ppoll) {
    sigset_t one, rest;
    sigemptyset(&one);
    sigaddset(&one, SIGUSR1);
    sigprocmask(SIG_BLOCK, &one, NULL);
    kill(getpid(), SIGUSR1);
    sigfillset(&rest);
    sigdelset(&rest, SIGUSR1);
    if (with_ppoll) {
        /* A counted array and a count the compiler cannot see: the
         * fortified ppoll (__ppoll_chk). */
        struct pollfd fds[1];
        static volatile int none = 0;
        struct timespec ts = {5, 0};
        ppoll(fds, none, &ts, &rest);
    } else {
        sigsuspend(&rest);
    }
    sigprocmask(SIG_UNBLOCK, &one, NULL);
}

int main(void) {
    sigset_t all, old;
    sigfillset(&all);

    pthread_t t;
    pthread_create(&t, NULL, blocked_thread, NULL);
    pthread_join(t, NULL);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setsigmask_np(&attr, &all);
    pthread_create(&t, &attr, plain_thread, NULL);
    pthread_join(t, NULL);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigfillset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    for (int i = 0; i < 10; i++) raise(SIGUSR1);
    wait_for_usr1(0);
    wait_for_usr1(1);

    sigprocmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < 100; i++) sink += ZERO();
    sigset_t now;
    sigprocmask(SIG_SETMASK, &old, &now);
    printf("mask said blocked: %d\n", sigismember(&now, SIGINT));
    int was = sigsetmask(~0);
    sink += ZERO();
    sigsetmask(was);
    was = sigblock(~0);
    sink += ZERO();
    sigsetmask(was);
    sighold(SIGTRAP);
    sink += ZERO();
    sigrelse(SIGTRAP);

    static char stack[65536];
    getcontext(&co_ctx);
    co_ctx.uc_stack.ss_sp = stack;
    co_ctx.uc_stack.ss_size = sizeof stack;
    co_ctx.uc_link = &main_ctx;
    co_ctx.uc_sigmask = all;
    makecontext(&co_ctx, in_context, 0);
    swapcontext(&main_ctx, &co_ctx);

    struct sigaction st;
    memset(&st, 0, sizeof st);
    st.sa_sigaction = on_trap;
    st.sa_flags = SA_SIGINFO;
    sigaction(SIGTRAP, &st, NULL);
    /* Read and written through one struct. */
    sigaction(SIGTRAP, &st, &st);
    printf("own handler %s\n", st.sa_sigaction == on_trap ? "kept" : "lost");
    for (int i = 0; i < 3; i++) __asm__ volatile("int3");
    raise(SIGTRAP);
    pid_t child = vfork();
    if (child == 0) {
        signal(SIGTRAP, SIG_DFL);
        _exit(0);
    }
    waitpid(child, NULL, 0);
    raise(SIGTRAP);
    sigset(SIGTRAP, on_trap_plain);
    __asm__ volatile("int3");
    printf("traps seen %d\n", traps_seen);
    sigignore(SIGTRAP);
    sink += ZERO();
    /* A child forked by a raw system call (no fork handlers) blocks every
     * signal and calls a trap-entry function. */
    pid_t raw = syscall(SYS_fork);
    if (raw == 0) {
        sigprocmask(SIG_BLOCK, &all, NULL);
        _exit(twice(21) == 42 ? 0 : 1);
    }
    int status = -1;
    waitpid(raw, &status, 0);
    printf("raw fork child: %s %d\n", WIFEXITED(status) ? "exit" : "signal",
           WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));

    for (int i = 0; i < 5; i++) sink += same(i);
    printf("usr1 %d\n", usr1);
    printf("EXPECT zero %d\nEXPECT same %d\n", zeros, 1000 + 5);
    return 0;
}
