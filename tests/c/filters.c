/* Seccomp filters that kill one system call, installed the ways programs
 * and sandboxes install them:
 *   filters exec NAME PROG ARGS...  libseccomp kills NAME, then exec PROG:
 *       the filter is there from PROG's start (as bwrap --seccomp and
 *       systemd's SystemCallFilter= put it);
 *   filters later NAME exit|_exit  work() runs, libseccomp kills NAME
 *       (installed through syscall(), as libseccomp does), work() again,
 *       then the program ends with exit(0) or _exit(0);
 *   filters raw NAME exit|_exit  the same with the filter installed by a
 *       raw `syscall` instruction (as Go's runtime does), nothing of libc
 *       seeing it, then work in libc (printf);
 *   filters threads  work() in two threads (a program to exec);
 *   filters bpf NAME  writes the filter killing NAME to standard output,
 *       for bwrap --seccomp.
 * Without the agent each prints its results and ends with status 0. */
#define _GNU_SOURCE
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))
volatile long sink;
NOINLINE long work(long x) { sink = x; return x + 1; }

static long spin(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += work(i);
    return s;
}

static int number(const char *name) {
    int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR) {
        fprintf(stderr, "no system call %s\n", name);
        exit(2);
    }
    return nr;
}

static void with_libseccomp(const char *name) {
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx || seccomp_rule_add(ctx, SCMP_ACT_KILL_PROCESS, number(name), 0) ||
        seccomp_load(ctx)) {
        fprintf(stderr, "libseccomp failed\n");
        exit(2);
    }
    seccomp_release(ctx);
}

/* Unused arguments zero: prctl refuses others. */
static long raw_syscall3(long nr, long a, long b, long c) {
    long ret;
    register long r10 __asm__("r10") = 0;
    register long r8 __asm__("r8") = 0;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
    return ret;
}

static void with_raw_instruction(const char *name) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)number(name), 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    if (raw_syscall3(__NR_prctl, PR_SET_NO_NEW_PRIVS, 1, 0) ||
        raw_syscall3(__NR_seccomp, SECCOMP_SET_MODE_FILTER, 0, (long)&prog)) {
        fprintf(stderr, "seccomp failed\n");
        exit(2);
    }
}

static void *thread_work(void *arg) {
    return (void *)spin((long)arg);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "bpf")) {
        scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
        if (!ctx || seccomp_rule_add(ctx, SCMP_ACT_KILL_PROCESS, number(argv[2]), 0) ||
            seccomp_export_bpf(ctx, 1)) {
            fprintf(stderr, "libseccomp failed\n");
            return 2;
        }
        return 0;
    }
    if (argc >= 4 && !strcmp(argv[1], "exec")) {
        with_libseccomp(argv[2]);
        execvp(argv[3], argv + 3);
        perror("exec");
        return 2;
    }
    if (argc == 2 && !strcmp(argv[1], "threads")) {
        pthread_t t;
        pthread_create(&t, NULL, thread_work, (void *)3000000);
        long s = spin(3000000);
        void *r;
        pthread_join(t, &r);
        printf("calls: work %d\nsums %ld %ld\n", 6000000, s, (long)r);
        return 0;
    }
    if (argc == 4 && (!strcmp(argv[1], "later") || !strcmp(argv[1], "raw"))) {
        long s = spin(3000000);
        if (!strcmp(argv[1], "later"))
            with_libseccomp(argv[2]);
        else
            with_raw_instruction(argv[2]);
        s += spin(3000000);
        printf("calls: work %d\nsum %ld\n", 6000000, s);
        fflush(stdout);
        if (!strcmp(argv[3], "_exit")) _exit(0);
        exit(0);
    }
    fprintf(stderr, "usage: filters exec NAME PROG ARGS... | later|raw NAME exit|_exit | threads\n");
    return 2;
}
