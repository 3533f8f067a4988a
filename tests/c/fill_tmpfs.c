/* Fills the file system of $FILL while running, then runs 300 ms of CPU
 * time in spin() and starts threads that call a counted function: the
 * agent must find no memory for the thread's samples by function (left
 * out) nor for the threads' counter stripes (they count in the shared
 * one, exactly), without faulting. With $PLUGIN, first a thread ends (its
 * counts go to the ended threads' sum) and the library $PLUGIN is loaded
 * (more counters in every stripe that is read), before the filling. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define THREADS 8
#define CALLS 10000

__attribute__((noinline)) long work(long x) {
    __asm__ volatile("");
    return x * 3 + 1;
}

static void *run(void *arg) {
    long s = 0;
    for (long i = 0; i < CALLS; i++) s += work(i);
    *(long *)arg = s;
    return NULL;
}

__attribute__((noinline)) void spin(long ms) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    long end = t.tv_sec * 1000 + t.tv_nsec / 1000000 + ms;
    static volatile long sink;
    do {
        for (int i = 0; i < 1000000; i++) sink += i;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    } while (t.tv_sec * 1000 + t.tv_nsec / 1000000 < end);
}

static void fill(const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) { perror("fill"); exit(2); }
    static char block[65536];
    while (fwrite(block, 1, sizeof block, f) == sizeof block && fflush(f) == 0) {
    }
    fclose(f);
}

int main(void) {
    long before = 0;
    for (long i = 0; i < CALLS; i++) before += work(i);
    int threads = THREADS;
    const char *plugin = getenv("PLUGIN");
    if (plugin) {
        pthread_t t;
        long sum;
        pthread_create(&t, NULL, run, &sum);
        pthread_join(t, NULL);
        before += sum;
        threads++;
        if (!dlopen(plugin, RTLD_NOW)) {
            fprintf(stderr, "%s\n", dlerror());
            return 2;
        }
    }
    const char *path = getenv("FILL");
    if (path) fill(path);
    spin(300);
    pthread_t t[THREADS];
    long sums[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, run, &sums[i]);
    long total = before;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        total += sums[i];
    }
    printf("total %ld\n", total);
    printf("EXPECT work %d\n", CALLS * (threads + 1));
    return 0;
}
