/* rtprof: reading rtprofd's presentation segment from C.
 *
 * The segment (default /run/rtprof/present) holds the statistics of the
 * last span for every profiled process: calls, samples, estimated time per
 * function. Layout: a 64-byte header, then two buffers; the header's
 * generation says which buffer is current (generation & 1). Each buffer:
 * a 64-byte buffer header, process entries, rows (per-process rows, then
 * global rows merged by executable and function), a hash index, strings.
 * All little-endian; see shared/src/present.rs for the writer.
 *
 * Usage:
 *     rtprof_segment seg;
 *     if (rtprof_open(&seg, "/run/rtprof/present") == 0) {
 *         rtprof_view v;
 *         if (rtprof_take(&seg, &v) == 0) {
 *             for (uint32_t i = 0; i < v.proc_count; i++) ...v.procs[i]...
 *             const rtprof_row *r = rtprof_lookup(&v, "/usr/bin/app", "matmul");
 *             rtprof_release(&v);
 *         }
 *         rtprof_close(&seg);
 *     }
 * rtprof_take copies the current buffer and checks the daemon did not
 * rewrite it meanwhile, so a view is always one consistent span; it never
 * blocks the daemon. Every offset is checked before use.
 */
#ifndef RTPROF_PRESENT_H
#define RTPROF_PRESENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RTPROF_PRESENT_VERSION 1
#define RTPROF_PROC_ENDED 1u   /* rtprof_proc.flags: the process ended */
#define RTPROF_ROW_COUNTED 1u  /* rtprof_row.flags: calls are counted */
#define RTPROF_ROW_GLOBAL 2u   /* rtprof_row.flags: merged across processes */

typedef struct {
    uint32_t pid, flags, exe_off, exe_len, first_row, row_count;
    uint64_t span_ns, samples, period_ns, lost, reserved;
} rtprof_proc;

typedef struct {
    uint32_t name_off, name_len, module_off, module_len, proc_index, flags;
    uint64_t calls, samples, time_ns, total_calls, check;
} rtprof_row;

typedef struct {
    const uint8_t *map;
    size_t len;
} rtprof_segment;

typedef struct {
    uint8_t *buf; /* private copy of the buffer */
    uint64_t generation, span_end_ns, span_ns;
    uint32_t proc_count, row_count, global_first, global_count;
    const rtprof_proc *procs;
    const rtprof_row *rows;
    const uint32_t *hash;
    uint32_t hash_cap;
    const char *strings;
    uint32_t strings_len;
} rtprof_view;

/* 0, or -1 with errno set. */
int rtprof_open(rtprof_segment *s, const char *path);
void rtprof_close(rtprof_segment *s);
/* 0; -1 malformed or never published; -2 the daemon kept rewriting. */
int rtprof_take(const rtprof_segment *s, rtprof_view *v);
void rtprof_release(rtprof_view *v);
/* Copies string (off, len) of the view into out (NUL-terminated, cut to
 * size); returns out. */
char *rtprof_string(const rtprof_view *v, uint32_t off, uint32_t len, char *out, size_t size);
/* The global row of `name` in executable `exe`, or NULL. */
const rtprof_row *rtprof_lookup(const rtprof_view *v, const char *exe, const char *name);

#ifdef __cplusplus
}
#endif

#endif
