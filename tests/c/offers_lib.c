/* A library offering, through its RTPROF_OFFER section, an implementation
 * of its loader's function `work` (offers.c): what is unloaded while it is
 * routed. */
#include <rtprof.h>
#include <stdatomic.h>
#include <stdint.h>

atomic_ulong lib_calls;

#define MIX(h) ((h) * 6364136223846793005ULL + 1442695040888963407ULL)

__attribute__((noinline)) uint64_t lib_work(uint64_t x) {
    atomic_fetch_add_explicit(&lib_calls, 1, memory_order_relaxed);
    uint64_t h = x;
    for (int i = 0; i < 32; i++) h = MIX(h) ^ (h >> 29);
    return h;
}

RTPROF_OFFER(work, lib_work, "lib");

/* A function of the library's own with an implementation of its own:
 * routed when the library is unloaded. */
atomic_ulong own_calls, own_fast_calls;

__attribute__((noinline)) uint64_t lib_own(uint64_t x) {
    atomic_fetch_add_explicit(&own_calls, 1, memory_order_relaxed);
    uint64_t s = 0;
    for (uint64_t i = 0; i < 24; i++) s += (x + i) * 3;
    return s;
}

__attribute__((noinline)) uint64_t lib_own_fast(uint64_t x) {
    atomic_fetch_add_explicit(&own_fast_calls, 1, memory_order_relaxed);
    return 3 * (24 * x + 276);
}

RTPROF_OFFER(lib_own, lib_own_fast, "fast");
