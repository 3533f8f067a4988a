/* A library whose fork handlers call an instrumented function: in the
 * parent before the fork (prepare), and in the child after it. */
#include <pthread.h>

volatile long forklib_sink;
__attribute__((noinline, noclone)) long forklib_fn(long x) { forklib_sink += x; return x * 3; }
static void prepare(void) { for (int i = 0; i < 1000; i++) forklib_fn(i); }
static void child(void) { for (int i = 0; i < 100000; i++) forklib_fn(i); }
__attribute__((constructor)) static void forklib_init(void) { pthread_atfork(prepare, 0, child); }
