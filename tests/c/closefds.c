/* Daemon style: close every descriptor above 2, open a file (it gets the
 * lowest number), fork, and write to it from both processes. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

volatile int sink;
__attribute__((noinline, noclone)) int child_work(int x) { sink = x; return x + 1; }

int main(void) {
    for (int fd = 3; fd < 1024; fd++) close(fd);
    char path[] = "/tmp/rtprof-closefds-XXXXXX";
    int fd = mkstemp(path);
    unlink(path);
    long n = write(fd, "parent", 6);
    printf("parent wrote %ld\n", n);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int s = 0;
        for (int i = 0; i < 3; i++) s += child_work(i);
        printf("child wrote %ld\n", (long)write(fd, "child!", 6));
        exit(s == 6 ? 0 : 1);
    }
    int st;
    waitpid(pid, &st, 0);
    return WEXITSTATUS(st);
}
