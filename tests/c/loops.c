/* Loops of known shape for the loop profile. nested(n, m): an outer loop
 * of n iterations around an inner one of m; two_loops(n): a loop of 3n
 * iterations, then one of n, with the same body (so the first takes three
 * quarters of the function's time); with_cold(n): one loop of n
 * iterations whose rarely taken branch the compiler moves out of line,
 * past the function's return. Bodies are serial hashes: no closed form,
 * nothing to vectorise. Each loop's body is on its header's line.
 * usage: loops ROUNDS [DIVISOR]: every trip count but the outer one of
 * nested() divided by DIVISOR (default 1). */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noipa)) unsigned nested(unsigned n, unsigned m) {
    unsigned acc = 1;
    for (unsigned i = 0; i < n; i++) { acc ^= i * 2654435761u; /* OUTER */
        for (unsigned j = 0; j < m; j++) { acc = acc * 1664525u + (acc >> 7) + j; } /* INNER */
    }
    return acc;
}

__attribute__((noipa)) unsigned two_loops(unsigned n) {
    unsigned a = 1, b = 2;
    for (unsigned i = 0; i < 3 * n; i++) { a = a * 1664525u + (a >> 7) + i; } /* FIRST */
    for (unsigned i = 0; i < n; i++) { b = b * 1664525u + (b >> 7) + i; } /* SECOND */
    return a ^ b;
}

__attribute__((noipa)) void cold_path(unsigned x) { printf("cold %u\n", x); }

__attribute__((noipa)) unsigned with_cold(unsigned n) {
    unsigned acc = 1;
    for (unsigned i = 0; i < n; i++) { acc = acc * 1664525u + (acc >> 7) + i; if (__builtin_expect(acc % 1000003u == 0, 0)) cold_path(acc); } /* COLD */
    return acc;
}

int main(int argc, char **argv) {
    unsigned rounds = argc > 1 ? (unsigned)atoi(argv[1]) : 20;
    unsigned d = argc > 2 ? (unsigned)atoi(argv[2]) : 1;
    unsigned x = 0;
    for (unsigned r = 0; r < rounds; r++) {
        x += nested(1000, 20000 / d);
        x += two_loops(20000000 / d);
        x += with_cold(20000000 / d);
    }
    printf("%u\n", x);
    return 0;
}
