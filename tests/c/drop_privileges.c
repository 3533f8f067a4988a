/* A program that drops root's privileges, run as root. glibc makes every
 * thread it knows take each change and aborts if one fails.
 *   keepcaps: single-threaded, the way setpriv does it: it keeps its
 *     capabilities across setresuid (PR_SET_KEEPCAPS, then capset, both for
 *     its own thread only), then changes groups;
 *   threads: with worker threads running, groups first, then user.
 * Afterwards no thread of the process may still hold root's user id. */
#define _GNU_SOURCE
#include <dirent.h>
#include <grp.h>
#include <linux/capability.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))
#define WORKERS 2
#define CALLS 200000
#define NOBODY 65534

volatile long sink;
NOINLINE long work(long x) { sink = x; return x + 1; }

static pthread_barrier_t dropped;

static void *worker(void *arg) {
    long s = 0;
    for (long i = 0; i < CALLS; i++) s += work(i);
    pthread_barrier_wait(&dropped);
    for (long i = 0; i < CALLS; i++) s += work(i);
    return (void *)(s + (long)arg * 0);
}

/* Raises the effective capabilities of the calling thread to its permitted
 * ones (as setpriv does after setresuid with PR_SET_KEEPCAPS). */
static void raise_effective(void) {
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d)) { perror("capget"); exit(2); }
    d[0].effective = d[0].permitted;
    d[1].effective = d[1].permitted;
    if (syscall(SYS_capset, &h, d)) { perror("capset"); exit(2); }
}

/* Threads of this process whose real, effective or saved user id is 0. */
static int root_tasks(void) {
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[300], line[256];
        snprintf(p, sizeof p, "/proc/self/task/%s/status", e->d_name);
        FILE *f = fopen(p, "r");
        while (f && fgets(line, sizeof line, f)) {
            unsigned r, eu, s;
            if (sscanf(line, "Uid: %u %u %u", &r, &eu, &s) == 3 && (!r || !eu || !s)) n++;
        }
        if (f) fclose(f);
    }
    if (d) closedir(d);
    return n;
}

static void keep_capabilities_and_drop(void) {
    gid_t groups[1] = {NOBODY};
    if (prctl(PR_SET_KEEPCAPS, 1)) { perror("prctl"); exit(2); }
    if (setresuid(NOBODY, NOBODY, NOBODY)) { perror("setresuid"); exit(2); }
    raise_effective();
    if (setresgid(NOBODY, NOBODY, NOBODY)) { perror("setresgid"); exit(2); }
    if (setgroups(1, groups)) { perror("setgroups"); exit(2); }
}

static void drop(void) {
    gid_t groups[1] = {NOBODY};
    if (setgroups(1, groups)) { perror("setgroups"); exit(2); }
    if (setregid(NOBODY, NOBODY)) { perror("setregid"); exit(2); }
    if (setgid(NOBODY)) { perror("setgid"); exit(2); }
    if (seteuid(NOBODY)) { perror("seteuid"); exit(2); }
    if (seteuid(0)) { perror("seteuid back"); exit(2); }
    if (setuid(NOBODY)) { perror("setuid"); exit(2); }
}

int main(int argc, char **argv) {
    int threads = argc > 1 && !strcmp(argv[1], "threads");
    int workers = threads ? WORKERS : 0;
    pthread_t t[WORKERS];
    if (!threads) {
        /* Single-threaded: the calls themselves, counted here. */
        long s = 0;
        for (long i = 0; i < 2 * WORKERS * CALLS; i++) s += work(i);
        keep_capabilities_and_drop();
        printf("sum %ld\n", s);
        printf("uid %d gid %d\n", (int)getuid(), (int)getgid());
        printf("tasks with user id 0: %d\n", root_tasks());
        printf("EXPECT work %d\n", 2 * WORKERS * CALLS);
        return 0;
    }
    pthread_barrier_init(&dropped, NULL, workers + 1);
    for (long i = 0; i < workers; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    drop();
    pthread_barrier_wait(&dropped);
    long s = 0;
    for (int i = 0; i < workers; i++) {
        void *r;
        pthread_join(t[i], &r);
        s += (long)r;
    }
    printf("sum %ld\n", s);
    printf("uid %d gid %d\n", (int)getuid(), (int)getgid());
    printf("tasks with user id 0: %d\n", root_tasks());
    printf("EXPECT work %d\n", 2 * WORKERS * CALLS);
    return 0;
}
