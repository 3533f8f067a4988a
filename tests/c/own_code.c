/* Calls functions a known number of times (EXPECT lines on stdout), then
 * tells on stderr, for every executable mapping of its own, which file
 * backs it and how many of its pages are private copies (Anonymous kB in
 * /proc/self/smaps): "CODE <anon kB> <file>". A module whose patched code
 * was mapped from a page image has none. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline, noclone))

volatile int sink;
NOINLINE int one(int x) { sink = x; return x + 1; }
NOINLINE int two(int x) { return one(x) * 2; }
NOINLINE long three(long a, long b) { return two((int)a) + two((int)b); }

static void tell_code(void) {
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[4096], head[4096] = "";
    int code = 0;
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        char perms[8];
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && strchr(line, ' ')) {
            code = strchr(perms, 'x') != NULL;
            strcpy(head, line);
            continue;
        }
        long kb;
        if (code && sscanf(line, "Anonymous: %ld kB", &kb) == 1) {
            char *file = strchr(head, '/');
            if (file) {
                file[strcspn(file, "\n")] = 0;
                fprintf(stderr, "CODE %ld %s\n", kb, file);
            }
        }
    }
    fclose(f);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 5000;
    long s = 0;
    for (int i = 0; i < n; i++) s += three(i, i + 1);
    printf("EXPECT three %d\nEXPECT two %d\nEXPECT one %d\n", n, 2 * n, 2 * n);
    printf("sum %ld\n", s);
    tell_code();
    return 0;
}
