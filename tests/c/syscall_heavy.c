/* Spends most of its CPU time in the kernel (reads of /dev/zero, whose
 * pages the kernel clears) and some in a function of its own, spin():
 * a sampler of user time gives spin() nearly all its samples.
 * Prints "ready", runs SECONDS, prints "done".
 * Usage: syscall_heavy SECONDS */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

__attribute__((noinline)) void spin(void) {
    for (int i = 0; i < 3000; i++)
        sink += (unsigned long)i * 7;
}

static char buf[1 << 17];

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 3;
    int fd = open("/dev/zero", O_RDONLY);
    if (fd < 0)
        return 2;
    puts("ready");
    fflush(stdout);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        for (int k = 0; k < 16; k++)
            /* A read interrupted by a signal may return less. */
            if (read(fd, buf, sizeof buf) <= 0)
                return 3;
        spin();
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec + (t.tv_nsec - t0.tv_nsec) / 1e9 > seconds)
            break;
    }
    puts("done");
    return 0;
}
