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

/* Spins in its own code between looks at the clock. */
#define BURN(name)                                                   \
    NOINLINE void name(long ms) {                                    \
        long end = cpu_ms() + ms;                                    \
        do {                                                         \
            for (volatile int i = 0; i < 2000000; i++) sink += i;   \
        } while (cpu_ms() < end);                                    \
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
