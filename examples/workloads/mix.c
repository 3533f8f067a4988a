/* A CPU-bound mix of kernels with different costs, for comparing sample
 * shares between profilers: dense matrix multiply, a sieve, software
 * CRC-32, recursive Fibonacci (many small calls), insertion of random keys
 * into a sorted array, and qsort (time in libc and in a comparator).
 * usage: mix [SCALE]   (SCALE 1 is about one second) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NOINLINE __attribute__((noinline))
static unsigned long rng = 88172645463325252UL;
static unsigned long next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

NOINLINE double matmul(int n) {
    static double a[160][160], b[160][160], c[160][160];
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) a[i][j] = i + j, b[i][j] = i - j, c[i][j] = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < n; k++)
            for (int j = 0; j < n; j++) c[i][j] += a[i][k] * b[k][j];
    return c[n / 2][n / 3];
}

NOINLINE int sieve(int n) {
    static char comp[2000001];
    memset(comp, 0, (size_t)n + 1);
    int count = 0;
    for (int i = 2; i <= n; i++) {
        if (comp[i]) continue;
        count++;
        for (long j = (long)i * i; j <= n; j += i) comp[j] = 1;
    }
    return count;
}

NOINLINE unsigned crc32_sw(const unsigned char *p, size_t len) {
    unsigned crc = ~0u;
    while (len--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0xEDB88320u & -(crc & 1));
    }
    return ~crc;
}

NOINLINE long fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

NOINLINE long sorted_insert(int n) {
    static int v[20000];
    int len = 0;
    for (int i = 0; i < n; i++) {
        int x = (int)(next() % 1000000), j = len++;
        while (j > 0 && v[j - 1] > x) v[j] = v[j - 1], j--;
        v[j] = x;
    }
    return v[n / 2];
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

NOINLINE int sort_random(int n) {
    static int v[400000];
    for (int i = 0; i < n; i++) v[i] = (int)next();
    qsort(v, (size_t)n, sizeof v[0], cmp_int);
    return v[n / 2];
}

static double seconds(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    /* Its own wall and CPU time, on stderr: what a profiler costs the
     * program itself, apart from the profiler's own start and end. */
    double wall0 = seconds(CLOCK_MONOTONIC), cpu0 = seconds(CLOCK_PROCESS_CPUTIME_ID);
    double scale = argc > 1 ? atof(argv[1]) : 1.0;
    static unsigned char buf[1 << 20];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)next();
    double acc = 0;
    int rounds = (int)(10 * scale + 0.5);
    for (int r = 0; r < rounds; r++) {
        acc += matmul(160);
        acc += sieve(2000000);
        acc += crc32_sw(buf, sizeof buf);
        acc += (double)fib(24);
        acc += (double)sorted_insert(6000);
        acc += sort_random(200000);
    }
    printf("%g\n", acc);
    fprintf(stderr, "mix-time %.6f %.6f\n", seconds(CLOCK_MONOTONIC) - wall0,
            seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0);
    return 0;
}
