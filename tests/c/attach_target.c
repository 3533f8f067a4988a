/* A multi-threaded program that counts its own calls of work() and prints
 * the running total every 100 ms: rtprof attach's counts over an interval
 * can be checked against it. Usage: attach_target SECONDS [THREADS [nodump]]
 * (nodump: the process makes itself not dumpable, which refuses ptrace to
 * tracers without CAP_SYS_PTRACE). */
#include <pthread.h>
#include <string.h>
#include <sys/prctl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static atomic_ulong calls;
static atomic_int stop;

__attribute__((noinline)) unsigned long work(unsigned long x) {
    atomic_fetch_add_explicit(&calls, 1, memory_order_relaxed);
    return x * 2654435761u + 1;
}

__attribute__((noinline)) unsigned long rarely(unsigned long x) { return x ^ 7; }

static void *spin(void *arg) {
    unsigned long v = (unsigned long)arg;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        for (int i = 0; i < 1000; i++)
            v = work(v);
        v = rarely(v);
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return (void *)v;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    int n = argc > 2 ? atoi(argv[2]) : 4;
    pthread_t t[64];
    if (n > 64)
        n = 64;
    if (argc > 3 && strcmp(argv[3], "nodump") == 0)
        prctl(PR_SET_DUMPABLE, 0);
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 0; i < n; i++)
        pthread_create(&t[i], NULL, spin, (void *)(unsigned long)i);
    int ticks = (int)(seconds * 10);
    for (int i = 1; i <= ticks; i++) {
        struct timespec ts = {0, 100000000};
        while (nanosleep(&ts, &ts) != 0)
            ;
        printf("tick %d calls %lu\n", i, atomic_load(&calls));
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    printf("done calls %lu\n", atomic_load(&calls));
    return 0;
}
