/* The cost of counting a loop: spin(n) runs a loop of n iterations with a
 * serial body, in each of T threads at once. Prints nanoseconds per
 * iteration (wall time of the slowest thread / n).
 * usage: loop_cost N THREADS */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noipa)) unsigned spin(unsigned long n) {
    unsigned acc = 1;
    for (unsigned long i = 0; i < n; i++) acc = acc * 1664525u + (acc >> 7) + (unsigned)i;
    return acc;
}

static unsigned long n;
static void *run(void *out) {
    *(unsigned *)out = spin(n);
    return NULL;
}

int main(int argc, char **argv) {
    n = argc > 1 ? strtoul(argv[1], 0, 10) : 100000000ul;
    int t = argc > 2 ? atoi(argv[2]) : 1;
    pthread_t th[64];
    unsigned res[64];
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < t; i++) pthread_create(&th[i], 0, run, &res[i]);
    unsigned x = 0;
    for (int i = 0; i < t; i++) {
        pthread_join(th[i], 0);
        x ^= res[i];
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("%.4f %u\n", ns / (double)n, x);
    return 0;
}
