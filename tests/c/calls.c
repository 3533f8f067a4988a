/* Call counts known by construction: a function called exactly n times,
 * mutual recursion, calls through function pointers, tail calls, and a
 * caller that keeps values in caller-saved registers across a local call
 * (GCC's -fipa-ra). Prints EXPECT lines the test compares with the report. */
#include <stdio.h>
#include <stdlib.h>

#define NOINLINE __attribute__((noinline, noclone))

volatile int sink;

NOINLINE int called_n(int x) { sink = x; return x + 1; }
NOINLINE int is_odd(unsigned n);
NOINLINE int is_even(unsigned n) { return n == 0 ? 1 : is_odd(n - 1); }
NOINLINE int is_odd(unsigned n) { return n == 0 ? 0 : is_even(n - 1); }

NOINLINE int op_add(int a, int b) { return a + b; }
NOINLINE int op_sub(int a, int b) { return a - b; }
NOINLINE int op_mul(int a, int b) { return a * b; }
static int (*const ops[3])(int, int) = {op_add, op_sub, op_mul};

NOINLINE int leaf(int x) { sink = x; return x * 3; }
/* Ends in a jump to leaf, not a call. */
NOINLINE int tail_caller(int x) { return leaf(x + 1); }

/* Local and not inlined: GCC knows which registers it leaves alone and may
 * keep the caller's values in r8-r11 across calls to it. */
static NOINLINE int ipa_helper(int x) { return x ^ 0x55; }
NOINLINE long ipa_caller(long a, long b, long c, long d) {
    long acc = 0;
    for (int i = 0; i < 100; i++) {
        long t0 = a * i, t1 = b + i, t2 = c ^ i, t3 = d - i;
        acc += ipa_helper((int)(t0 + t1));
        acc += t0 * 3 + t1 * 5 + t2 * 7 + t3 * 11;
    }
    return acc;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    long s = 0;
    for (int i = 0; i < n; i++) s += called_n(i);
    printf("EXPECT called_n %d\n", n);

    /* is_even(k) makes k+1 calls in all: even/odd alternate. */
    int k = 57;
    s += is_even(k);
    printf("EXPECT is_even %d\n", k / 2 + 1);
    printf("EXPECT is_odd %d\n", (k + 1) / 2);

    for (int i = 0; i < 300; i++) s += ops[i % 3](i, 7);
    printf("EXPECT op_add 100\nEXPECT op_sub 100\nEXPECT op_mul 100\n");

    for (int i = 0; i < 50; i++) s += tail_caller(i);
    printf("EXPECT tail_caller 50\nEXPECT leaf 50\n");

    for (int i = 0; i < 7; i++) s += ipa_caller(i, 2 * i, 3 * i, 4 * i);
    printf("EXPECT ipa_caller 7\nEXPECT ipa_helper 700\n");

    printf("checksum %ld\n", s);
    fprintf(stderr, "to stderr %d\n", n);
    return (int)(s & 0x3f);
}
