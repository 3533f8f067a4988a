/* A thread that shares its CPU: twice as many busy threads as CPUs spin
 * while "measured" burns 300 ms of its own CPU time, then all end. Prints
 * the measured thread's CPU time by its own clock as SPIN, for the test
 * to compare with the time the profiler sampled in it. */
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

__attribute__((noinline)) void measured_spin(void) {
    while (clock_ns(CLOCK_THREAD_CPUTIME_ID) < 300000000LL)
        for (int i = 0; i < 100000; i++) sink++;
}

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
    for (long i = 0; i < 2 * cpus; i++) pthread_create(&b[i], NULL, busy, NULL);
    pthread_create(&m, NULL, measured, NULL);
    pthread_join(m, NULL);
    done = 1;
    for (long i = 0; i < 2 * cpus; i++) pthread_join(b[i], NULL);
    printf("SPIN %lld\n", spun);
    return 0;
}
