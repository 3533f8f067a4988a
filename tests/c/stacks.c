/* A known call tree: c does all the work, reached as main->a->b->c (half
 * of c's calls), main->a->c and main->d->c (a quarter each). Sampled
 * stacks must show exactly these paths, in about these shares. Built at
 * -O2 without frame pointers: stacks come from unwind information. */
#include <stdio.h>
#include <stdlib.h>

static volatile unsigned long sink;

__attribute__((noipa)) void c(unsigned long n) {
    unsigned long x = n;
    for (unsigned long i = 0; i < 200000; i++) x = x * 6364136223846793005UL + i;
    sink += x;
}
/* Work after the call keeps each caller's frame (no tail call). */
__attribute__((noipa)) void b(unsigned long n) {
    c(n);
    sink++;
}
__attribute__((noipa)) void a(unsigned long n) {
    b(n);
    b(n + 1);
    c(n + 2);
    sink++;
}
__attribute__((noipa)) void d(unsigned long n) {
    c(n);
    sink++;
}

int main(int argc, char **argv) {
    /* Rounds: 400, or as asked (more samples for a coarse sampler). */
    unsigned long rounds = argc > 1 ? strtoul(argv[1], 0, 10) : 400;
    for (unsigned long i = 0; i < rounds; i++) {
        a(i + argc);
        d(i);
    }
    printf("%lu\n", (unsigned long)sink);
    printf("CALLS c %lu\n", rounds * 4);
    return 0;
}
