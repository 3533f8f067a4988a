//! Trap entries (`RTPROF_TRAPS=1`): the last resort for a function whose
//! entry can take no jump (2-byte functions with no fill near them, short
//! branches into the first bytes). Its first byte becomes a trap; the
//! handler here sends the thread on to the function's stub, which counts
//! the call, runs the first instruction and jumps back past it. Exact, but
//! a call costs a signal (about a microsecond): the report flags these
//! functions.
//!
//! A trap whose signal is blocked or ignored kills the process, so while
//! trap entries exist the program is kept from blocking SIGTRAP or taking
//! it over: its masks and handlers' masks lose SIGTRAP (see `interpose`),
//! and a handler it installs for SIGTRAP is kept here and called for traps
//! that are not ours. Code that blocks every signal with raw system calls
//! (the C library's own, around `clone` and `fork`) must never reach a
//! trap entry: the C runtime's modules get none. Never enabled for a
//! process that has a SIGTRAP handler or a tracer at start-up, nor under
//! `rtprof attach`.

use crate::arch::{InstructionSet, Native};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Trap entries are in use in this process.
static ON: AtomicBool = AtomicBool::new(false);

/// (trap address, stub) sorted by address, as the handler reads it.
struct Table(Vec<(u64, u64)>);

/// The current table. Tables are replaced when a library adds trap
/// entries and the old one is never freed (a handler on another thread
/// may be reading it): a few bytes per library load with trap entries.
static TABLE: AtomicPtr<Table> = AtomicPtr::new(std::ptr::null_mut());
/// Every trap entry, for building the next table.
static ALL: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

/// The program's own SIGTRAP disposition, as it set it: handler and
/// flags (`SIG_DFL` until it sets one).
static PROGRAM_HANDLER: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
static PROGRAM_FLAGS: AtomicI32 = AtomicI32::new(0);

/// Whether trap entries are in use.
pub fn on() -> bool {
    ON.load(Ordering::Acquire)
}

/// Whether a module may get trap entries: not the C runtime, which runs
/// code with every signal blocked by raw system calls.
pub fn allowed_in(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    !["libc.so", "libc-", "ld-linux", "ld-", "libpthread"]
        .iter()
        .any(|p| name.starts_with(p))
}

/// Turns trap entries on, at start-up (one thread, no tracer): only if
/// the program has no SIGTRAP handler of its own yet. Installs the
/// handler and unblocks SIGTRAP.
pub fn enable() -> bool {
    let Some(real) = crate::interpose::real_sigaction() else {
        return false;
    };
    // SAFETY: zeroed sigaction structs are valid; `real` is libc's
    // sigaction, given a live struct to fill.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if real(libc::SIGTRAP, std::ptr::null(), &mut old) != 0 {
            return false;
        }
        if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN {
            crate::log::vlog!("the program handles SIGTRAP: no trap entries");
            return false;
        }
        PROGRAM_HANDLER.store(old.sa_sigaction, Ordering::Relaxed);
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_trap as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        if real(libc::SIGTRAP, &act, std::ptr::null_mut()) != 0 {
            return false;
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTRAP);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
    ON.store(true, Ordering::Release);
    true
}

/// Adds trap entries (trap address, stub), before their traps are
/// written.
pub fn add(sites: &[(u64, u64)]) {
    if sites.is_empty() {
        return;
    }
    let mut all = ALL.lock().unwrap_or_else(|e| e.into_inner());
    all.extend_from_slice(sites);
    all.sort_unstable();
    let table = Box::into_raw(Box::new(Table(all.clone())));
    // The old table is left as it is (see TABLE).
    TABLE.store(table, Ordering::Release);
}

/// The stub of the trap entry at `site`.
fn stub_of(site: u64) -> Option<u64> {
    let t = TABLE.load(Ordering::Acquire);
    if t.is_null() {
        return None;
    }
    // SAFETY: tables are published whole and never freed.
    let v = unsafe { &(*t).0 };
    v.binary_search_by_key(&site, |e| e.0).ok().map(|i| v[i].1)
}

/// SIGTRAP: a trap entry's goes on to its stub; any other goes where it
/// would have gone without us.
extern "C" fn on_trap(sig: libc::c_int, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let uc = uc as *mut libc::ucontext_t;
    // Only a trap instruction's signal (SI_KERNEL), never one sent with
    // kill(): a thread may be right after a trap entry's first byte by
    // chance, having run its instruction in the stub already.
    // SAFETY: the kernel's siginfo and context for an SA_SIGINFO handler.
    let from_trap = !info.is_null() && unsafe { (*info).si_code } == libc::SI_KERNEL;
    if from_trap {
        // SAFETY: as above.
        let pc = unsafe { Native::signal_pc(uc) };
        if let Some(stub) = stub_of(Native::trap_site(pc)) {
            // SAFETY: as above; the thread resumes in the stub.
            unsafe { Native::set_signal_pc(uc, stub) };
            return;
        }
    }
    let handler = PROGRAM_HANDLER.load(Ordering::Acquire);
    match handler {
        libc::SIG_IGN if !from_trap => {}
        // What the kernel does to a trap nobody handles, or to a signal
        // whose disposition is the default: the process ends, with a core.
        libc::SIG_DFL | libc::SIG_IGN => {
            if let Some(real) = crate::interpose::real_sigaction() {
                // SAFETY: a zeroed sigaction is SIG_DFL with no flags;
                // raised while SIGTRAP is blocked in this handler, it is
                // delivered, with that disposition, once the handler returns.
                unsafe {
                    let dfl: libc::sigaction = std::mem::zeroed();
                    real(libc::SIGTRAP, &dfl, std::ptr::null_mut());
                    libc::raise(libc::SIGTRAP);
                }
            }
        }
        h if PROGRAM_FLAGS.load(Ordering::Acquire) & libc::SA_SIGINFO != 0 => {
            type Action = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);
            // SAFETY: the program installed `h` as an SA_SIGINFO handler.
            let f: Action = unsafe { std::mem::transmute(h) };
            f(sig, info, uc as *mut libc::c_void);
        }
        h => {
            type Handler = extern "C" fn(libc::c_int);
            // SAFETY: the program installed `h` as a plain handler.
            let f: Handler = unsafe { std::mem::transmute(h) };
            f(sig);
        }
    }
}

/// The program's `sigaction(SIGTRAP, act, old)` while trap entries are
/// in use: it keeps its disposition here, not in the kernel. Returns 0.
///
/// # Safety
/// `act` and `old` are null or valid, as for `sigaction(2)`.
pub unsafe fn program_sigaction(act: *const libc::sigaction, old: *mut libc::sigaction) -> i32 {
    if !old.is_null() {
        // SAFETY: the caller's struct; all-zero is a valid value.
        *old = std::mem::zeroed();
        (*old).sa_sigaction = PROGRAM_HANDLER.load(Ordering::Acquire);
        (*old).sa_flags = PROGRAM_FLAGS.load(Ordering::Acquire);
    }
    if !act.is_null() {
        PROGRAM_FLAGS.store((*act).sa_flags, Ordering::Release);
        PROGRAM_HANDLER.store((*act).sa_sigaction, Ordering::Release);
    }
    0
}

/// The program's `signal(SIGTRAP, handler)` likewise: the previous one.
pub fn program_signal(handler: libc::sighandler_t) -> libc::sighandler_t {
    PROGRAM_FLAGS.store(0, Ordering::Release);
    PROGRAM_HANDLER.swap(handler, Ordering::AcqRel)
}

/// `set` without SIGTRAP, if it holds it and trap entries are in use:
/// what a mask the program asks for becomes.
///
/// # Safety
/// `set` is null or a valid signal set.
pub unsafe fn without_trap(set: *const libc::sigset_t) -> Option<libc::sigset_t> {
    if !on() || set.is_null() || libc::sigismember(set, libc::SIGTRAP) != 1 {
        return None;
    }
    let mut s = *set;
    libc::sigdelset(&mut s, libc::SIGTRAP);
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_c_runtime_gets_no_traps() {
        for p in [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib64/ld-linux-x86-64.so.2",
            "/usr/lib/libpthread.so.0",
        ] {
            assert!(!allowed_in(p), "{p}");
        }
        for p in [
            "/usr/bin/app",
            "/usr/lib/libpython3.11.so.1.0",
            "libcrypto.so.3",
        ] {
            assert!(allowed_in(p), "{p}");
        }
    }

    #[test]
    fn tables_find_their_sites() {
        add(&[(0x3000, 0x9000), (0x1000, 0x8000)]);
        add(&[(0x2000, 0x7000)]);
        assert_eq!(stub_of(0x1000), Some(0x8000));
        assert_eq!(stub_of(0x2000), Some(0x7000));
        assert_eq!(stub_of(0x3000), Some(0x9000));
        assert_eq!(stub_of(0x2001), None);
    }
}
