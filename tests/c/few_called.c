/* 900 functions f_100 .. f_999, of which the program calls every STEP-th
 * (argv[1], default 100), each as many times as its number; it prints
 * "CALLED name count" for each and "CALLED_FUNCTIONS n". With "spin" as
 * argv[2], it then spends CPU time in `inner`, reached from `outer`, which
 * does nothing else itself: `outer` is a caller frame of every stack. */
#include <stdio.h>
#include <stdlib.h>

volatile int sink;

#define F(n) __attribute__((noinline)) int f_##n(int x) { sink += x * n; return sink ^ n; }
#define F10(p) F(p##0) F(p##1) F(p##2) F(p##3) F(p##4) F(p##5) F(p##6) F(p##7) F(p##8) F(p##9)
#define F100(p) F10(p##0) F10(p##1) F10(p##2) F10(p##3) F10(p##4) F10(p##5) F10(p##6) F10(p##7) F10(p##8) F10(p##9)
F100(1) F100(2) F100(3) F100(4) F100(5) F100(6) F100(7) F100(8) F100(9)

#define A(n) f_##n,
#define A10(p) A(p##0) A(p##1) A(p##2) A(p##3) A(p##4) A(p##5) A(p##6) A(p##7) A(p##8) A(p##9)
#define A100(p) A10(p##0) A10(p##1) A10(p##2) A10(p##3) A10(p##4) A10(p##5) A10(p##6) A10(p##7) A10(p##8) A10(p##9)
static int (*const table[900])(int) = {
    A100(1) A100(2) A100(3) A100(4) A100(5) A100(6) A100(7) A100(8) A100(9)
};

__attribute__((noinline)) void inner(void) {
    for (long i = 0; i < 100000000L; i++) sink += (int)i;
}

__attribute__((noinline)) void outer(void) {
    inner();
    __asm__ volatile("");
}

int main(int argc, char **argv) {
    int step = argc > 1 ? atoi(argv[1]) : 100;
    int called = 0;
    for (int i = 0; i < 900; i += step) {
        int n = 100 + i;
        for (int k = 0; k < n; k++) table[i](k);
        printf("CALLED f_%d %d\n", n, n);
        called++;
    }
    printf("CALLED_FUNCTIONS %d\n", called);
    if (argc > 2) outer();
    return 0;
}
