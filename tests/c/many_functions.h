/* MANY_FUNCTIONS(N): N functions many_0 .. many_<N-1>, written by the
 * assembler in a moment (a compiler takes seconds for thousands), each a
 * frame set up and torn down: patched as any other. */
#define MANY_FUNCTIONS_STR(x) #x
#define MANY_FUNCTIONS(n)                                                  \
    __asm__(".text\n"                                                      \
            ".altmacro\n"                                                  \
            ".macro many_fn k\n"                                           \
            ".globl many_\\k\n"                                            \
            ".type many_\\k, @function\n"                                  \
            "many_\\k: push %rbp\n mov %rsp, %rbp\n pop %rbp\n ret\n"       \
            ".size many_\\k, .-many_\\k\n"                                 \
            ".endm\n"                                                      \
            ".set many_i, 0\n"                                             \
            ".rept " MANY_FUNCTIONS_STR(n) "\n"                            \
            "many_fn %many_i\n"                                            \
            ".set many_i, many_i + 1\n"                                    \
            ".endr\n"                                                      \
            ".noaltmacro\n")
