/* Touches known numbers of new pages in a function of its own: touch(n)
 * maps n fresh pages (no huge pages) and writes one byte in each, n page
 * faults. Two threads touch 400 and 1200 pages, then the main thread
 * 1000 twice (few enough for the agent's rings without a drain); compute() makes none. Prints the pages touched and the
 * threads' ids. With the argument "fork", a forked child then touches 700
 * pages and prints "child <pid> touched 700". */
#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) long touch(int pages) {
    size_t len = (size_t)pages * 4096;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return 0;
    madvise(p, len, MADV_NOHUGEPAGE);
    long n = 0;
    for (int i = 0; i < pages; i++) {
        p[(size_t)i * 4096] = 1;
        n += p[(size_t)i * 4096];
    }
    return n;
}

__attribute__((noinline)) unsigned long compute(unsigned long x) {
    for (int i = 0; i < 1000; i++)
        x = x * 6364136223846793005ul + 1;
    return x;
}

struct job {
    int pages;
    long touched;
    long tid;
};

static void *worker(void *arg) {
    struct job *j = arg;
    j->tid = syscall(SYS_gettid);
    j->touched = touch(j->pages);
    return NULL;
}

int main(int argc, char **argv) {
    struct job jobs[2] = {{400, 0, 0}, {1200, 0, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        pthread_create(&t[i], NULL, worker, &jobs[i]);
        pthread_join(t[i], NULL);
    }
    long mine = touch(1000) + touch(1000);
    unsigned long x = 1;
    for (int i = 0; i < 100; i++)
        x = compute(x);
    printf("touched %ld %ld %ld tids %ld %ld x %lu\n", jobs[0].touched, jobs[1].touched, mine,
           jobs[0].tid, jobs[1].tid, x & 1);
    if (argc > 1 && strcmp(argv[1], "fork") == 0) {
        fflush(stdout);
        pid_t child = fork();
        if (child == 0) {
            long n = touch(700);
            printf("child %ld touched %ld\n", (long)getpid(), n);
            return 0;
        }
        int status = 0;
        if (child < 0 || waitpid(child, &status, 0) != child || status != 0)
            return 1;
    }
    return 0;
}
