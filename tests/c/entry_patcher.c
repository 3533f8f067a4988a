/* A preloaded library whose constructor rewrites the first byte of
 * `never_called` in the main program, as another tool or a debugger would
 * before the agent starts: the agent must leave that entry alone. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <sys/mman.h>

__attribute__((constructor)) static void rewrite(void) {
    unsigned char *f = dlsym(RTLD_DEFAULT, "never_called");
    if (!f) return;
    uintptr_t page = (uintptr_t)f & ~(uintptr_t)4095;
    if (mprotect((void *)page, 8192, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) return;
    *f = 0xcc; /* int3, as a breakpoint */
    mprotect((void *)page, 8192, PROT_READ | PROT_EXEC);
}
