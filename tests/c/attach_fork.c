/* Forks a child only when told to (SIGUSR1), so that it is made while
 * rtprof is attached: the child calls fresh() for 2 s of CPU time and
 * prints how many times; the parent waits for it, then exits 0. */
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) unsigned long fresh(unsigned long x) {
    for (int i = 0; i < 8; i++) x = x * 6364136223846793005ul + 1442695040888963407ul;
    return x;
}

static double cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, NULL);
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    int sig;
    sigwait(&set, &sig);
    pid_t p = fork();
    if (p == 0) {
        unsigned long v = 1, n = 0;
        double end = cpu() + 2;
        while (cpu() < end)
            for (int i = 0; i < 100000; i++, n++) v = fresh(v);
        printf("child %d called fresh %lu times (%lu)\n", getpid(), n, v & 1);
        _exit(0);
    }
    int st;
    waitpid(p, &st, 0);
    printf("parent done %d\n", WEXITSTATUS(st));
    return 0;
}
