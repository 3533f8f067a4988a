/* Calls `paced_tick` RATE times a second of wall time for SECONDS, in a
 * batch every millisecond against absolute deadlines (a late batch catches
 * up), so any window of a second or more sees RATE calls a second however
 * the machine is loaded; then prints the exact count.
 * usage: paced RATE SECONDS */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;
__attribute__((noinline)) void paced_tick(void) { sink++; }

int main(int argc, char **argv) {
    long rate = argc > 1 ? atol(argv[1]) : 100000;
    long secs = argc > 2 ? atol(argv[2]) : 10;
    struct timespec t0, next;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    next = t0;
    long n = 0;
    for (long ms = 1; ms <= secs * 1000; ms++) {
        for (long due = rate * ms / 1000; n < due; n++) paced_tick();
        next.tv_nsec += 1000000;
        if (next.tv_nsec >= 1000000000) next.tv_nsec -= 1000000000, next.tv_sec++;
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, 0);
    }
    printf("calls %ld\n", n);
    return 0;
}
