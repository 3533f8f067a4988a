/* Hot code running on a coroutine's stack (makecontext/swapcontext), a
 * small mapping with an inaccessible page right above its top: a sampler
 * that unwinds in place must not read past the stack it is on. */
#include <stdio.h>
#include <sys/mman.h>
#include <ucontext.h>

static ucontext_t main_ctx, co_ctx;
static volatile unsigned long sink;

__attribute__((noipa)) void spin(unsigned long n) {
    for (unsigned long i = 0; i < n; i++) sink += i * 2654435761UL;
}

static void body(void) {
    for (int i = 0; i < 1500; i++) spin(300000);
}

int main(void) {
    const size_t page = 4096, len = 16 * page;
    char *m = mmap(NULL, len + 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || mprotect(m + page, len, PROT_READ | PROT_WRITE) != 0) return 2;
    getcontext(&co_ctx);
    co_ctx.uc_stack.ss_sp = m + page;
    co_ctx.uc_stack.ss_size = len;
    co_ctx.uc_link = &main_ctx;
    makecontext(&co_ctx, body, 0);
    swapcontext(&main_ctx, &co_ctx);
    printf("done %lu\n", (unsigned long)sink);
    return 0;
}
