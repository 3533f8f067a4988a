/* A program debugged by gdb in tests/sweep.rs: main calls work twice, work
 * calls leaf in a loop. Unbuffered output keeps its lines in order with
 * gdb's own. Keep the line marked call-work: the test breaks on it. */
#include <stdio.h>

__attribute__((noipa)) int leaf(int x)
{
    return x * x + 1;
}

__attribute__((noipa)) int work(int n)
{
    int s = 0;
    for (int i = 0; i < n; i++)
        s += leaf(i);
    printf("prog: work %d -> %d\n", n, s);
    return s;
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    puts("prog: start");
    int t = work(3); /* call-work */
    t += work(4);
    printf("prog: total %d\n", t);
    puts("prog: end");
    return t % 7;
}
