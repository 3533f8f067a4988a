/* rtprof: reading rtprofd's presentation segment from C.
 *
 * The segment (default /run/rtprof/present) holds the statistics of the
 * last span for every profiled process: calls, samples, estimated time per
 * function. Layout: a 64-byte header, then two buffers; the header's
 * generation says which buffer is current (generation & 1). Each buffer:
 * a 128-byte buffer header (with the time it was published), process
 * entries, rows (each process's rows followed by its threads' rows when
 * rtprofd runs with --thread-rows, then global rows merged by executable
 * and function), a hash index, strings. All little-endian; see
 * abi/src/present/layout.rs for the layout and writer.rs beside it for
 * the writer.
 *
 * Usage:
 *     rtprof_segment seg;
 *     int rc = rtprof_open(&seg, "/run/rtprof/present");
 *     if (rc == 0) {
 *         rtprof_view v;
 *         if ((rc = rtprof_take(&seg, &v)) == 0) {
 *             if (rtprof_is_stale(&v)) ...the daemon stopped publishing...
 *             for (uint32_t i = 0; i < v.proc_count; i++) ...v.procs[i]...
 *             const rtprof_row *r = rtprof_lookup(&v, "/usr/bin/app", "matmul");
 *             rtprof_release(&v);
 *         }
 *         rtprof_close(&seg);
 *     }
 *     if (rc != 0) fprintf(stderr, "%s\n", rtprof_strerror(rc));
 * rtprof_take copies the current buffer and checks the daemon did not
 * rewrite it meanwhile, so a view is always one consistent span; it never
 * blocks the daemon. Every offset and count is checked before
 * rtprof_take returns 0: a view's rows, processes and strings can be used
 * as they are.
 */
#ifndef RTPROF_PRESENT_H
#define RTPROF_PRESENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RTPROF_PRESENT_VERSION 5
#define RTPROF_DEFAULT_PRESENT "/run/rtprof/present" /* where rtprofd publishes */
#define RTPROF_PROC_ENDED 1u   /* rtprof_proc.flags: the process ended */
#define RTPROF_ROW_COUNTED 1u  /* rtprof_row.flags: calls are counted */
#define RTPROF_ROW_GLOBAL 2u   /* rtprof_row.flags: merged across processes */
#define RTPROF_ROW_ESTIMATED 4u /* rtprof_row.flags: calls estimated under a budget */
#define RTPROF_ROW_ACCELERATED 8u /* rtprof_row.flags: calls added through the C API */
#define RTPROF_ROW_COUNTING_OFF 16u /* rtprof_row.flags: counting switched off */
#define RTPROF_ROW_THREAD 32u /* rtprof_row.flags: one thread's calls (rtprofd --thread-rows) */
#define RTPROF_ROW_THREAD_HEAD 64u /* with RTPROF_ROW_THREAD: a thread's first row, its name */
#define RTPROF_ROW_AT_LEAST 128u /* with RTPROF_ROW_ESTIMATED: the calls counted in bursts, at least */
#define RTPROF_ROW_AGENT 256u /* "[rtprof]": what rtprof cost the process over the span (time_ns) */
#define RTPROF_ROW_OFFERED 512u        /* the program offered other implementations of it */
#define RTPROF_ROW_IMPLEMENTATION 1024u /* "function [name]": calls routed to an implementation */
#define RTPROF_ROW_ACTIVE 2048u        /* the implementation that runs the function's calls now */

/* A view is stale when it is older than this many ticks (plus a second of
 * slack): the daemon that published it has stopped. */
#define RTPROF_STALE_TICKS 3

/* Results of rtprof_open and rtprof_take. */
enum {
    RTPROF_OK = 0,
    RTPROF_ERR_SYSTEM = -1,      /* a system call failed: errno says why */
    RTPROF_ERR_BUSY = -2,        /* the daemon kept rewriting the buffer */
    RTPROF_ERR_UNPUBLISHED = -3, /* nothing published yet */
    RTPROF_ERR_NOT_REGULAR = -4, /* not a regular file (a FIFO, a directory, ...) */
    RTPROF_ERR_TRUNCATED = -5,   /* smaller than the segment header */
    RTPROF_ERR_MAGIC = -6,       /* not a presentation segment */
    RTPROF_ERR_VERSION = -7,     /* another layout version */
    RTPROF_ERR_BOUNDS = -8,      /* a size, offset or count out of bounds */
    RTPROF_ERR_CHECKSUM = -9,    /* not returned since version 4 (rows carry no checksum) */
    RTPROF_ERR_NO_PROCESS = -10  /* rtprof_take_process: no such process in the table */
};

typedef struct {
    uint32_t pid, flags, exe_off, exe_len, first_row, row_count;
    uint64_t span_ns, samples, period_ns, lost;
    uint64_t thread_rows; /* its threads' rows, after its row_count rows
                             (0 in a rtprof_take_process view) */
} rtprof_proc;

typedef struct {
    uint32_t name_off, name_len, module_off, module_len, proc_index, flags;
    uint64_t calls, samples, time_ns, total_calls;
    uint64_t tid; /* a thread row's thread, else 0 */
} rtprof_row;

typedef struct {
    const uint8_t *map;
    size_t len;
} rtprof_segment;

typedef struct {
    uint8_t *buf; /* private copy of the buffer */
    uint64_t generation, span_end_ns, span_ns;
    uint64_t publish_ns; /* CLOCK_REALTIME when the daemon published it */
    uint64_t tick_ns;    /* the daemon's tick */
    uint32_t proc_count, row_count, global_first, global_count;
    const rtprof_proc *procs;
    const rtprof_row *rows;
    const uint32_t *hash;
    uint32_t hash_cap;
    const char *strings;
    uint32_t strings_len;
} rtprof_view;

/* One process's rows (rtprof_take_process): a private copy of its entry,
 * its rows (hottest first; first_row is 0, name and module offsets point
 * into `strings`) and the strings they name. */
typedef struct {
    uint8_t *buf; /* private copy: rows, then strings */
    uint64_t generation, span_end_ns, span_ns, publish_ns, tick_ns;
    rtprof_proc proc;
    const rtprof_row *rows;
    uint32_t row_count;
    const char *strings;
    uint32_t strings_len;
} rtprof_process_view;

/* Maps the segment at path: RTPROF_OK, RTPROF_ERR_SYSTEM (errno set),
 * RTPROF_ERR_NOT_REGULAR or RTPROF_ERR_TRUNCATED. Never blocks (a FIFO is
 * refused, not waited on). */
int rtprof_open(rtprof_segment *s, const char *path);
void rtprof_close(rtprof_segment *s);
/* RTPROF_OK, or one of the errors above (the view is then empty). */
int rtprof_take(const rtprof_segment *s, rtprof_view *v);
void rtprof_release(rtprof_view *v);
/* A sentence for a result of rtprof_open or rtprof_take. */
const char *rtprof_strerror(int rc);
/* Nanoseconds since the view was published (0 if the clock went back). */
uint64_t rtprof_age_ns(const rtprof_view *v);
/* Whether the view is older than RTPROF_STALE_TICKS ticks plus a second. */
int rtprof_is_stale(const rtprof_view *v);
/* Copies string (off, len) of the view into out (NUL-terminated, cut to
 * size); returns out. */
char *rtprof_string(const rtprof_view *v, uint32_t off, uint32_t len, char *out, size_t size);
/* The global row of `name` in executable `exe`, or NULL. */
const rtprof_row *rtprof_lookup(const rtprof_view *v, const char *exe, const char *name);
/* Process `pid`'s rows of the current table, copying only them (and their
 * strings), not the whole table: RTPROF_OK, RTPROF_ERR_NO_PROCESS, or an
 * error of rtprof_take. Checked as rtprof_take checks a view. An image
 * replaced by exec and its successor share a pid: this is the first. */
int rtprof_take_process(const rtprof_segment *s, uint32_t pid, rtprof_process_view *v);
void rtprof_release_process(rtprof_process_view *v);
/* Copies string (off, len) of a process view, as rtprof_string does. */
char *rtprof_process_string(const rtprof_process_view *v, uint32_t off, uint32_t len, char *out, size_t size);

/* rtprofd's socket when none is given and $RTPROF_DAEMON_SOCKET is unset. */
#define RTPROF_DEFAULT_SOCKET "/run/rtprof/rtprofd.sock"
/* Asks rtprofd at socket_path (NULL: $RTPROF_DAEMON_SOCKET, else the
 * default) to send the calls of `function` in process `pid` to the
 * implementation the program offered as `implementation` ("original": its
 * own code). Waits for the answer, given once the process's agent has done
 * it (at most 5 s), and copies it into answer (NUL-terminated, cut to
 * size). Returns 0 if the calls go there now, 1 if refused (answer says
 * why: the caller is neither root nor the process's user, no such
 * function or implementation, ...), -1 on a system error (errno set).
 * In abi/c/rtprof_route.c. */
int rtprof_route(const char *socket_path, uint32_t pid, const char *function,
                 const char *implementation, char *answer, size_t size);

#ifdef __cplusplus
}
#endif

#endif
