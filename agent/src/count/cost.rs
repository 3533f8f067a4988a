//! What the agent costs its process, measured where it is spent and kept
//! in the counter segment's cost block (`layout::cost`), so `rtprof run`,
//! rtprofd and `rtprof top` can show it per process: the CPU time of the
//! agent's threads (each adds its own after every tick), of the timer
//! sampler's signal handlers, the time the budget holds the program's
//! threads still, and, through the sampler, the samples that land in
//! stubs (counting's cost). Start-up has its own header field.

use rtprof_abi::layout::cost;
use std::sync::atomic::Ordering;

/// Adds `ns` to word `word` of the cost block. Allocation-free and
/// async-signal-safe.
pub fn add(word: usize, ns: u64) {
    if ns == 0 {
        return;
    }
    if let Some(a) = crate::agent() {
        a.segment
            .counters
            .cost(word)
            .fetch_add(ns, Ordering::Relaxed);
    }
}

/// Brings the process's CPU time in the block up to date, so a reader
/// can put the rest in proportion.
pub fn note_process_cpu() {
    if let Some(a) = crate::agent() {
        a.segment
            .counters
            .cost(cost::PROCESS_CPU_NS)
            // Several threads update it: a late store never moves it back.
            .fetch_max(clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID), Ordering::Relaxed);
    }
}

/// The calling thread's CPU time, in ns: a system call (the vDSO does
/// not serve CPU clocks), async-signal-safe, exact to the nanosecond the
/// kernel has accounted (a handler timed by wall time would count a stop
/// of the thread inside it).
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the timespec on our stack; clock_gettime is
    // async-signal-safe.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
