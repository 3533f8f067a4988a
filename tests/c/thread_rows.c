/* Named threads calling functions known numbers of times, then staying
 * alive until stdin closes: worker-k calls work() (k+1)*1000 times and
 * tick() k+1 times, and runs burn_k() once for 150 ms of its CPU time
 * (so only worker-k is ever sampled in burn_k); the main thread calls
 * tick() 5 times. Prints "ready" once every thread is done. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noipa))

NOINLINE int work(int x) { return x * 3 + 1; }
NOINLINE int tick(int x) { return x + 1; }

static volatile int sink;
static pthread_barrier_t done;

static long cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Rounds of 100,000 spins in 1 ms of CPU, as measured in main. Sized
 * once: a thread that reads its own CPU clock as it spins has its
 * CPU-time timers expire late (see docs/limits.md), and its samples would
 * land past the function. */
static long rounds_per_ms = 1;

static void spin_rounds(long n) {
    for (long r = 0; r < n; r++)
        for (volatile int i = 0; i < 100000; i++) sink += i;
}

static void size_rounds(void) {
    long n = 0, start = cpu_ms(), took;
    do {
        spin_rounds(1);
        n++;
    } while ((took = cpu_ms() - start) < 20);
    rounds_per_ms = n / took + 1;
}

/* Spins in its own code for about `ms` of CPU. */
#define BURN(name)                                                   \
    NOINLINE void name(long ms) {                                    \
        for (long r = 0; r < ms * rounds_per_ms; r++)                \
            for (volatile int i = 0; i < 100000; i++) sink += i;    \
    }
BURN(burn_0)
BURN(burn_1)
BURN(burn_2)
static void (*const burns[3])(long) = {burn_0, burn_1, burn_2};

static void *worker(void *arg) {
    long k = (long)arg;
    char name[16];
    snprintf(name, sizeof name, "worker-%ld", k);
    pthread_setname_np(pthread_self(), name);
    for (int i = 0; i < (k + 1) * 1000; i++) sink += work(i);
    for (int i = 0; i <= k; i++) sink += tick(i);
    burns[k](150);
    pthread_barrier_wait(&done);
    /* Alive until the main thread's stdin closes. */
    pause();
    return NULL;
}

int main(void) {
    pthread_t t[3];
    size_rounds();
    pthread_barrier_init(&done, NULL, 4);
    for (long k = 0; k < 3; k++) pthread_create(&t[k], NULL, worker, (void *)k);
    for (int i = 0; i < 5; i++) sink += tick(i);
    pthread_barrier_wait(&done);
    printf("ready\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}
