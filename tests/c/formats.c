/* Two hot functions, heavy doing three times the work of light per call,
 * called equally often: about 3:1 in CPU time. The program prints how
 * often it called each, and takes a factor for longer runs. */
#include <stdio.h>
#include <stdlib.h>

static volatile unsigned long sink;

__attribute__((noinline)) unsigned long heavy(unsigned long x) {
    for (long i = 0; i < 3000; i++) x = x * 6364136223846793005ul + (x >> 29);
    return x;
}

__attribute__((noinline)) unsigned long light(unsigned long x) {
    for (long i = 0; i < 1000; i++) x = x * 6364136223846793005ul + (x >> 29);
    return x;
}

int main(int argc, char **argv) {
    long factor = argc > 1 ? atol(argv[1]) : 1;
    long calls = 80000 * factor;
    unsigned long x = 1;
    for (long i = 0; i < calls; i++) {
        x = heavy(x);
        x = light(x);
    }
    sink = x;
    printf("CALLS heavy %ld\nCALLS light %ld\n", calls, calls);
    return 0;
}
