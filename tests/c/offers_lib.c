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
