/* Offers rtprof must take apart: a second offer after libc's functions
 * were named for samples, offers of a function itself, of an alias of it,
 * of an address inside it or inside another function, with names
 * `rtprof route` cannot carry, and a section with bad entries among good
 * ones. Each refusal's code is printed on stderr (`what CODE`); the calls
 * of f, g and h run until SIGTERM, and SIGUSR1 prints how many each
 * implementation ran:
 *
 *   offer_checks second   f offered as "a", libc busy, f offered as "b"
 *   offer_checks bad      f offered as "a"; every bad offer refused
 *
 * stdout: `ready`, then `f own N a N b N g own N fast N h own N fast N`.
 */
#include <rtprof.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_ulong f_own, f_a_calls, f_b_calls, g_own, g_fast_calls, h_own, h_fast_calls;
static volatile sig_atomic_t asked, stop;
static uint64_t data_word = 42;

__attribute__((noinline, noclone)) uint64_t f(uint64_t x) {
    atomic_fetch_add_explicit(&f_own, 1, memory_order_relaxed);
    return x * 3 + 1;
}
/* The same code under another name. */
extern uint64_t f_alias(uint64_t) __attribute__((alias("f")));

__attribute__((noinline, noclone)) uint64_t f_a(uint64_t x) {
    atomic_fetch_add_explicit(&f_a_calls, 1, memory_order_relaxed);
    return x * 3 + 1;
}

__attribute__((noinline, noclone)) uint64_t f_b(uint64_t x) {
    atomic_fetch_add_explicit(&f_b_calls, 1, memory_order_relaxed);
    return x * 3 + 1;
}

__attribute__((noinline, noclone)) uint64_t g(uint64_t x) {
    atomic_fetch_add_explicit(&g_own, 1, memory_order_relaxed);
    return x ^ 0x5555;
}

__attribute__((noinline, noclone)) uint64_t g_fast(uint64_t x) {
    atomic_fetch_add_explicit(&g_fast_calls, 1, memory_order_relaxed);
    return x ^ 0x5555;
}

__attribute__((noinline, noclone)) uint64_t h(uint64_t x) {
    atomic_fetch_add_explicit(&h_own, 1, memory_order_relaxed);
    return x + 7;
}

__attribute__((noinline, noclone)) uint64_t h_fast(uint64_t x) {
    atomic_fetch_add_explicit(&h_fast_calls, 1, memory_order_relaxed);
    return x + 7;
}

/* Good entries, and among them bad ones: a function name that is a string
 * of another library (libc's code), an implementation in data, a null
 * name. The good ones are taken all the same. */
RTPROF_OFFER(g, g_fast, "fast");
__attribute__((used, section("rtprof_offers"), aligned(8))) static const struct rtprof_offer_entry
    bad_elsewhere = {(const char *)(const void *)puts, (const void *)g_fast, "elsewhere"};
__attribute__((used, section("rtprof_offers"), aligned(8))) static const struct rtprof_offer_entry
    bad_data = {"g", (const void *)&data_word, "data"};
__attribute__((used, section("rtprof_offers"), aligned(8))) static const struct rtprof_offer_entry
    bad_null = {"h", (const void *)h_fast, 0};
RTPROF_OFFER(h, h_fast, "fast");

static void on_signal(int sig) {
    if (sig == SIGUSR1) asked = 1;
    else stop = 1;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* ~300 ms inside libc's memset: samples land in libc, whose functions
 * the agent then names. */
static void busy_in_libc(void) {
    size_t n = 16 << 20;
    char *buf = malloc(n);
    volatile char sink = 0;
    double end = now() + 0.3;
    for (int i = 0; now() < end; i++) {
        memset(buf, i, n);
        sink += buf[i % n];
    }
    free(buf);
}

static int offer(const char *what, const char *function, void *implementation, const char *name) {
    int rc = rtprof_offer ? rtprof_offer(function, implementation, name) : 1;
    fprintf(stderr, "%s %d\n", what, rc);
    return rc;
}

int main(int argc, char **argv) {
    signal(SIGUSR1, on_signal);
    signal(SIGTERM, on_signal);
    const char *mode = argc > 1 ? argv[1] : "bad";
    offer("first", "f", (void *)f_a, "a");
    if (!strcmp(mode, "second")) {
        busy_in_libc();
        usleep(1200 * 1000);
        offer("second", "f", (void *)f_b, "b");
    } else {
        offer("itself", "f", (void *)f, "self");
        offer("alias", "f", (void *)f_alias, "alias");
        offer("inside", "f", (void *)((char *)f + 1), "inside");
        offer("elsewhere", "f", (void *)((char *)g + 1), "elsewhere");
        offer("null", NULL, (void *)f_a, "null");
        offer("utf8", "f", (void *)f_b, "\xff\xfe");
        offer("newline", "f", (void *)f_b, "b\nroute");
        offer("tab", "f", (void *)f_b, "b\t");
        offer("good", "f", (void *)f_b, "b");
    }
    fflush(stderr);
    printf("ready\n");
    fflush(stdout);
    volatile uint64_t sink = 0;
    while (!stop) {
        for (int i = 0; i < 1000; i++) sink += f(i) + g(i) + h(i);
        if (asked) {
            asked = 0;
            printf("f own %lu a %lu b %lu g own %lu fast %lu h own %lu fast %lu\n",
                   atomic_load(&f_own), atomic_load(&f_a_calls), atomic_load(&f_b_calls),
                   atomic_load(&g_own), atomic_load(&g_fast_calls), atomic_load(&h_own),
                   atomic_load(&h_fast_calls));
            fflush(stdout);
        }
        usleep(100);
    }
    printf("f own %lu a %lu b %lu g own %lu fast %lu h own %lu fast %lu\n", atomic_load(&f_own),
           atomic_load(&f_a_calls), atomic_load(&f_b_calls), atomic_load(&g_own),
           atomic_load(&g_fast_calls), atomic_load(&h_own), atomic_load(&h_fast_calls));
    return 0;
}
