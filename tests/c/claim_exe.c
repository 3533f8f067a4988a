/* A process that claims to be another program: it overwrites the
 * executable path in its own counter segment (found in /proc/self/maps,
 * as the agent maps it), then loads a library so that rtprofd reads the
 * names again, then calls functions until its standard input closes.
 *
 * usage: claim_exe CLAIM LIBRARY EXE_OFF_AT EXE_LEN_AT STRINGS_OFF_AT
 * (the last three: where the header keeps exe_off, exe_len and
 * strings_off, so this program follows the segment's layout). */
#include <dlfcn.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

volatile long claim_sink;
__attribute__((noinline, noclone)) long claim_work(long x) {
    claim_sink += x;
    return x + 1;
}

/* The agent's own mapping of its segment: shared, writable, from offset
 * 0, larger than the header page. */
static unsigned char *own_segment(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return 0;
    char line[1024];
    unsigned char *found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long a, b, off;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s %lx", &a, &b, perms, &off) != 4) continue;
        if (strstr(line, "/memfd:rtprof (deleted)") && !strcmp(perms, "rw-s") && off == 0 &&
            b - a > 4096)
            found = (unsigned char *)a;
    }
    fclose(f);
    return found;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: claim_exe CLAIM LIBRARY EXE_OFF_AT EXE_LEN_AT STRINGS_OFF_AT\n");
        return 2;
    }
    const char *claim = argv[1];
    size_t exe_off_at = strtoul(argv[3], 0, 0), exe_len_at = strtoul(argv[4], 0, 0),
           strings_off_at = strtoul(argv[5], 0, 0);
    unsigned char *seg = own_segment();
    if (!seg) {
        fprintf(stderr, "claim_exe: no counter segment mapped (run it with the agent)\n");
        return 1;
    }
    uint64_t strings_off;
    uint32_t exe_off, exe_len;
    memcpy(&strings_off, seg + strings_off_at, 8);
    memcpy(&exe_off, seg + exe_off_at, 4);
    memcpy(&exe_len, seg + exe_len_at, 4);
    uint32_t n = (uint32_t)strlen(claim);
    if (n > exe_len) {
        fprintf(stderr, "claim_exe: the claim is longer than the real path\n");
        return 1;
    }
    /* In place: the agent adds names after the executable's. */
    memcpy(seg + strings_off + exe_off, claim, n);
    __atomic_store_n((uint32_t *)(seg + exe_len_at), n, __ATOMIC_RELEASE);
    /* New functions: rtprofd reads the names again. */
    void *h = dlopen(argv[2], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "claim_exe: %s\n", dlerror());
        return 1;
    }
    long (*entry)(long) = (long (*)(long))dlsym(h, "plugin_entry");
    if (!entry) {
        fprintf(stderr, "claim_exe: no plugin_entry\n");
        return 1;
    }
    printf("claimed\n");
    fflush(stdout);
    long s = 0;
    for (;;) {
        for (long i = 0; i < 10000; i++) s += claim_work(i);
        s += entry(100);
        struct pollfd p = {0, POLLIN, 0};
        if (poll(&p, 1, 1) != 0) break; /* input, end of file or error */
    }
    printf("done %ld\n", s);
    return 0;
}
