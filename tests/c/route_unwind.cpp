/* Exceptions and backtraces through a routed call: parse throws on every
 * third value, in its own code and in the implementation it offers; the
 * caller catches. Inside the implementation, backtrace() must still find
 * the caller. Until SIGTERM, then:
 *   "parse original A fast B thrown T wrong W traced K of M"
 */
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <dlfcn.h>
#include <execinfo.h>
#include <rtprof.h>
#include <stdexcept>

static std::atomic<unsigned long> own_calls, fast_calls;
static unsigned long traced, traces;
static volatile sig_atomic_t stop;

extern "C" __attribute__((noinline, noclone)) long parse(long x) {
    own_calls.fetch_add(1, std::memory_order_relaxed);
    if (x % 3 == 0) throw std::runtime_error("three");
    return x * 2;
}

extern "C" __attribute__((noinline)) long caller_of_parse(long x);

extern "C" __attribute__((noinline, noclone)) long parse_fast(long x) {
    fast_calls.fetch_add(1, std::memory_order_relaxed);
    if (x % 4096 == 1) {
        void *f[32];
        int n = backtrace(f, 32);
        traces++;
        for (int i = 0; i < n; i++) {
            Dl_info d;
            if (dladdr(f[i], &d) && d.dli_sname && !strcmp(d.dli_sname, "caller_of_parse")) {
                traced++;
                break;
            }
        }
    }
    if (x % 3 == 0) throw std::runtime_error("three");
    return x + x;
}

extern "C" __attribute__((noinline)) long caller_of_parse(long x) {
    try {
        return parse(x);
    } catch (const std::exception &) {
        return -1;
    }
}

int main() {
    if (rtprof_offer && rtprof_offer("parse", (void *)parse_fast, "fast") != 0) return 4;
    std::signal(SIGTERM, [](int) { stop = 1; });
    std::printf("ready\n");
    std::fflush(stdout);
    unsigned long wrong = 0, thrown = 0;
    for (long i = 1; !stop; i++) {
        long r = caller_of_parse(i);
        if (r == -1) thrown++;
        if (r != (i % 3 == 0 ? -1 : 2 * i)) wrong++;
    }
    std::printf("parse original %lu fast %lu thrown %lu wrong %lu traced %lu of %lu\n", own_calls.load(),
                fast_calls.load(), thrown, wrong, traced, traces);
    return 0;
}
