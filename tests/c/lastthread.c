/* A process ends when its last thread ends, even if that is not the main
 * thread: glibc calls exit(0) then, after that thread's key destructors.
 * The agent's own thread must neither keep it alive nor end it early.
 *   lastthread main   main calls pthread_exit; a worker finishes later and
 *                     its key destructor still runs.
 *   lastthread fork   a worker forks; in the child that thread (the child's
 *                     only one) starts and joins another, then pthread_exits.
 *   lastthread sigev  main calls pthread_exit while a SIGEV_THREAD timer
 *                     (whose thread glibc makes itself) keeps ticking; the
 *                     third tick ends the process with status 7. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile unsigned long sink;
__attribute__((noinline)) void burn(long n) { for (long i = 0; i < n; i++) sink += i; }

static pthread_key_t key;
static void destructor(void *v) {
    printf("key destructor ran for %s\n", (char *)v);
    fflush(stdout);
}

static void *late(void *arg) {
    (void)arg;
    pthread_setspecific(key, "worker");
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

static volatile int ticks;
static void tick(union sigval v) {
    (void)v;
    if (++ticks == 3) {
        printf("three ticks\n");
        fflush(stdout);
        exit(7);
    }
}

int main(int argc, char **argv) {
    pthread_t t;
    if (argc > 1 && strcmp(argv[1], "sigev") == 0) {
        struct sigevent sev = {0};
        sev.sigev_notify = SIGEV_THREAD;
        sev.sigev_notify_function = tick;
        timer_t id;
        timer_create(CLOCK_MONOTONIC, &sev, &id);
        struct itimerspec its = {{0, 20000000}, {0, 20000000}};
        timer_settime(id, 0, &its, NULL);
        pthread_exit(NULL);
    }
    pthread_key_create(&key, destructor);
    if (argc > 1 && strcmp(argv[1], "fork") == 0) {
        pthread_create(&t, NULL, forker, NULL);
        pthread_join(t, NULL);
        return 3;
    }
    pthread_create(&t, NULL, late, NULL);
    pthread_exit(NULL);
}
