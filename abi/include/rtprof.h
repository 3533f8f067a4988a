/* rtprof: the agent's C API.
 *
 * A program (or a runtime that runs a kernel on an accelerator instead of
 * calling it in software) adds calls and CPU time to one of its functions,
 * so that profiles and rtprofd's spans stay continuous after the kernel
 * moved. The functions are defined by librtprof.so; the declarations are
 * weak, so a program built with this header also runs without the agent:
 * test the function pointer first.
 *
 *     if (rtprof_add_calls) rtprof_add_calls("matmul", 1, elapsed_ns);
 */
#ifndef RTPROF_H
#define RTPROF_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Adds `calls` calls and `time_ns` nanoseconds of time (counted as samples
 * of the process's sampling period) to the function named `function` in
 * this process (the first one of that name). Returns 0, or -1 if the agent
 * is not active or knows no such function. Thread-safe. */
__attribute__((weak)) int rtprof_add_calls(const char *function, uint64_t calls, uint64_t time_ns);

/* The same, for the function whose code contains `address`. */
__attribute__((weak)) int rtprof_add_calls_at(const void *address, uint64_t calls, uint64_t time_ns);

/* Switches counting of every patched function whose name matches `pattern`
 * (`*` and `?` globbing) on (`on` != 0) or off, while the program's threads
 * keep running through them. Off, a call costs a jump over the count.
 * Returns how many functions matched, or -1 if the agent is not active or
 * cannot rewrite its stubs. Thread-safe. */
__attribute__((weak)) int rtprof_set_counting(const char *pattern, int on);

#ifdef __cplusplus
}
#endif

#endif
