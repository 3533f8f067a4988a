// Offers in C++: by the name reports print (k::sum), from the section
// macro with a qualified name, and by address for one of two overloads
// (k::scale(long) and k::scale(double), both `k::scale` without their
// parameters). Each implementation counts its own calls.
//   offers_cxx   prints the offers' answers, then "ready"; reads lines:
//   "counts" prints the calls per implementation, "quit" ends.
#include <atomic>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include "rtprof.h"

#define NOINLINE __attribute__((noinline, noclone))

static std::atomic<long> n_sum{0}, n_unrolled{0}, n_pairs{0}, n_scale{0}, n_scale_fast{0};
static std::atomic<bool> stop{false};

namespace k {
NOINLINE long sum(const long *v, int n) {
    n_sum.fetch_add(1, std::memory_order_relaxed);
    long s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return s;
}
NOINLINE long sum_unrolled(const long *v, int n) {
    n_unrolled.fetch_add(1, std::memory_order_relaxed);
    long a = 0, b = 0;
    int i = 0;
    for (; i + 1 < n; i += 2) { a += v[i]; b += v[i + 1]; }
    if (i < n) a += v[i];
    return a + b;
}
NOINLINE long sum_pairs(const long *v, int n) {
    n_pairs.fetch_add(1, std::memory_order_relaxed);
    long s = 0;
    for (int i = n - 1; i >= 0; i--) s += v[i];
    return s;
}
NOINLINE long scale(long x) {
    n_scale.fetch_add(1, std::memory_order_relaxed);
    return x * 3;
}
NOINLINE double scale(double x) { return x * 3.5; }
NOINLINE long scale_fast(long x) {
    n_scale_fast.fetch_add(1, std::memory_order_relaxed);
    return (x << 1) + x;
}
}  // namespace k

RTPROF_OFFER(k::sum, k::sum_pairs, "pairs");

static void counts() {
    std::printf("sum %ld unrolled %ld pairs %ld scale %ld scale_fast %ld\n", n_sum.load(),
                n_unrolled.load(), n_pairs.load(), n_scale.load(), n_scale_fast.load());
    std::fflush(stdout);
}

int main() {
    std::printf("offer k::sum unrolled %d\n",
                rtprof_offer ? rtprof_offer("k::sum", (void *)&k::sum_unrolled, "unrolled") : 1);
    std::printf("offer k::scale fast %d\n",
                rtprof_offer ? rtprof_offer("k::scale", (void *)&k::scale_fast, "fast") : 1);
    long (*scale_long)(long) = &k::scale;
    std::printf("offer_at k::scale(long) fast %d\n",
                rtprof_offer_at ? rtprof_offer_at((const void *)scale_long, (const void *)&k::scale_fast, "fast") : 1);
    std::printf("ready\n");
    std::fflush(stdout);
    std::thread worker([] {
        long v[16];
        for (int i = 0; i < 16; i++) v[i] = i;
        long bad = 0;
        double d = 0;
        while (!stop.load()) {
            if (k::sum(v, 16) != 120) bad++;
            if (k::scale(7L) != 21) bad++;
            d += k::scale(1.0);
        }
        if (bad) std::printf("wrong results: %ld\n", bad);
        (void)d;
    });
    std::string line;
    while (std::getline(std::cin, line)) {
        if (line == "counts") counts();
        if (line == "quit") break;
    }
    stop.store(true);
    worker.join();
    counts();
    return 0;
}
