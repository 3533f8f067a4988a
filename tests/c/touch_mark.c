/* Writes "ran" into the file named by $RTPROF_TEST_MARK: whether its
 * main ran (a program started only to fill the cache must not run). */
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    const char *mark = getenv("RTPROF_TEST_MARK");
    FILE *f = mark ? fopen(mark, "w") : NULL;
    if (f) {
        fputs("ran\n", f);
        fclose(f);
    }
    return 0;
}
