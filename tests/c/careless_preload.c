/* A preloaded library that does what an agent must not, chosen by
 * -DCARELESS_SECCOMP or -DCARELESS_THREAD at compile time:
 *   seccomp: opens a perf event from its constructor whatever filter the
 *     process runs under (a filter that kills on perf_event_open kills it);
 *   thread: starts a thread that keeps whatever credentials it had, so
 *     glibc's repetition of setresgid after a setresuid that kept the
 *     caller's capabilities fails in it and aborts the process.
 * `rtprof system enable --agent` must refuse both. */
#define _GNU_SOURCE
#include <linux/perf_event.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifdef CARELESS_THREAD
static void *idle(void *arg) {
    for (;;) pause();
    return arg;
}
#endif

__attribute__((constructor)) static void start(void) {
#ifdef CARELESS_SECCOMP
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_CPU_CLOCK;
    a.disabled = 1;
    a.exclude_kernel = 1;
    long fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
    if (fd >= 0) close((int)fd);
#endif
#ifdef CARELESS_THREAD
    pthread_t t;
    pthread_create(&t, NULL, idle, NULL);
    pthread_detach(t);
#endif
}
