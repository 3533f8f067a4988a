/* Adds calls and time to its own function through the agent's C API, by
 * name and by address, as a runtime that moved the function to an
 * accelerator would. Runs the same without the agent (weak symbols). */
#include <stdio.h>
#include "rtprof.h"

static volatile unsigned long sink;
__attribute__((noinline)) void kernel(void) { sink++; }

int main(void) {
    for (int i = 0; i < 10; i++) kernel();
    int by_name = rtprof_add_calls ? rtprof_add_calls("kernel", 1000, 5000000) : 0;
    int by_addr = rtprof_add_calls_at ? rtprof_add_calls_at((const char *)kernel + 1, 90, 0) : 0;
    int unknown = rtprof_add_calls ? rtprof_add_calls("no_such_function", 1, 0) : -1;
    printf("%d %d %d\n", by_name, by_addr, unknown);
    return 0;
}
