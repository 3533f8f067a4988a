/* A program that profiles itself with SIGPROF (as gprof's runtime or
 * gperftools do): it checks that nobody handles SIGPROF yet, installs a
 * handler, starts ITIMER_PROF and burns CPU in two threads. Its own handler
 * must receive its own ticks, and nothing else. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>

static volatile long ticks, foreign;
static volatile unsigned long sink;

static void on_prof(int sig, siginfo_t *si, void *uc) {
    (void)sig, (void)uc;
    /* setitimer's signal comes from the kernel; a timer_create timer's
     * would say SI_TIMER. */
    if (si->si_code == SI_TIMER) foreign++;
    else ticks++;
}

__attribute__((noinline)) void burn(long n) {
    unsigned long x = sink;
    for (long i = 0; i < n; i++) x = x * 6364136223846793005UL + 1;
    sink = x;
}

static volatile int stop;
static void *spin(void *arg) {
    (void)arg;
    while (!stop) burn(100000);
    return NULL;
}

int main(void) {
    pthread_t t;
    pthread_create(&t, NULL, spin, NULL);
    burn(20000000); /* CPU before the handler: the agent's timer may tick */
    struct sigaction old;
    sigaction(SIGPROF, NULL, &old);
    printf("before: %s\n", old.sa_handler == SIG_DFL ? "default" : "taken");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_prof;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGPROF, &sa, NULL);
    struct itimerval it = {{0, 10000}, {0, 10000}};
    setitimer(ITIMER_PROF, &it, NULL);
    while (ticks < 20) burn(1000000);
    stop = 1;
    pthread_join(t, NULL);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &off, NULL);
    printf("own ticks: %s, foreign: %ld\n", ticks >= 20 ? "yes" : "no", foreign);
    return 0;
}
