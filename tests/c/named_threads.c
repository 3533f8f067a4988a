/* Eight named threads call functions known numbers of times; a ninth
 * ("sleeper") is still blocked when main exits; a tenth ("spinner") burns
 * about 300 ms of CPU. Each function's calls per thread are printed as
 * THREAD lines, the spinner's CPU time by its own clock as SPIN, for the
 * test to compare with the profiler's per-thread figures. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static long long thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long spun_ns;
static volatile unsigned long spins;

static void *spinner(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "spinner");
    while (thread_cpu_ns() < 300000000LL)
        for (int i = 0; i < 100000; i++) spins++;
    spun_ns = thread_cpu_ns();
    return NULL;
}

__attribute__((noinline)) int work(int x) { __asm__ volatile(""); return x * 3 + 1; }
__attribute__((noinline)) int shared_step(int x) { __asm__ volatile(""); return x ^ 5; }

static volatile int sink;
static volatile int sleeper_ready;
static int gate[2];

static void *worker(void *arg) {
    long k = (long)arg;
    char name[16];
    snprintf(name, sizeof name, "worker-%ld", k);
    pthread_setname_np(pthread_self(), name);
    for (long i = 0; i < (k + 1) * 1000; i++) sink += work((int)i);
    for (long i = 0; i < 100 * k; i++) sink += shared_step((int)i);
    return NULL;
}

static void *sleeper(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "sleeper");
    for (int i = 0; i < 5; i++) sink += work(i);
    sleeper_ready = 1;
    char c;
    /* Never written: still blocked here when main exits. */
    while (read(gate[0], &c, 1) < 0) {}
    return NULL;
}

int main(void) {
    pthread_t t[8], s, spin;
    if (pipe(gate) != 0) return 2;
    pthread_create(&s, NULL, sleeper, NULL);
    pthread_create(&spin, NULL, spinner, NULL);
    pthread_join(spin, NULL);
    for (long k = 0; k < 8; k++) pthread_create(&t[k], NULL, worker, (void *)k);
    for (int k = 0; k < 8; k++) pthread_join(t[k], NULL);
    for (int i = 0; i < 7; i++) sink += shared_step(i);
    /* The sleeper has called work() 5 times before main ends. */
    while (!sleeper_ready) usleep(1000);
    for (long k = 0; k < 8; k++)
        printf("THREAD worker-%ld work %ld shared_step %ld\n", k, (k + 1) * 1000, 100 * k);
    printf("THREAD sleeper work 5 shared_step 0\n");
    printf("THREAD main shared_step 7\n");
    printf("SPIN %lld\n", spun_ns);
    return 0;
}
