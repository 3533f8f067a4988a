/* Worker threads that receive a steady stream of queued real-time
 * signals, each carrying its number. At the end the program prints how
 * many it sent and received and the sums of their numbers: a tracer that
 * holds its threads now and then (rtprof attach and detach) must hand
 * back every signal it intercepted, once.
 * Usage: signal_storm THREADS. Prints "ready", sends until its standard
 * input ends, then prints "sent N SUM got N SUM". */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static atomic_ulong got, got_sum;
static atomic_int stop, stop_sending;

static void on_signal(int sig, siginfo_t *si, void *ctx) {
    (void)sig;
    (void)ctx;
    atomic_fetch_add(&got, 1);
    atomic_fetch_add(&got_sum, (unsigned long)si->si_value.sival_int);
}

__attribute__((noinline)) unsigned long step(unsigned long x) { return x * 2654435761u + 1; }

static void *work(void *arg) {
    unsigned long v = (unsigned long)arg;
    while (!atomic_load(&stop)) {
        for (int i = 0; i < 200; i++)
            v = step(v);
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    return (void *)v;
}

static void *until_eof(void *arg) {
    char buf[64];
    while (fread(buf, 1, sizeof buf, stdin) > 0)
        ;
    atomic_store(&stop_sending, 1);
    return arg;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4;
    if (n < 1 || n > 32)
        n = 4;
    struct sigaction sa = {0};
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGRTMIN, &sa, NULL);
    /* Only the workers take the signals. */
    sigset_t rt;
    sigemptyset(&rt);
    sigaddset(&rt, SIGRTMIN);
    pthread_t t[32];
    for (int i = 0; i < n; i++)
        pthread_create(&t[i], NULL, work, (void *)(unsigned long)i);
    pthread_sigmask(SIG_BLOCK, &rt, NULL);
    pthread_t reader;
    pthread_create(&reader, NULL, until_eof, NULL);
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    unsigned long sent = 0, sent_sum = 0;
    for (int i = 1; !atomic_load(&stop_sending); i++) {
        union sigval v = {.sival_int = i};
        if (pthread_sigqueue(t[i % n], SIGRTMIN, v) == 0) {
            sent++;
            sent_sum += (unsigned long)i;
        }
        if (i % 16 == 0) {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
    /* Signals still queued arrive while the workers run on. */
    for (int i = 0; i < 500 && atomic_load(&got) < sent; i++) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    pthread_join(reader, NULL);
    printf("sent %lu %lu got %lu %lu\n", sent, sent_sum, atomic_load(&got), atomic_load(&got_sum));
    return 0;
}
