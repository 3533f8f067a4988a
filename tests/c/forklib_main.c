/* Forks once; the library's fork handlers do the calling. */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

long forklib_fn(long x);

int main(void) {
    forklib_fn(1);
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    int st;
    waitpid(pid, &st, 0);
    printf("child %d\n", WEXITSTATUS(st));
    return 0;
}
