/* A library with one function that takes CPU time. */
__attribute__((noinline)) long busy(long x) {
    for (int i = 0; i < 1000; i++) x = x * 6364136223846793005L + 1442695040888963407L;
    return x;
}
