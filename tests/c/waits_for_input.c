/* Prints its pid, waits for a line on stdin, then calls work() and exits:
 * a test prepares the files the process will meet at exit meanwhile. */
#include <stdio.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))
#define CALLS 1000

volatile long sink;
NOINLINE long work(long x) { sink = x; return x + 1; }

int main(void) {
    printf("pid %d\n", (int)getpid());
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 2;
    long s = 0;
    for (long i = 0; i < CALLS; i++) s += work(i);
    printf("sum %ld\nEXPECT work %d\n", s, CALLS);
    return 0;
}
