/* Work in libc from the first sample: libc is only sampled, so its
 * functions are listed when a sample first lands in it, and the samples
 * taken before that wait for the names. The program prints how many
 * buffers it filled. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 20000;
    size_t len = 1 << 20;
    char *buf = malloc(len);
    unsigned long sum = 0;
    for (long i = 0; i < rounds; i++) {
        memset(buf, (int)i, len);
        sum += (unsigned char)buf[i % len];
    }
    printf("%lu\nBUFFERS %ld\n", sum, rounds);
    free(buf);
    return 0;
}
