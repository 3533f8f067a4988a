/* Burns CPU in three functions in a known proportion (60% / 30% / 10% of
 * iterations), in N threads, optionally in a forked child instead of the
 * parent. It measures the CPU time each function really took (thread CPU
 * clock) and prints it, so a profile can be compared with the truth.
 *
 * usage: split THREADS MILLISECONDS [fork]   (MILLISECONDS of CPU per thread) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))
static volatile unsigned long sink;
static long unit; /* iterations per 1% of a round */
static long long cpu_ns[3];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static long long thread_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Three copies of one loop, so an iteration costs the same in each. */
NOINLINE void hot60(long n) { unsigned long x = sink; for (long i = 0; i < n; i++) x = x * 6364136223846793005UL + 1442695040888963407UL; sink = x; }
NOINLINE void warm30(long n) { unsigned long x = sink; for (long i = 0; i < n; i++) x = x * 6364136223846793005UL + 1442695040888963407UL; sink = x; }
NOINLINE void cool10(long n) { unsigned long x = sink; for (long i = 0; i < n; i++) x = x * 6364136223846793005UL + 1442695040888963407UL; sink = x; }

static long rounds;

static void *worker(void *arg) {
    (void)arg;
    long long mine[3] = {0, 0, 0};
    for (long r = 0; r < rounds; r++) {
        long long t0 = thread_ns();
        hot60(60 * unit);
        long long t1 = thread_ns();
        warm30(30 * unit);
        long long t2 = thread_ns();
        cool10(10 * unit);
        long long t3 = thread_ns();
        mine[0] += t1 - t0, mine[1] += t2 - t1, mine[2] += t3 - t2;
    }
    pthread_mutex_lock(&lock);
    for (int i = 0; i < 3; i++) cpu_ns[i] += mine[i];
    pthread_mutex_unlock(&lock);
    return NULL;
}

static void work(int threads, long ms) {
    /* Calibrate: iterations per millisecond of this thread's CPU. */
    long long t0 = thread_ns();
    long n = 1000000;
    hot60(n);
    long long calibration = thread_ns() - t0;
    long long per_ms = n * 1000000LL / (calibration + 1);
    /* Rounds of ~50 ms: many rounds, each long next to a sampling period. */
    unit = per_ms * 50 / 100;
    rounds = ms / 50;
    memset(cpu_ns, 0, sizeof cpu_ns);
    cpu_ns[0] = calibration;
    pthread_t t[64];
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    printf("CPU hot60 %lld\nCPU warm30 %lld\nCPU cool10 %lld\n", cpu_ns[0], cpu_ns[1], cpu_ns[2]);
    fflush(stdout);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    long ms = argc > 2 ? atol(argv[2]) : 1000;
    if (threads < 1 || threads > 64) return 2;
    if (argc > 3 && strcmp(argv[3], "fork") == 0) {
        pid_t pid = fork();
        if (pid == 0) {
            printf("child\n");
            work(threads, ms);
            _exit(0);
        }
        int st;
        waitpid(pid, &st, 0);
        return WEXITSTATUS(st);
    }
    work(threads, ms);
    return 0;
}
