//! An agent thread's life: started, woken, paused and ended on request.
//! Three run this way: the sampler's drain thread, the budget's, and the
//! control thread of an agent loaded by `rtprof attach`.
//!
//! It sleeps on a futex for as long as its tick asks: a tick that found
//! work asks for the busy interval, an idle one for twice its last sleep
//! (up to a limit, so an idle process costs one wake-up a second), or for
//! an exact time. It can be stopped and joined (a process must be
//! single-threaded to enter a user namespace), and it ends by itself once
//! the program's last thread has ended, so that glibc ends the process
//! exactly as it would without it.

use crate::count::threads;
use crate::error::Errno;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

const NONE: u32 = 0;
const RUNNING: u32 = 1;
const STOPPING: u32 = 2;

/// What a tick asks of the next sleep.
pub enum Next {
    /// Work came: sleep the busy interval.
    Busy,
    /// Nothing came: sleep twice as long as last time, up to the limit.
    Idle,
    /// Wake after exactly this long.
    In(Duration),
}

/// One tick: `gone` says the program's last thread has ended (this is the
/// last tick).
pub type Tick = fn(gone: bool) -> Next;

pub struct Worker {
    name: &'static std::ffi::CStr,
    /// The word of the segment's cost block its CPU time goes to.
    cost: usize,
    state: AtomicU32,
    /// Futex word: non-zero asks the thread to look at its state now.
    wake: AtomicU32,
    /// The program's last thread has ended: tick once more and end.
    program_gone: AtomicBool,
    thread: AtomicUsize,
    /// Its kernel thread id, once it runs (0: none).
    tid: AtomicU32,
    /// The counter segment's request words (sequence, answered) it also
    /// wakes for, if set: rtprofd wakes it as it leaves a request.
    requests: AtomicUsize,
    requests_ack: AtomicUsize,
}

const BUSY_SLEEP_MS: u64 = 100;

impl Worker {
    pub const fn new(name: &'static std::ffi::CStr, cost: usize) -> Worker {
        Worker {
            name,
            cost,
            state: AtomicU32::new(NONE),
            wake: AtomicU32::new(0),
            program_gone: AtomicBool::new(false),
            thread: AtomicUsize::new(0),
            tid: AtomicU32::new(0),
            requests: AtomicUsize::new(0),
            requests_ack: AtomicUsize::new(0),
        }
    }

    /// Wakes the thread also when another process (rtprofd) leaves a
    /// request in the shared words `seq` and `ack` (see
    /// `rtprof_abi::layout::control`), so that it is served at once, not
    /// at the next tick. The words must outlive the thread.
    pub fn wake_on_requests(&self, (seq, ack): (&AtomicU32, &AtomicU32)) {
        self.requests_ack
            .store(ack.as_ptr() as usize, Ordering::Release);
        self.requests
            .store(seq.as_ptr() as usize, Ordering::Release);
    }

    fn futex_wait(&self, timeout: Duration) {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: timeout.subsec_nanos() as i64,
        };
        let (word, op, expected) = match self.requests.load(Ordering::Acquire) {
            0 => (
                self.wake.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                0,
            ),
            seq => {
                // SAFETY: the segment's request words, set by
                // `wake_on_requests` and mapped for the process's life.
                let (seq, ack) = unsafe {
                    (
                        AtomicU32::from_ptr(seq as *mut u32),
                        AtomicU32::from_ptr(self.requests_ack.load(Ordering::Acquire) as *mut u32),
                    )
                };
                let now = seq.load(Ordering::Acquire);
                if now != ack.load(Ordering::Acquire) {
                    return; // a request waits: tick now
                }
                // Shared (no PRIVATE flag): rtprofd wakes it through its
                // own mapping of the same memfd page.
                (seq.as_ptr(), libc::FUTEX_WAIT, now)
            }
        };
        // SAFETY: a futex word that stays mapped, and a timespec on the stack.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word,
                op,
                expected,
                &ts as *const libc::timespec,
            )
        };
    }

    /// Asks the thread to tick now (async-signal-safe: a store and a
    /// system call or two).
    pub fn wake(&self) {
        self.wake.store(1, Ordering::Release);
        let (word, op) = match self.requests.load(Ordering::Acquire) {
            0 => (
                self.wake.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            ),
            seq => (seq as *mut u32, libc::FUTEX_WAKE),
        };
        // SAFETY: the futex word the thread waits on (see `futex_wait`).
        unsafe { libc::syscall(libc::SYS_futex, word, op, 1) };
    }

    /// Starts the thread (if not running), ticking with `tick`; an idle
    /// tick sleeps at most `max_sleep_ms`. `void` is private memory its own
    /// counted calls go to (0: none).
    pub fn start(&'static self, max_sleep_ms: u64, void: usize, tick: Tick) -> Result<(), Errno> {
        // No thread of the agent under a seccomp filter (see `sandbox`):
        // creating it, and what it does, take calls the filter may forbid.
        if crate::lifecycle::sandbox::on() {
            return Err(Errno(libc::EPERM));
        }
        if self
            .state
            .compare_exchange(NONE, RUNNING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Ok(());
        }
        self.program_gone.store(false, Ordering::Release);
        let job = Box::new(move || self.run(max_sleep_ms, void, tick));
        match threads::spawn_unprofiled(job) {
            Ok(t) => {
                self.thread.store(t as usize, Ordering::Release);
                Ok(())
            }
            Err(e) => {
                self.state.store(NONE, Ordering::Release);
                Err(e)
            }
        }
    }

    fn run(&self, max_sleep_ms: u64, void: usize, tick: Tick) {
        self.tid.store(threads::gettid(), Ordering::Release);
        if void != 0 {
            threads::set_stripe(void as *mut u64);
        }
        // SAFETY: names this thread; the name is a static C string.
        unsafe { libc::pthread_setname_np(libc::pthread_self(), self.name.as_ptr()) };
        let busy = Duration::from_millis(BUSY_SLEEP_MS.min(max_sleep_ms));
        let mut sleep = busy;
        // Its CPU time so far, in the cost block already.
        let mut spent = 0;
        loop {
            if self.wake.load(Ordering::Acquire) == 0 {
                self.futex_wait(sleep);
            }
            self.wake.store(0, Ordering::Release);
            let gone = self.program_gone.load(Ordering::Acquire);
            let next = tick(gone);
            let now = crate::count::cost::thread_cpu_ns();
            crate::count::cost::add(self.cost, now.saturating_sub(spent));
            spent = now;
            crate::count::cost::note_process_cpu();
            if gone {
                // No one will join us: the process ends once we have.
                if self
                    .state
                    .compare_exchange(RUNNING, NONE, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    self.thread.store(0, Ordering::Release);
                    // SAFETY: detaches this very thread.
                    unsafe { libc::pthread_detach(libc::pthread_self()) };
                }
                return;
            }
            if self.state.load(Ordering::Acquire) == STOPPING {
                return;
            }
            sleep = match next {
                Next::Busy => busy,
                Next::Idle => (sleep * 2).min(Duration::from_millis(max_sleep_ms)),
                Next::In(d) => d,
            };
        }
    }

    /// Stops and joins the thread (after a last tick). Returns whether one
    /// was running, to restart it with [`Worker::start`].
    pub fn stop(&self) -> bool {
        if self
            .state
            .compare_exchange(RUNNING, STOPPING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        self.wake();
        let t = self.thread.swap(0, Ordering::AcqRel);
        if t != 0 {
            // SAFETY: the thread we started and nobody else joins.
            unsafe { libc::pthread_join(t as libc::pthread_t, std::ptr::null_mut()) };
            wait_gone(self.tid.swap(0, Ordering::AcqRel));
        }
        self.state.store(NONE, Ordering::Release);
        true
    }

    /// The program's last thread has ended: the thread ticks once more and
    /// ends, so that glibc, which counts it, ends the process.
    pub fn program_gone(&self) {
        self.program_gone.store(true, Ordering::Release);
        self.wake();
    }

    /// In a forked child: the parent's thread does not exist here.
    pub fn forget_in_child(&self) {
        self.tid.store(0, Ordering::Relaxed);
        self.state.store(NONE, Ordering::Relaxed);
        self.wake.store(0, Ordering::Relaxed);
        self.thread.store(0, Ordering::Relaxed);
        self.program_gone.store(false, Ordering::Relaxed);
    }
}

/// Waits (a little, never for ever) until thread `tid` of this process has
/// left the kernel's thread list. A join returns once the thread cleared
/// its id, before the kernel releases it: until then it is still one of
/// the process's tasks, with the credentials it had (a program that drops
/// root and then lists its tasks would find it), and a process that must
/// be single-threaded (`unshare(CLONE_NEWUSER)`) is not yet.
fn wait_gone(tid: u32) {
    if tid == 0 {
        return;
    }
    // SAFETY: getpid takes no argument.
    let pid = unsafe { libc::getpid() };
    for _ in 0..10_000 {
        // SAFETY: signal 0 to one thread of our own: only checks it exists.
        let r = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid as libc::pid_t, 0) };
        if r != 0 {
            return;
        }
        std::thread::yield_now();
    }
}
