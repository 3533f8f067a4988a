/* Many threads calling the same functions: no increment may be lost. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define NOINLINE __attribute__((noinline, noclone))
#define THREADS 4
#define CALLS 250000

volatile long sink;
NOINLINE long hot(long x) { sink = x; return x + 1; }
NOINLINE long per_thread(long id) { return id; }

static void *worker(void *arg) {
    long id = (long)arg, s = per_thread(id);
    for (long i = 0; i < CALLS; i++) s += hot(i);
    return (void *)s;
}

int main(void) {
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    /* The main thread calls too, concurrently. */
    long s = 0;
    for (long i = 0; i < CALLS; i++) s += hot(i);
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        s += (long)r;
    }
    printf("sum %ld\n", s);
    printf("EXPECT hot %d\nEXPECT per_thread %d\nEXPECT worker %d\n", (THREADS + 1) * CALLS, THREADS, THREADS);
    return 0;
}
