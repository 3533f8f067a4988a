#include <stdio.h>
#include <unistd.h>
long spin_fn(long x);
int main(void) {
    long s = 0;
    for (int i = 0; i < 100000; i++) s += spin_fn(i);
    usleep(20000);
    printf("%ld\n", s);
    return 0;
}
