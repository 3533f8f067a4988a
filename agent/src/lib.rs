//! librtprof.so, the rtprof agent. Preloaded into a process, it counts every
//! call of every instrumented function exactly, in a shared counter segment.
//!
//! Start-up (before `main`): configuration -> modules (`discover`) -> their
//! plans, cached or analysed (`plan`) -> counter segment (`count`) -> stubs
//! and entries patched (`patch`) -> sampler (`sampling`); `lifecycle` runs
//! it and follows dlopen, fork and exit. Every failure leaves the function,
//! module or process unpatched and running.

// A test build exports no C symbols (the interposers' `no_mangle` is for
// the real library only), so what only they reach looks unused there;
// the library build checks dead code.
#![cfg_attr(test, allow(dead_code))]

// The folders follow the data flow: discover -> plan -> patch -> count,
// with sampling beside counting and lifecycle driving it all.
pub(crate) mod arch;
pub(crate) mod config;
pub(crate) mod count;
pub(crate) mod discover;
pub(crate) mod error;
pub(crate) mod lifecycle;
pub(crate) mod log;
pub(crate) mod options;
pub(crate) mod patch;
pub(crate) mod plan;
pub(crate) mod sampling;

use config::Config;
use count::segment::Segment;
use std::sync::OnceLock;

pub(crate) struct Agent {
    pub config: Config,
    pub segment: Segment,
    pub tls_offset: i32,
    /// The stub map, the modules known and the budget: changed by the
    /// loader hook (dlopen, dlclose), the drain and budget threads and
    /// counting switches.
    state: lifecycle::locked::StateLock,
}

static AGENT: OnceLock<Agent> = OnceLock::new();

/// Makes the process's agent, with the state start-up (or an attach)
/// built; false if there is one already.
pub(crate) fn set_agent(
    config: Config,
    segment: Segment,
    tls_offset: i32,
    stubs: patch::install::StubMap,
    known: lifecycle::loader::Known,
    writer: rtprof_abi::SegmentWriter,
) -> bool {
    let state = lifecycle::locked::StateLock::new(lifecycle::locked::Locked {
        stubs,
        known,
        budget: None,
        routes: Default::default(),
        writer,
    });
    AGENT
        .set(Agent {
            config,
            segment,
            tls_offset,
            state,
        })
        .is_ok()
}

/// The running agent, once start-up has completed.
pub(crate) fn agent() -> Option<&'static Agent> {
    AGENT.get()
}

pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the timespec on our stack.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(not(test))]
#[ctor::ctor]
fn rtprof_init() {
    lifecycle::interpose::resolve();
    // Switched off: nothing more, not even an allocation (a seccomp filter
    // may allow no call the dynamic loader did not make).
    if lifecycle::startup::switched_off() {
        lifecycle::startup::end_if_warming();
        return;
    }
    // Our panic messages stay quiet unless asked for; none crosses into the host.
    std::panic::set_hook(Box::new(|info| {
        log::emit(format_args!("internal error: {info}"))
    }));
    if std::panic::catch_unwind(lifecycle::startup::start).is_err() {
        log::emit(format_args!("start-up failed; process left unprofiled"));
    }
    lifecycle::startup::end_if_warming();
    // Start-up's temporary memory (symbol tables, plans: all dropped by
    // now) is free but still resident: hand it back, so a small program
    // does not carry it.
    // SAFETY: glibc's malloc_trim only releases free memory.
    unsafe { libc::malloc_trim(0) };
}

/// Unit tests count their own thread's allocations: code that must not
/// allocate (signal handlers, fork handlers, the stopped world) is
/// checked, not trusted.
#[cfg(test)]
pub(crate) mod test_alloc {
    use std::cell::Cell;

    struct Counting;
    thread_local! {
        static ALLOCS: Cell<u64> = const { Cell::new(0) };
    }
    // SAFETY: forwards to the system allocator; the count is a
    // thread-local cell, touched only if the thread's locals still live.
    unsafe impl std::alloc::GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
            let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
            // SAFETY: the caller's layout, as GlobalAlloc requires.
            unsafe { std::alloc::System.alloc(l) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
            // SAFETY: `p` came from `alloc` above with layout `l`.
            unsafe { std::alloc::System.dealloc(p, l) }
        }
    }
    #[global_allocator]
    static ALLOC: Counting = Counting;

    /// Allocations this thread made so far.
    pub fn allocs() -> u64 {
        ALLOCS.with(|c| c.get())
    }
}
