/* Entries reached by a jump with data live in the red zone below rsp, as in
 * BOLT- and compiler-split functions.
 *
 * rz_head keeps its arguments in its red zone and jumps to rz_tail, which
 * reads them back: rz_tail looks like an ordinary function (named, sized,
 * never jumping back) and is patched, so its stub must not write below rsp.
 * split_head jumps into split_head.warm, a BOLT-style fragment that is not
 * a function at all and must not be listed or counted as one. */
#include <stdio.h>
#include <stdlib.h>

__asm__(".text\n"
        ".globl rz_head\n.hidden rz_head\n.type rz_head,@function\n"
        ".p2align 4\n"
        "rz_head:\n"
        "  mov %rdi, -8(%rsp)\n"
        "  mov %rsi, -16(%rsp)\n"
        "  jmp rz_tail\n"
        ".size rz_head, .-rz_head\n"
        ".globl rz_tail\n.hidden rz_tail\n.type rz_tail,@function\n"
        ".p2align 4\n"
        "rz_tail:\n"
        "  mov -8(%rsp), %rax\n"
        "  imul -16(%rsp), %rax\n"
        "  ret\n"
        ".size rz_tail, .-rz_tail\n"
        ".globl split_head\n.hidden split_head\n.type split_head,@function\n"
        ".p2align 4\n"
        "split_head:\n"
        "  mov %rdi, -24(%rsp)\n"
        "  lea 1(%rdi), %rax\n"
        "  cmp $0, %rdi\n"
        "  jge split_head.warm\n"
        "  ret\n"
        ".size split_head, .-split_head\n"
        ".type split_head.warm,@function\n"
        ".p2align 4\n"
        "split_head.warm:\n"
        "  add -24(%rsp), %rax\n"
        "  ret\n"
        ".size split_head.warm, .-split_head.warm\n");

long rz_head(long a, long b);
long split_head(long a);

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000;
    long sum = 0;
    for (long i = 0; i < n; i++) {
        sum += rz_head(i & 0xffff, 3);
        sum += split_head(i & 0xff);
    }
    printf("sum %ld\n", sum);
    printf("EXPECT rz_head %ld\n", n);
    printf("EXPECT rz_tail %ld\n", n);
    printf("EXPECT split_head %ld\n", n);
    return 0;
}
