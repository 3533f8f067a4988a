/* Preloaded after the agent (so its constructor runs first): takes one page
 * at each place the agent could put the executable's stubs at a fixed
 * distance (1 GiB below and above its first segment), so no page image of
 * it can be made or mapped and the agent installs it the usual way. */
#define _GNU_SOURCE
#include <link.h>
#include <sys/auxv.h>
#include <sys/mman.h>

static int first_load(struct dl_phdr_info *info, size_t size, void *out) {
    (void)size;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_LOAD) {
            *(unsigned long *)out = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
            return 1;
        }
    return 0;
}

__attribute__((constructor)) static void take(void) {
    unsigned long lo = 0;
    dl_iterate_phdr(first_load, &lo); /* the executable comes first */
    lo &= ~4095UL;
    unsigned long at[2] = {lo - (1UL << 30), lo + (1UL << 30)};
    for (int i = 0; i < 2; i++)
        mmap((void *)at[i], 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
}
