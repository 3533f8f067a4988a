/* Run with tests/c/entry_patcher.c preloaded after the agent. */
#include <stdio.h>

__attribute__((noinline)) int never_called(int x) {
    __asm__ volatile("");
    return x * 7 + 3;
}

__attribute__((noinline)) int used(int x) {
    __asm__ volatile("");
    return x * 5 + 11;
}

int main(int argc, char **argv) {
    int s = 0;
    for (int i = 0; i < 100; i++) s += used(i);
    int (*volatile keep)(int) = never_called;
    printf("%d %d\n", s, keep != 0);
    printf("EXPECT used 100\n");
    return 0;
}
