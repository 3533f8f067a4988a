/* Exit paths and pass-through: echoes stdin, then ends as argv[1] says:
 * "exit N", "abort", "kill" (SIGKILL to itself), "_exit N". */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((noinline, noclone)) int work(int x) { return x * 2 + 1; }

int main(int argc, char **argv) {
    char buf[256];
    long s = 0;
    for (int i = 0; i < 77; i++) s += work(i);
    while (fgets(buf, sizeof buf, stdin)) fputs(buf, stdout);
    printf("s=%ld\n", s);
    fflush(stdout);
    if (argc < 2) return 0;
    if (!strcmp(argv[1], "exit")) exit(atoi(argv[2]));
    if (!strcmp(argv[1], "_exit")) _exit(atoi(argv[2]));
    if (!strcmp(argv[1], "abort")) abort();
    if (!strcmp(argv[1], "kill")) kill(getpid(), SIGKILL);
    return 0;
}
