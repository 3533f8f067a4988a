/* A program that offers other implementations of two of its functions
 * (work by rtprof_offer, scale by the RTPROF_OFFER section) and counts, in
 * each implementation, the calls it ran: what rtprof's rows per
 * implementation are checked against.
 *
 *   offers serve          calls both until SIGTERM; SIGUSR1 prints counts
 *   offers threads N      N threads check work's results until SIGTERM
 *   offers fork           on SIGUSR1: 1000 calls, fork (1000 calls), exec
 *   offers fresh          1000 calls (the exec'd image)
 *   offers dlclose LIB    LIB offers "lib" for work; SIGUSR1: 1000 calls,
 *                         dlclose, 1000 calls
 */
#include <dlfcn.h>
#include <pthread.h>
#include <rtprof.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static atomic_ulong work_own, work_fast_calls, scale_own, scale_fast_calls;
static volatile sig_atomic_t asked, stop;

#define MIX(h) ((h) * 6364136223846793005ULL + 1442695040888963407ULL)

__attribute__((noinline, noclone)) uint64_t work(uint64_t x) {
    atomic_fetch_add_explicit(&work_own, 1, memory_order_relaxed);
    uint64_t h = x;
    for (int i = 0; i < 32; i++) h = MIX(h) ^ (h >> 29);
    return h;
}

/* The same results, two rounds a step. */
__attribute__((noinline, noclone)) uint64_t work_fast(uint64_t x) {
    atomic_fetch_add_explicit(&work_fast_calls, 1, memory_order_relaxed);
    uint64_t h = x;
    for (int i = 0; i < 32; i += 2) {
        h = MIX(h) ^ (h >> 29);
        h = MIX(h) ^ (h >> 29);
    }
    return h;
}

__attribute__((noinline, noclone)) uint64_t scale(uint64_t x) {
    atomic_fetch_add_explicit(&scale_own, 1, memory_order_relaxed);
    uint64_t s = 0;
    for (uint64_t i = 0; i < 24; i++) s += (x + i) * 3;
    return s;
}

__attribute__((noinline, noclone)) uint64_t scale_fast(uint64_t x) {
    atomic_fetch_add_explicit(&scale_fast_calls, 1, memory_order_relaxed);
    return 3 * (24 * x + 276);
}

RTPROF_OFFER(scale, scale_fast, "fast");

/* What work returns, computed apart from it. */
static uint64_t expected(uint64_t x) {
    uint64_t h = x;
    for (int i = 0; i < 32; i++) h = MIX(h) ^ (h >> 29);
    return h;
}

static void on_signal(int sig) {
    if (sig == SIGUSR1) asked = 1;
    else stop = 1;
}

static void counts(const char *who) {
    printf("%s work original %lu fast %lu scale original %lu fast %lu\n", who,
           atomic_load(&work_own), atomic_load(&work_fast_calls), atomic_load(&scale_own),
           atomic_load(&scale_fast_calls));
    fflush(stdout);
}

static void reset(void) {
    atomic_store(&work_own, 0);
    atomic_store(&work_fast_calls, 0);
    atomic_store(&scale_own, 0);
    atomic_store(&scale_fast_calls, 0);
}

static void calls(int n) {
    volatile uint64_t sink = 0;
    for (int i = 0; i < n; i++) sink += work(i);
}

static void wait_asked(void) {
    while (!asked && !stop) usleep(1000);
    asked = 0;
}

static atomic_ulong wrong;
static void *checker(void *arg) {
    uint64_t x = (uintptr_t)arg * 1000003;
    while (!stop) {
        for (int i = 0; i < 1000; i++, x++)
            if (work(x) != expected(x)) atomic_fetch_add(&wrong, 1);
    }
    return 0;
}

int main(int argc, char **argv) {
    signal(SIGUSR1, on_signal);
    signal(SIGTERM, on_signal);
    const char *mode = argc > 1 ? argv[1] : "serve";
    if (rtprof_offer) {
        fprintf(stderr, "offer %d\n", rtprof_offer("work", (void *)work_fast, "fast"));
        /* The same code offered under a second name: never routed to. */
        fprintf(stderr, "twin %d\n", rtprof_offer("work", (void *)work_fast, "twin"));
        /* Refused: data is no code, no such function, a reserved name. */
        fprintf(stderr, "data %d\n", rtprof_offer("work", (void *)&work_own, "data"));
        fprintf(stderr, "unknown %d\n", rtprof_offer("no_such_function", (void *)work_fast, "x"));
        fprintf(stderr, "reserved %d\n", rtprof_offer("work", (void *)work_fast, "original"));
    }
    if (!strcmp(mode, "serve")) {
        printf("ready\n");
        fflush(stdout);
        volatile uint64_t sink = 0;
        for (uint64_t i = 0; !stop; i++) {
            sink += work(i) + scale(i);
            if (asked) {
                asked = 0;
                counts("now");
            }
        }
        counts("end");
    } else if (!strcmp(mode, "threads")) {
        int n = argc > 2 ? atoi(argv[2]) : 8;
        pthread_t t[64];
        for (int i = 0; i < n && i < 64; i++) pthread_create(&t[i], 0, checker, (void *)(uintptr_t)i);
        printf("ready\n");
        fflush(stdout);
        for (int i = 0; i < n && i < 64; i++) pthread_join(t[i], 0);
        printf("%d threads, %lu wrong results\n", n, atomic_load(&wrong));
        fprintf(stderr, "work original %lu fast %lu\n", atomic_load(&work_own),
                atomic_load(&work_fast_calls));
    } else if (!strcmp(mode, "fork")) {
        printf("ready\n");
        fflush(stdout);
        wait_asked();
        reset();
        calls(1000);
        counts("parent");
        pid_t c = fork();
        if (c == 0) {
            reset();
            calls(1000);
            counts("child");
            execl(argv[0], argv[0], "fresh", (char *)0);
            _exit(127);
        }
        int st;
        waitpid(c, &st, 0);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
    } else if (!strcmp(mode, "fresh")) {
        reset();
        calls(1000);
        counts("exec");
    } else if (!strcmp(mode, "dlclose")) {
        void *h = dlopen(argv[2], RTLD_NOW);
        if (!h) {
            fprintf(stderr, "%s\n", dlerror());
            return 1;
        }
        atomic_ulong *lib_calls = dlsym(h, "lib_calls");
        atomic_ulong *own = dlsym(h, "own_calls"), *own_fast = dlsym(h, "own_fast_calls");
        uint64_t (*lib_own)(uint64_t) = (uint64_t(*)(uint64_t))dlsym(h, "lib_own");
        printf("ready\n");
        fflush(stdout);
        wait_asked();
        reset();
        calls(1000);
        volatile uint64_t sink = 0;
        for (int i = 0; i < 1000; i++) sink += lib_own(i);
        printf("loaded work original %lu lib %lu lib_own original %lu fast %lu\n",
               atomic_load(&work_own), atomic_load(lib_calls), atomic_load(own),
               atomic_load(own_fast));
        fflush(stdout);
        dlclose(h);
        calls(1000);
        printf("unloaded work original %lu\n", atomic_load(&work_own));
    }
    return 0;
}
