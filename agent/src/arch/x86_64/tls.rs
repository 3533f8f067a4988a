//! The per-thread stripe pointer in static TLS, at a fixed offset from the
//! `fs` base: stubs reach it with one `mov rcx, fs:[offset]`; and the same
//! for the thread's loop counters (`RTPROF_LOOPS`), which loop probes reach,
//! and for the side stack of route stubs (two words: top and limit).

// An initial-exec TLS variable: a preloaded library's TLS block sits at a
// fixed offset from the thread pointer in every thread.
std::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 3",
    ".hidden rtprof_tls_stripe",
    ".type rtprof_tls_stripe, @object",
    ".size rtprof_tls_stripe, 8",
    "rtprof_tls_stripe:",
    ".zero 8",
    ".hidden rtprof_tls_loops",
    ".type rtprof_tls_loops, @object",
    ".size rtprof_tls_loops, 8",
    "rtprof_tls_loops:",
    ".zero 8",
    ".hidden rtprof_tls_route",
    ".type rtprof_tls_route, @object",
    ".size rtprof_tls_route, 16",
    "rtprof_tls_route:",
    ".zero 16",
    ".popsection",
    ".pushsection .text.rtprof_tls_route_offset,\"ax\",@progbits",
    ".globl rtprof_tls_route_offset",
    ".hidden rtprof_tls_route_offset",
    ".type rtprof_tls_route_offset, @function",
    "rtprof_tls_route_offset:",
    "mov rax, qword ptr [rip + rtprof_tls_route@GOTTPOFF]",
    "ret",
    ".size rtprof_tls_route_offset, . - rtprof_tls_route_offset",
    ".popsection",
    ".pushsection .text.rtprof_tls_loops_offset,\"ax\",@progbits",
    ".globl rtprof_tls_loops_offset",
    ".hidden rtprof_tls_loops_offset",
    ".type rtprof_tls_loops_offset, @function",
    "rtprof_tls_loops_offset:",
    "mov rax, qword ptr [rip + rtprof_tls_loops@GOTTPOFF]",
    "ret",
    ".size rtprof_tls_loops_offset, . - rtprof_tls_loops_offset",
    ".popsection",
    ".pushsection .text.rtprof_tls_offset,\"ax\",@progbits",
    ".globl rtprof_tls_offset",
    ".hidden rtprof_tls_offset",
    ".type rtprof_tls_offset, @function",
    "rtprof_tls_offset:",
    "mov rax, qword ptr [rip + rtprof_tls_stripe@GOTTPOFF]",
    "ret",
    ".size rtprof_tls_offset, . - rtprof_tls_offset",
    ".popsection",
);

extern "C" {
    fn rtprof_tls_offset() -> i64;
    fn rtprof_tls_loops_offset() -> i64;
    fn rtprof_tls_route_offset() -> i64;
}

/// Offset of the thread's side stack words (route stubs): the top, then
/// the limit a frame may start below.
pub fn route_offset() -> i64 {
    // SAFETY: a leaf function that only reads its GOT entry.
    unsafe { rtprof_tls_route_offset() }
}

/// Offset of the loop counters pointer from the thread pointer.
pub fn loops_offset() -> i64 {
    // SAFETY: a leaf function that only reads its GOT entry.
    unsafe { rtprof_tls_loops_offset() }
}

/// Offset of the stripe pointer from the thread pointer (negative).
pub fn offset() -> i64 {
    // SAFETY: a leaf function that only reads its GOT entry.
    unsafe { rtprof_tls_offset() }
}

pub fn load(off: i64) -> u64 {
    let v: u64;
    // SAFETY: `off` is our TLS variable's offset from fs: this thread's own.
    unsafe {
        std::arch::asm!("mov {v}, qword ptr fs:[{off}]", off = in(reg) off, v = out(reg) v, options(nostack, readonly))
    };
    v
}

pub fn store(off: i64, v: u64) {
    // SAFETY: as in `load`.
    unsafe {
        std::arch::asm!("mov qword ptr fs:[{off}], {v}", off = in(reg) off, v = in(reg) v, options(nostack))
    };
}
