/* Forks while other threads keep starting and ending threads (the agent's
 * slow paths: stripe hand-out and folding). Every child must run to its
 * end (no lock held by a vanished thread), with exact counts of its own;
 * an alarm turns a hang into a failure. Also spawns children with
 * posix_spawn and vfork, which run no fork handlers before exec. */
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))
extern char **environ;
volatile long sink;
volatile int stop;
NOINLINE void leaf(long x) { sink += x; }
NOINLINE void *short_lived(void *arg) { leaf((long)arg); return 0; }
NOINLINE void *churn(void *arg) {
    (void)arg;
    while (!stop) {
        pthread_t t;
        pthread_create(&t, 0, short_lived, (void *)1);
        pthread_join(t, 0);
    }
    return 0;
}
NOINLINE int in_child(void) {
    pthread_t t;
    pthread_create(&t, 0, short_lived, (void *)2);
    pthread_join(t, 0);
    for (int i = 0; i < 10; i++) leaf(i);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1) { /* spawned child: a new image */
        for (int i = 0; i < 4; i++) leaf(i);
        return 3;
    }
    alarm(60);
    pthread_t c[2];
    for (int i = 0; i < 2; i++) pthread_create(&c[i], 0, churn, 0);
    int ok = 0;
    for (int i = 0; i < 40; i++) {
        pid_t pid = fork();
        if (pid == 0) _exit(in_child());
        int st;
        waitpid(pid, &st, 0);
        ok += WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    stop = 1;
    for (int i = 0; i < 2; i++) pthread_join(c[i], 0);
    char *args[] = {argv[0], "spawned", 0};
    pid_t pid;
    int st, spawned = 0;
    if (posix_spawn(&pid, "/proc/self/exe", 0, 0, args, environ) == 0 && waitpid(pid, &st, 0) == pid)
        spawned += WEXITSTATUS(st) == 3;
    pid = vfork();
    if (pid == 0) {
        execve("/proc/self/exe", args, environ);
        _exit(127);
    }
    if (waitpid(pid, &st, 0) == pid) spawned += WEXITSTATUS(st) == 3;
    printf("children ok %d spawned ok %d\n", ok, spawned);
    return 0;
}
