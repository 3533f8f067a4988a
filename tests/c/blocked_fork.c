/* Forks with every signal blocked, as perl does, and unblocks them in the
 * child, which then burns CPU in `spin`: the child must be sampled. */
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) double spin(long n) {
    double x = 0;
    for (long i = 0; i < n; i++) x += (double)i * 0.5;
    return x;
}

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(void) {
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    pid_t pid = fork();
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid == 0) {
        double x = 0;
        while (cpu_seconds() < 0.4) x += spin(1000000);
        printf("child done %d\n", x > 0);
        return 0;
    }
    int st;
    waitpid(pid, &st, 0);
    printf("parent done %d\n", WEXITSTATUS(st));
    return 0;
}
