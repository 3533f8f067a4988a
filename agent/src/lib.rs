//! librtprof.so, the rtprof agent. Preloaded into a process, it counts every
//! call of every instrumented function exactly, in a shared counter segment.
//!
//! Start-up (before `main`): configuration -> modules (`discover`) -> their
//! plans, cached or analysed (`plan`) -> counter segment (`count`) -> stubs
//! and entries patched (`patch`) -> sampler (`sampling`); `lifecycle` runs
//! it and follows dlopen, fork and exit. Every failure leaves the function,
//! module or process unpatched and running.

// The folders follow the data flow: discover -> plan -> patch -> count,
// with sampling beside counting and lifecycle driving it all.
pub mod arch;
pub mod config;
pub mod count;
pub mod discover;
pub mod lifecycle;
pub mod log;
pub mod patch;
pub mod plan;
pub mod sampling;

// Each module by its own name, as the rest of the crate uses them.
pub use count::{api, register, segment, switching, threads};
pub(crate) use count::{budget, records};
pub use discover::{fileimage, maps, modules, symbols};
pub use lifecycle::system;
pub(crate) use lifecycle::{fork, loader, startup};
pub use patch::{install, stopworld, stubmem, switch};
pub(crate) use plan::pipeline;
pub use plan::{analysis, cache};

use config::Config;
use install::StubMap;
use segment::Segment;
use std::sync::OnceLock;

pub struct Agent {
    pub config: Config,
    pub segment: Segment,
    pub tls_offset: i32,
    /// Guards `stubs` and `known`: changed by the loader hook (dlopen,
    /// dlclose), whose calls the loader serialises but a fork may cut off.
    loader_lock: loader::SpinLock,
    stubs: std::cell::UnsafeCell<StubMap>,
    known: std::cell::UnsafeCell<loader::Known>,
}

// `stubs` and `known` are only touched under `loader_lock` (or at start-up).
unsafe impl Sync for Agent {}

impl Agent {
    /// The stub map; caller holds `loader_lock`.
    #[allow(clippy::mut_from_ref)]
    fn stubs(&self) -> &mut StubMap {
        unsafe { &mut *self.stubs.get() }
    }

    /// In a forked child: no other thread exists to hold the lock.
    fn reset_loader_lock(&self) {
        self.loader_lock.reset();
    }
}

static AGENT: OnceLock<Agent> = OnceLock::new();

/// The running agent, once start-up has completed.
pub fn agent() -> Option<&'static Agent> {
    AGENT.get()
}

pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(not(test))]
#[ctor::ctor]
fn rtprof_init() {
    // Our panic messages stay quiet unless asked for; none crosses into the host.
    std::panic::set_hook(Box::new(|info| {
        log::emit(format_args!("internal error: {info}"))
    }));
    sampling::timer::resolve_mask_fns();
    if std::panic::catch_unwind(startup::start).is_err() {
        log::emit(format_args!("start-up failed; process left unprofiled"));
    }
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
