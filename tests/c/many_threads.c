/* 2,000 short-lived threads, 25 alive at a time, each calling a function
 * a known number of times. */
#include <pthread.h>
#include <stdio.h>

#define NOINLINE __attribute__((noinline, noclone))
#define BATCH 25
#define ROUNDS 80
volatile long sink;
NOINLINE void tick(long x) { sink += x; }
NOINLINE void *worker(void *arg) {
    long n = (long)arg;
    for (long i = 0; i < n; i++) tick(i);
    return 0;
}

int main(void) {
    long expected = 0;
    for (int r = 0; r < ROUNDS; r++) {
        pthread_t t[BATCH];
        for (long i = 0; i < BATCH; i++) {
            long n = 100 + r * BATCH + i;
            expected += n;
            pthread_create(&t[i], 0, worker, (void *)n);
        }
        for (int i = 0; i < BATCH; i++) pthread_join(t[i], 0);
    }
    printf("EXPECT tick %ld\nEXPECT worker %d\n", expected, BATCH * ROUNDS);
    return 0;
}
