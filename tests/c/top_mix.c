/* Three functions with clearly different calls and costs, so that `rtprof
 * top` orders them differently by time and by calls: `many_cheap` is
 * called 200,000 times a second and costs next to nothing; `few_costly`
 * is called 100 times a second and spins about 1 ms each time (the most
 * time); `some_middle` is in between in both. `offloaded_kernel` runs
 * "elsewhere": the program adds its calls through the C API, 500 a second
 * with 20 ms of time. Runs for SECONDS.
 * usage: top_mix SECONDS */
#include <stdlib.h>
#include <time.h>
#include "rtprof.h"

static volatile unsigned long sink;
__attribute__((noinline)) void many_cheap(void) { sink++; }
__attribute__((noinline)) void some_middle(void) {
    for (int i = 0; i < 20000; i++) sink += i;
}
__attribute__((noinline)) void few_costly(void) {
    for (int i = 0; i < 1000000; i++) sink += i;
}

__attribute__((noinline)) void offloaded_kernel(void) { sink--; }

int main(int argc, char **argv) {
    long secs = argc > 1 ? atol(argv[1]) : 30;
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    /* A batch every 10 ms: 2,000 cheap calls, 20 middle ones, one costly. */
    for (long b = 0; b < secs * 100; b++) {
        for (int i = 0; i < 2000; i++) many_cheap();
        for (int i = 0; i < 20; i++) some_middle();
        few_costly();
        /* Time is added as whole sampling periods (1 ms): in tenths of a
         * second's worth at a time. */
        if (rtprof_add_calls && b % 10 == 0)
            rtprof_add_calls("offloaded_kernel", 50, 2000000);
        next.tv_nsec += 10000000;
        if (next.tv_nsec >= 1000000000) next.tv_nsec -= 1000000000, next.tv_sec++;
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, 0);
    }
    return 0;
}
