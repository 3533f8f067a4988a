/* Function entries of known shapes, written in assembly so every
 * optimisation level sees the same bytes: 1-4-byte functions followed by
 * alignment fill, a packed one that is too small, a loop target at the first
 * instruction (must be refused, never broken), a loop whose rel32 branch
 * lands on the second of the moved instructions, one reached through
 * dead fill inside the function, and entries that begin with a
 * rip-relative load, a short jcc, or a call. Each has unwind info, as
 * real assembly functions do, so stripped builds still list them. */
#include <stdio.h>
#include <stdint.h>

int shape_ret1(void);       /* 1 byte: ret */
int shape_xor3(void);       /* 3 bytes: xor eax,eax; ret */
int shape_lea4(int, int);   /* 4 bytes: lea eax,[rdi+rsi]; ret */
int shape_endbr_ret(void);  /* endbr64; ret */
int shape_packed(void);     /* 1 byte, next function follows at once */
int shape_after_packed(void);
int shape_loop(int);        /* loop back to the first instruction */
int shape_loop32(int);      /* the same loop, its branch back a jcc rel32 */
int shape_short(int);       /* push rbx; mov rbx,rdi; then a loop to +4 */
int shape_mid(int);         /* push rbx; then a loop to +1 through a jcc rel32 */
int shape_fall(int);        /* add edi,1, then runs on through fill into: */
int shape_fall_into(int);   /* as shape_short: its fill is not dead */
int shape_inner(int);       /* as shape_short, no fill before it: aligned dead fill inside */
int shape_riprel(int);      /* mov eax,[rip+x]; add eax,edi; ret */
int shape_jcc(int);         /* test edi,edi; je ...; short jcc in window */
uintptr_t shape_call(void); /* call get_ret; ret -> returns its own return address */
uintptr_t get_ret(void);

int shape_data = 40;

__asm__(
    ".intel_syntax noprefix\n"
    ".text\n"
    ".p2align 4\n"
    ".globl shape_ret1\n.type shape_ret1,@function\n"
    ".cfi_startproc\n"
    "shape_ret1: ret\n"
    ".cfi_endproc\n"
    ".size shape_ret1, .-shape_ret1\n"
    ".p2align 4\n"
    ".globl shape_xor3\n.type shape_xor3,@function\n"
    ".cfi_startproc\n"
    "shape_xor3: xor eax,eax\n ret\n"
    ".cfi_endproc\n"
    ".size shape_xor3, .-shape_xor3\n"
    ".p2align 4\n"
    ".globl shape_lea4\n.type shape_lea4,@function\n"
    ".cfi_startproc\n"
    "shape_lea4: lea eax,[rdi+rsi]\n ret\n"
    ".cfi_endproc\n"
    ".size shape_lea4, .-shape_lea4\n"
    ".p2align 4\n"
    ".globl shape_endbr_ret\n.type shape_endbr_ret,@function\n"
    ".cfi_startproc\n"
    "shape_endbr_ret: endbr64\n ret\n"
    ".cfi_endproc\n"
    ".size shape_endbr_ret, .-shape_endbr_ret\n"
    ".p2align 4\n"
    ".globl shape_packed\n.type shape_packed,@function\n"
    ".cfi_startproc\n"
    "shape_packed: ret\n"
    ".cfi_endproc\n"
    ".size shape_packed, .-shape_packed\n"
    ".globl shape_after_packed\n.type shape_after_packed,@function\n"
    ".cfi_startproc\n"
    "shape_after_packed: mov eax, 7\n ret\n"
    ".cfi_endproc\n"
    ".size shape_after_packed, .-shape_after_packed\n"
    ".p2align 4\n"
    ".globl shape_loop\n.type shape_loop,@function\n"
    ".cfi_startproc\n"
    "shape_loop:\n"
    "1: add eax, 2\n sub edi, 1\n jg 1b\n ret\n"
    ".cfi_endproc\n"
    ".size shape_loop, .-shape_loop\n"
    ".p2align 4\n"
    ".globl shape_loop32\n.type shape_loop32,@function\n"
    ".cfi_startproc\n"
    "shape_loop32:\n"
    "3: add eax, 1\n sub edi, 1\n .byte 0x0f, 0x8f\n .long 3b - (. + 4)\n ret\n"
    ".cfi_endproc\n"
    ".size shape_loop32, .-shape_loop32\n"
    ".p2align 5\n"
    ".globl shape_short\n.type shape_short,@function\n"
    ".cfi_startproc\n"
    "shape_short: push rbx\n mov rbx, rdi\n"
    "5: add eax, 1\n sub rbx, 1\n jg 5b\n pop rbx\n ret\n"
    ".cfi_endproc\n"
    ".size shape_short, .-shape_short\n"
    ".p2align 4\n"
    ".globl shape_mid\n.type shape_mid,@function\n"
    ".cfi_startproc\n"
    "shape_mid: push rbx\n .cfi_adjust_cfa_offset 8\n"
    "8: add eax, 3\n sub edi, 1\n .byte 0x0f, 0x8f\n .long 8b - (. + 4)\n"
    " pop rbx\n .cfi_adjust_cfa_offset -8\n ret\n"
    ".cfi_endproc\n"
    ".size shape_mid, .-shape_mid\n"
    ".p2align 4\n"
    ".globl shape_fall\n.type shape_fall,@function\n"
    ".cfi_startproc\n"
    "shape_fall: add edi, 1\n"
    ".cfi_endproc\n"
    ".size shape_fall, .-shape_fall\n"
    ".p2align 5\n"
    ".globl shape_fall_into\n.type shape_fall_into,@function\n"
    ".cfi_startproc\n"
    "shape_fall_into: push rbx\n mov rbx, rdi\n"
    "6: add eax, 1\n sub rbx, 1\n jg 6b\n pop rbx\n ret\n"
    ".cfi_endproc\n"
    ".size shape_fall_into, .-shape_fall_into\n"
    ".globl shape_inner\n.type shape_inner,@function\n"
    ".cfi_startproc\n"
    "shape_inner: push rbx\n mov rbx, rdi\n"
    "9: add eax, 1\n sub rbx, 1\n jg 9b\n mov ecx, 1\n jmp 4f\n"
    " .p2align 4\n"
    "4: pop rbx\n ret\n"
    ".cfi_endproc\n"
    ".size shape_inner, .-shape_inner\n"
    ".p2align 4\n"
    ".globl shape_riprel\n.type shape_riprel,@function\n"
    ".cfi_startproc\n"
    "shape_riprel: mov eax, DWORD PTR [rip+shape_data]\n add eax, edi\n ret\n"
    ".cfi_endproc\n"
    ".size shape_riprel, .-shape_riprel\n"
    ".p2align 4\n"
    ".globl shape_jcc\n.type shape_jcc,@function\n"
    ".cfi_startproc\n"
    "shape_jcc: test edi, edi\n je 2f\n mov eax, 1\n ret\n"
    "2: mov eax, -1\n ret\n"
    ".cfi_endproc\n"
    ".size shape_jcc, .-shape_jcc\n"
    ".p2align 4\n"
    ".globl get_ret\n.type get_ret,@function\n"
    ".cfi_startproc\n"
    "get_ret: mov rax, QWORD PTR [rsp]\n ret\n"
    ".cfi_endproc\n"
    ".size get_ret, .-get_ret\n"
    ".p2align 4\n"
    ".globl shape_call\n.type shape_call,@function\n"
    ".cfi_startproc\n"
    "shape_call: call get_ret\n ret\n"
    ".cfi_endproc\n"
    ".size shape_call, .-shape_call\n"
    ".att_syntax prefix\n");

/* Calls a shape that counts its loop's iterations in eax, from 0 (the
 * call steps over this function's red zone first). */
static int looped(int (*shape)(int), int n) {
    int r;
    __asm__ volatile("xor %%eax, %%eax\n lea -128(%%rsp), %%rsp\n call *%[f]\n lea 128(%%rsp), %%rsp"
                     : "=&a"(r), "+D"(n)
                     : [f] "r"(shape)
                     : "rcx", "rdx", "rsi", "r8", "r9", "r10", "r11", "memory", "cc");
    return r;
}

int main(void) {
    long s = 0;
    for (int i = 0; i < 11; i++) shape_ret1(); /* eax is undefined */
    for (int i = 0; i < 12; i++) s += shape_xor3();
    for (int i = 0; i < 13; i++) s += shape_lea4(i, 1);
    for (int i = 0; i < 14; i++) shape_endbr_ret();
    for (int i = 0; i < 15; i++) { shape_packed(); s += shape_after_packed(); }
    /* shape_loop is called 16 times; eax starts undefined, so only its
     * iteration count matters: it must return having looped. */
    for (int i = 0; i < 16; i++) shape_loop(i + 1);
    /* A branch back to the entry is a loop, not a call: 20 calls, 210
     * iterations, and eax counts them from 0 (shape_ret1's xor is not
     * relied on: eax is set here). */
    int iterations = 0;
    for (int i = 0; i < 20; i++) iterations += looped(shape_loop32, i + 1);
    /* Through the fill that shape_fall runs on into: 22 runs of n + 1
     * iterations; shape_fall_into's fill is not a place for a trampoline. */
    for (int i = 0; i < 22; i++) iterations += looped(shape_fall, i + 1);
    /* The same through a short entry: a loop lands 4 bytes in. */
    for (int i = 0; i < 21; i++) iterations += looped(shape_short, i + 1);
    /* The same with no fill before it: its trampoline goes in the dead
     * fill after its loop's exit jump. */
    for (int i = 0; i < 24; i++) iterations += looped(shape_inner, i + 1);
    /* A loop that lands on the second moved instruction: sent to its copy
     * (no short entry: one byte moves before it), 3 a turn. */
    for (int i = 0; i < 23; i++) iterations += looped(shape_mid, i + 1);
    for (int i = 0; i < 17; i++) s += shape_riprel(i);
    int pos = 0, neg = 0;
    for (int i = 0; i < 18; i++) (shape_jcc(i % 3) > 0) ? pos++ : neg++;
    int ret_ok = 1;
    for (int i = 0; i < 19; i++)
        ret_ok &= shape_call() == (uintptr_t)shape_call + 5;
    printf("s=%ld pos=%d neg=%d ret_ok=%d iterations=%d\n", s, pos, neg, ret_ok, iterations);
    printf("EXPECT shape_ret1 11\nEXPECT shape_xor3 12\nEXPECT shape_lea4 13\n");
    printf("EXPECT shape_endbr_ret 14\nEXPECT shape_after_packed 15\n");
    printf("EXPECT shape_loop32 20\nEXPECT shape_short 21\nEXPECT shape_mid 23\n");
    printf("EXPECT shape_inner 24\n");
    printf("EXPECT shape_riprel 17\nEXPECT shape_jcc 18\nEXPECT shape_call 19\nEXPECT get_ret 19\n");
    printf("EXPECT_REFUSED shape_packed too_small\n");
    printf("EXPECT_REFUSED shape_loop branch_into_window\n");
    printf("EXPECT_REFUSED shape_fall_into branch_into_window\n");
    return ret_ok && iterations == 210 + 275 + 231 + 300 + 3 * 276 ? 0 : 1;
}
