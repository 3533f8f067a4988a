/* Loop shapes that a loop probe must not get wrong.
 * loop_edges cold N: scan() and scan2() have a rarely taken branch that
 *   gcc moves into a .cold part, which jumps back into the loop.
 * loop_edges top N: f() is a loop entered at two places whose short test
 *   at its top runs on into the code after the loop; the program counts
 *   its iterations itself and prints them.
 * loop_edges exit L: loop()'s block back to its header calls g(), which
 *   exits the process (status 3) at its L-th call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define N __attribute__((noipa))
volatile int sink;
__attribute__((noipa, cold)) void report(int i) { sink += i; }

N int scan(int *a, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) {
        if (__builtin_expect(a[i] < 0, 0)) { report(i); continue; }
        s += a[i] * 3;
    }
    return s;
}

N int scan2(int *a, int n) {
    int s = 0, i = 0;
    while (i < n) {
        if (a[i] < 0) { report(i); i += 2; continue; }
        s += a[i] ^ i;
        i++;
    }
    return s;
}

static unsigned long iters;
N int f(int n, int start_mid) {
    int s = 0, i = 0;
    if (start_mid) goto mid;
top:
    s += i * 2;
mid:
    s ^= i;
    i++;
    if (i < n) { iters++; goto top; }
    return s;
}

int limit;
N void g(int i) {
    sink += i;
    if (i == limit) { printf("leaving at %d\n", i); fflush(stdout); exit(3); }
}

N int loop(int *a, int n) {
    int i = 0, s = 0;
    (void)n;
    for (;;) {
        if (a[i & 15] > 100) return s;
        s += a[i & 15] * 3 + s;
        g(i);
        i++;
    }
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int n = atoi(argv[2]);
    if (!strcmp(argv[1], "cold")) {
        int *a = malloc(n * sizeof *a);
        for (int i = 0; i < n; i++) a[i] = (i % 7 == 3) ? -1 : i;
        printf("%d %d\n", scan(a, n), scan2(a, n));
    } else if (!strcmp(argv[1], "top")) {
        long r = 0;
        for (int k = 0; k < 3; k++) r += f(n + k, k & 1);
        printf("%ld %lu\n", r, iters);
    } else {
        int a[16] = {0};
        limit = n;
        for (int k = 0; k < 5; k++) sink += loop(a, 0);
    }
    return 0;
}
