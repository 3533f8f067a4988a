/* A caller that keeps values in call-clobbered registers across a call
 * (GCC's -fipa-ra, on at -O2: crc32c's own code leaves them alone), and
 * two offered implementations of crc32c that overwrite every
 * call-clobbered register. Routed, the caller must find them as crc32c
 * would have left them: every round's hash is checked against the one
 * the main thread computed before any route.
 *
 *   route_registers N     N threads hash rounds until SIGTERM, then:
 *                         "crc32c original A slice8 B table C rounds R wrong W
 *                          signals S wrong X"
 *
 * A timer's signal handler calls crc32c too, in whichever thread it
 * interrupts (inside a routed call or not), and checks its result.
 */
#include <pthread.h>
#include <rtprof.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#define POLY 0x82f63b78u
#define ROUND 64

static atomic_ulong own_calls, slice8_calls, table_calls;
static volatile sig_atomic_t stop;
static uint8_t data[1024];
static uint32_t table[8][256];

/* The plain bitwise CRC-32C: few registers. */
__attribute__((noinline, noclone)) uint32_t crc32c(const uint8_t *p, size_t n) {
    atomic_fetch_add_explicit(&own_calls, 1, memory_order_relaxed);
    uint32_t c = ~0u;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (POLY & -(c & 1));
    }
    return ~c;
}

/* Every call-clobbered register overwritten (vector upper halves too
 * where the build has AVX), as any other code may. */
#if defined(__AVX__)
#define VCLOB(n) "vpcmpeqd %%ymm" #n ", %%ymm" #n ", %%ymm" #n "\n\t"
#else
#define VCLOB(n) "pcmpeqd %%xmm" #n ", %%xmm" #n "\n\t"
#endif
#define CLOBBER()                                                                          \
    __asm__ volatile("mov $-1, %%rax\n\tmov $-1, %%rcx\n\tmov $-1, %%rdx\n\t"             \
                     "mov $-1, %%rsi\n\tmov $-1, %%rdi\n\tmov $-1, %%r8\n\t"              \
                     "mov $-1, %%r9\n\tmov $-1, %%r10\n\tmov $-1, %%r11\n\t" VCLOB(0)      \
                         VCLOB(1) VCLOB(2) VCLOB(3) VCLOB(4) VCLOB(5) VCLOB(6) VCLOB(7)    \
                             VCLOB(8) VCLOB(9) VCLOB(10) VCLOB(11) VCLOB(12) VCLOB(13)     \
                                 VCLOB(14) VCLOB(15)                                       \
                     :                                                                     \
                     :                                                                     \
                     : "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "xmm0", \
                       "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",     \
                       "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "memory")

/* Slicing by eight. */
__attribute__((noinline, noclone)) uint32_t crc32c_slice8(const uint8_t *p, size_t n) {
    atomic_fetch_add_explicit(&slice8_calls, 1, memory_order_relaxed);
    CLOBBER();
    uint32_t c = ~0u;
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= c;
        c = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^
            table[4][lo >> 24] ^ table[3][hi & 0xff] ^ table[2][(hi >> 8) & 0xff] ^
            table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
    CLOBBER();
    return ~c;
}

/* A byte at a time through the table. */
__attribute__((noinline, noclone)) uint32_t crc32c_table(const uint8_t *p, size_t n) {
    atomic_fetch_add_explicit(&table_calls, 1, memory_order_relaxed);
    CLOBBER();
    uint32_t c = ~0u;
    for (size_t i = 0; i < n; i++) c = (c >> 8) ^ table[0][(c ^ p[i]) & 0xff];
    return ~c;
}

/* One round: many values live across each call, and a double (a vector
 * register); with AVX2, a 256-bit vector too (a whole ymm register). */
__attribute__((noinline, noclone)) uint64_t round_hash(const uint8_t *buf, uint64_t seed) {
    uint64_t a = seed, b = seed * 3 + 1, c = seed ^ 0x9e3779b97f4a7c15ull, d = seed + 7, h = 0;
    double acc = 1.0;
#if defined(__AVX2__)
    typedef uint64_t v4 __attribute__((vector_size(32)));
    v4 wide = {seed, seed + 1, seed + 2, seed + 3};
#endif
    for (int i = 0; i < ROUND; i++) {
        uint32_t r = crc32c(buf + (a & 255), 64 + (b & 63));
        h = (h ^ r) * 0x100000001b3ull + a + buf[(c + i) & 511];
        a += b;
        b ^= c;
        c += d;
        d = d * 5 + r;
        acc = acc * 1.0000001 + (double)(r & 0xff);
#if defined(__AVX2__)
        wide = (wide ^ (v4){r, r, r, r}) + (wide << 3);
#endif
    }
#if defined(__AVX2__)
    h ^= wide[0] ^ wide[1] ^ wide[2] ^ wide[3];
#endif
    return h ^ (uint64_t)acc;
}

struct worker {
    pthread_t t;
    uint64_t seed, want, rounds, wrong;
};

static void *work(void *arg) {
    struct worker *w = arg;
    while (!stop) {
        if (round_hash(data, w->seed) != w->want) w->wrong++;
        w->rounds++;
    }
    return NULL;
}

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static uint32_t in_handler_want;
static atomic_ulong in_handler_calls, in_handler_wrong;

static void on_timer(int sig) {
    (void)sig;
    if (crc32c(data + 5, 100) != in_handler_want)
        atomic_fetch_add_explicit(&in_handler_wrong, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&in_handler_calls, 1, memory_order_relaxed);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4;
    if (n < 1 || n > 64) return 2;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (POLY & -(c & 1));
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int s = 1; s < 8; s++) table[s][i] = (table[s - 1][i] >> 8) ^ table[0][table[s - 1][i] & 0xff];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 131 + 7);
    /* The implementations agree with crc32c. */
    for (size_t k = 0; k < 200; k++)
        if (crc32c_slice8(data + k, k) != crc32c(data + k, k) || crc32c_table(data + k, k) != crc32c(data + k, k)) {
            fprintf(stderr, "implementations disagree at %zu\n", k);
            return 3;
        }
    if (rtprof_offer) {
        int a = rtprof_offer("crc32c", (void *)crc32c_slice8, "slice8");
        int b = rtprof_offer("crc32c", (void *)crc32c_table, "table");
        if (a || b) {
            fprintf(stderr, "offers refused: %d %d\n", a, b);
            return 4;
        }
    }
    signal(SIGTERM, on_signal);
    in_handler_want = crc32c(data + 5, 100);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_timer;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval every = {{0, 200}, {0, 200}};
    setitimer(ITIMER_REAL, &every, NULL);
    struct worker *w = calloc(n, sizeof *w);
    for (int i = 0; i < n; i++) {
        w[i].seed = 1000003u * (i + 1);
        w[i].want = round_hash(data, w[i].seed);
    }
    /* Routed calls from here: the checks above called the implementations
     * directly (crc32c's own calls are all counted, as rtprof does). */
    atomic_store(&slice8_calls, 0);
    atomic_store(&table_calls, 0);
    for (int i = 0; i < n; i++) pthread_create(&w[i].t, NULL, work, &w[i]);
    printf("ready\n");
    fflush(stdout);
    uint64_t rounds = 0, wrong = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(w[i].t, NULL);
        rounds += w[i].rounds;
        wrong += w[i].wrong;
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("crc32c original %lu slice8 %lu table %lu rounds %lu wrong %lu signals %lu wrong %lu\n",
           atomic_load(&own_calls), atomic_load(&slice8_calls), atomic_load(&table_calls),
           (unsigned long)rounds, (unsigned long)wrong, atomic_load(&in_handler_calls),
           atomic_load(&in_handler_wrong));
    return 0;
}
