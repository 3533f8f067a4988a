/* Threads that come and go: N threads started and joined one after
 * another, each running four functions for about 0.4 ms of its CPU time
 * each and calling tick() k times (k its number mod 7). Prints the calls
 * of tick it made. usage: thread_churn [N] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define NOINLINE __attribute__((noipa))
static volatile long sink;

static long cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

#define SPIN(name)                                              \
    NOINLINE void name(void) {                                  \
        long end = cpu_ns() + 400000;                           \
        do {                                                    \
            for (int i = 0; i < 2000; i++) sink += i;           \
        } while (cpu_ns() < end);                               \
    }
SPIN(spin_a)
SPIN(spin_b)
SPIN(spin_c)
SPIN(spin_d)
NOINLINE void tick(void) { sink++; }

static void *run(void *arg) {
    long k = (long)arg;
    spin_a();
    spin_b();
    spin_c();
    spin_d();
    for (long i = 0; i < k % 7; i++) tick();
    return 0;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 2000, ticks = 0;
    for (long k = 0; k < n; k++) {
        pthread_t t;
        pthread_create(&t, 0, run, (void *)k);
        pthread_join(t, 0);
        ticks += k % 7;
    }
    printf("tick %ld\n", ticks);
    return 0;
}
