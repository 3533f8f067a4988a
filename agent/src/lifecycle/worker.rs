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
        if self.requests.load(Ordering::Acquire) != 0 && self.wait_for_requests_too(timeout) {
            return;
        }
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: timeout.subsec_nanos() as i64,
        };
        // SAFETY: our futex word and a timespec on the stack.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.wake.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                0u32,
                &ts as *const libc::timespec,
            )
        };
    }

    /// Waits on its own word and on the segment's request word at once
    /// (`futex_waitv`, Linux 5.16): woken by [`Worker::wake`] (which
    /// changes its own word, so no wake-up is lost) or by rtprofd leaving a
    /// request (a shared futex: rtprofd wakes it through its own mapping
    /// of the memfd's page). False where the kernel has no `futex_waitv`:
    /// requests then wait for the next tick.
    fn wait_for_requests_too(&self, timeout: Duration) -> bool {
        /// `struct futex_waitv` (linux/futex.h).
        #[repr(C)]
        struct FutexWaitv {
            val: u64,
            uaddr: u64,
            flags: u32,
            reserved: u32,
        }
        const SYS_FUTEX_WAITV: libc::c_long = 449;
        const FUTEX2_SIZE_U32: u32 = 0x02;
        const FUTEX2_PRIVATE: u32 = 128;
        static MISSING: AtomicBool = AtomicBool::new(false);
        if MISSING.load(Ordering::Relaxed) {
            return false;
        }
        // SAFETY: the segment's request words, set by `wake_on_requests`
        // and mapped for the process's life.
        let (seq, ack) = unsafe {
            (
                AtomicU32::from_ptr(self.requests.load(Ordering::Acquire) as *mut u32),
                AtomicU32::from_ptr(self.requests_ack.load(Ordering::Acquire) as *mut u32),
            )
        };
        let now = seq.load(Ordering::Acquire);
        if now != ack.load(Ordering::Acquire) {
            return true; // a request waits: tick now
        }
        let waiters = [
            FutexWaitv {
                val: 0,
                uaddr: self.wake.as_ptr() as u64,
                flags: FUTEX2_SIZE_U32 | FUTEX2_PRIVATE,
                reserved: 0,
            },
            FutexWaitv {
                val: now as u64,
                uaddr: seq.as_ptr() as u64,
                flags: FUTEX2_SIZE_U32,
                reserved: 0,
            },
        ];
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: writes the timespec on our stack.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let ns = ts.tv_nsec as u64 + timeout.subsec_nanos() as u64;
        ts.tv_sec += timeout.as_secs() as i64 + (ns / 1_000_000_000) as i64;
        ts.tv_nsec = (ns % 1_000_000_000) as i64;
        // SAFETY: two waiters on words that stay mapped, and an absolute
        // timeout on our stack.
        let r = unsafe {
            libc::syscall(
                SYS_FUTEX_WAITV,
                waiters.as_ptr(),
                2u32,
                0u32,
                &ts as *const libc::timespec,
                libc::CLOCK_MONOTONIC,
            )
        };
        if r < 0 && Errno::last().0 == libc::ENOSYS {
            MISSING.store(true, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Asks the thread to tick now (async-signal-safe: a store and a
    /// system call).
    pub fn wake(&self) {
        self.wake.store(1, Ordering::Release);
        // SAFETY: our futex word.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.wake.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                1,
            )
        };
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
            // A tick that panics (said by the panic hook) is an idle one:
            // the thread must go on, since while it is marked running no
            // other starts, and a request left for it would wait for ever.
            let next = std::panic::catch_unwind(|| tick(gone)).unwrap_or(Next::Idle);
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
