/* A plugin loaded with dlopen: a few functions of different shapes. */
volatile long plugin_sink;
__attribute__((noinline, noclone)) long plugin_work(long x) { plugin_sink += x; return x * 2; }
__attribute__((noinline, noclone)) long plugin_entry(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += plugin_work(i);
    return s;
}
