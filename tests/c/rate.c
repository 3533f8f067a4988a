/* Calls `tick` 1000 times per millisecond of wall time for SECONDS, then
 * prints the exact count. With "hold", it then says so and waits to be
 * killed. usage: rate SECONDS [hold] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;
__attribute__((noinline)) void tick(void) { sink++; }

int main(int argc, char **argv) {
    int secs = argc > 1 ? atoi(argv[1]) : 2;
    struct timespec ts = {0, 1000000};
    long n = 0;
    for (int i = 0; i < secs * 1000; i++) {
        for (int k = 0; k < 1000; k++) tick(), n++;
        nanosleep(&ts, 0);
    }
    printf("calls %ld\n", n);
    fflush(stdout);
    if (argc > 2 && strcmp(argv[2], "hold") == 0)
        for (;;) pause();
    return 0;
}
