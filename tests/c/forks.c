/* fork: parent and child call known functions different numbers of times,
 * while another parent thread keeps calling one of them across the fork. */
#include <pthread.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))
volatile long sink;
NOINLINE void f(void) { sink++; }
NOINLINE void g(void) { sink += 2; }
NOINLINE void busy(void) { sink += 3; }

static void *spinner(void *arg) {
    (void)arg;
    for (int i = 0; i < 200000; i++) busy();
    return NULL;
}

int main(void) {
    pthread_t t;
    pthread_create(&t, NULL, spinner, NULL);
    for (int i = 0; i < 10; i++) f();
    pid_t pid = fork();
    if (pid == 0) {
        for (int i = 0; i < 3; i++) f();
        for (int i = 0; i < 5; i++) g();
        _exit(0);
    }
    for (int i = 0; i < 7; i++) f();
    int st;
    waitpid(pid, &st, 0);
    pthread_join(t, NULL);
    printf("child %d\n", WEXITSTATUS(st));
    return 0;
}
