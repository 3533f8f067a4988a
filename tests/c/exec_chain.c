/* A chain of images: each stage calls stage_work (stage+1)*10 times, then
 * execs the next stage of the same program; the last one exits 5. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((noinline, noclone)) int stage_work(int x) { return x * 3 + 1; }

int main(int argc, char **argv) {
    int stage = argc > 1 ? atoi(argv[1]) : 0;
    long s = 0;
    for (int i = 0; i < (stage + 1) * 10; i++) s += stage_work(i);
    printf("stage %d: %ld\n", stage, s);
    fflush(stdout);
    if (stage < 2) {
        char next[16];
        snprintf(next, sizeof next, "%d", stage + 1);
        execl("/proc/self/exe", argv[0], next, (char *)0);
        return 99;
    }
    return 5;
}
