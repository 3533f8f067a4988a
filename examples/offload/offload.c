/* rtprof's offload demonstration: a program with a hot kernel in two
 * implementations, its own plain loop and a vectorised one, which it
 * offers to rtprof (RTPROF_OFFER). A scheduler watching rtprofd routes the
 * kernel's calls to the fast one while the program is in a hot phase, and
 * gives the slot to another program when that one is hotter.
 *
 * The kernel: the sum of squares of a block of 32-bit integers (64-bit
 * sum), exact in both implementations, so the results never differ.
 *
 * usage: offload SECONDS PHASE...   each PHASE is `hot` or `idle`, SECONDS
 *        long; hot calls the kernel without pause, idle sleeps.
 * prints: work N (kernel calls done), calls original A fast B, wrong W
 * (results that differ from the plain loop's: always 0)
 *
 * build: cc -O2 -Iabi/include -o offload examples/offload/offload.c */
#include <rtprof.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BLOCK 4096

static atomic_ulong own_calls, fast_calls;

/* The plain loop, kept scalar. */
__attribute__((noinline, noclone, optimize("no-tree-vectorize"))) uint64_t kernel(const uint32_t *v,
                                                                                   size_t n) {
    atomic_fetch_add_explicit(&own_calls, 1, memory_order_relaxed);
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) s += (uint64_t)v[i] * v[i];
    return s;
}

/* The same sum, vectorised for AVX2 (offered where the machine has it),
 * and for SSE2, which every x86-64 has. */
__attribute__((noinline, noclone, target("avx2"), optimize("O3", "tree-vectorize"))) uint64_t
kernel_avx2(const uint32_t *v, size_t n) {
    atomic_fetch_add_explicit(&fast_calls, 1, memory_order_relaxed);
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) s += (uint64_t)v[i] * v[i];
    return s;
}

__attribute__((noinline, noclone, optimize("O3", "tree-vectorize"))) uint64_t
kernel_sse2(const uint32_t *v, size_t n) {
    atomic_fetch_add_explicit(&fast_calls, 1, memory_order_relaxed);
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) s += (uint64_t)v[i] * v[i];
    return s;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

#define USAGE "usage: offload SECONDS PHASE...   (each PHASE hot or idle, SECONDS long)\n"

int main(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf(USAGE);
        return 0;
    }
    if (argc < 3) {
        fprintf(stderr, USAGE);
        return 2;
    }
    char *end;
    double seconds = strtod(argv[1], &end);
    if (end == argv[1] || *end || !(seconds > 0)) {
        fprintf(stderr, "offload: SECONDS %s: not a positive number\n" USAGE, argv[1]);
        return 2;
    }
    /* Every phase checked before any runs. */
    for (int p = 2; p < argc; p++)
        if (strcmp(argv[p], "hot") && strcmp(argv[p], "idle")) {
            fprintf(stderr, "offload: unknown phase %s\n" USAGE, argv[p]);
            return 2;
        }
    if (rtprof_offer) {
        if (__builtin_cpu_supports("avx2")) rtprof_offer("kernel", (void *)kernel_avx2, "avx2");
        else rtprof_offer("kernel", (void *)kernel_sse2, "sse2");
    }
    static uint32_t v[BLOCK];
    for (int i = 0; i < BLOCK; i++) v[i] = (uint32_t)(i * 2654435761u);
    uint64_t work = 0, wrong = 0, expect = 0;
    for (int i = 0; i < BLOCK; i++) expect += (uint64_t)v[i] * v[i];
    for (int p = 2; p < argc; p++) {
        double end = now() + seconds;
        if (!strcmp(argv[p], "idle")) {
            usleep((useconds_t)(seconds * 1e6));
            continue;
        }
        while (now() < end)
            for (int k = 0; k < 64; k++, work++) wrong += kernel(v, BLOCK) != expect;
    }
    printf("work %lu\ncalls original %lu fast %lu\nwrong %lu\n", (unsigned long)work,
           atomic_load(&own_calls), atomic_load(&fast_calls), (unsigned long)wrong);
    return 0;
}
