/* Functions only a trap entry can count (2-3 byte bodies packed together
 * at -Os), called where a trap would kill a careless profiler: in a thread
 * that blocks every signal, in a handler whose mask blocks every signal,
 * with every signal blocked by sigprocmask, and beside the program's own
 * SIGTRAP handler, which must still see the program's own traps. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#define NOINLINE __attribute__((noipa))

NOINLINE int zero(void) { return 0; }
NOINLINE int same(int x) { return x; }

static volatile int sink;
static volatile int usr1;
static volatile int traps_seen;

static void *blocked_thread(void *arg) {
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    for (int i = 0; i < 1000; i++) sink += same(i) + zero();
    return NULL;
}

static void on_usr1(int sig) {
    (void)sig;
    usr1 += 1 + zero();
}

static void on_trap(int sig, siginfo_t *si, void *uc) {
    (void)sig;
    (void)si;
    (void)uc;
    traps_seen++;
}

int main(void) {
    pthread_t t;
    pthread_create(&t, NULL, blocked_thread, NULL);
    pthread_join(t, NULL);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigfillset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    for (int i = 0; i < 10; i++) raise(SIGUSR1);

    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < 100; i++) sink += zero();
    sigset_t now;
    sigprocmask(SIG_SETMASK, &old, &now);
    printf("mask said blocked: %d\n", sigismember(&now, SIGINT));

    struct sigaction st, back;
    memset(&st, 0, sizeof st);
    st.sa_sigaction = on_trap;
    st.sa_flags = SA_SIGINFO;
    sigaction(SIGTRAP, &st, NULL);
    sigaction(SIGTRAP, NULL, &back);
    printf("own handler %s\n", back.sa_sigaction == on_trap ? "kept" : "lost");
    for (int i = 0; i < 3; i++) __asm__ volatile("int3");
    raise(SIGTRAP);
    printf("traps seen %d\n", traps_seen);
    for (int i = 0; i < 5; i++) sink += same(i);
    printf("usr1 %d\n", usr1);
    printf("EXPECT zero %d\nEXPECT same %d\n", 1000 + 10 + 100, 1000 + 5);
    return 0;
}
