//! The drain thread's life: started, woken, paused and ended on request.
//!
//! It sleeps on a futex: 100 ms while samples keep arriving, doubling up to
//! the longest safe sleep (one second at 1 kHz) while the process is idle,
//! so an idle process costs one wake-up a second. It can be stopped and
//! joined (a process must be single-threaded to enter a user namespace),
//! and it ends by itself once the program's last thread has ended, so that
//! glibc ends the process exactly as it would without it.

use crate::threads;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

const NONE: u32 = 0;
const RUNNING: u32 = 1;
const STOPPING: u32 = 2;

static STATE: AtomicU32 = AtomicU32::new(NONE);
/// Futex word: non-zero asks the thread to look at its state now.
static WAKE: AtomicU32 = AtomicU32::new(0);
/// The program's last thread has ended: drain once more and end.
static PROGRAM_GONE: AtomicBool = AtomicBool::new(false);
static THREAD: AtomicUsize = AtomicUsize::new(0);

const BUSY_SLEEP_MS: u64 = 100;

fn futex_wait(timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: timeout.subsec_nanos() as i64,
    };
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            WAKE.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            0u32,
            &ts as *const libc::timespec,
        )
    };
}

fn wake() {
    WAKE.store(1, Ordering::Release);
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            WAKE.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        )
    };
}

/// Starts the drain thread; `drain_once` returns the records it read.
/// `void` is private memory its own counted calls go to (0: none).
pub fn start(max_sleep_ms: u64, void: usize, drain_once: fn(bool) -> usize) -> Result<(), i32> {
    if STATE
        .compare_exchange(NONE, RUNNING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Ok(());
    }
    PROGRAM_GONE.store(false, Ordering::Release);
    let job = Box::new(move || run(max_sleep_ms, void, drain_once));
    match threads::spawn_unprofiled(job) {
        Ok(t) => {
            THREAD.store(t as usize, Ordering::Release);
            Ok(())
        }
        Err(e) => {
            STATE.store(NONE, Ordering::Release);
            Err(e)
        }
    }
}

fn run(max_sleep_ms: u64, void: usize, drain_once: fn(bool) -> usize) {
    if void != 0 {
        threads::set_stripe(void as *mut u64);
    }
    unsafe { libc::pthread_setname_np(libc::pthread_self(), c"rtprof-drain".as_ptr()) };
    let mut sleep = BUSY_SLEEP_MS.min(max_sleep_ms);
    loop {
        if WAKE.load(Ordering::Acquire) == 0 {
            futex_wait(Duration::from_millis(sleep));
        }
        WAKE.store(0, Ordering::Release);
        let gone = PROGRAM_GONE.load(Ordering::Acquire);
        let read = drain_once(gone);
        if gone {
            // No one will join us: the process ends once we have.
            if STATE
                .compare_exchange(RUNNING, NONE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                THREAD.store(0, Ordering::Release);
                unsafe { libc::pthread_detach(libc::pthread_self()) };
            }
            return;
        }
        if STATE.load(Ordering::Acquire) == STOPPING {
            return;
        }
        sleep = if read > 0 {
            BUSY_SLEEP_MS.min(max_sleep_ms)
        } else {
            (sleep * 2).min(max_sleep_ms)
        };
    }
}

/// Stops and joins the drain thread (after a last drain). Returns whether
/// one was running, to restart it with [`start`].
pub fn stop() -> bool {
    if STATE
        .compare_exchange(RUNNING, STOPPING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return false;
    }
    wake();
    let t = THREAD.swap(0, Ordering::AcqRel);
    if t != 0 {
        unsafe { libc::pthread_join(t as libc::pthread_t, std::ptr::null_mut()) };
    }
    STATE.store(NONE, Ordering::Release);
    true
}

/// The program's last thread has ended: the drain thread drains once more
/// and ends, so that glibc, which counts it, ends the process.
pub fn program_gone() {
    PROGRAM_GONE.store(true, Ordering::Release);
    wake();
}

/// In a forked child: the parent's drain thread does not exist here.
pub fn forget_in_child() {
    STATE.store(NONE, Ordering::Relaxed);
    WAKE.store(0, Ordering::Relaxed);
    THREAD.store(0, Ordering::Relaxed);
    PROGRAM_GONE.store(false, Ordering::Relaxed);
}
