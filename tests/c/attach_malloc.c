/* A single-threaded program that spends its time in malloc and free (and
 * in a function of its own between them): a thread rtprof attach
 * interrupts is likely inside malloc, holding its arena's lock, which
 * dlopen would need. Prints "done N" after SECONDS. With "handler", a
 * profiling timer's handler of its own runs a fifth of the time, often
 * on top of malloc: outside libc, yet with the lock held.
 * Usage: attach_malloc SECONDS [handler] */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static volatile unsigned long spun;

__attribute__((noinline)) static void on_prof(int sig) {
    (void)sig;
    for (int i = 0; i < 1500000; i++)
        spun++;
}

__attribute__((noinline)) size_t fill(char *p, size_t n) {
    memset(p, 1, n);
    return n;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    if (argc > 2 && strcmp(argv[2], "handler") == 0) {
        struct sigaction sa = {0};
        sa.sa_handler = on_prof;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGPROF, &sa, NULL);
        struct itimerval it = {{0, 500}, {0, 500}};
        setitimer(ITIMER_PROF, &it, NULL);
    }
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    unsigned long total = 0, rounds = 0;
    void *keep[64] = {0};
    for (;;) {
        for (int i = 0; i < 64; i++) {
            size_t n = 16 + (size_t)((rounds * 7 + i * 13) % 4000);
            free(keep[i]);
            keep[i] = malloc(n);
            total += fill(keep[i], n);
        }
        if (++rounds % 256 == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if (t.tv_sec - t0.tv_sec + (t.tv_nsec - t0.tv_nsec) / 1e9 > seconds)
                break;
        }
    }
    printf("done %d\n", total > 0);
    return 0;
}
