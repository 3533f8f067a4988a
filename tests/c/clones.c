/* GCC copies a static function once per constant argument it is called
 * with (deep.constprop.N) and splits its rare path out (.part/.cold): a
 * report shows one function, with the calls of all its copies. */
#include <stdio.h>

static __attribute__((noinline)) long deep(long n, int k) {
    long s = 0;
    for (long i = 0; i < n; i++) s += i * k + (k > 4 ? i : -i);
    return s;
}

int main(int argc, char **argv) {
    (void)argv;
    long s = 0;
    for (int i = 0; i < 100; i++) {
        s += deep(i + argc, 3);
        s += deep(i + argc, 7);
    }
    printf("%ld\n", s);
    printf("CALLS deep 200\n");
    return 0;
}
