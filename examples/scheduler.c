/* A scheduler in C against a live rtprofd: every span, the hottest
 * functions of all profiled programs (merged per executable), and which of
 * them it would move to an accelerator.
 *
 * Cost model: moving a function saves its time x (1 - 1/speedup), and costs
 * a transfer per call; move it if the saving is larger.
 *
 * build: gcc -O2 -Ishared/include -o scheduler examples/scheduler.c shared/c/rtprof_present.c
 * usage: scheduler [--present PATH] [--once] [--speedup S] [--transfer-ns T] [--top N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rtprof_present.h"

int main(int argc, char **argv) {
    const char *path = "/run/rtprof/present";
    int once = 0, top = 5;
    double speedup = 10, transfer_ns = 5000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--present") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--once")) once = 1;
        else if (!strcmp(argv[i], "--speedup") && i + 1 < argc) speedup = atof(argv[++i]);
        else if (!strcmp(argv[i], "--transfer-ns") && i + 1 < argc) transfer_ns = atof(argv[++i]);
        else if (!strcmp(argv[i], "--top") && i + 1 < argc) top = atoi(argv[++i]);
        else { fprintf(stderr, "usage: %s [--present PATH] [--once] [--speedup S] [--transfer-ns T] [--top N]\n", argv[0]); return 2; }
    }
    rtprof_segment seg;
    if (rtprof_open(&seg, path) != 0) { perror(path); return 1; }
    uint64_t last = 0;
    for (;;) {
        rtprof_view v;
        int rc = rtprof_take(&seg, &v);
        if (rc != 0) { fprintf(stderr, "%s: %s\n", path, rc == -2 ? "busy" : "not published or malformed"); usleep(200000); continue; }
        if (v.generation != last) {
            last = v.generation;
            /* Global rows, hottest first (selection of the top N). */
            uint32_t n = v.global_count;
            uint32_t *order = malloc((n ? n : 1) * sizeof *order);
            for (uint32_t i = 0; i < n; i++) order[i] = v.global_first + i;
            for (int k = 0; k < top && (uint32_t)k < n; k++)
                for (uint32_t j = k + 1; j < n; j++)
                    if (v.rows[order[j]].time_ns > v.rows[order[k]].time_ns ||
                        (v.rows[order[j]].time_ns == v.rows[order[k]].time_ns && v.rows[order[j]].calls > v.rows[order[k]].calls)) {
                        uint32_t t = order[k]; order[k] = order[j]; order[j] = t;
                    }
            printf("span %.1f s, %u process(es)\n", v.span_ns / 1e9, v.proc_count);
            for (int k = 0; k < top && (uint32_t)k < n; k++) {
                const rtprof_row *r = &v.rows[order[k]];
                char name[128], exe[256];
                rtprof_string(&v, r->name_off, r->name_len, name, sizeof name);
                const rtprof_proc *p = &v.procs[r->proc_index < v.proc_count ? r->proc_index : 0];
                rtprof_string(&v, p->exe_off, p->exe_len, exe, sizeof exe);
                double saved = r->time_ns * (1 - 1 / speedup), cost = r->calls * transfer_ns;
                int counted = r->flags & RTPROF_ROW_COUNTED;
                printf("  %-24s %-28s %12.0f calls/s %9.1f ms %s\n", name, exe,
                       v.span_ns ? r->calls * 1e9 / v.span_ns : 0.0, r->time_ns / 1e6,
                       !counted ? "keep (calls unknown)" : saved > cost ? "MOVE" : "keep");
            }
            fflush(stdout);
            free(order);
        }
        rtprof_release(&v);
        if (once) break;
        usleep(100000);
    }
    rtprof_close(&seg);
    return 0;
}
