/* GCC splits rarely taken paths into foo.cold fragments, entered by a jump
 * from foo: they are not functions and must not be counted as calls. */
#include <stdio.h>

int g;
__attribute__((cold, noinline)) void report(int x) { fprintf(stderr, "negative %d\n", x); }
__attribute__((noinline, noclone)) int foo(int x) {
    if (__builtin_expect(x < 0, 0)) {
        report(x);
        g += x * 7;
        return -x * g;
    }
    return x + 1;
}

int main(void) {
    long s = 0;
    for (int i = 0; i < 1000; i++) s += foo(i - (i % 100 == 0 ? 1000 : 0));
    printf("%ld %d\n", s, g);
    printf("EXPECT foo 1000\nEXPECT report 10\n");
    return 0;
}
