/* A library whose constructor starts a thread that calls one of its
 * functions in a loop: it runs before the agent's constructor. */
#include <pthread.h>

volatile long spin_sink;
__attribute__((noinline, noclone)) long spin_fn(long x) { spin_sink += x; return x ^ 5; }
static void *spin(void *arg) {
    (void)arg;
    for (long i = 0;; i++) spin_fn(i);
    return 0;
}
__attribute__((constructor)) static void spinlib_init(void) {
    pthread_t t;
    pthread_create(&t, 0, spin, 0);
    pthread_detach(t);
}
