/* backtrace() from inside instrumented code names the right callers. */
#include <execinfo.h>
#include <stdio.h>
#include <string.h>

#define NOINLINE __attribute__((noinline, noclone))
volatile int depth_sink;

NOINLINE void print_frames(void) {
    void *buf[16];
    int n = backtrace(buf, 16);
    char **names = backtrace_symbols(buf, n);
    for (int i = 1; i < n && i < 5; i++) {
        /* "./prog(frame_c+0x1d) [0x...]" -> "frame_c" */
        const char *open = strchr(names[i], '('), *plus = open ? strchr(open, '+') : NULL;
        if (open && plus) printf("frame %d: %.*s\n", i, (int)(plus - open - 1), open + 1);
        else printf("frame %d: ?\n", i);
    }
}
NOINLINE void frame_c(void) { print_frames(); depth_sink++; }
NOINLINE void frame_b(void) { frame_c(); depth_sink++; }
NOINLINE void frame_a(void) { frame_b(); depth_sink++; }

int main(void) {
    frame_a();
    printf("EXPECT frame_a 1\nEXPECT frame_b 1\nEXPECT frame_c 1\n");
    return 0;
}
