//! fork(): the child gets a counter segment of its own, starting from zero,
//! at the same address. vfork and posix_spawn children run no fork handlers
//! and do nothing here before they exec.
//!
//! Other libraries' fork handlers run in both processes too, and must count
//! where they run. Our handlers are therefore registered before anyone
//! else's (we interpose `__register_atfork`, which `pthread_atfork` calls):
//! our prepare handler runs last, our parent and child handlers first. From
//! our prepare to our parent/child handler, the forking thread counts into a
//! private scratch stripe: in the parent those counts are added back; in the
//! child they are the parent's and are dropped. glibc serialises forks (its
//! handler lock is held from prepare to parent/child), so one scratch stripe
//! suffices.

use crate::log::vlog;
use crate::{agent, count::threads};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

static SCRATCH: AtomicPtr<u64> = AtomicPtr::new(std::ptr::null_mut());
/// The forking thread's stripe pointer before the fork.
static SAVED: AtomicPtr<u64> = AtomicPtr::new(std::ptr::null_mut());

/// Empties the scratch stripe; adds its counts to `dst` (the thread's own
/// stripe), or atomically to the shared stripe if `dst` is null, when `keep`.
fn drain_scratch(dst: *mut u64, keep: bool) {
    let (Some(a), scratch) = (agent(), SCRATCH.load(Ordering::Acquire)) else {
        return;
    };
    if scratch.is_null() {
        return;
    }
    let shared = a.segment.counters.stripe_ptr(0);
    for i in 0..a.segment.counters.func_count() as usize {
        // SAFETY: slot `i` (below func_count) of the scratch stripe, which only this thread uses
        // during a fork, and of `dst` (this thread's own stripe) or the shared stripe (added
        // atomically).
        unsafe {
            let n = *scratch.add(i);
            if n == 0 {
                continue;
            }
            *scratch.add(i) = 0;
            match (keep, dst.is_null()) {
                (false, _) => {}
                (true, true) => {
                    (*(shared.add(i) as *const AtomicU64)).fetch_add(n, Ordering::Relaxed);
                }
                (true, false) => *dst.add(i) += n,
            }
        }
    }
}

extern "C" fn prepare() {
    let scratch = SCRATCH.load(Ordering::Acquire);
    if !scratch.is_null() {
        SAVED.store(threads::stripe(), Ordering::Relaxed);
        threads::set_stripe(scratch);
    }
}

extern "C" fn in_parent() {
    if SCRATCH.load(Ordering::Acquire).is_null() {
        return;
    }
    let saved = SAVED.load(Ordering::Relaxed);
    threads::set_stripe(saved);
    drain_scratch(saved, true);
}

extern "C" fn in_child() {
    // This child is known: its own from here on (the mark's page exists,
    // zeroed by the kernel in the child; no system call).
    crate::lifecycle::process_mark::mark_this_process();
    let scratch = SCRATCH.load(Ordering::Acquire);
    // Under a seccomp filter the child gets no segment of its own (that
    // takes system calls): it counts into the scratch stripe, private to
    // it and never read, not into its parent's counts.
    if crate::lifecycle::sandbox::on() && !scratch.is_null() {
        crate::options::traps::reset_in_child();
        CHILD_UNCOUNTED.store(true, Ordering::Release);
        return;
    }
    let p = if scratch.is_null() {
        threads::stripe()
    } else {
        SAVED.load(Ordering::Relaxed)
    };
    become_child(p);
    FORKED.store(true, Ordering::Relaxed);
    if !scratch.is_null() {
        // Same address, now in the child's own segment.
        threads::set_stripe(p);
        drain_scratch(p, false);
    }
}

/// Whether this process is a child of `fork()` (its fork handlers ran):
/// glibc's `fork` gives the child malloc's and the loader's locks free,
/// whatever the parent's other threads held, which `_Fork` and a raw
/// `clone` do not.
static FORKED: AtomicBool = AtomicBool::new(false);

/// From `_exit`/`_Exit`: a child of `fork()` ending so (redis's BGSAVE
/// child does) writes its `RTPROF_REPORT` as at `exit`, marked ended
/// without exit handlers. Nothing else does: a vfork child (it shares its
/// parent's memory and is not the segment's process) or a `_Fork` child
/// must not allocate, and the parent's threads run on at its `_exit`.
/// (An `_exit` from a signal handler that interrupted this child's own
/// malloc would wait for that lock: the price of the report, taken only
/// with RTPROF_REPORT set.)
pub fn ending_without_exit_handlers() {
    if !FORKED.load(Ordering::Relaxed) {
        return;
    }
    let Some(a) = agent() else { return };
    // Before anything allocates: a vfork child of this child sees the
    // flag too, but the segment is not its own.
    if a.config.report.is_none() || crate::lifecycle::sandbox::filter_arrived_unseen() {
        return;
    }
    if a.segment.counters.pid() != std::process::id() {
        return;
    }
    crate::lifecycle::startup::finish(None);
}

/// What a fork child forgets of its parent before it counts, in this
/// order: locks and flags a parent's thread held (it does not exist here),
/// threads, timers and rings that were the parent's, tables of the
/// parent's counts. Run from the fork handler: none allocates. The trap
/// handler goes first (whatever else fails, it must be this child's), the
/// state lock before what takes it (the budget).
pub const CHILD_FORGETS: &[(&str, fn())] = &[
    (
        "trap entries' handler",
        crate::options::traps::reset_in_child,
    ),
    (
        "attach's control thread",
        crate::options::attach::forget_in_child,
    ),
    (
        "the plan cache's directories",
        crate::plan::cache::forget_in_child,
    ),
    (
        "the free space for stubs",
        crate::patch::stubmem::forget_in_child,
    ),
    ("the state lock", || {
        if let Some(a) = agent() {
            a.state.reset_in_child();
        }
    }),
    ("the budget's controller", || {
        if let Some(a) = agent() {
            crate::options::budget::forget_in_child(a);
        }
    }),
    (
        "the sampler's rings and drain thread",
        crate::sampling::forget_parent_in_child,
    ),
    (
        "timer samples held for names",
        crate::sampling::held_forget_in_child,
    ),
    (
        "address table readers",
        crate::sampling::addrmap::reset_readers_in_child,
    ),
    ("sampling timers", crate::sampling::timer::forget_in_child),
    ("page images found", crate::patch::image::forget_in_child),
    ("sampled stacks", crate::sampling::stacks::forget_in_child),
    ("sampled offsets", crate::sampling::offsets::forget_in_child),
    ("event counters", crate::options::events::forget_in_child),
    ("exact callers", crate::options::callers::forget_in_child),
    (
        "exact loop counts",
        crate::options::loops::counts::forget_in_child,
    ),
    (
        "per-thread counts",
        crate::count::thread_rows::forget_in_child,
    ),
    (
        "program threads",
        crate::count::threads::reset_program_threads_in_child,
    ),
];

/// What a fork child starts again once `fork()` has returned (allocating
/// and starting threads is safe again), in this order. A child made by
/// `_Fork` or inside libc never gets these.
pub const CHILD_STARTS: &[(&str, fn())] = &[
    (
        "the thread as a program thread",
        crate::count::threads::mark_program_thread,
    ),
    ("the sampler", crate::sampling::restart_in_child),
    ("the budget's controller", crate::options::budget::resume),
];

/// Runs the steps of `list`, each on its own: one that panics does not
/// keep the others from running.
pub fn run_steps(list: &[(&str, fn())]) {
    for (_, step) in list {
        let _ = std::panic::catch_unwind(step);
    }
}

/// Gives this new child process its own segment, keeping the stripe at
/// `p` (the forking thread's) for its only thread.
pub fn become_child(p: *mut u64) {
    crate::lifecycle::process_mark::mark_this_process();
    // Until the fork handler says it was `fork()`.
    FORKED.store(false, Ordering::Relaxed);
    run_steps(CHILD_FORGETS);
    let _ = std::panic::catch_unwind(|| {
        let Some(a) = agent() else { return };
        let w = &a.segment.counters;
        let first = w.stripe_ptr(0) as u64;
        let bytes = w.layout().stripe_bytes;
        let keep = (p as u64 >= first
            && (p as u64) < first + bytes * w.layout().caps.stripes as u64)
            .then(|| ((p as u64 - first) / bytes) as u32)
            .filter(|&i| i != 0);
        // SAFETY: takes nothing.
        let (pid, ppid) = (std::process::id(), unsafe { libc::getppid() } as u32);
        if let Err(e) = a.segment.reopen_in_child(keep, pid, ppid, crate::now_ns()) {
            vlog!("{e}; this child's calls are not recorded");
        }
        // Until `fork()` returns and starts the child's own sampler (a
        // child made by `_Fork` or inside libc never gets one).
        a.segment.counters.set_sampler(
            rtprof_abi::sampling::Sampler::Off,
            rtprof_abi::sampling::Why::ChildWithoutFork,
            0,
            0,
        );
    });
}

static REGISTERED: AtomicBool = AtomicBool::new(false);

/// A child forked under a seccomp filter: its threads count where nobody
/// reads (see `in_child`).
static CHILD_UNCOUNTED: AtomicBool = AtomicBool::new(false);

/// The stripe a new thread of an uncounted child counts into, if this is
/// one.
pub fn uncounted_stripe() -> Option<*mut u64> {
    CHILD_UNCOUNTED
        .load(Ordering::Acquire)
        .then(|| SCRATCH.load(Ordering::Acquire))
}

/// Registers our fork handlers, once, before anyone else's.
pub fn register_ours_once() {
    if !REGISTERED.swap(true, Ordering::AcqRel) {
        if let Some(real) = crate::lifecycle::interpose::real_register_atfork() {
            // SAFETY: libc's __register_atfork with handlers that live as long as the library
            // (never unloaded) and no DSO handle.
            unsafe {
                real(
                    Some(prepare),
                    Some(in_parent),
                    Some(in_child),
                    std::ptr::null_mut(),
                )
            };
        }
    }
}

/// Sets up the scratch stripe (`stripe_bytes`) and our fork handlers.
pub fn install_handlers(stripe_bytes: u64) {
    // SAFETY: a fresh anonymous private mapping; no pointer is passed.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            stripe_bytes as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p != libc::MAP_FAILED {
        SCRATCH.store(p as *mut u64, Ordering::Release);
    }
    register_ours_once();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The orders the steps depend on: the trap handler first, the state
    /// lock freed before the budget takes it; each step named once.
    #[test]
    fn child_steps_keep_their_order() {
        let at = |what: &str| CHILD_FORGETS.iter().position(|s| s.0 == what).unwrap();
        assert_eq!(at("trap entries' handler"), 0);
        assert!(at("the state lock") < at("the budget's controller"));
        for list in [CHILD_FORGETS, CHILD_STARTS] {
            let mut names: Vec<&str> = list.iter().map(|s| s.0).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), list.len());
        }
        // A step that panics leaves the others to run.
        static RAN: AtomicBool = AtomicBool::new(false);
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        run_steps(&[
            ("fails", || panic!("no")),
            ("runs", || RAN.store(true, Ordering::Relaxed)),
        ]);
        std::panic::set_hook(hook);
        assert!(RAN.load(Ordering::Relaxed));
    }
}
