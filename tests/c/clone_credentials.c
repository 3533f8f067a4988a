/* A child made by clone() (or a raw clone system call) that changes its
 * credentials, as sandboxing tools (firejail) do:
 *   clone_credentials clone|raw  the child calls seteuid, setegid,
 *       setgroups, initgroups and setresuid, printing each result, then
 *       counts work() calls; the parent waits for it and prints its status.
 * No fork handler runs in such a child: its C library still lists every
 * thread its parent had. */
#define _GNU_SOURCE
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))
volatile long sink;
NOINLINE long work(long x) { sink = x; return x + 1; }

static char stack[1 << 17];

static int child(void *arg) {
    (void)arg;
    gid_t none[1] = {65534};
    int r;
    r = setegid(65534);
    printf("setegid %d egid %d\n", r, (int)getegid());
    r = seteuid(65534);
    printf("seteuid %d euid %d\n", r, (int)geteuid());
    r = seteuid(0);
    printf("seteuid back %d euid %d\n", r, (int)geteuid());
    r = setgroups(1, none);
    printf("setgroups %d groups %d\n", r, getgroups(0, NULL));
    r = initgroups("nobody", 65534);
    printf("initgroups %d groups %d\n", r, getgroups(0, NULL));
    r = setresuid(65534, 65534, 65534);
    printf("setresuid %d uid %d\n", r, (int)getuid());
    r = seteuid(0);
    printf("seteuid to root refused %d\n", r);
    long s = 0;
    for (int i = 0; i < 1000; i++) s += work(i);
    printf("child work %ld\n", s);
    fflush(stdout);
    return 7;
}

int main(int argc, char **argv) {
    /* At once: the agent's drain thread may still be starting, which is
     * when the C library's list of threads is hardest on the child. */
    pid_t pid;
    if (argc > 1 && argv[1][0] == 'r') {
        pid = syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
        if (pid == 0) _exit(child(NULL));
    } else {
        pid = clone(child, stack + sizeof stack, SIGCHLD, NULL);
    }
    if (pid < 0) { perror("clone"); return 1; }
    int st = 0;
    waitpid(pid, &st, 0);
    printf("child exited %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
    return 0;
}
