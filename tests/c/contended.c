/* A thread that shares its CPU: twice as many busy threads as CPUs spin
 * while "measured" burns about 300 ms of its own CPU time, then all end.
 * Prints the measured thread's CPU time by its own clock as SPIN, for the
 * test to compare with the time the profiler sampled in it.
 *
 * The work is sized before the busy threads start, and the measured
 * thread reads its clock only once it is done: a thread that reads its
 * own CPU clock every few hundred microseconds has its CPU-time timers
 * expire far less often than its clock advances (Linux 6.18 here, with no
 * profiler at all: 0 signals in 7 of 10 runs of 300 ms beside other busy
 * processes), and the test is about sharing a CPU, not about that. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static volatile int done;
static volatile unsigned long sink;

static long long clock_ns(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Rounds of work for 300 ms of CPU, as measured alone for 30 ms. */
static long rounds;

__attribute__((noinline)) void work(long n) {
    volatile unsigned long own = 0;
    for (long r = 0; r < n; r++)
        for (int i = 0; i < 100000; i++) own++;
}

static long size_work(void) {
    long n = 0;
    long long start = clock_ns(CLOCK_THREAD_CPUTIME_ID), t;
    do {
        work(1);
        n++;
    } while ((t = clock_ns(CLOCK_THREAD_CPUTIME_ID) - start) < 30000000LL);
    return n * 300000000LL / t + 1;
}

__attribute__((noinline)) void measured_spin(void) { work(rounds); }

static void *busy(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "busy");
    while (!done) sink++;
    return NULL;
}

static long long spun;

static void *measured(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "measured");
    measured_spin();
    spun = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    return NULL;
}

int main(void) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus < 1) cpus = 1;
    if (cpus > 32) cpus = 32;
    pthread_t b[64], m;
    rounds = size_work();
    for (long i = 0; i < 2 * cpus; i++) pthread_create(&b[i], NULL, busy, NULL);
    pthread_create(&m, NULL, measured, NULL);
    pthread_join(m, NULL);
    done = 1;
    for (long i = 0; i < 2 * cpus; i++) pthread_join(b[i], NULL);
    printf("SPIN %lld\n", spun);
    return 0;
}
