/* A program that calls one small function in a tight loop and prints, every
 * 100 ms, the calls it made in that time: bench-attach attaches rtprof to
 * it and compares the rate before, during and after.
 * Usage: attach_rate SECONDS */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline, noipa)) unsigned long step(unsigned long x) { return x * 2654435761u + 1; }

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10;
    setvbuf(stdout, NULL, _IOLBF, 0);
    unsigned long v = 1, calls = 0;
    double start = now(), last = start;
    for (;;) {
        for (int i = 0; i < 65536; i++)
            v = step(v);
        calls += 65536;
        double t = now();
        if (t - last >= 0.1) {
            printf("rate %.0f at %.3f\n", calls / (t - last), t - start);
            calls = 0;
            last = t;
            if (t - start >= seconds)
                break;
        }
    }
    fprintf(stderr, "%lu\n", v);
    return 0;
}
