/* A scheduler in C against a live rtprofd: every span, the hottest
 * functions of all profiled programs (merged per executable), and which of
 * them it would move to an accelerator.
 *
 * Cost model: moving a function saves its time x (1 - 1/speedup), and costs
 * a transfer per call; move it if the saving is larger.
 *
 * build: gcc -O2 -Iabi/include -o scheduler examples/scheduler.c abi/c/rtprof_present.c
 * usage: scheduler [--present PATH] [--once] [--speedup S] [--transfer-ns T] [--top N]
 * exit status: 0 after --once; 1 when the segment cannot be read (missing,
 * not a segment, malformed, never published, or rewritten under every read
 * for five seconds); 2 for a bad argument. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rtprof_present.h"

#define USAGE "usage: scheduler [--present PATH] [--once] [--speedup S] [--transfer-ns T] [--top N]\n"
/* Polls (100 ms apart) that may find the segment busy, or not yet
 * published by a daemon that just started, before giving up. */
#define RETRIES 50

/* Names come from binaries anyone can build: control characters (C0, DEL,
 * C1 in UTF-8) and bidirectional overrides are shown escaped, never sent to
 * the terminal. */
static const char *shown(const char *s, char *out, size_t size) {
    size_t o = 0;
    for (const unsigned char *c = (const unsigned char *)s; *c && o + 12 < size; c++) {
        if (*c < 0x20 || *c == 0x7f || *c == '\\') {
            o += (size_t)snprintf(out + o, size - o, *c == '\\' ? "\\\\" : "\\x%02x", *c);
        } else if (c[0] == 0xc2 && c[1] >= 0x80 && c[1] <= 0x9f) {
            o += (size_t)snprintf(out + o, size - o, "\\u{%x}", c[1]);
            c++;
        } else if (c[0] == 0xe2 && ((c[1] == 0x80 && ((c[2] >= 0xaa && c[2] <= 0xae) || c[2] == 0x8e || c[2] == 0x8f)) ||
                                    (c[1] == 0x81 && c[2] >= 0xa6 && c[2] <= 0xa9))) {
            unsigned cp = 0x2000 + ((c[1] & 0x3f) << 6) + (c[2] & 0x3f);
            o += (size_t)snprintf(out + o, size - o, "\\u{%x}", cp);
            c += 2;
        } else {
            out[o++] = (char)*c;
        }
    }
    out[o] = 0;
    return out;
}

static int positive(const char *v, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x > 0)) return 0;
    *out = x;
    return 1;
}

int main(int argc, char **argv) {
    const char *path = RTPROF_DEFAULT_PRESENT;
    int once = 0, top = 5;
    double speedup = 10, transfer_ns = 5000, t;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf(USAGE);
            return 0;
        }
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--present") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--once")) once = 1;
        else if (!strcmp(argv[i], "--speedup") && i + 1 < argc && positive(argv[i + 1], &speedup)) i++;
        else if (!strcmp(argv[i], "--transfer-ns") && i + 1 < argc && positive(argv[i + 1], &transfer_ns)) i++;
        else if (!strcmp(argv[i], "--top") && i + 1 < argc && positive(argv[i + 1], &t)) top = (int)t, i++;
        else {
            fprintf(stderr, "scheduler: bad argument %s\n" USAGE, argv[i]);
            return 2;
        }
    }
    char where[512];
    shown(path, where, sizeof where);
    rtprof_segment seg;
    int rc = rtprof_open(&seg, path);
    if (rc != RTPROF_OK) {
        int missing = rc == RTPROF_ERR_SYSTEM && errno == ENOENT;
        fprintf(stderr, "scheduler: %s: %s%s\n", where, rtprof_strerror(rc), missing ? " (is rtprofd running?)" : "");
        return 1;
    }
    uint64_t last = 0;
    int retries = 0, warned = 0;
    for (;;) {
        rtprof_view v;
        rc = rtprof_take(&seg, &v);
        if (rc == RTPROF_ERR_BUSY || rc == RTPROF_ERR_UNPUBLISHED) {
            /* Passing states: a daemon mid-publish, or one that has not
             * published its first span yet. Not for ever. */
            if (++retries > RETRIES) break;
            usleep(100000);
            continue;
        }
        if (rc != RTPROF_OK) break;
        retries = 0;
        int stale = rtprof_is_stale(&v);
        if (stale && !warned)
            fprintf(stderr, "scheduler: %s: nothing new for %.1f s: rtprofd has stopped or is stuck\n", where,
                    rtprof_age_ns(&v) / 1e9);
        warned = stale;
        if (v.generation != last) {
            last = v.generation;
            /* Global rows, hottest first (selection of the top N). */
            uint32_t n = v.global_count;
            uint32_t *order = malloc((n ? n : 1) * sizeof *order);
            if (!order) {
                rtprof_release(&v);
                rc = RTPROF_ERR_SYSTEM;
                break;
            }
            for (uint32_t i = 0; i < n; i++) order[i] = v.global_first + i;
            for (int k = 0; k < top && (uint32_t)k < n; k++)
                for (uint32_t j = k + 1; j < n; j++)
                    if (v.rows[order[j]].time_ns > v.rows[order[k]].time_ns ||
                        (v.rows[order[j]].time_ns == v.rows[order[k]].time_ns && v.rows[order[j]].calls > v.rows[order[k]].calls)) {
                        uint32_t tmp = order[k]; order[k] = order[j]; order[j] = tmp;
                    }
            printf("span %.1f s, %u process(es)\n", v.span_ns / 1e9, v.proc_count);
            for (int k = 0; k < top && (uint32_t)k < n; k++) {
                /* rtprof_take checked every row's process and strings. */
                const rtprof_row *r = &v.rows[order[k]];
                const rtprof_proc *p = &v.procs[r->proc_index];
                char name[128], exe[256], name_shown[512], exe_shown[1024];
                rtprof_string(&v, r->name_off, r->name_len, name, sizeof name);
                rtprof_string(&v, p->exe_off, p->exe_len, exe, sizeof exe);
                double saved = r->time_ns * (1 - 1 / speedup), cost = r->calls * transfer_ns;
                int counted = r->flags & RTPROF_ROW_COUNTED;
                printf("  %-24s %-28s %12.0f calls/s %9.1f ms %s\n", shown(name, name_shown, sizeof name_shown),
                       shown(exe, exe_shown, sizeof exe_shown), v.span_ns ? r->calls * 1e9 / v.span_ns : 0.0,
                       r->time_ns / 1e6, !counted ? "keep (calls unknown)" : saved > cost ? "MOVE" : "keep");
            }
            fflush(stdout);
            free(order);
        }
        rtprof_release(&v);
        if (once) break;
        usleep(100000);
    }
    rtprof_close(&seg);
    if (rc != RTPROF_OK) {
        fprintf(stderr, "scheduler: %s: %s\n", where, rtprof_strerror(rc));
        return 1;
    }
    return 0;
}
