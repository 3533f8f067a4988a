/* Enters a new user namespace, in the process and in a forked child, then
 * burns about 0.2 s of CPU in `after`. The kernel allows unshare(CLONE_NEWUSER)
 * only in a single-threaded process. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile unsigned long sink;
__attribute__((noinline)) void after(long n) { for (long i = 0; i < n; i++) sink += i * 3; }

static void enter(const char *who) {
    int rc = unshare(CLONE_NEWUSER);
    printf("%s: %s\n", who, rc == 0 ? "ok" : errno == EPERM ? "EPERM" : strerror(errno));
    fflush(stdout);
    after(200000000);
}

int main(void) {
    pid_t pid = fork();
    if (pid == 0) {
        enter("child");
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    enter("parent");
    return 0;
}
