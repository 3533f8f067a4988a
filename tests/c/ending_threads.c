/* Threads that end without pause until the process ends: four spawners
 * each start a thread, which calls tick() 1,000 times, and join it, over
 * and over. What the program did is kept in a shared file the test reads
 * after the process is gone: [0] threads started, [1] threads that made
 * all their calls, [2] the pid.
 * usage: ending_threads FILE exit MS   (exit(0) after MS ms, threads running)
 *        ending_threads FILE wait      (until killed) */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "many_functions.h"

#define CALLS 1000
static volatile long sink;
static _Atomic unsigned long *shared;

__attribute__((noipa)) void tick(void) { sink++; }

/* 20,000 more functions, never called: a thread's end folds a counter
 * per function, so they make each fold long enough for the process's end
 * to fall inside one. */
MANY_FUNCTIONS(20000);

static void *worker(void *arg) {
    (void)arg;
    for (int i = 0; i < CALLS; i++) tick();
    atomic_fetch_add(&shared[1], 1);
    return NULL;
}

static void *spawner(void *arg) {
    (void)arg;
    for (;;) {
        pthread_t t;
        atomic_fetch_add(&shared[0], 1);
        if (pthread_create(&t, NULL, worker, NULL) != 0) {
            atomic_fetch_sub(&shared[0], 1);
            continue;
        }
        pthread_join(t, NULL);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int fd = open(argv[1], O_RDWR);
    if (fd < 0 || ftruncate(fd, 4096) != 0) return 2;
    shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (shared == MAP_FAILED) return 2;
    shared[2] = (unsigned long)getpid();
    for (int i = 0; i < 4; i++) {
        pthread_t s;
        if (pthread_create(&s, NULL, spawner, NULL) != 0) return 2;
    }
    if (strcmp(argv[2], "exit") == 0 && argc > 3) {
        usleep(atoi(argv[3]) * 1000);
        puts("exiting");
        exit(0);
    }
    for (;;) pause();
}
