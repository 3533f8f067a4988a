//! The default sampler: one CPU-time timer per thread (the thread's
//! `CPUCLOCK_SCHED` clock, delivered to that thread as SIGPROF), and a
//! handler that attributes the interrupted instruction pointer. The
//! scheduler's clock, not the user-time one (`CPUCLOCK_VIRT`): user time
//! is sampled at the tick, charged whole to whoever runs then, and a
//! thread that shares its CPU with others is charged a fraction of what it
//! ran (a thread spinning 300 ms of CPU beside three busy loops on two
//! CPUs drew 59-163 user-time periods of 1 ms, and 186-298 on this clock).
//! The price: time in system calls is sampled too, and charged to the
//! libc wrapper the signal interrupts on its way out (the perf sampler's
//! events exclude the kernel). The handler never allocates, never locks
//! and preserves errno.
//!
//! Timers are created and deleted with raw system calls (no allocation,
//! usable in a forked child) and listed in a fixed table, so that all of
//! them can be stopped at once if the program takes SIGPROF over.

use super::addrmap;
use crate::arch::{Native, ThreadContext};
use crate::error::Errno;
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

extern "C" fn on_signal(_sig: libc::c_int, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let errno = Errno::last();
    if ACTIVE.load(Ordering::Relaxed) && !info.is_null() && !uc.is_null() {
        // SAFETY: installed with SA_SIGINFO: a non-null `info` is the
        // siginfo the kernel wrote on this thread's stack for this signal.
        let info = unsafe { &*info };
        // SI_TIMER: one of our timers (not a kill(2) from someone).
        if info.si_code == libc::SI_TIMER {
            let started = crate::count::cost::thread_cpu_ns();
            let uc = uc as *const libc::ucontext_t;
            // SAFETY: the context the kernel passed to this handler.
            let ip = unsafe { Native::signal_pc(uc) };
            let n = periods(info);
            // Counted and stacked together, or neither: stacks and
            // counts are reported against each other.
            if let Some(a) = crate::agent() {
                let held = count_here(a, ip, n);
                if super::STACKS.load(Ordering::Relaxed) {
                    // SAFETY: as for the program counter.
                    let (sp, bp) = unsafe { Native::signal_sp_bp(uc) };
                    super::stacks::record_here(ip, sp, bp, n, held);
                }
            }
            crate::count::cost::add(
                rtprof_abi::layout::cost::SAMPLING_NS,
                crate::count::cost::thread_cpu_ns().saturating_sub(started),
            );
        }
    }
    // SAFETY: `__errno_location` is this thread's errno, always valid;
    // the interrupted code finds it as it left it.
    unsafe { *libc::__errno_location() = errno.0 };
}

/// Counts `n` samples at `ip` of the calling thread: for the function it
/// lands in, or held for the drain thread if its module is not named yet
/// (for the module, if nothing can hold it). Returns whether it was held.
fn count_here(a: &crate::Agent, ip: u64, n: u64) -> bool {
    let hold = super::HOLDING.load(Ordering::Relaxed);
    let counted = if hold {
        addrmap::count_unless_unnamed(ip, n)
    } else {
        addrmap::count(ip, n)
    };
    let slot = match counted {
        addrmap::Counted::Function(slot) => Some(slot),
        addrmap::Counted::Held(_) => {
            if let Some(owner) = crate::count::thread_rows::owner_here(a) {
                if super::held::hold(ip, n, owner) {
                    super::wake_drainer();
                    return true;
                }
            }
            addrmap::count(ip, n);
            None
        }
        addrmap::Counted::Elsewhere => None,
    };
    crate::count::thread_rows::sampled_here(a, slot, n);
    false
}

/// The timer periods one SI_TIMER signal stands for. CPU-time timers are
/// checked at the scheduler tick: several periods may expire per signal
/// (the overrun count). The interrupted code ran for all of them, so the
/// sample counts that many times.
fn periods(info: &libc::siginfo_t) -> u64 {
    // SAFETY: only called for `si_code == SI_TIMER`, for which the kernel
    // filled the timer member of siginfo's union that `si_overrun` reads.
    let overrun = unsafe { info.si_overrun() };
    1 + overrun.max(0) as u64
}

/// Installs the handler, unless the program handles SIGPROF itself.
pub fn install(period_ns: u64) -> Result<(), super::perf::Failure> {
    use rtprof_abi::sampling::Why;
    let Some(real) = crate::lifecycle::interpose::real_sigaction() else {
        return Err((Why::TimerFailed, Some(Errno(libc::ENOSYS))));
    };
    // SAFETY: `sigaction` is integers, a handler address and a signal set,
    // for all of which zero bytes are valid (SIG_DFL, no flags, empty set).
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: libc's sigaction; a null new action only reads the current
    // one into `old`, a live local.
    unsafe { real(SIGNAL, std::ptr::null(), &mut old) };
    if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != on_signal as *const () as usize {
        return Err((Why::SignalInUse, None));
    }
    PROGRAM_VIEW.store(old.sa_sigaction, Ordering::Relaxed);
    // SAFETY: as for `old`.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_signal as *const () as usize;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    // Nothing interrupts the handler (a program handler that longjmps out
    // would leave the address table's reader count raised).
    // SAFETY: `sa.sa_mask` is a live, writable sigset_t.
    unsafe { libc::sigfillset(&mut sa.sa_mask) };
    // SAFETY: libc's sigaction with a fully initialised action whose
    // handler has the SA_SIGINFO signature; the old one is not asked for.
    if unsafe { real(SIGNAL, &sa, std::ptr::null_mut()) } != 0 {
        return Err((Why::TimerFailed, Some(Errno::last())));
    }
    if KEY.load(Ordering::Acquire) == usize::MAX {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: `key` is a live local; the destructor is an `extern "C"`
        // function taking the value, as pthread expects.
        if unsafe { libc::pthread_key_create(&mut key, Some(on_thread_exit)) } == 0 {
            KEY.store(key as usize, Ordering::Release);
        }
    }
    PERIOD_NS.store(period_ns, Ordering::Relaxed);
    ACTIVE.store(true, Ordering::Release);
    Ok(())
}

/// The calling thread's kernel id (a raw call: no allocation, any glibc).
fn gettid() -> i32 {
    crate::count::threads::gettid() as i32
}

/// A timer event that sends `signo` to thread `tid` alone.
fn to_thread(signo: i32, tid: i32) -> libc::sigevent {
    // SAFETY: `sigevent` is integers, padding and a union of an int and a
    // pointer: all zero bytes are a valid value (and no value is passed).
    let mut sev: libc::sigevent = unsafe { std::mem::zeroed() };
    sev.sigev_signo = signo;
    sev.sigev_notify = libc::SIGEV_THREAD_ID;
    sev.sigev_notify_thread_id = tid;
    sev
}

/// Creates a timer on `clock` that notifies as `sev` says; its id.
fn create_timer(clock: libc::clockid_t, sev: &libc::sigevent) -> Result<i32, Errno> {
    let mut id: i32 = 0;
    // SAFETY: `sev` points to a whole sigevent, `id` to a live int the
    // kernel writes the new timer's id into.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_timer_create,
            clock,
            sev as *const libc::sigevent,
            &mut id as *mut i32,
        )
    };
    if rc != 0 {
        return Err(Errno::last());
    }
    Ok(id)
}

/// Starts timer `id`, first expiring after `period_ns` and every
/// `period_ns` after that.
fn run_every(id: i32, period_ns: u64) -> Result<(), Errno> {
    let p = period_ns as i64;
    let ts = libc::timespec {
        tv_sec: p / 1_000_000_000,
        tv_nsec: p % 1_000_000_000,
    };
    let spec = libc::itimerspec {
        it_interval: ts,
        it_value: ts,
    };
    // SAFETY: `spec` is a live itimerspec; the old setting is not asked
    // for (null); a bad id only makes the call fail.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_timer_settime,
            id,
            0,
            &spec as *const libc::itimerspec,
            std::ptr::null_mut::<libc::itimerspec>(),
        )
    };
    if rc != 0 {
        return Err(Errno::last());
    }
    Ok(())
}

/// Whether the calling thread blocks SIGPROF (a timer's signals would
/// stay pending: the thread is left unsampled instead).
fn blocked_here() -> bool {
    // SAFETY: a sigset_t is a bit array: zero bytes are the empty set.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: no new mask (null), so this only writes the current one
    // into `set`, a live local that sigismember then reads.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set) == 0
            && libc::sigismember(&set, SIGNAL) == 1
    }
}

/// Starts a CPU-time timer for the calling thread, or, if the thread
/// blocks SIGPROF now (a child forked while all signals were blocked, as
/// perl forks), as soon as it unblocks it. A thread that never does (one
/// that takes signals with `sigwait`) is never sent one. Allocation-free.
pub fn arm_or_wait() -> Result<(), Errno> {
    match arm_current_thread() {
        Err(Errno(libc::EWOULDBLOCK)) => {
            let _ = WAITING.try_with(|w| w.set(true));
            Ok(())
        }
        r => r,
    }
}

/// After the program changed this thread's signal mask: starts the timer
/// that waited for SIGPROF to be unblocked.
pub fn mask_changed() {
    if WAITING.try_with(|w| w.get()).unwrap_or(false) && active() && !blocked_here() {
        let _ = WAITING.try_with(|w| w.set(false));
        let _ = arm_current_thread();
    }
}

/// Starts a CPU-time timer for the calling thread. Allocation-free.
pub fn arm_current_thread() -> Result<(), Errno> {
    if !active() {
        return Ok(());
    }
    if blocked_here() {
        return Err(Errno(libc::EWOULDBLOCK));
    }
    let tid = gettid();
    let slot = arm(thread_cpu_clock(tid), tid)?;
    // A stop that ran meanwhile may have passed this slot by.
    if !ACTIVE.load(Ordering::SeqCst) {
        release(slot);
        return Ok(());
    }
    let key = KEY.load(Ordering::Acquire);
    if key != usize::MAX {
        // SAFETY: `key` was created by pthread_key_create; the value is a
        // number stored as a pointer, never dereferenced.
        unsafe { libc::pthread_setspecific(key as libc::pthread_key_t, (slot + 1) as *const _) };
    }
    Ok(())
}

/// The CPU-time clock of thread `tid` of this process, in the kernel's
/// encoding of CPU clocks (what `pthread_getcpuclockid` makes): `!tid <<
/// 3`, 4 for one thread rather than the process, 2 for `CPUCLOCK_SCHED`
/// (the time the scheduler ran it, to the nanosecond).
fn thread_cpu_clock(tid: i32) -> libc::clockid_t {
    (!tid << 3) | 4 | 2
}

/// Starts a CPU-time timer for thread `tid` of this process, from another
/// thread: for an agent loaded late (`rtprof attach`), when the program's
/// threads exist already. A thread that blocks SIGPROF keeps its signals
/// pending. Allocation-free.
pub fn arm_thread(tid: i32) -> Result<(), Errno> {
    if !active() {
        return Ok(());
    }
    arm(thread_cpu_clock(tid), tid)?;
    // The timer goes with the thread's clock when it ends; its slot is
    // freed by `stop_all` (detach).
    Ok(())
}

/// Takes a free slot and starts in it a timer on `clock` signalling
/// thread `tid` every period: its slot. Allocation-free.
fn arm(clock: libc::clockid_t, tid: i32) -> Result<usize, Errno> {
    let Some(slot) = TIMERS.iter().position(|t| {
        t.compare_exchange(FREE, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }) else {
        return Err(Errno(libc::EAGAIN));
    };
    let id = match create_timer(clock, &to_thread(SIGNAL, tid)) {
        Ok(id) => id,
        Err(e) => {
            TIMERS[slot].store(FREE, Ordering::Release);
            return Err(e);
        }
    };
    // Stored before it can fire, so a stop finds it.
    TIMERS[slot].store(id + 1, Ordering::Release);
    if let Err(e) = run_every(id, PERIOD_NS.load(Ordering::Relaxed)) {
        release(slot);
        return Err(e);
    }
    Ok(slot)
}

/// Deletes the timer in `slot` (if still there) and frees the slot.
fn release(slot: usize) {
    let v = TIMERS[slot].swap(FREE, Ordering::AcqRel);
    if v > 0 {
        // SAFETY: takes a timer id, no pointer; the swap made us the only
        // one deleting this timer.
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
        // SAFETY: a key created by pthread_key_create, set to null: its
        // destructor will not run for this thread.
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

/// What the program should see as SIGPROF's disposition, while our
/// timers use the signal (asked before its `sigaction`/`signal` call: the
/// call may stop them). `None`: the real one.
pub fn program_view(sig: i32) -> Option<usize> {
    (sig == SIGNAL && active()).then(|| PROGRAM_VIEW.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits for `sig` (blocked), retrying when another test's signal
    /// interrupts the wait; the signal number, or -1.
    fn wait_for(set: &libc::sigset_t, info: *mut libc::siginfo_t, secs: i64) -> i32 {
        let ts = libc::timespec {
            tv_sec: secs,
            tv_nsec: 0,
        };
        loop {
            // SAFETY: `set` and `ts` are live; `info` is null or a live
            // siginfo_t the kernel fills.
            let got = unsafe { libc::sigtimedwait(set, info, &ts) };
            if got != -1 || Errno::last() != Errno(libc::EINTR) {
                return got;
            }
        }
    }

    /// A real timer signal, read as the handler reads it: a 1 ms timer
    /// whose signal this thread blocks for 20 ms queues one signal and
    /// counts the other expirations in its overrun, which the kernel also
    /// reports through `timer_getoverrun`. A wrong siginfo layout reads
    /// another field.
    #[test]
    fn a_timer_signal_counts_every_period_it_stands_for() {
        // Ignored by default: one that stays pending harms nothing.
        let sig = libc::SIGWINCH;
        // SAFETY: zero bytes are an empty signal set and a valid siginfo;
        // the calls below only write into these live locals.
        let (mut set, mut old, mut info): (libc::sigset_t, libc::sigset_t, libc::siginfo_t) =
            unsafe { std::mem::zeroed() };
        // SAFETY: `set` and `old` are live, writable sigset_ts.
        unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        }
        let id = create_timer(libc::CLOCK_MONOTONIC, &to_thread(sig, gettid())).unwrap();
        run_every(id, 1_000_000).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let got = wait_for(&set, &mut info, 5);
        // SAFETY: takes a timer id only.
        let overrun = unsafe { libc::syscall(libc::SYS_timer_getoverrun, id) };
        // SAFETY: as in `release`; the id is this test's timer.
        unsafe { libc::syscall(libc::SYS_timer_delete, id) };
        // Any signal queued since: taken before the mask is restored.
        while wait_for(&set, std::ptr::null_mut(), 0) == sig {}
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };

        assert_eq!(got, sig);
        assert_eq!(info.si_code, libc::SI_TIMER);
        // SAFETY: an SI_TIMER siginfo: the timer member is filled.
        assert_eq!(unsafe { info.si_timerid() }, id);
        assert!(overrun >= 5, "20 ms of 1 ms periods, one queued: {overrun}");
        assert_eq!(periods(&info), 1 + overrun as u64);
    }
}
