/* _Fork makes a child without fork handlers: the child must still count
 * in a segment of its own, and the parent's counts stay exact. */
#include <stdio.h>
#include <unistd.h>
#include <sys/wait.h>
pid_t _Fork(void);
volatile long sink;
__attribute__((noinline)) void f(void) { sink++; }
int main(void) {
  for (int i = 0; i < 1000; i++) f();
  pid_t p = _Fork();
  if (p == 0) { for (int i = 0; i < 500; i++) f(); _exit(0); }
  waitpid(p, 0, 0);
  for (int i = 0; i < 1000; i++) f();
  printf("ok\n");
  return 0;
}
