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
 *
 * It also offers other implementations of a function, to which a
 * scheduler may route its calls while the program runs (rtprof_offer,
 * RTPROF_OFFER).
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

/* Offers `implementation`, a function with the same signature as the one
 * named `function` (the program's promise), as its implementation `name`
 * (at most 64 bytes; not "original", which is the function's own code).
 * Calls of `function` keep running its own code until they are routed to
 * `name` (`rtprof route PID function name`, through rtprofd); they are
 * then counted in the row `function [name]` and run `implementation`.
 * `implementation` must be where a function starts (by its module's
 * symbols, or its unwind entries where it has none), and not the function
 * itself: routed, the calls would run into the route again.
 * Returns 0, or a negative reason:
 *   -1 the agent is not active;
 *   -2 no patched function of that name;
 *   -3 `implementation` is not in executable memory;
 *   -4 a bad name (empty, "original", longer than 64 bytes, or offered
 *      already with another address);
 *   -5 no room;
 *   -6 `function`, `implementation` or `name` is null;
 *   -7 `implementation` is the function's own code: its address, an alias
 *      of it, or an address inside it (where its patched entry is);
 *   -8 `implementation` is not where a function of its module starts;
 *   -9 `name` is not UTF-8, or holds a control character (a newline, a
 *      tab...): `rtprof route` could not name it;
 *   -10 several patched functions have that name (static functions of
 *      several files, C++ overloads named without their parameters):
 *      offer by address, with rtprof_offer_at.
 * `function` is the function's symbol or its name as reports print it:
 * C++'s `k::sum` or `k::sum(int)`, Rust's `dot::dot_plain`.
 * Thread-safe. */
__attribute__((weak)) int rtprof_offer(const char *function, void *implementation, const char *name);

/* The same, for the function whose code starts at `function` (a pointer
 * to it): one of several of the same name, a C++ overload, a Rust
 * function. Same answers (-2: no patched function starts there). */
__attribute__((weak)) int rtprof_offer_at(const void *function, const void *implementation,
                                          const char *name);

/* The same offer without a call at run time: an entry in the ELF section
 * `rtprof_offers`, which the agent reads at start-up and after each
 * dlopen. Each entry is taken or refused on its own (both names must be
 * strings of the module itself); a refusal is logged under
 * RTPROF_VERBOSE=1. At file scope:
 *
 *     RTPROF_OFFER(work, work_fast, "fast");
 */
struct rtprof_offer_entry {
    const char *function;
    const void *implementation;
    const char *name;
};
#define RTPROF_OFFER_CAT2(a, b) a##b
#define RTPROF_OFFER_CAT(a, b) RTPROF_OFFER_CAT2(a, b)
#define RTPROF_OFFER(function, implementation, name)                                  \
    __attribute__((used, section("rtprof_offers"), aligned(8))) static const struct \
        rtprof_offer_entry RTPROF_OFFER_CAT(rtprof_offer_, __LINE__) = {              \
            #function, (const void *)(implementation), name}

#ifdef __cplusplus
}
#endif

#endif
