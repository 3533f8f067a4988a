/* Threads that come and go, for as long as asked: SPAWNERS threads each
 * start a thread, which calls tick() 100 times, and join it, over and
 * over. The program has 20,000 more functions (a large program's count),
 * so that what a thread's end costs per function shows. Prints the
 * threads that ended per second.
 * usage: thread_churn MS [SPAWNERS] */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../../tests/c/many_functions.h"

MANY_FUNCTIONS(20000);

static volatile long sink;
static atomic_long ended;
static atomic_int stop;

__attribute__((noipa)) void tick(void) { sink++; }

static void *worker(void *arg) {
    (void)arg;
    for (int i = 0; i < 100; i++) tick();
    return NULL;
}

static void *spawner(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker, NULL) == 0) {
            pthread_join(t, NULL);
            atomic_fetch_add(&ended, 1);
        }
    }
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    long ms = argc > 1 ? atol(argv[1]) : 1000;
    int n = argc > 2 ? atoi(argv[2]) : 2;
    pthread_t s[64];
    if (n < 1 || n > 64) return 2;
    double start = now();
    for (int i = 0; i < n; i++) pthread_create(&s[i], NULL, spawner, NULL);
    struct timespec d = {ms / 1000, ms % 1000 * 1000000};
    nanosleep(&d, NULL);
    atomic_store(&stop, 1);
    for (int i = 0; i < n; i++) pthread_join(s[i], NULL);
    printf("%.0f\n", atomic_load(&ended) / (now() - start));
    return 0;
}
