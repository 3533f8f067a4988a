//! Trap entries (`RTPROF_TRAPS=1`): the last resort for a function whose
//! entry can take no jump (2-byte functions with no fill near them, short
//! branches into the first bytes). Its first byte becomes a trap; the
//! handler here sends the thread on to the function's stub, which counts
//! the call, runs the first instruction and jumps back past it. Exact, but
//! a call costs a signal (microseconds): the report flags these functions.
//!
//! A trap whose signal is blocked kills the process, so while trap entries
//! exist the program is kept from blocking SIGTRAP or taking it over: the
//! masks it hands the C library lose SIGTRAP (see `interpose`), new threads
//! start with it unblocked, and a handler it installs for SIGTRAP is kept
//! here and called for traps that are not ours. Code that blocks every
//! signal with raw system calls (the C library's own, around `clone` and
//! `fork`) must never reach a trap entry: the C runtime's modules get none.
//! Never used in a process that has a SIGTRAP handler or a tracer at
//! start-up, under an overhead budget (a trap costs a thousand times a
//! counted call), nor under `rtprof attach`.

pub mod signals;

use crate::arch::{Native, ThreadContext};
use crate::lifecycle::lock::Lock;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering};

/// Trap entries may be planned (set at start-up, before planning).
static WANTED: AtomicBool = AtomicBool::new(false);
/// The handler is installed: trap entries may be written, and SIGTRAP is
/// kept unblocked.
static ON: AtomicBool = AtomicBool::new(false);
/// The process whose handler that is. A vfork child shares our memory but
/// not our signal handlers: its calls go straight to the C library.
static OWNER: AtomicI32 = AtomicI32::new(0);

/// (trap address, stub) sorted by address, as the handler reads it.
struct Table(Vec<(u64, u64)>);

/// The current table. Tables are replaced when libraries with trap entries
/// come and go, and an old one is never freed (a handler on another thread
/// may be reading it): a few bytes per such load or unload.
static TABLE: AtomicPtr<Table> = AtomicPtr::new(std::ptr::null_mut());

/// Every trap entry, for building the next table.
static SITES: Lock<Vec<(u64, u64)>> = Lock::new(Vec::new());
/// Set in a forked child: its parent may have been changing the list when
/// it forked, so the list is made again from the published table before
/// its next use.
static STALE: AtomicBool = AtomicBool::new(false);

/// Runs `f` on every trap entry, then publishes them as the new table.
fn with_sites(f: impl FnOnce(&mut Vec<(u64, u64)>)) {
    // Never re-entered: the loader hook, which calls this, is not.
    let Some(mut all) = SITES.lock() else { return };
    if STALE.swap(false, Ordering::AcqRel) {
        // The parent may have been moving it when it forked: let the old
        // one go untouched.
        std::mem::forget(std::mem::take(&mut *all));
        // SAFETY: a published table, never freed.
        if let Some(t) = unsafe { TABLE.load(Ordering::Acquire).as_ref() } {
            all.extend_from_slice(&t.0);
        }
    }
    f(&mut all);
    all.sort_unstable_by_key(|e| e.0);
    let table = Box::into_raw(Box::new(Table(all.clone())));
    // The old table is left as it is (see TABLE).
    TABLE.store(table, Ordering::Release);
}

/// In a forked child (one thread, allocation-free): a parent's thread that
/// held the list does not exist here, and the handler is now this
/// process's.
pub fn reset_in_child() {
    STALE.store(true, Ordering::Release);
    SITES.reset_in_child();
    // SAFETY: takes nothing.
    OWNER.store(unsafe { libc::getpid() }, Ordering::Release);
}

/// The program's own SIGTRAP disposition as it set it, in one word so a
/// trap never sees a handler with another's flags: the handler's address
/// (`SIG_DFL` until it sets one) and its flags in the top bits.
static PROGRAM: AtomicU64 = AtomicU64::new(libc::SIG_DFL as u64);
const P_SIGINFO: u64 = 1 << 63;
const P_RESETHAND: u64 = 1 << 62;
const P_NODEFER: u64 = 1 << 61;
const P_HANDLER: u64 = (1 << 56) - 1;
/// Its `sa_mask`, signals 1 to 64 (bit n-1 for signal n).
static PROGRAM_MASK: AtomicU64 = AtomicU64::new(0);

fn pack(handler: usize, flags: i32) -> u64 {
    let bit = |f: i32, b: u64| if flags & f != 0 { b } else { 0 };
    (handler as u64 & P_HANDLER)
        | bit(libc::SA_SIGINFO, P_SIGINFO)
        | bit(libc::SA_RESETHAND, P_RESETHAND)
        | bit(libc::SA_NODEFER, P_NODEFER)
}

fn unpack(p: u64) -> (usize, i32) {
    let bit = |b: u64, f: i32| if p & b != 0 { f } else { 0 };
    (
        (p & P_HANDLER) as usize,
        bit(P_SIGINFO, libc::SA_SIGINFO)
            | bit(P_RESETHAND, libc::SA_RESETHAND)
            | bit(P_NODEFER, libc::SA_NODEFER),
    )
}

/// Whether trap entries are planned for modules analysed from now on.
pub fn wanted() -> bool {
    WANTED.load(Ordering::Acquire)
}

/// Whether trap entries are in use (their handler is installed): masks
/// keep SIGTRAP out.
pub fn on() -> bool {
    ON.load(Ordering::Acquire)
}

/// Whether the program's SIGTRAP disposition is kept here: trap entries
/// are in use and this is the process that installed their handler, or a
/// child of it with memory of its own (one forked without our fork
/// handlers, by a raw system call, becomes the owner here). A vfork
/// child shares our memory but not our signal handlers: its calls go
/// straight to the C library, and it writes nothing here.
pub fn owns_disposition() -> bool {
    if !on() {
        return false;
    }
    // SAFETY: takes nothing.
    let me = unsafe { libc::getpid() };
    let owner = OWNER.load(Ordering::Acquire);
    if me == owner {
        return true;
    }
    const KCMP_VM: libc::c_long = 1;
    // SAFETY: compares two processes' address spaces; takes no pointer.
    let shared = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            me as libc::c_long,
            owner as libc::c_long,
            KCMP_VM,
            0,
            0,
        )
    };
    if shared == 1 || shared == 2 {
        OWNER.store(me, Ordering::Release);
        return true;
    }
    // The same memory, or no way to tell: leave it to the C library.
    false
}

/// Whether a module may get trap entries: not the C runtime, which runs
/// code with every signal blocked by raw system calls (and helper threads
/// that start so).
pub fn allowed_in(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    ![
        "libc.so",
        "libc-2.",
        "ld-linux",
        "ld-2.",
        "libpthread",
        "librt.",
        "librt-",
        "libanl",
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

/// Decides, at start-up (one thread, no tracer), whether trap entries are
/// planned: only if the program has no SIGTRAP handler of its own.
pub fn want() -> bool {
    let Some(real) = crate::lifecycle::interpose::real_sigaction() else {
        return false;
    };
    // SAFETY: a zeroed sigaction is valid; `real` is libc's sigaction,
    // given a live struct to fill.
    let old = unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if real(libc::SIGTRAP, std::ptr::null(), &mut old) != 0 {
            return false;
        }
        old
    };
    if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN {
        crate::log::vlog!("the program handles SIGTRAP: no trap entries");
        return false;
    }
    PROGRAM.store(pack(old.sa_sigaction, 0), Ordering::Release);
    WANTED.store(true, Ordering::Release);
    true
}

/// Installs the handler and unblocks SIGTRAP, before the first trap entry
/// is written; false (and no trap entry is written) if it cannot.
pub fn arm() -> bool {
    if !wanted() {
        return false;
    }
    let Some(real) = crate::lifecycle::interpose::real_sigaction() else {
        return false;
    };
    // SAFETY: a zeroed sigaction and sigset are valid; `real` is libc's
    // sigaction, given live structs.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_trap as *const () as usize;
        // Not deferred: a program's handler we call may run into a trap
        // entry itself. On the alternate stack where there is one.
        act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_NODEFER | libc::SA_ONSTACK;
        libc::sigemptyset(&mut act.sa_mask);
        if real(libc::SIGTRAP, &act, std::ptr::null_mut()) != 0 {
            return false;
        }
    }
    unblock_here();
    // SAFETY: takes nothing.
    OWNER.store(unsafe { libc::getpid() }, Ordering::Release);
    ON.store(true, Ordering::Release);
    true
}

/// Unblocks SIGTRAP in the calling thread.
pub fn unblock_here() {
    // SAFETY: a local signal set, initialised before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTRAP);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// Adds trap entries (trap address, stub), before their traps are
/// written; an entry at an address already there replaces it.
pub fn add(sites: &[(u64, u64)]) {
    if sites.is_empty() {
        return;
    }
    with_sites(|all| {
        all.retain(|e| !sites.iter().any(|s| s.0 == e.0));
        all.extend_from_slice(sites);
    });
}

/// Forgets the trap entries whose stubs lie in [lo, hi): their module was
/// unloaded and its stub area goes.
pub fn remove_stubs_in(lo: u64, hi: u64) {
    let here = |e: &(u64, u64)| (lo..hi).contains(&e.1);
    // SAFETY: a read of the published table, never freed.
    let any =
        unsafe { TABLE.load(Ordering::Acquire).as_ref() }.is_some_and(|t| t.0.iter().any(here));
    if any {
        with_sites(|all| all.retain(|e| !here(e)));
    }
}

/// The stub of the trap entry at `site`.
fn stub_of(site: u64) -> Option<u64> {
    // SAFETY: tables are published whole and never freed.
    let t = unsafe { TABLE.load(Ordering::Acquire).as_ref() }?;
    let v = &t.0;
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
    let (handler, flags) = unpack(PROGRAM.load(Ordering::Acquire));
    match handler {
        libc::SIG_IGN if !from_trap => {}
        // What the kernel does to a trap nobody handles (ignored or not),
        // or to a signal left to its default: the process ends, with a
        // core dump.
        libc::SIG_DFL | libc::SIG_IGN => die_of_sigtrap(),
        h => call_program(h, flags, sig, info, uc as *mut libc::c_void),
    }
}

/// Ends the process as an unhandled SIGTRAP does.
fn die_of_sigtrap() {
    let Some(real) = crate::lifecycle::interpose::real_sigaction() else {
        // SAFETY: ends the process.
        unsafe { libc::abort() }
    };
    // SAFETY: a zeroed sigaction is SIG_DFL with no flags; SIGTRAP raised
    // with that disposition, unblocked, ends the process.
    unsafe {
        let dfl: libc::sigaction = std::mem::zeroed();
        real(libc::SIGTRAP, &dfl, std::ptr::null_mut());
        libc::raise(libc::SIGTRAP);
    }
    unblock_here();
    // SAFETY: ends the process, should the signal not have.
    unsafe { libc::_exit(128 + libc::SIGTRAP) }
}

/// Calls the program's SIGTRAP handler `h` as the kernel would have: with
/// its mask (SIGTRAP itself never blocked: its handler may run into a trap
/// entry), and its disposition reset first if it asked for that.
fn call_program(
    h: usize,
    flags: i32,
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    uc: *mut libc::c_void,
) {
    if flags & libc::SA_RESETHAND != 0 {
        PROGRAM.store(libc::SIG_DFL as u64, Ordering::Release);
    }
    let bits = PROGRAM_MASK.load(Ordering::Acquire);
    // SAFETY: local signal sets; pthread_sigmask is async-signal-safe in
    // practice (one system call), and the old mask is put back.
    let old = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in 1..=64 {
            if bits & (1 << (s - 1)) != 0 && s != libc::SIGTRAP {
                libc::sigaddset(&mut set, s);
            }
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        old
    };
    if flags & libc::SA_SIGINFO != 0 {
        type Action = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);
        // SAFETY: the program installed `h` as an SA_SIGINFO handler.
        let f: Action = unsafe { std::mem::transmute(h) };
        f(sig, info, uc);
    } else {
        type Handler = extern "C" fn(libc::c_int);
        // SAFETY: the program installed `h` as a plain handler.
        let f: Handler = unsafe { std::mem::transmute(h) };
        f(sig);
    }
    // SAFETY: the mask this handler started with, from above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
}

/// The program's `sigaction(SIGTRAP, act, old)` while trap entries are
/// in use: it keeps its disposition here, not in the kernel. Returns 0.
///
/// # Safety
/// `act` and `old` are null or valid, as for `sigaction(2)` (they may be
/// the same struct).
pub unsafe fn program_sigaction(act: *const libc::sigaction, old: *mut libc::sigaction) -> i32 {
    // Read before `old` is written: they may be one struct.
    let new = (!act.is_null()).then(|| *act);
    if !old.is_null() {
        let (h, flags) = unpack(PROGRAM.load(Ordering::Acquire));
        // SAFETY: the caller's struct; all-zero is a valid value.
        *old = std::mem::zeroed();
        (*old).sa_sigaction = h;
        (*old).sa_flags = flags;
        libc::sigemptyset(&mut (*old).sa_mask);
        let bits = PROGRAM_MASK.load(Ordering::Acquire);
        for s in 1..=64 {
            if bits & (1 << (s - 1)) != 0 {
                libc::sigaddset(&mut (*old).sa_mask, s);
            }
        }
    }
    if let Some(a) = new {
        let mut bits = 0u64;
        for s in 1..=64 {
            if libc::sigismember(&a.sa_mask, s) == 1 {
                bits |= 1 << (s - 1);
            }
        }
        PROGRAM_MASK.store(bits, Ordering::Release);
        PROGRAM.store(pack(a.sa_sigaction, a.sa_flags), Ordering::Release);
    }
    0
}

/// The program's SIGTRAP handler as it set it.
pub fn program_handler() -> libc::sighandler_t {
    unpack(PROGRAM.load(Ordering::Acquire)).0
}

/// The program's `signal(SIGTRAP, handler)` (or `sigset`, `sysv_signal`
/// with its one-shot `flags`, `bsd_signal`, `sigignore`) likewise: the
/// previous handler.
pub fn program_signal(handler: libc::sighandler_t, flags: i32) -> libc::sighandler_t {
    PROGRAM_MASK.store(0, Ordering::Release);
    unpack(PROGRAM.swap(pack(handler, flags), Ordering::AcqRel)).0
}

/// `set` without SIGTRAP, if it holds it and trap entries are in use:
/// what a mask the program asks for becomes.
///
/// # Safety
/// `set` is null or a valid signal set.
pub unsafe fn without_trap(set: *const libc::sigset_t) -> Option<libc::sigset_t> {
    if set.is_null() || !on() || libc::sigismember(set, libc::SIGTRAP) != 1 {
        return None;
    }
    let mut s = *set;
    libc::sigdelset(&mut s, libc::SIGTRAP);
    Some(s)
}

/// A BSD-style mask (bit n-1 for signal n) without SIGTRAP while trap
/// entries are in use.
pub fn without_trap_bits(mask: libc::c_int) -> libc::c_int {
    if on() {
        mask & !(1 << (libc::SIGTRAP - 1))
    } else {
        mask
    }
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
            "/lib/x86_64-linux-gnu/librt.so.1",
        ] {
            assert!(!allowed_in(p), "{p}");
        }
        for p in [
            "/usr/bin/app",
            "/usr/lib/libpython3.11.so.1.0",
            "libcrypto.so.3",
            "libc-client.so.2007e",
        ] {
            assert!(allowed_in(p), "{p}");
        }
    }

    #[test]
    fn tables_find_their_sites_and_lose_unloaded_ones() {
        add(&[(0x3000, 0x9000), (0x1000, 0x8000)]);
        add(&[(0x2000, 0x7000)]);
        assert_eq!(stub_of(0x1000), Some(0x8000));
        assert_eq!(stub_of(0x2000), Some(0x7000));
        assert_eq!(stub_of(0x3000), Some(0x9000));
        assert_eq!(stub_of(0x2001), None);
        // Unloaded: its stubs' sites go; a module loaded at the same place
        // brings its own.
        remove_stubs_in(0x8000, 0x9000);
        assert_eq!(stub_of(0x1000), None);
        assert_eq!(stub_of(0x3000), Some(0x9000));
        add(&[(0x1000, 0x8800), (0x3000, 0x9100)]);
        assert_eq!(stub_of(0x1000), Some(0x8800));
        assert_eq!(stub_of(0x3000), Some(0x9100));
    }

    #[test]
    fn dispositions_keep_their_flags() {
        let h = 0x7f12_3456_789a_usize;
        for flags in [0, libc::SA_SIGINFO, libc::SA_SIGINFO | libc::SA_RESETHAND] {
            assert_eq!(unpack(pack(h, flags)), (h, flags));
        }
        assert_eq!(unpack(pack(libc::SIG_IGN, 0)), (libc::SIG_IGN, 0));
    }
}
