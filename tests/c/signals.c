/* Signal handlers that are instrumented functions and call instrumented
 * functions, interrupting the same functions in the main flow; and
 * longjmp out of a chain of instrumented frames. Counts must stay exact. */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>

#define NOINLINE __attribute__((noinline, noclone))
volatile long sink;
volatile sig_atomic_t handled;
static jmp_buf env;

NOINLINE void bump(long x) { sink += x; }
NOINLINE void on_alarm(int sig) { handled++; bump(sig); }
NOINLINE void on_usr1(int sig) { bump(sig); bump(1); }

NOINLINE void dive(int depth) {
    bump(depth);
    if (depth == 0) longjmp(env, 7);
    dive(depth - 1);
    bump(-1); /* never reached */
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, 0);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, 0);
    struct itimerval it = {{0, 200}, {0, 200}};
    setitimer(ITIMER_REAL, &it, 0);
    long calls = 0;
    while (handled < 200) bump(1), calls++;
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, 0);
    for (int i = 0; i < 5; i++) raise(SIGUSR1);
    int jumps = 0;
    for (int i = 0; i < 3; i++)
        if (setjmp(env) == 0) dive(10);
        else jumps++;
    /* Counts depend on timing, so only the EXPECT lines are compared, not
     * printed values that differ between runs. */
    printf("jumps %d\n", jumps);
    printf("EXPECT bump %ld\n", calls + handled + 5 * 2 + 3 * 11);
    printf("EXPECT on_alarm %d\nEXPECT on_usr1 5\nEXPECT dive 33\n", (int)handled);
    return 0;
}
