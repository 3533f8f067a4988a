/* A steady program for the overhead budget: functions called at fixed
 * ratios in a loop, by THREADS threads, so every count is known exactly.
 * Usage: budget ITERATIONS THREADS [fork]
 * With `fork`, one thread runs the loop, then forks a child that runs it
 * again: each process makes ITERATIONS calls of hot1 of its own. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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
    if (argc > 3 && strcmp(argv[3], "fork") == 0) {
        work(NULL);
        fflush(stdout);
        pid_t child = fork();
        if (child < 0) return 4;
        if (child == 0) {
            work(NULL);
            printf("child hot1 %ld\n", iterations);
            return 0;
        }
        int st;
        if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return 5;
        printf("parent hot1 %ld\n", iterations);
        return 0;
    }
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
