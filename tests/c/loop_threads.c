/* Loops counted across threads and a fork: 8 threads each call work(1000 +
 * t) ten times, then end; the main thread calls it 5 times with 7; a
 * forked child calls it 3 times with 11 and exits. work(n) runs a loop of
 * n iterations. usage: loop_threads */
#include <pthread.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noipa)) unsigned work(unsigned n) {
    unsigned acc = 1;
    for (unsigned i = 0; i < n; i++) acc = acc * 1664525u + (acc >> 7) + i;
    return acc;
}

static void *run(void *arg) {
    unsigned t = (unsigned)(long)arg, x = 0;
    for (int r = 0; r < 10; r++) x += work(1000 + t);
    return (void *)(long)x;
}

int main(void) {
    pthread_t th[8];
    for (long t = 0; t < 8; t++) pthread_create(&th[t], 0, run, (void *)t);
    unsigned x = 0;
    for (int t = 0; t < 8; t++) {
        void *r;
        pthread_join(th[t], &r);
        x += (unsigned)(long)r;
    }
    for (int r = 0; r < 5; r++) x += work(7);
    fflush(stdout);
    pid_t c = fork();
    if (c == 0) {
        unsigned y = 0;
        for (int r = 0; r < 3; r++) y += work(11);
        printf("child %u\n", y);
        return 0;
    }
    waitpid(c, 0, 0);
    printf("%u\n", x);
    return 0;
}
