/* Programs whose hot functions' rates change, for the overhead budget;
 * every count is known to the program and printed as EXPECT lines.
 * Usage: budget_shapes MODE [SECONDS]
 *   worker: one thread calls multiply() while main waits in pthread_join
 *   phased: one worker; phases of 10-100 ms (by the clock) each call a
 *           different mix of phase_a, phase_b and phase_c
 *   spiky:  a steady background of steady(), with spike() hot only in
 *           2-5 ms spikes every 30-90 ms */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NOINLINE __attribute__((noipa))
static volatile long sink;
NOINLINE long multiply(long a, long b) { sink += a * b; return a * b; }
NOINLINE long phase_a(long x) { sink += x; return x; }
NOINLINE long phase_b(long x) { sink ^= x; return x; }
NOINLINE long phase_c(long x) { sink -= x; return x; }
NOINLINE long steady(long x) { sink += x; return x; }
NOINLINE long spike(long x) { sink ^= x; return x; }

static long counts[8];
static double seconds = 1.5;
static char mode[16];
static unsigned long long rng = 88172645463325252ull;
static unsigned next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (unsigned)rng; }

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *worker(void *arg) {
    (void)arg;
    if (!strcmp(mode, "worker")) {
        long n = (long)(seconds * 6.7e7);
        for (long i = 0; i < n; i++) multiply(i, 3);
        counts[0] = n;
    } else if (!strcmp(mode, "phased")) {
        double end = now() + seconds;
        while (now() < end) {
            double until = now() + (10 + next() % 91) / 1000.0;
            int mix = next() % 3;
            while (now() < until) {
                for (int i = 0; i < 1000; i++) {
                    phase_a(i), counts[0]++;
                    if (mix >= 1) phase_b(i), counts[1]++;
                    if (mix == 2) phase_c(i), phase_c(i), counts[2] += 2;
                }
            }
        }
    } else if (!strcmp(mode, "spiky")) {
        double end = now() + seconds;
        while (now() < end) {
            double quiet = now() + (30 + next() % 61) / 1000.0;
            while (now() < quiet)
                for (int i = 0; i < 1000; i++) steady(i), counts[3]++;
            double loud = now() + (2 + next() % 4) / 1000.0;
            while (now() < loud)
                for (int i = 0; i < 1000; i++) spike(i), spike(i), counts[4] += 2;
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    snprintf(mode, sizeof mode, "%s", argv[1]);
    if (argc > 2) seconds = atof(argv[2]);
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0) return 3;
    pthread_join(t, NULL);

    if (!strcmp(mode, "worker")) printf("EXPECT multiply %ld\n", counts[0]);
    if (!strcmp(mode, "phased")) {
        printf("EXPECT phase_a %ld\n", counts[0]);
        printf("EXPECT phase_b %ld\n", counts[1]);
        printf("EXPECT phase_c %ld\n", counts[2]);
    }
    if (!strcmp(mode, "spiky")) {
        printf("EXPECT steady %ld\n", counts[3]);
        printf("EXPECT spike %ld\n", counts[4]);
    }
    return 0;
}
