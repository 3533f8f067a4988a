/* A process ends when its last thread ends, even if that is not the main
 * thread: glibc calls exit(0) then. The agent's own thread must not keep it
 * alive.
 *   lastthread main   main calls pthread_exit; a worker finishes later.
 *   lastthread fork   a worker forks; in the child that thread (the child's
 *                     only one) starts and joins another, then pthread_exits. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile unsigned long sink;
__attribute__((noinline)) void burn(long n) { for (long i = 0; i < n; i++) sink += i; }

static void *late(void *arg) {
    (void)arg;
    burn(50000000);
    printf("worker done\n");
    fflush(stdout);
    return NULL;
}

static void *helper(void *arg) { (void)arg; burn(1000000); return NULL; }

static void *forker(void *arg) {
    (void)arg;
    pid_t pid = fork();
    if (pid == 0) {
        pthread_t t;
        pthread_create(&t, NULL, helper, NULL);
        pthread_join(t, NULL);
        printf("child done\n");
        fflush(stdout);
        pthread_exit(NULL);
    }
    int st = -1;
    waitpid(pid, &st, 0);
    printf("child status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return NULL;
}

int main(int argc, char **argv) {
    pthread_t t;
    if (argc > 1 && strcmp(argv[1], "fork") == 0) {
        pthread_create(&t, NULL, forker, NULL);
        pthread_join(t, NULL);
        return 3;
    }
    pthread_create(&t, NULL, late, NULL);
    pthread_exit(NULL);
}
