/* Test driver for the C reader (rtprof_present.c), built by tests/present_c.rs
 * with -fsanitize=address,undefined: every read the reader makes outside
 * what it was given stops the program with a report.
 *
 *   present_check open PATH        rtprof_open + rtprof_take on the file
 *   present_check copy PATH        the file's bytes in a heap block of exactly
 *                                  their size (ASan sees any byte beyond it)
 *   present_check fuzz PATH N SEED N random corruptions of those bytes
 *   present_check process PATH PID rtprof_take_process on a heap copy
 *   present_check time PATH PID N  median ns of rtprof_take_process and of
 *                                  rtprof_take on the mapped file (N reads
 *                                  each, in batches of 100)
 *
 * Prints "ok ..." and every row, or "error RC: message"; exits 0 unless
 * something crashed or the usage was wrong. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rtprof_present.h"

/* Reads every process, row and string of a view, and looks every global
 * row up again: all of it must stay inside the view's copy. */
static unsigned long walk(const rtprof_view *v, int print) {
    unsigned long sum = 0;
    char name[256], exe[256], module[256];
    for (uint32_t i = 0; i < v->proc_count; i++) {
        const rtprof_proc *p = &v->procs[i];
        rtprof_string(v, p->exe_off, p->exe_len, exe, sizeof exe);
        if (print) printf("proc %u %s rows %u\n", p->pid, exe, p->row_count);
        for (uint32_t r = p->first_row; r < p->first_row + p->row_count; r++) sum += v->rows[r].calls;
    }
    for (uint32_t i = 0; i < v->row_count; i++) {
        const rtprof_row *r = &v->rows[i];
        const rtprof_proc *p = &v->procs[r->proc_index];
        rtprof_string(v, r->name_off, r->name_len, name, sizeof name);
        rtprof_string(v, r->module_off, r->module_len, module, sizeof module);
        rtprof_string(v, p->exe_off, p->exe_len, exe, sizeof exe);
        sum += strlen(name) + strlen(module);
        if (i >= v->global_first) {
            const rtprof_row *g = rtprof_lookup(v, exe, name);
            if (print) printf("global %s %s calls %llu found %d\n", exe, name, (unsigned long long)r->calls, g == r);
        } else if (print) {
            printf("row %u %s %s calls %llu\n", p->pid, name, module, (unsigned long long)r->calls);
        }
    }
    return sum;
}

static int take(const rtprof_segment *s, int print) {
    rtprof_view v;
    int rc = rtprof_take(s, &v);
    if (rc != RTPROF_OK) {
        if (print) printf("error %d: %s\n", rc, rtprof_strerror(rc));
        return rc;
    }
    if (print)
        printf("ok generation %llu procs %u rows %u globals %u publish_ns %llu tick_ns %llu stale %d\n",
               (unsigned long long)v.generation, v.proc_count, v.row_count, v.global_count,
               (unsigned long long)v.publish_ns, (unsigned long long)v.tick_ns, rtprof_is_stale(&v));
    walk(&v, print);
    rtprof_release(&v);
    return rc;
}

/* Reads one process's view and every string it names. */
static int take_process(const rtprof_segment *s, uint32_t pid, int print) {
    rtprof_process_view v;
    int rc = rtprof_take_process(s, pid, &v);
    if (rc != RTPROF_OK) {
        if (print) printf("error %d: %s\n", rc, rtprof_strerror(rc));
        return rc;
    }
    char exe[256], name[256], module[256];
    rtprof_process_string(&v, v.proc.exe_off, v.proc.exe_len, exe, sizeof exe);
    if (print)
        printf("process %u %s generation %llu rows %u ended %u\n", v.proc.pid, exe,
               (unsigned long long)v.generation, v.row_count, v.proc.flags & RTPROF_PROC_ENDED);
    for (uint32_t i = 0; i < v.row_count; i++) {
        const rtprof_row *r = &v.rows[i];
        rtprof_process_string(&v, r->name_off, r->name_len, name, sizeof name);
        rtprof_process_string(&v, r->module_off, r->module_len, module, sizeof module);
        if (print) printf("row %s %s calls %llu\n", name, module, (unsigned long long)r->calls);
    }
    rtprof_release_process(&v);
    return rc;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median over batches of 100 reads of ns per read; -1 if a read failed. */
static double time_reads(const rtprof_segment *s, uint32_t pid, long n, int whole) {
    long batches = n / 100 > 3 ? n / 100 : 3;
    double *per = malloc(sizeof *per * (size_t)batches);
    if (!per) return -1;
    for (long b = 0; b < batches; b++) {
        uint64_t t = now_ns();
        for (int k = 0; k < 100; k++) {
            if (whole) {
                rtprof_view v;
                if (rtprof_take(s, &v) != RTPROF_OK) return free(per), -1;
                rtprof_release(&v);
            } else {
                rtprof_process_view v;
                if (rtprof_take_process(s, pid, &v) != RTPROF_OK) return free(per), -1;
                rtprof_release_process(&v);
            }
        }
        per[b] = (double)(now_ns() - t) / 100.0;
    }
    qsort(per, (size_t)batches, sizeof *per, by_value);
    double m = per[batches / 2];
    free(per);
    return m;
}

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    /* malloc keeps 16-byte alignment; a zero-length file gets 1 byte. */
    uint8_t *b = malloc(n > 0 ? (size_t)n : 1);
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) { perror(path); exit(2); }
    fclose(f);
    *len = (size_t)n;
    return b;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "open")) {
        rtprof_segment s;
        int rc = rtprof_open(&s, argv[2]);
        if (rc != RTPROF_OK) {
            printf("error %d: %s\n", rc, rtprof_strerror(rc));
            return 0;
        }
        take(&s, 1);
        rtprof_close(&s);
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "copy")) {
        size_t len;
        uint8_t *b = slurp(argv[2], &len);
        rtprof_segment s = {b, len};
        take(&s, 1);
        free(b);
        return 0;
    }
    if (argc == 5 && !strcmp(argv[1], "time")) {
        rtprof_segment s;
        int rc = rtprof_open(&s, argv[2]);
        if (rc != RTPROF_OK) {
            printf("error %d: %s\n", rc, rtprof_strerror(rc));
            return 0;
        }
        uint32_t pid = (uint32_t)strtoul(argv[3], NULL, 10);
        long n = atol(argv[4]);
        double one = time_reads(&s, pid, n, 0), whole = time_reads(&s, pid, n / 100 + 300, 1);
        printf("take_process %.0f ns, take %.0f ns\n", one, whole);
        rtprof_close(&s);
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "process")) {
        size_t len;
        uint8_t *b = slurp(argv[2], &len);
        rtprof_segment s = {b, len};
        take_process(&s, (uint32_t)strtoul(argv[3], NULL, 10), 1);
        free(b);
        return 0;
    }
    if (argc == 5 && !strcmp(argv[1], "fuzz")) {
        size_t len;
        uint8_t *orig = slurp(argv[2], &len);
        long n = atol(argv[3]);
        uint64_t x = strtoull(argv[4], NULL, 10) | 1;
        uint8_t *b = malloc(len ? len : 1);
        int counts[16] = {0};
        /* The current buffer, where corruption matters (if the header is
         * sane: a broken one is fuzzed as it is). */
        uint64_t gen = 0, off[2] = {0, 0};
        if (len >= 64) {
            memcpy(&gen, orig + 24, 8); /* generation */
            memcpy(off, orig + 32, 16); /* buffer_off */
        }
        size_t boff = off[gen & 1] < len ? (size_t)off[gen & 1] : 0;
        size_t window = len - boff < 4096 ? len - boff : 4096;
        for (long k = 0; k < n; k++) {
            memcpy(b, orig, len);
            for (int j = 0; j < 3 && len; j++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                /* A quarter in the segment header, the rest in the
                 * current buffer's header and first records. */
                size_t pos = (x >> 32) % 4 == 0 || !window ? (size_t)(x % (len < 64 ? len : 64))
                                                           : boff + (size_t)(x % window);
                b[pos] = (uint8_t)(x >> 40);
            }
            rtprof_segment s = {b, len};
            take_process(&s, 10, 0);
            take_process(&s, 11, 0);
            int rc = take(&s, 0);
            counts[-rc < 16 && rc <= 0 ? -rc : 15]++;
        }
        printf("fuzzed %ld:", n);
        for (int i = 0; i < 16; i++)
            if (counts[i]) printf(" %d=%d", -i, counts[i]);
        printf("\n");
        free(b);
        free(orig);
        return 0;
    }
    fprintf(stderr, "usage: %s open|copy PATH | process PATH PID | time PATH PID N | fuzz PATH N SEED\n", argv[0]);
    return 2;
}
