/* Counting switched on and off while threads call the function.
 *
 * usage: switch <threads> <rounds> <calls per round> <stress switches>
 *
 * Exact phase: before each round the main thread switches counting of
 * `hot` (on in even rounds, off in odd ones) while the other threads wait
 * at a barrier; then each calls `hot` a fixed number of times. stderr says
 * how many calls were made while counting was on ("expected N").
 * Stress phase: the threads call `hot` without pause while the main thread
 * switches it on and off; it ends on. stderr: "stress N", the calls made.
 * stdout: what the calls computed (the same with and without the agent). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "rtprof.h"

__attribute__((noinline, noclone)) long hot(long x) {
    __asm__ volatile("");
    return x * 3 + 1;
}

static int nthreads, rounds;
static long per_round;
static pthread_barrier_t start, done;
static volatile int stop;
static long results[64], stress_calls[64];

static void *worker(void *arg) {
    long id = (long)arg, acc = 0;
    for (int r = 0; r < rounds; r++) {
        pthread_barrier_wait(&start);
        for (long i = 0; i < per_round; i++) acc += hot(i + id) & 7;
        pthread_barrier_wait(&done);
    }
    pthread_barrier_wait(&start);
    long n = 0;
    while (!stop) {
        acc += hot(n + id) & 7;
        n++;
    }
    results[id] = acc;
    stress_calls[id] = n;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    nthreads = atoi(argv[1]);
    rounds = atoi(argv[2]);
    per_round = atol(argv[3]);
    int switches = atoi(argv[4]);
    if (nthreads < 1 || nthreads > 64) return 2;
    int api = rtprof_set_counting != 0;
    pthread_barrier_init(&start, 0, nthreads + 1);
    pthread_barrier_init(&done, 0, nthreads + 1);
    pthread_t t[64];
    for (long i = 0; i < nthreads; i++) pthread_create(&t[i], 0, worker, (void *)i);
    long expected = 0;
    for (int r = 0; r < rounds; r++) {
        int on = r % 2 == 0;
        if (api && rtprof_set_counting("hot", on) != 1) {
            fprintf(stderr, "switch failed\n");
            return 1;
        }
        if (on || !api) expected += per_round * nthreads;
        pthread_barrier_wait(&start);
        pthread_barrier_wait(&done);
    }
    pthread_barrier_wait(&start);
    for (int s = 0; s < switches; s++)
        if (api) rtprof_set_counting("hot", s % 2);
    if (api) rtprof_set_counting("hot", 1);
    stop = 1;
    long acc = 0, stress = 0;
    for (int i = 0; i < nthreads; i++) {
        pthread_join(t[i], 0);
        acc += results[i];
        stress += stress_calls[i];
    }
    /* What the stress phase computed depends on how long it ran: only the
     * exact phase's sum is printed. */
    long exact = 0;
    for (int i = 0; i < nthreads; i++)
        for (long k = 0; k < per_round; k++) exact += ((k + i) * 3 + 1) & 7;
    printf("%ld\n", exact * rounds);
    fprintf(stderr, "expected %ld\nstress %ld\n", expected, stress);
    (void)acc;
    return 0;
}
