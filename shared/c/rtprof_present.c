/* A small reader of rtprofd's presentation segment (see rtprof_present.h). */
#include "rtprof_present.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char magic[8];
    uint32_t version, header_size;
    uint64_t total_size, generation, buffer_off[2], buffer_len, tick_ns;
} seg_header;

typedef struct {
    uint64_t seq, span_end_ns, span_ns;
    uint32_t proc_count, row_count, global_first, global_count, hash_cap, strings_len;
    uint32_t procs_off, rows_off, hash_off, strings_off;
} buf_header;

int rtprof_open(rtprof_segment *s, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(seg_header)) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return -1;
    s->map = p;
    s->len = (size_t)st.st_size;
    return 0;
}

void rtprof_close(rtprof_segment *s) {
    if (s->map) munmap((void *)s->map, s->len);
    s->map = NULL;
}

static int within(uint64_t off, uint64_t n, uint64_t len) { return off <= len && n <= len - off; }

int rtprof_take(const rtprof_segment *s, rtprof_view *v) {
    memset(v, 0, sizeof *v);
    seg_header h;
    memcpy(&h, s->map, sizeof h);
    if (memcmp(h.magic, "RTPROFP", 8) != 0 || h.version != RTPROF_PRESENT_VERSION) return -1;
    for (int i = 0; i < 2; i++)
        if (h.buffer_off[i] < 64 || !within(h.buffer_off[i], h.buffer_len, s->len)) return -1;
    const volatile uint64_t *gen_word = (const volatile uint64_t *)(s->map + offsetof(seg_header, generation));
    uint8_t *copy = malloc(h.buffer_len ? h.buffer_len : 1);
    if (!copy) return -1;
    for (int attempt = 0; attempt < 1000; attempt++) {
        uint64_t gen = __atomic_load_n(gen_word, __ATOMIC_ACQUIRE);
        if (gen == 0) break;
        const uint8_t *b = s->map + h.buffer_off[gen & 1];
        const volatile uint64_t *seq = (const volatile uint64_t *)b;
        uint64_t s1 = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
        if (s1 & 1) continue;
        memcpy(copy, b, h.buffer_len);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(seq, __ATOMIC_RELAXED) != s1) continue;
        buf_header bh;
        memcpy(&bh, copy, sizeof bh);
        uint64_t len = h.buffer_len;
        if (!within(bh.procs_off, (uint64_t)bh.proc_count * 64, len) ||
            !within(bh.rows_off, (uint64_t)bh.row_count * 64, len) ||
            !within(bh.hash_off, (uint64_t)bh.hash_cap * 4, len) ||
            !within(bh.strings_off, bh.strings_len, len) ||
            (uint64_t)bh.global_first + bh.global_count != bh.row_count ||
            bh.hash_cap == 0 || (bh.hash_cap & (bh.hash_cap - 1)) ||
            bh.procs_off % 8 || bh.rows_off % 8 || bh.hash_off % 4)
            break;
        for (uint32_t i = 0; i < bh.proc_count; i++) {
            const rtprof_proc *p = (const rtprof_proc *)(copy + bh.procs_off) + i;
            if ((uint64_t)p->first_row + p->row_count > bh.global_first) goto bad;
        }
        v->buf = copy;
        v->generation = gen;
        v->span_end_ns = bh.span_end_ns;
        v->span_ns = bh.span_ns;
        v->proc_count = bh.proc_count;
        v->row_count = bh.row_count;
        v->global_first = bh.global_first;
        v->global_count = bh.global_count;
        v->procs = (const rtprof_proc *)(copy + bh.procs_off);
        v->rows = (const rtprof_row *)(copy + bh.rows_off);
        v->hash = (const uint32_t *)(copy + bh.hash_off);
        v->hash_cap = bh.hash_cap;
        v->strings = (const char *)(copy + bh.strings_off);
        v->strings_len = bh.strings_len;
        return 0;
    }
    free(copy);
    return __atomic_load_n(gen_word, __ATOMIC_ACQUIRE) == 0 ? -1 : -2;
bad:
    free(copy);
    return -1;
}

void rtprof_release(rtprof_view *v) {
    free(v->buf);
    memset(v, 0, sizeof *v);
}

char *rtprof_string(const rtprof_view *v, uint32_t off, uint32_t len, char *out, size_t size) {
    if (size == 0) return out;
    if ((uint64_t)off + len > v->strings_len) len = 0, off = 0;
    size_t n = len < size - 1 ? len : size - 1;
    memcpy(out, v->strings + off, n);
    out[n] = 0;
    return out;
}

static int equals(const rtprof_view *v, uint32_t off, uint32_t len, const char *s) {
    return (uint64_t)off + len <= v->strings_len && strlen(s) == len && memcmp(v->strings + off, s, len) == 0;
}

const rtprof_row *rtprof_lookup(const rtprof_view *v, const char *exe, const char *name) {
    uint32_t h = 0x811c9dc5u;
    for (const char *c = exe; *c; c++) h = (h ^ (uint8_t)*c) * 0x01000193u;
    h = (h ^ 0) * 0x01000193u;
    for (const char *c = name; *c; c++) h = (h ^ (uint8_t)*c) * 0x01000193u;
    for (uint32_t k = 0, i = h & (v->hash_cap - 1); k < v->hash_cap; k++, i = (i + 1) & (v->hash_cap - 1)) {
        uint32_t ix = v->hash[i];
        if (ix == UINT32_MAX) return NULL;
        if (ix < v->global_first || ix >= v->row_count) return NULL;
        const rtprof_row *r = &v->rows[ix];
        if (r->proc_index >= v->proc_count) return NULL;
        const rtprof_proc *p = &v->procs[r->proc_index];
        if (equals(v, r->name_off, r->name_len, name) && equals(v, p->exe_off, p->exe_len, exe)) return r;
    }
    return NULL;
}
