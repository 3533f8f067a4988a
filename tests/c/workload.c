/* A small but ordinary program: a tokenizer and recursive-descent
 * evaluator (switches compile to jump tables), a hash table, qsort with a
 * comparator, string helpers. Every function counts its own calls and the
 * program prints them as EXPECT lines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { F_NEXT_TOKEN, F_PARSE_EXPR, F_PARSE_TERM, F_PARSE_FACTOR, F_APPLY, F_HASH, F_LOOKUP,
       F_INSERT, F_CMP, F_CLASSIFY, F_REVERSE, F_CHECKSUM, F_NFUNCS };
static const char *names[F_NFUNCS] = {"next_token", "parse_expr", "parse_term", "parse_factor",
    "apply", "hash", "lookup", "insert", "cmp_ints", "classify", "reverse", "checksum"};
static long counts[F_NFUNCS];
#define COUNT(f) (counts[f]++)
#define NOINLINE __attribute__((noinline, noclone))

typedef struct { const char *p; int tok; long val; } Lexer;
volatile long sink_depth;

NOINLINE void next_token(Lexer *lx) {
    COUNT(F_NEXT_TOKEN);
    while (*lx->p == ' ') lx->p++;
    char c = *lx->p;
    if (c >= '0' && c <= '9') {
        lx->val = strtol(lx->p, (char **)&lx->p, 10);
        lx->tok = 'n';
        return;
    }
    lx->tok = c ? c : 0;
    if (c) lx->p++;
}

NOINLINE long apply(int op, long a, long b) {
    COUNT(F_APPLY);
    switch (op) {
    case '+': return a + b;
    case '-': return a - b;
    case '*': return a * b;
    case '/': return b ? a / b : 0;
    case '%': return b ? a % b : 0;
    case '&': return a & b;
    case '|': return a | b;
    case '^': return a ^ b;
    default: return 0;
    }
}

NOINLINE long parse_expr(Lexer *lx);

NOINLINE long parse_factor(Lexer *lx) {
    COUNT(F_PARSE_FACTOR);
    if (lx->tok == 'n') { long v = lx->val; next_token(lx); return v; }
    if (lx->tok == '(') { next_token(lx); long v = parse_expr(lx); next_token(lx); return v; }
    if (lx->tok == '-') {
        next_token(lx);
        /* Not a tail position: keeps GCC from turning the recursion into a loop. */
        long v = parse_factor(lx);
        sink_depth = v;
        return -v;
    }
    return 0;
}

NOINLINE long parse_term(Lexer *lx) {
    COUNT(F_PARSE_TERM);
    long v = parse_factor(lx);
    while (lx->tok == '*' || lx->tok == '/' || lx->tok == '%' || lx->tok == '&') {
        int op = lx->tok; next_token(lx);
        v = apply(op, v, parse_factor(lx));
    }
    return v;
}

NOINLINE long parse_expr(Lexer *lx) {
    COUNT(F_PARSE_EXPR);
    long v = parse_term(lx);
    while (lx->tok == '+' || lx->tok == '-' || lx->tok == '|' || lx->tok == '^') {
        int op = lx->tok; next_token(lx);
        v = apply(op, v, parse_term(lx));
    }
    return v;
}

#define NBUCKETS 64
typedef struct Entry { char key[24]; long val; struct Entry *next; } Entry;
static Entry *table[NBUCKETS];

NOINLINE unsigned hash(const char *s) {
    COUNT(F_HASH);
    unsigned h = 2166136261u;
    while (*s) h = (h ^ (unsigned char)*s++) * 16777619u;
    return h;
}

NOINLINE Entry *lookup(const char *k) {
    COUNT(F_LOOKUP);
    for (Entry *e = table[hash(k) % NBUCKETS]; e; e = e->next)
        if (!strcmp(e->key, k)) return e;
    return NULL;
}

NOINLINE void insert(const char *k, long v) {
    COUNT(F_INSERT);
    Entry *e = lookup(k);
    if (!e) {
        e = calloc(1, sizeof *e);
        snprintf(e->key, sizeof e->key, "%s", k);
        unsigned b = hash(k) % NBUCKETS;
        e->next = table[b];
        table[b] = e;
    }
    e->val += v;
}

NOINLINE int cmp_ints(const void *a, const void *b) {
    COUNT(F_CMP);
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

NOINLINE const char *classify(int c) {
    COUNT(F_CLASSIFY);
    switch (c % 12) {
    case 0: return "zero"; case 1: return "one"; case 2: return "two"; case 3: return "three";
    case 4: return "four"; case 5: return "five"; case 6: return "six"; case 7: return "seven";
    case 8: return "eight"; case 9: return "nine"; case 10: return "ten"; default: return "eleven";
    }
}

NOINLINE void reverse(char *s) {
    COUNT(F_REVERSE);
    size_t n = strlen(s);
    for (size_t i = 0; i < n / 2; i++) { char t = s[i]; s[i] = s[n - 1 - i]; s[n - 1 - i] = t; }
}

NOINLINE unsigned long checksum(const long *v, int n) {
    COUNT(F_CHECKSUM);
    unsigned long h = 0;
    for (int i = 0; i < n; i++) h = h * 31 + (unsigned long)v[i];
    return h;
}

int main(void) {
    static const char *exprs[] = {"1 + 2 * 3", "(4 + 5) * (6 - 7) / 2", "-(3 ^ 5) | 8 & 12",
                                  "100 % 7 + 2 * (3 + (4 * (5 - 1)))", "((((1))))", "9 / 0 + 1"};
    long results[600];
    int nres = 0;
    for (int round = 0; round < 100; round++) {
        for (unsigned i = 0; i < sizeof exprs / sizeof *exprs; i++) {
            Lexer lx = {exprs[i], 0, 0};
            next_token(&lx);
            long v = parse_expr(&lx) + round;
            results[nres++] = v;
            char key[24];
            snprintf(key, sizeof key, "%s", classify((int)(v < 0 ? -v : v)));
            reverse(key);
            insert(key, v);
        }
    }
    qsort(results, nres, sizeof *results, cmp_ints);
    printf("checksum %lu median %ld\n", checksum(results, nres), results[nres / 2]);
    for (int b = 0; b < NBUCKETS; b++)
        for (Entry *e = table[b]; e; e = e->next) printf("%s=%ld\n", e->key, e->val);
    for (int f = 0; f < F_NFUNCS; f++) printf("EXPECT %s %ld\n", names[f], counts[f]);
    return 0;
}
