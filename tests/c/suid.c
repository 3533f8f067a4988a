/* Says whether the agent is loaded into it and whether it patched it: run
 * set-user-ID by an unprivileged user in the system tests. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

volatile int sink;
__attribute__((noinline, noclone)) int probe(int x) { sink = x; return x * 7 + 3; }

int main(void) {
    FILE *m = fopen("/proc/self/maps", "r");
    char line[512];
    int loaded = 0;
    while (fgets(line, sizeof line, m))
        if (strstr(line, "librtprof")) loaded = 1;
    fclose(m);
    unsigned char first = *(volatile unsigned char *)(void *)probe;
    printf("euid %d loaded %d patched %d result %d\n", (int)geteuid(), loaded, first == 0xe9, probe(2));
    return 0;
}
