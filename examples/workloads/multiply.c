/* The worst case for entry instrumentation: an 8-byte function
 * (mov rax,rdi; imul rax,rsi; ret) called in a tight loop. Prints the time
 * the calls took, measured inside the program so start-up is excluded.
 * usage: multiply CALLS THREADS */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) long multiply(long a, long b) { return a * b; }

static long calls;

static void *loop(void *arg) {
    long acc = (long)arg;
    for (long i = 0; i < calls; i++) acc += multiply(i, 3);
    return (void *)acc;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
    calls = argc > 1 ? atol(argv[1]) : 100000000;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    pthread_t t[64];
    double t0 = now();
    for (int i = 1; i < threads; i++) pthread_create(&t[i], NULL, loop, (void *)(long)i);
    long acc = (long)loop(0);
    for (int i = 1; i < threads; i++) {
        void *r;
        pthread_join(t[i], &r);
        acc += (long)r;
    }
    double ns = now() - t0;
    printf("%.0f %ld\n", ns, acc);
    return 0;
}
