/* Four threads already run when a plugin is loaded with dlopen; then they
 * hammer its functions; then it is unloaded, and loaded again. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#define THREADS 4
#define CALLS 50000
static long (*entry)(long);
static pthread_barrier_t ready, go;
static void *worker(void *arg) {
    (void)arg;
    pthread_barrier_wait(&ready);
    pthread_barrier_wait(&go);
    entry(CALLS);
    return 0;
}

int main(int argc, char **argv) {
    const char *path = argv[1];
    pthread_t t[THREADS];
    pthread_barrier_init(&ready, 0, THREADS + 1);
    pthread_barrier_init(&go, 0, THREADS + 1);
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], 0, worker, 0);
    pthread_barrier_wait(&ready);
    void *h = dlopen(path, RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    entry = (long (*)(long))dlsym(h, "plugin_entry");
    pthread_barrier_wait(&go);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], 0);
    dlclose(h);
    h = dlopen(path, RTLD_NOW);
    entry = (long (*)(long))dlsym(h, "plugin_entry");
    long s = entry(10);
    dlclose(h);
    printf("done %ld\n", s);
    return 0;
}
