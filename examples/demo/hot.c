/* A small program to profile: a hash table filled with generated words,
 * then looked up many times. Each function is called a known number of
 * times, printed at the end, to compare with rtprof's counts. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS (1 << 16)
#define WORDS 50000
#define ROUNDS 40

struct entry {
    char word[16];
    unsigned count;
    struct entry *next;
};

static struct entry *table[SLOTS];
static unsigned long calls_hash, calls_insert, calls_lookup, calls_make;

__attribute__((noinline)) static uint32_t hash(const char *s) {
    calls_hash++;
    uint32_t h = 2166136261u;
    while (*s)
        h = (h ^ (unsigned char)*s++) * 16777619u;
    return h;
}

__attribute__((noinline)) static void make_word(unsigned i, char *out) {
    calls_make++;
    for (int k = 0; k < 8; k++) {
        out[k] = 'a' + (i % 26);
        i = i / 26 + k * 7919;
    }
    out[8] = 0;
}

__attribute__((noinline)) static void insert(const char *w) {
    calls_insert++;
    uint32_t h = hash(w) % SLOTS;
    for (struct entry *e = table[h]; e; e = e->next)
        if (!strcmp(e->word, w)) {
            e->count++;
            return;
        }
    struct entry *e = calloc(1, sizeof *e);
    strcpy(e->word, w);
    e->count = 1;
    e->next = table[h];
    table[h] = e;
}

__attribute__((noinline)) static unsigned lookup(const char *w) {
    calls_lookup++;
    for (struct entry *e = table[hash(w) % SLOTS]; e; e = e->next)
        if (!strcmp(e->word, w))
            return e->count;
    return 0;
}

int main(void) {
    char w[16];
    for (unsigned i = 0; i < WORDS; i++) {
        make_word(i, w);
        insert(w);
    }
    unsigned long found = 0;
    for (int r = 0; r < ROUNDS; r++)
        for (unsigned i = 0; i < WORDS * 2; i++) {
            make_word(i, w);
            found += lookup(w) != 0;
        }
    printf("found %lu; calls: make_word %lu, hash %lu, insert %lu, lookup %lu\n", found,
           calls_make, calls_hash, calls_insert, calls_lookup);
    return 0;
}
