//! The fallback sampler: one CPU-time timer per thread
//! (`CLOCK_THREAD_CPUTIME_ID`, delivered to that thread as SIGPROF), and a
//! handler that attributes the interrupted instruction pointer. The handler
//! never allocates, never locks and preserves errno.
//!
//! Timers are created and deleted with raw system calls (no allocation,
//! usable in a forked child) and listed in a fixed table, so that all of
//! them can be stopped at once if the program takes SIGPROF over.

use super::addrmap;
use crate::arch::{InstructionSet, Native};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

pub const SIGNAL: i32 = libc::SIGPROF;
/// Threads sampled at once; later threads run unsampled.
const MAX_TIMERS: usize = 4096;
const FREE: i32 = -1;

static ACTIVE: AtomicBool = AtomicBool::new(false);
/// SIGPROF's disposition as the program set it (before ours): what a
/// program asking `sigaction` sees while our handler is installed.
static PROGRAM_VIEW: AtomicUsize = AtomicUsize::new(0);
static PERIOD_NS: AtomicU64 = AtomicU64::new(0);
static TIMERS: [AtomicI32; MAX_TIMERS] = [const { AtomicI32::new(FREE) }; MAX_TIMERS];
/// Key whose value (table index + 1) deletes a thread's timer at its exit.
static KEY: AtomicUsize = AtomicUsize::new(usize::MAX);

thread_local! {
    /// This thread blocked SIGPROF when its timer was due to start: the
    /// timer starts when the program unblocks the signal.
    static WAITING: Cell<bool> = const { Cell::new(false) };
}

pub fn active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

type SigactionFn =
    unsafe extern "C" fn(libc::c_int, *const libc::sigaction, *mut libc::sigaction) -> libc::c_int;

fn real_sigaction() -> Option<SigactionFn> {
    static F: AtomicUsize = AtomicUsize::new(0);
    let mut f = F.load(Ordering::Acquire);
    if f == 0 {
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"sigaction".as_ptr()) } as usize;
        F.store(f, Ordering::Release);
    }
    (f != 0).then(|| unsafe { std::mem::transmute::<usize, SigactionFn>(f) })
}

extern "C" fn on_signal(_sig: libc::c_int, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let errno = unsafe { *libc::__errno_location() };
    if ACTIVE.load(Ordering::Relaxed) && !info.is_null() && !uc.is_null() {
        // SI_TIMER: one of our timers (not a kill(2) from someone).
        if unsafe { (*info).si_code } == libc::SI_TIMER {
            let uc = uc as *const libc::ucontext_t;
            // SAFETY: the context the kernel passed to this handler.
            let ip = unsafe { Native::signal_pc(uc) };
            // CPU-time timers are checked at the scheduler tick: several
            // periods may expire per signal (si_overrun, after si_tid in the
            // timer part of siginfo). The interrupted code ran for all of
            // them, so the sample counts that many times.
            let overrun = unsafe { *((info as *const u8).add(20) as *const i32) };
            addrmap::count(ip, 1 + overrun.max(0) as u64);
        }
    }
    unsafe { *libc::__errno_location() = errno };
}

/// Installs the handler, unless the program handles SIGPROF itself.
pub fn install(period_ns: u64) -> Result<(), super::perf::Failure> {
    use rtprof_shared::sampling::Why;
    real_signal();
    let Some(real) = real_sigaction() else {
        return Err((Why::TimerFailed, libc::ENOSYS));
    };
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    unsafe { real(SIGNAL, std::ptr::null(), &mut old) };
    if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != on_signal as *const () as usize {
        return Err((Why::SignalInUse, 0));
    }
    PROGRAM_VIEW.store(old.sa_sigaction, Ordering::Relaxed);
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_signal as *const () as usize;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    // Nothing interrupts the handler (a program handler that longjmps out
    // would leave the address table's reader count raised).
    unsafe { libc::sigfillset(&mut sa.sa_mask) };
    if unsafe { real(SIGNAL, &sa, std::ptr::null_mut()) } != 0 {
        return Err((Why::TimerFailed, errno()));
    }
    if KEY.load(Ordering::Acquire) == usize::MAX {
        let mut key: libc::pthread_key_t = 0;
        if unsafe { libc::pthread_key_create(&mut key, Some(on_thread_exit)) } == 0 {
            KEY.store(key as usize, Ordering::Release);
        }
    }
    PERIOD_NS.store(period_ns, Ordering::Relaxed);
    ACTIVE.store(true, Ordering::Release);
    Ok(())
}

fn errno() -> i32 {
    unsafe { *libc::__errno_location() }
}

#[repr(C)]
struct SigEvent {
    value: usize,
    signo: i32,
    notify: i32,
    tid: i32,
    pad: [i32; 11],
}

#[repr(C)]
struct ITimerSpec {
    interval: libc::timespec,
    value: libc::timespec,
}

/// Whether the calling thread blocks SIGPROF (a timer's signals would
/// stay pending: the thread is left unsampled instead).
fn blocked_here() -> bool {
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set) == 0
            && libc::sigismember(&set, SIGNAL) == 1
    }
}

/// Starts a CPU-time timer for the calling thread, or, if the thread
/// blocks SIGPROF now (a child forked while all signals were blocked, as
/// perl forks), as soon as it unblocks it. A thread that never does (one
/// that takes signals with `sigwait`) is never sent one. Allocation-free.
pub fn arm_or_wait() -> Result<(), i32> {
    match arm_current_thread() {
        Err(libc::EWOULDBLOCK) => {
            let _ = WAITING.try_with(|w| w.set(true));
            Ok(())
        }
        r => r,
    }
}

/// After the program changed this thread's signal mask: starts the timer
/// that waited for SIGPROF to be unblocked. (The interposers below are
/// exported only outside unit tests.)
#[cfg_attr(test, allow(dead_code))]
fn mask_changed() {
    if WAITING.try_with(|w| w.get()).unwrap_or(false) && active() && !blocked_here() {
        let _ = WAITING.try_with(|w| w.set(false));
        let _ = arm_current_thread();
    }
}

#[cfg_attr(test, allow(dead_code))]
type MaskFn =
    unsafe extern "C" fn(libc::c_int, *const libc::sigset_t, *mut libc::sigset_t) -> libc::c_int;

#[cfg_attr(test, allow(dead_code))]
fn real_mask_fn(name: &std::ffi::CStr, cache: &AtomicUsize) -> Option<MaskFn> {
    let mut f = cache.load(Ordering::Acquire);
    if f == 0 {
        // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds libc's.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
        cache.store(f, Ordering::Release);
    }
    // SAFETY: the symbol is libc's function of exactly this signature.
    (f != 0).then(|| unsafe { std::mem::transmute::<usize, MaskFn>(f) })
}

static REAL_SIGPROCMASK: AtomicUsize = AtomicUsize::new(0);
static REAL_PTHREAD_SIGMASK: AtomicUsize = AtomicUsize::new(0);

/// Looks libc's mask functions up once, from the agent's constructor
/// (whether or not it goes on to profile): a vfork child, which must not
/// take the loader's locks, then never calls `dlsym` in the wrappers.
#[cfg_attr(test, allow(dead_code))]
pub fn resolve_mask_fns() {
    let _ = real_mask_fn(c"sigprocmask", &REAL_SIGPROCMASK);
    let _ = real_mask_fn(c"pthread_sigmask", &REAL_PTHREAD_SIGMASK);
}

/// `sigprocmask(2)`, unchanged, then a waiting timer may start.
///
/// # Safety
/// Same contract as `sigprocmask(2)`.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn sigprocmask(
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    let Some(real) = real_mask_fn(c"sigprocmask", &REAL_SIGPROCMASK) else {
        *libc::__errno_location() = libc::ENOSYS;
        return -1;
    };
    let rc = real(how, set, old);
    if rc == 0 && !set.is_null() {
        mask_changed();
    }
    rc
}

/// `pthread_sigmask(3)`, unchanged, then a waiting timer may start.
///
/// # Safety
/// Same contract as `pthread_sigmask(3)`.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn pthread_sigmask(
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    let Some(real) = real_mask_fn(c"pthread_sigmask", &REAL_PTHREAD_SIGMASK) else {
        return libc::ENOSYS;
    };
    let rc = real(how, set, old);
    if rc == 0 && !set.is_null() {
        mask_changed();
    }
    rc
}

/// Starts a CPU-time timer for the calling thread. Allocation-free.
pub fn arm_current_thread() -> Result<(), i32> {
    if !active() {
        return Ok(());
    }
    if blocked_here() {
        return Err(libc::EWOULDBLOCK);
    }
    let Some(slot) = TIMERS.iter().position(|t| {
        t.compare_exchange(FREE, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }) else {
        return Err(libc::EAGAIN);
    };
    let sev = SigEvent {
        value: 0,
        signo: SIGNAL,
        notify: libc::SIGEV_THREAD_ID,
        tid: unsafe { libc::syscall(libc::SYS_gettid) } as i32,
        pad: [0; 11],
    };
    let mut id: i32 = 0;
    let rc = unsafe {
        libc::syscall(
            libc::SYS_timer_create,
            libc::CLOCK_THREAD_CPUTIME_ID,
            &sev as *const SigEvent,
            &mut id as *mut i32,
        )
    };
    if rc != 0 {
        let e = errno();
        TIMERS[slot].store(FREE, Ordering::Release);
        return Err(e);
    }
    let p = PERIOD_NS.load(Ordering::Relaxed) as i64;
    let ts = libc::timespec {
        tv_sec: p / 1_000_000_000,
        tv_nsec: p % 1_000_000_000,
    };
    let spec = ITimerSpec {
        interval: ts,
        value: ts,
    };
    // Stored before it can fire, so a stop finds it.
    TIMERS[slot].store(id + 1, Ordering::Release);
    let rc = unsafe {
        libc::syscall(
            libc::SYS_timer_settime,
            id,
            0,
            &spec as *const ITimerSpec,
            std::ptr::null_mut::<ITimerSpec>(),
        )
    };
    if rc != 0 {
        let e = errno();
        release(slot);
        return Err(e);
    }
    // A stop that ran meanwhile may have passed this slot by.
    if !ACTIVE.load(Ordering::SeqCst) {
        release(slot);
        return Ok(());
    }
    let key = KEY.load(Ordering::Acquire);
    if key != usize::MAX {
        unsafe { libc::pthread_setspecific(key as libc::pthread_key_t, (slot + 1) as *const _) };
    }
    Ok(())
}

/// Deletes the timer in `slot` (if still there) and frees the slot.
fn release(slot: usize) {
    let v = TIMERS[slot].swap(FREE, Ordering::AcqRel);
    if v > 0 {
        unsafe { libc::syscall(libc::SYS_timer_delete, v - 1) };
    }
}

unsafe extern "C" fn on_thread_exit(v: *mut libc::c_void) {
    let slot = v as usize;
    if (1..=MAX_TIMERS).contains(&slot) {
        release(slot - 1);
    }
}

/// Stops sampling in every thread.
pub fn stop_all() {
    ACTIVE.store(false, Ordering::SeqCst);
    for slot in 0..MAX_TIMERS {
        release(slot);
    }
}

/// In a forked child: timers are not inherited, and the parent's timer ids
/// mean nothing here (they may name the child's own timers later).
pub fn forget_in_child() {
    for t in &TIMERS {
        t.store(FREE, Ordering::Relaxed);
    }
    // The forking thread's slot number is its parent's: forget it too
    // (keys created early live in the thread itself: no allocation).
    let key = KEY.load(Ordering::Acquire);
    if key != usize::MAX {
        unsafe { libc::pthread_setspecific(key as libc::pthread_key_t, std::ptr::null()) };
    }
}

/// Called before the program changes SIGPROF's disposition: the signal is
/// the program's from then on, and our timers must stop first.
pub fn program_takes_signal(sig: i32, handler: usize) {
    if sig == SIGNAL && active() && handler != on_signal as *const () as usize {
        stop_all();
        super::timer_taken_over();
    }
}

/// `sigaction(2)` as the program sees it: unchanged, except that taking
/// SIGPROF over stops our timers first, and that while they run the
/// program sees its own disposition, not our handler.
///
/// # Safety
/// Same contract as `sigaction(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sigaction(
    sig: libc::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    let ours = sig == SIGNAL && active();
    if !act.is_null() {
        program_takes_signal(sig, (*act).sa_sigaction);
    }
    let Some(real) = real_sigaction() else {
        *libc::__errno_location() = libc::ENOSYS;
        return -1;
    };
    let rc = real(sig, act, old);
    if ours && rc == 0 && !old.is_null() {
        (*old).sa_sigaction = PROGRAM_VIEW.load(Ordering::Relaxed);
        (*old).sa_flags = 0;
        libc::sigemptyset(&mut (*old).sa_mask);
    }
    rc
}

/// `signal(3)`: glibc's calls its internal sigaction directly, so it is
/// wrapped too.
///
/// # Safety
/// Same contract as `signal(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn signal(
    sig: libc::c_int,
    handler: libc::sighandler_t,
) -> libc::sighandler_t {
    type SignalFn = unsafe extern "C" fn(libc::c_int, libc::sighandler_t) -> libc::sighandler_t;
    let ours = sig == SIGNAL && active();
    program_takes_signal(sig, handler);
    let f = real_signal();
    if f == 0 {
        return libc::SIG_ERR;
    }
    let old = std::mem::transmute::<usize, SignalFn>(f)(sig, handler);
    if ours && old != libc::SIG_ERR {
        PROGRAM_VIEW.load(Ordering::Relaxed)
    } else {
        old
    }
}

fn real_signal() -> usize {
    static F: AtomicUsize = AtomicUsize::new(0);
    let mut f = F.load(Ordering::Acquire);
    if f == 0 {
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"signal".as_ptr()) } as usize;
        F.store(f, Ordering::Release);
    }
    f
}
