/* Told to (SIGUSR1), the main thread calls pthread_exit; its worker calls
 * work() until SECONDS after that and returns, and the process ends with
 * it (exit status 0), attached or not. Prints "ready" when the worker
 * runs. (Attach must come first: once the main thread has ended, the
 * process's memory map reads empty.) */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) unsigned long work(unsigned long x) { return x * 2654435761u + 1; }

static double seconds;
static atomic_int told;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *worker(void *arg) {
    unsigned long v = (unsigned long)arg;
    double until = 0;
    for (;;) {
        for (int i = 0; i < 100000; i++)
            v = work(v);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        if (atomic_load(&told) && until == 0)
            until = now() + seconds;
        if (until != 0 && now() > until)
            return (void *)v;
    }
}

int main(int argc, char **argv) {
    seconds = argc > 1 ? atof(argv[1]) : 2;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    setvbuf(stdout, NULL, _IOLBF, 0);
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    printf("ready\n");
    int sig;
    sigwait(&set, &sig);
    atomic_store(&told, 1);
    pthread_exit(NULL);
}
