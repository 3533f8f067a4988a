/* One thread lists the process's descriptors over and over while the main
 * thread spends CPU time in libraries it loaded (argv[1..]), so that the
 * agent's own threads have files to read (naming a module where a sample
 * landed, its unwind tables for stacks). Prints every descriptor it saw
 * that was not the program's own; the agent must add none, not even for
 * a moment. */
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int stop;
static char inherited[1024];
static char seen[64][256];
static int nseen;
static long scans;

static void *watch(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) {
        DIR *d = opendir("/proc/self/fd");
        if (!d) continue;
        int self = dirfd(d);
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            int fd = atoi(e->d_name);
            if (fd == self || (fd < 1024 && inherited[fd])) continue;
            char link[200] = "?", path[64];
            snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
            ssize_t n = readlink(path, link, sizeof link - 1);
            if (n > 0) link[n] = 0;
            int dup = 0;
            for (int i = 0; i < nseen; i++) dup |= atoi(seen[i]) == fd && strstr(seen[i], link) != 0;
            if (!dup && nseen < 64) snprintf(seen[nseen++], sizeof seen[0], "%d -> %s", fd, link);
        }
        closedir(d);
        scans++;
    }
    return 0;
}

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    /* What the program was started with is its own. */
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.' && atoi(e->d_name) < 1024) inherited[atoi(e->d_name)] = 1;
    if (d) closedir(d);
    long (*busy[64])(long);
    int n = 0;
    for (int i = 1; i < argc && n < 64; i++) {
        void *h = dlopen(argv[i], RTLD_NOW);
        if (!h || !(busy[n] = (long (*)(long))dlsym(h, "busy"))) {
            fprintf(stderr, "%s: %s\n", argv[i], dlerror());
            return 2;
        }
        n++;
    }
    pthread_t t;
    pthread_create(&t, 0, watch, 0);
    /* Calls for 50 ms of CPU each, sized once: a thread reading its own
     * CPU clock between calls would have its CPU-time timers expire far
     * less often than the clock advances (see docs/limits.md). */
    long s = 0, calls = 0;
    double start = cpu_now(), took;
    do {
        for (int k = 0; k < 1000; k++) s += busy[0](s);
        calls += 1000;
    } while ((took = cpu_now() - start) < 0.02);
    calls = (long)(calls * 0.05 / took) + 1;
    for (int i = 0; i < n; i++)
        for (long k = 0; k < calls; k++) s += busy[i](s);
    atomic_store(&stop, 1);
    pthread_join(t, 0);
    printf("libraries %d, sum %s, scanned %s\n", n, s ? "nonzero" : "zero", scans > 100 ? "often" : "rarely");
    for (int i = 0; i < nseen; i++) printf("unexpected descriptor %s\n", seen[i]);
    return 0;
}
