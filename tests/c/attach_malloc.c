/* A single-threaded program that spends its time in malloc and free (and
 * in a function of its own between them): a thread rtprof attach
 * interrupts is likely inside malloc, holding its arena's lock, which
 * dlopen would need. Prints "done N" after SECONDS. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

__attribute__((noinline)) size_t fill(char *p, size_t n) {
    memset(p, 1, n);
    return n;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    unsigned long total = 0, rounds = 0;
    void *keep[64] = {0};
    for (;;) {
        for (int i = 0; i < 64; i++) {
            size_t n = 16 + (size_t)((rounds * 7 + i * 13) % 4000);
            free(keep[i]);
            keep[i] = malloc(n);
            total += fill(keep[i], n);
        }
        if (++rounds % 256 == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if (t.tv_sec - t0.tv_sec + (t.tv_nsec - t0.tv_nsec) / 1e9 > seconds)
                break;
        }
    }
    printf("done %d\n", total > 0);
    return 0;
}
