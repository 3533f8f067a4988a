/* Loads and unloads two libraries of one layout in turn (usually at the
 * same address), calling their trap-entry functions each time. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    for (int r = 0; r < 6; r++) {
        const char *lib = argv[1 + r % 2];
        void *h = dlopen(lib, RTLD_NOW);
        if (!h) return 2;
        int (*tiny)(void) = (int (*)(void))dlsym(h, "tiny");
        int (*tiny2)(int) = (int (*)(int))dlsym(h, "tiny2");
        int s = 0;
        for (int i = 0; i < 10; i++) s += tiny() + tiny2(i);
        printf("round %d: %d\n", r, s);
        dlclose(h);
    }
    return argc == 3 ? 0 : 1;
}
