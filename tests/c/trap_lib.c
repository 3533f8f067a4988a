/* Two libraries of one layout (built with and without -DREFUSED): a
 * function, then two packed 2- and 3-byte functions only trap entries can
 * count. With REFUSED the first function cannot be patched at all
 * (`xbegin`), so the two libraries' stubs lie at different offsets. */
#ifdef REFUSED
__asm__(".text\n.globl first\n.type first,@function\nfirst:\n xbegin 1f\n1: nop\n nop\n nop\n"
        " nop\n nop\n ret\n.size first, .-first\n");
#else
__asm__(".text\n.globl first\n.type first,@function\nfirst:\n push %rbp\n mov %rsp,%rbp\n nop\n"
        " nop\n nop\n nop\n nop\n nop\n pop %rbp\n ret\n.size first, .-first\n");
#endif
__asm__(".globl tiny\n.type tiny,@function\ntiny:\n xor %eax,%eax\n ret\n.size tiny,.-tiny\n"
        ".globl tiny2\n.type tiny2,@function\ntiny2:\n lea 1(%rdi),%eax\n ret\n"
        ".size tiny2,.-tiny2\n");
