/* A program under a seccomp filter, as sandboxes make them.
 *   sandboxed deny PROG ARGS...  kills on perf_event_open and timer_create
 *       (as systemd's SystemCallFilter= does for what it does not list),
 *       then execs PROG: the filter is there from PROG's start;
 *   sandboxed deny-memfd PROG ARGS...  the same, killing on memfd_create
 *       (a call the agent's start-up makes);
 *   sandboxed later prctl|syscall  starts unfiltered, calls work(), then
 *       installs a strict allow-list (with prctl, or the seccomp system
 *       call through syscall()), calls work() again, forks a child that
 *       calls child_work() and ends with _exit, and exits;
 *   sandboxed spin  calls work() (the program run under "deny").
 * Anything else the filter does not allow kills the process (SIGSYS). */
#define _GNU_SOURCE
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))
#define CALLS 3000000

volatile long sink;
NOINLINE long work(long x) { sink = x; return x + 1; }
NOINLINE long child_work(long x) { sink = x; return x + 2; }

#define ARCH_CHECK \
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)), \
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0), \
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS), \
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))
#define ALLOW(n) \
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (n), 0, 1), \
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)
#define KILL(n) \
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (n), 0, 1), \
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS)

static struct sock_filter deny[] = {
    ARCH_CHECK,
    KILL(__NR_perf_event_open),
    KILL(__NR_timer_create),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
};

static struct sock_filter deny_memfd[] = {
    ARCH_CHECK,
    KILL(__NR_memfd_create),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
};

/* What this program itself needs from here on, and nothing else. */
static struct sock_filter allow[] = {
    ARCH_CHECK,
    ALLOW(__NR_write),
    ALLOW(__NR_exit_group),
    ALLOW(__NR_exit),
    ALLOW(__NR_rt_sigreturn),
    ALLOW(__NR_clone),
    ALLOW(__NR_wait4),
    ALLOW(__NR_fstat),
    ALLOW(__NR_newfstatat),
    ALLOW(__NR_brk),
    ALLOW(__NR_set_robust_list),
    ALLOW(__NR_rt_sigprocmask),
    ALLOW(__NR_getpid),
    ALLOW(__NR_gettid),
    ALLOW(__NR_clock_nanosleep),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
};

static void install(struct sock_filter *f, unsigned short n, int through_syscall) {
    struct sock_fprog prog = {n, f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) { perror("no_new_privs"); exit(2); }
    int rc = through_syscall
        ? (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog)
        : prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
    if (rc) { perror("seccomp"); exit(2); }
}

static long spin(long calls) {
    long s = 0;
    for (long i = 0; i < calls; i++) s += work(i);
    return s;
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "deny")) {
        install(deny, sizeof deny / sizeof deny[0], 0);
        execvp(argv[2], argv + 2);
        perror("exec");
        return 2;
    }
    if (argc > 2 && !strcmp(argv[1], "deny-memfd")) {
        install(deny_memfd, sizeof deny_memfd / sizeof deny_memfd[0], 0);
        execvp(argv[2], argv + 2);
        perror("exec");
        return 2;
    }
    if (argc > 1 && !strcmp(argv[1], "spin")) {
        printf("sum %ld\n", spin(CALLS));
        printf("EXPECT work %d\n", CALLS);
        return 0;
    }
    if (argc < 3 || strcmp(argv[1], "later")) {
        fprintf(stderr, "usage: sandboxed deny|deny-memfd PROG ARGS... | later prctl|syscall | spin\n");
        return 2;
    }
    long s = spin(CALLS);
    printf("before the filter: %ld\n", s);
    fflush(stdout);
    install(allow, sizeof allow / sizeof allow[0], !strcmp(argv[2], "syscall"));
    s += spin(CALLS);
    /* Long enough for a timer or a drain to come round under the filter. */
    struct timespec ts = {0, 200 * 1000 * 1000};
    clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL);
    s += spin(CALLS);
    pid_t c = fork();
    if (c == 0) {
        long t = 0;
        for (long i = 0; i < 1000; i++) t += child_work(i);
        _exit(t > 0 ? 7 : 8);
    }
    int st = 0;
    if (c < 0 || waitpid(c, &st, 0) != c) { printf("fork failed\n"); return 2; }
    printf("child status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
    printf("sum %ld\n", s);
    printf("EXPECT work %d\n", 3 * CALLS);
    return 0;
}
