/* A small reader of rtprofd's presentation segment (see rtprof_present.h).
 * The segment is written by another process and may be anything: every
 * size is checked before anything is copied, and the copy is checked again
 * on its own before a view is handed out. */
#include "rtprof_present.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    char magic[8];
    uint32_t version, header_size;
    uint64_t total_size, generation, buffer_off[2], buffer_len, tick_ns;
} seg_header;

typedef struct {
    uint64_t seq, span_end_ns, span_ns, publish_ns;
    uint32_t proc_count, row_count, global_first, global_count, hash_cap, strings_len;
    uint32_t procs_off, rows_off, hash_off, strings_off;
    uint32_t claims_off, claim_count; /* not read here: see layout.rs */
    uint64_t reserved[6];
} buf_header;

_Static_assert(sizeof(seg_header) == 64, "segment header is 64 bytes");
_Static_assert(sizeof(buf_header) == 128, "buffer header is 128 bytes");
_Static_assert(sizeof(rtprof_proc) == 64, "process entry is 64 bytes");
_Static_assert(sizeof(rtprof_row) == 64, "row is 64 bytes");

int rtprof_open(rtprof_segment *s, const char *path) {
    s->map = NULL;
    s->len = 0;
    /* Non-blocking: opening a FIFO must not wait for a writer. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return RTPROF_ERR_SYSTEM;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return RTPROF_ERR_SYSTEM;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return RTPROF_ERR_NOT_REGULAR;
    }
    if ((uint64_t)st.st_size < sizeof(seg_header)) {
        close(fd);
        return RTPROF_ERR_TRUNCATED;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        errno = e;
        return RTPROF_ERR_SYSTEM;
    }
    s->map = p;
    s->len = (size_t)st.st_size;
    return RTPROF_OK;
}

void rtprof_close(rtprof_segment *s) {
    if (s->map) munmap((void *)s->map, s->len);
    s->map = NULL;
    s->len = 0;
}

const char *rtprof_strerror(int rc) {
    switch (rc) {
    case RTPROF_OK: return "no error";
    case RTPROF_ERR_SYSTEM: return strerror(errno);
    case RTPROF_ERR_BUSY: return "segment rewritten during every read attempt";
    case RTPROF_ERR_UNPUBLISHED: return "nothing published yet";
    case RTPROF_ERR_NOT_REGULAR: return "not a regular file (rtprofd writes its segment as one)";
    case RTPROF_ERR_TRUNCATED: return "presentation segment truncated";
    case RTPROF_ERR_MAGIC: return "not an rtprof presentation segment";
    case RTPROF_ERR_VERSION: return "presentation segment of another version (rtprofd and this reader come from different rtprof builds)";
    case RTPROF_ERR_BOUNDS: return "presentation segment malformed: a size, offset or count is out of bounds";
    case RTPROF_ERR_NO_PROCESS: return "no such process in the table";
    case RTPROF_ERR_CHECKSUM: return "presentation segment corrupted (a version 3 row checksum)";
    default: return "unknown rtprof error";
    }
}

static int within(uint64_t off, uint64_t n, uint64_t len) { return off <= len && n <= len - off; }

/* Checks that a buffer header's regions lie in `len` bytes and are aligned
 * for their records; sets *end to the end of the last one. */
static int regions(const buf_header *bh, uint64_t len, uint64_t *end) {
    if (len < sizeof *bh ||
        !within(bh->procs_off, (uint64_t)bh->proc_count * sizeof(rtprof_proc), len) ||
        !within(bh->rows_off, (uint64_t)bh->row_count * sizeof(rtprof_row), len) ||
        !within(bh->hash_off, (uint64_t)bh->hash_cap * 4, len) ||
        !within(bh->strings_off, bh->strings_len, len) ||
        bh->procs_off % 8 || bh->rows_off % 8 || bh->hash_off % 4 ||
        (uint64_t)bh->global_first + bh->global_count != bh->row_count ||
        bh->hash_cap == 0 || (bh->hash_cap & (bh->hash_cap - 1)))
        return RTPROF_ERR_BOUNDS;
    uint64_t e = sizeof *bh, x;
    if ((x = bh->procs_off + (uint64_t)bh->proc_count * sizeof(rtprof_proc)) > e) e = x;
    if ((x = bh->rows_off + (uint64_t)bh->row_count * sizeof(rtprof_row)) > e) e = x;
    if ((x = bh->hash_off + (uint64_t)bh->hash_cap * 4) > e) e = x;
    if ((x = (uint64_t)bh->strings_off + bh->strings_len) > e) e = x;
    *end = e;
    return RTPROF_OK;
}

/* Checks every process, row and hash entry of a private copy of `len`
 * bytes, so users of the view need no checks of their own. */
static int contents(const uint8_t *copy, uint64_t len, buf_header *bh) {
    uint64_t end;
    memcpy(bh, copy, sizeof *bh);
    int rc = regions(bh, len, &end);
    if (rc) return rc;
    const rtprof_proc *procs = (const rtprof_proc *)(copy + bh->procs_off);
    const rtprof_row *rows = (const rtprof_row *)(copy + bh->rows_off);
    const uint32_t *hash = (const uint32_t *)(copy + bh->hash_off);
    for (uint32_t i = 0; i < bh->proc_count; i++) {
        const rtprof_proc *p = &procs[i];
        /* Its rows, then its threads' rows, all before the global rows. */
        if (p->thread_rows > bh->global_first ||
            (uint64_t)p->first_row + p->row_count + p->thread_rows > bh->global_first ||
            !within(p->exe_off, p->exe_len, bh->strings_len))
            return RTPROF_ERR_BOUNDS;
    }
    for (uint32_t i = 0; i < bh->row_count; i++) {
        const rtprof_row *r = &rows[i];
        if (r->proc_index >= bh->proc_count ||
            !within(r->name_off, r->name_len, bh->strings_len) ||
            !within(r->module_off, r->module_len, bh->strings_len))
            return RTPROF_ERR_BOUNDS;
    }
    for (uint32_t i = 0; i < bh->hash_cap; i++)
        if (hash[i] != UINT32_MAX && (hash[i] < bh->global_first || hash[i] >= bh->row_count))
            return RTPROF_ERR_BOUNDS;
    return RTPROF_OK;
}

/* Checks the segment header; *h gets it. The generation and sequence
 * words are read as atomics, hence the alignment. */
static int segment_header(const rtprof_segment *s, seg_header *h) {
    if (!s->map || s->len < sizeof *h) return RTPROF_ERR_TRUNCATED;
    if ((uintptr_t)s->map % 8) return RTPROF_ERR_BOUNDS;
    memcpy(h, s->map, sizeof *h);
    if (memcmp(h->magic, "RTPROFP", 8) != 0) return RTPROF_ERR_MAGIC;
    if (h->version != RTPROF_PRESENT_VERSION) return RTPROF_ERR_VERSION;
    if (h->buffer_len < sizeof(buf_header)) return RTPROF_ERR_BOUNDS;
    for (int i = 0; i < 2; i++)
        if (h->buffer_off[i] < sizeof *h || h->buffer_off[i] % 8 || !within(h->buffer_off[i], h->buffer_len, s->len))
            return RTPROF_ERR_BOUNDS;
    return RTPROF_OK;
}

int rtprof_take(const rtprof_segment *s, rtprof_view *v) {
    memset(v, 0, sizeof *v);
    seg_header h;
    int hrc = segment_header(s, &h);
    if (hrc != RTPROF_OK) return hrc;
    const volatile uint64_t *gen_word = (const volatile uint64_t *)(s->map + offsetof(seg_header, generation));
    uint8_t *copy = NULL;
    uint64_t cap = 0;
    int rc = RTPROF_ERR_BUSY;
    for (int attempt = 0; attempt < 1000; attempt++) {
        uint64_t gen = __atomic_load_n(gen_word, __ATOMIC_ACQUIRE);
        if (gen == 0) {
            rc = RTPROF_ERR_UNPUBLISHED;
            break;
        }
        const uint8_t *b = s->map + h.buffer_off[gen & 1];
        const volatile uint64_t *seq = (const volatile uint64_t *)b;
        uint64_t s1 = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
        if (s1 & 1) {
            rc = RTPROF_ERR_BUSY;
            continue;
        }
        /* Copy only the part of the buffer the table uses; the header that
         * says how much may be mid-rewrite, so it is checked first, and
         * the copy is checked again on its own below. */
        buf_header bh;
        memcpy(&bh, b, sizeof bh);
        uint64_t used = 0;
        rc = regions(&bh, h.buffer_len, &used);
        if (rc == RTPROF_OK) {
            if (used > cap) {
                free(copy);
                copy = malloc(used);
                cap = copy ? used : 0;
                if (!copy) return RTPROF_ERR_SYSTEM;
            }
            memcpy(copy, b, used);
        }
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(seq, __ATOMIC_RELAXED) != s1) {
            rc = RTPROF_ERR_BUSY;
            continue;
        }
        if (rc != RTPROF_OK) break;
        rc = contents(copy, used, &bh);
        if (rc != RTPROF_OK) break;
        v->buf = copy;
        v->generation = gen;
        v->span_end_ns = bh.span_end_ns;
        v->span_ns = bh.span_ns;
        v->publish_ns = bh.publish_ns;
        v->tick_ns = h.tick_ns;
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
        return RTPROF_OK;
    }
    free(copy);
    return rc;
}

void rtprof_release(rtprof_view *v) {
    free(v->buf);
    memset(v, 0, sizeof *v);
}

uint64_t rtprof_age_ns(const rtprof_view *v) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    return now > v->publish_ns ? now - v->publish_ns : 0;
}

int rtprof_is_stale(const rtprof_view *v) {
    return rtprof_age_ns(v) > v->tick_ns * RTPROF_STALE_TICKS + 1000000000ull;
}

/* Copies string (off, len) of `strings` into out, NUL-terminated and cut
 * to size; an out-of-bounds string copies as empty. */
static char *copy_string(const char *strings, uint32_t strings_len, uint32_t off, uint32_t len, char *out,
                         size_t size) {
    if (size == 0) return out;
    if (!within(off, len, strings_len)) len = 0, off = 0;
    size_t n = len < size - 1 ? len : size - 1;
    if (n) memcpy(out, strings + off, n);
    out[n] = 0;
    return out;
}

char *rtprof_string(const rtprof_view *v, uint32_t off, uint32_t len, char *out, size_t size) {
    return copy_string(v->strings, v->strings_len, off, len, out, size);
}

static int equals(const rtprof_view *v, uint32_t off, uint32_t len, const char *s) {
    return within(off, len, v->strings_len) && strlen(s) == len && memcmp(v->strings + off, s, len) == 0;
}

const rtprof_row *rtprof_lookup(const rtprof_view *v, const char *exe, const char *name) {
    if (v->hash_cap == 0) return NULL;
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

/* One attempt at copying process `pid` out of buffer `b` (header `bh`,
 * regions checked): its entry by binary search (entries are in pid
 * order), its rows, then their strings. Everything read from `b` may be
 * mid-rewrite: the caller checks the sequence word afterwards, and the
 * copy is checked here on its own. */
static int copy_process(const uint8_t *b, const buf_header *bh, uint32_t pid, rtprof_process_view *v) {
    const uint8_t *procs = b + bh->procs_off;
    uint32_t lo = 0, hi = bh->proc_count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        rtprof_proc p;
        memcpy(&p, procs + (uint64_t)mid * sizeof p, sizeof p);
        if (p.pid < pid) lo = mid + 1;
        else hi = mid;
    }
    if (lo >= bh->proc_count) return RTPROF_ERR_NO_PROCESS;
    memcpy(&v->proc, procs + (uint64_t)lo * sizeof v->proc, sizeof v->proc);
    rtprof_proc *p = &v->proc;
    if (p->pid != pid) return RTPROF_ERR_NO_PROCESS;
    if ((uint64_t)p->first_row + p->row_count > bh->global_first || !within(p->exe_off, p->exe_len, bh->strings_len))
        return RTPROF_ERR_BOUNDS;
    /* Its own rows only are copied: the view holds no thread rows. */
    p->thread_rows = 0;
    /* Rows first, then the strings they name, sized from the copy. */
    uint64_t rows_len = (uint64_t)p->row_count * sizeof(rtprof_row);
    rtprof_row *rows = malloc(rows_len ? rows_len : 1);
    if (!rows) return RTPROF_ERR_SYSTEM;
    memcpy(rows, b + bh->rows_off + (uint64_t)p->first_row * sizeof(rtprof_row), rows_len);
    uint64_t strings_len = p->exe_len;
    for (uint32_t i = 0; i < p->row_count; i++) {
        if (!within(rows[i].name_off, rows[i].name_len, bh->strings_len) ||
            !within(rows[i].module_off, rows[i].module_len, bh->strings_len)) {
            free(rows);
            return RTPROF_ERR_BOUNDS;
        }
        strings_len += (uint64_t)rows[i].name_len + rows[i].module_len;
    }
    /* Offsets into the copy are 32-bit, as in the segment. */
    if (strings_len > UINT32_MAX) {
        free(rows);
        return RTPROF_ERR_BOUNDS;
    }
    uint8_t *buf = malloc(rows_len + strings_len + 1);
    if (!buf) {
        free(rows);
        return RTPROF_ERR_SYSTEM;
    }
    char *strings = (char *)buf + rows_len;
    const uint8_t *from = b + bh->strings_off;
    uint32_t at = 0;
#define TAKE(off, len)                                 \
    do {                                               \
        memcpy(strings + at, from + (off), (len));     \
        (off) = at;                                    \
        at += (len);                                   \
    } while (0)
    TAKE(p->exe_off, p->exe_len);
    for (uint32_t i = 0; i < p->row_count; i++) {
        TAKE(rows[i].name_off, rows[i].name_len);
        TAKE(rows[i].module_off, rows[i].module_len);
        rows[i].proc_index = 0;
    }
#undef TAKE
    memcpy(buf, rows, rows_len);
    free(rows);
    p->first_row = 0;
    v->buf = buf;
    v->rows = (const rtprof_row *)buf;
    v->row_count = p->row_count;
    v->strings = strings;
    v->strings_len = at;
    return RTPROF_OK;
}

int rtprof_take_process(const rtprof_segment *s, uint32_t pid, rtprof_process_view *v) {
    memset(v, 0, sizeof *v);
    seg_header h;
    int rc = segment_header(s, &h);
    if (rc != RTPROF_OK) return rc;
    const volatile uint64_t *gen_word = (const volatile uint64_t *)(s->map + offsetof(seg_header, generation));
    rc = RTPROF_ERR_BUSY;
    for (int attempt = 0; attempt < 1000; attempt++) {
        uint64_t gen = __atomic_load_n(gen_word, __ATOMIC_ACQUIRE);
        if (gen == 0) return RTPROF_ERR_UNPUBLISHED;
        const uint8_t *b = s->map + h.buffer_off[gen & 1];
        const volatile uint64_t *seq = (const volatile uint64_t *)b;
        uint64_t s1 = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
        if (s1 & 1) continue;
        buf_header bh;
        memcpy(&bh, b, sizeof bh);
        uint64_t used;
        rc = regions(&bh, h.buffer_len, &used);
        if (rc == RTPROF_OK) rc = copy_process(b, &bh, pid, v);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(seq, __ATOMIC_RELAXED) != s1) {
            rtprof_release_process(v);
            rc = RTPROF_ERR_BUSY;
            continue;
        }
        if (rc != RTPROF_OK) {
            rtprof_release_process(v);
            return rc;
        }
        v->generation = gen;
        v->span_end_ns = bh.span_end_ns;
        v->span_ns = bh.span_ns;
        v->publish_ns = bh.publish_ns;
        v->tick_ns = h.tick_ns;
        return RTPROF_OK;
    }
    return rc;
}

void rtprof_release_process(rtprof_process_view *v) {
    free(v->buf);
    memset(v, 0, sizeof *v);
}

char *rtprof_process_string(const rtprof_process_view *v, uint32_t off, uint32_t len, char *out, size_t size) {
    return copy_string(v->strings, v->strings_len, off, len, out, size);
}
