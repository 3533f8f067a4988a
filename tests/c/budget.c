/* A steady program for the overhead budget: functions called at fixed
 * ratios in a loop, by THREADS threads, so every count is known exactly.
 * Usage: budget ITERATIONS THREADS */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static volatile long sink;
__attribute__((noinline)) long hot1(long x) { sink += x; return x + 1; }
__attribute__((noinline)) long hot2(long x) { sink ^= x; return x * 3; }
__attribute__((noinline)) long warm(long x) { sink -= x; return x; }
__attribute__((noinline)) long cold(long x) { sink |= x; return x; }

static long iterations;

static void *work(void *arg) {
    (void)arg;
    for (long i = 0; i < iterations; i++) {
        hot1(i);
        if (i % 2 == 0) hot2(i);
        if (i % 100 == 0) warm(i);
        if (i % 100000 == 0) cold(i);
    }
    return NULL;
}

int main(int argc, char **argv) {
    iterations = argc > 1 ? atol(argv[1]) : 100000000;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    if (threads < 1 || threads > 64) return 2;
    pthread_t t[64];
    for (int k = 1; k < threads; k++)
        if (pthread_create(&t[k], NULL, work, NULL) != 0) return 3;
    work(NULL);
    for (int k = 1; k < threads; k++) pthread_join(t[k], NULL);
    printf("EXPECT hot1 %ld\n", threads * iterations);
    printf("EXPECT hot2 %ld\n", threads * ((iterations + 1) / 2));
    printf("EXPECT warm %ld\n", threads * ((iterations + 99) / 100));
    printf("EXPECT cold %ld\n", threads * ((iterations + 99999) / 100000));
    return 0;
}
