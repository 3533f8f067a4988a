/* Creates its threads only when told to (SIGUSR1), so that they start
 * after rtprof has attached: 4 threads each call fresh() 2,000,000 times
 * and are joined, then "fresh done 8000000" is printed. Told a second
 * time (after detach), it does the same again and exits 0. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>

__attribute__((noinline)) unsigned long fresh(unsigned long x) {
    for (int i = 0; i < 8; i++) x = x * 6364136223846793005ul + 1442695040888963407ul;
    return x;
}

static unsigned long calls[4];

static void *run(void *arg) {
    unsigned long *n = arg, v = 1;
    for (int i = 0; i < 2000000; i++, (*n)++) v = fresh(v);
    return (void *)v;
}

int main(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    for (int round = 0; round < 2; round++) {
        int sig;
        sigwait(&set, &sig);
        pthread_t t[4];
        for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, run, &calls[i]);
        unsigned long total = 0;
        for (int i = 0; i < 4; i++) pthread_join(t[i], NULL), total += calls[i], calls[i] = 0;
        printf("fresh done %lu\n", total);
    }
    return 0;
}
