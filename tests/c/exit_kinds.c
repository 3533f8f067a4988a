/* Children of fork() ending by exit, _exit and _Exit, each after a known
 * number of calls of work(), while a thread of the parent allocates all
 * along (malloc's locks are taken at every fork); and a vfork child ending
 * by _exit, which shares the parent's memory. Prints "CHILD pid how calls"
 * per child and "PARENT pid calls". */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))
volatile long sink;
NOINLINE void work(void) { sink++; }

static volatile int stop;

static void *allocator(void *arg) {
    (void)arg;
    while (!stop) {
        void *p = malloc(1 + (sink & 4095));
        sink += (long)(p != NULL);
        free(p);
    }
    return NULL;
}

static void calls(int n) {
    for (int i = 0; i < n; i++) work();
}

int main(void) {
    pthread_t t;
    pthread_create(&t, NULL, allocator, NULL);
    calls(10);
    const char *how[] = {"exit", "_exit", "_Exit"};
    for (int k = 0; k < 3; k++) {
        int n = 100 * (k + 1);
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            calls(n);
            if (k == 0) exit(0);
            if (k == 1) _exit(0);
            _Exit(0);
        }
        printf("CHILD %d %s %d\n", (int)pid, how[k], n);
        waitpid(pid, NULL, 0);
    }
    fflush(stdout);
    pid_t v = vfork();
    if (v == 0) _exit(0);
    printf("CHILD %d vfork 0\n", (int)v);
    waitpid(v, NULL, 0);
    stop = 1;
    pthread_join(t, NULL);
    calls(7);
    printf("PARENT %d 17\n", (int)getpid());
    return 0;
}
