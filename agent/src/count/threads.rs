//! Per-thread stripes. Each thread's stripe pointer lives in static TLS at a
//! fixed offset from the thread pointer, so a stub reaches it with one
//! load (`arch`). New threads get a stripe in a `pthread_create`
//! wrapper before their start routine runs; when a thread ends, its counts
//! are folded into the ended threads' sum and its stripe is reused.

use crate::arch::{Native, ThreadContext};
use crate::error::Errno;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Offset of the stripe pointer from the thread pointer.
pub fn tls_offset() -> i64 {
    Native::stripe_tls_offset()
}

/// Sets this thread's stripe pointer (null: count in the shared stripe).
pub fn set_stripe(p: *mut u64) {
    Native::set_thread_word(tls_offset(), p as u64);
}

pub fn stripe() -> *mut u64 {
    Native::thread_word(tls_offset()) as *mut u64
}

pub fn gettid() -> u32 {
    // SAFETY: a system call without arguments.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// pthread key whose destructor retires the thread's stripe.
static EXIT_KEY: AtomicUsize = AtomicUsize::new(usize::MAX);

/// At thread exit: later calls of this thread (other destructors) go to the
/// shared stripe, and its own stripe's counts are folded into the ended
/// threads' sum, freeing the stripe for the next thread.
unsafe extern "C" fn on_thread_exit(_: *mut libc::c_void) {
    if let Some(a) = crate::agent() {
        // The stripe the thread counts in now, if still its own: after a
        // detach and a new attach it was given another.
        let held = a.segment.counters.stripe_held_at(stripe(), gettid());
        set_stripe(std::ptr::null_mut());
        if let Some(i) = held {
            super::thread_rows::thread_ending(a, i, gettid());
        }
    }
}

/// Program threads alive (the agent's own not included). glibc ends a
/// process with `exit(0)` when its last thread returns or calls
/// `pthread_exit`; it counts our drain thread too, so with one running it
/// would wait for ever. When the program's last thread ends, the drain
/// thread is told to end too, and glibc does the rest as usual.
static PROGRAM_THREADS: AtomicUsize = AtomicUsize::new(1);
static LIVE_KEY: AtomicUsize = AtomicUsize::new(usize::MAX);

unsafe extern "C" fn on_program_thread_exit(_: *mut libc::c_void) {
    if PROGRAM_THREADS.fetch_sub(1, Ordering::AcqRel) == 1 {
        crate::lifecycle::interpose::program_threads_gone();
    }
}

/// A program thread is being created (counted before it exists: the
/// creator may end first).
pub fn program_thread_coming() {
    PROGRAM_THREADS.fetch_add(1, Ordering::AcqRel);
}

/// A thread counted by [`program_thread_coming`] was not created.
pub fn program_thread_not_started() {
    PROGRAM_THREADS.fetch_sub(1, Ordering::AcqRel);
}

/// Marks the calling thread as one of the program's.
pub fn mark_program_thread() {
    let key = LIVE_KEY.load(Ordering::Acquire);
    if key != usize::MAX {
        // SAFETY: a key pthread_key_create gave us; the value is only a
        // non-null marker, never dereferenced.
        unsafe {
            libc::pthread_setspecific(
                key as libc::pthread_key_t,
                std::ptr::dangling::<libc::c_void>(),
            )
        };
    }
}

/// In a forked child only the forking thread exists (marked again when
/// `fork()` returns, in case it was not one of ours).
pub fn reset_program_threads_in_child() {
    PROGRAM_THREADS.store(1, Ordering::Relaxed);
}

/// Creates the keys whose destructors follow threads' ends; `caller_is_program`:
/// the calling thread is one of the program's (start-up, not attach).
pub fn init_exit_key(caller_is_program: bool) {
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is ours to write; the destructor is an extern "C" fn
    // that lives as long as the library.
    if unsafe { libc::pthread_key_create(&mut key, Some(on_program_thread_exit)) } == 0 {
        LIVE_KEY.store(key as usize, Ordering::Release);
        // The main thread: its key runs only if it calls pthread_exit.
        if caller_is_program {
            mark_program_thread();
        }
    }
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: as for the program-thread key above.
    if unsafe { libc::pthread_key_create(&mut key, Some(on_thread_exit)) } == 0 {
        EXIT_KEY.store(key as usize, Ordering::Release);
    }
}

/// Gives the calling thread a stripe of its own, if any is left (and its
/// own loop counters).
pub fn attach_current() {
    crate::options::loops::counts::attach_thread();
    let Some(a) = crate::agent() else { return };
    if !stripe().is_null() {
        return;
    }
    if let Some(scratch) = crate::lifecycle::fork::uncounted_stripe() {
        return set_stripe(scratch);
    }
    if let Some(idx) = a.segment.new_stripe(gettid()) {
        set_stripe(a.segment.counters.stripe_ptr(idx));
        let key = EXIT_KEY.load(Ordering::Acquire);
        if key != usize::MAX {
            // SAFETY: a key we created; the value is only a non-null
            // marker (so the destructor runs), never dereferenced.
            unsafe {
                libc::pthread_setspecific(
                    key as libc::pthread_key_t,
                    (idx as usize + 1) as *const libc::c_void,
                )
            };
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

extern "C" fn unprofiled_start(p: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: `p` is the Box `spawn_unprofiled` leaked for this thread,
    // taken back exactly once, here.
    let job = unsafe { Box::from_raw(p as *mut Job) };
    crate::lifecycle::private_files::enter();
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    std::ptr::null_mut()
}

/// Runs `f` with every signal that can be blocked blocked in this thread,
/// the mask put back after: a handler of the program never runs inside
/// it, and a thread created meanwhile starts with them all blocked.
pub fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sigset_t is plain data, filled by sigfillset before use;
    // the old mask is put back before returning.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let r = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        r
    }
}

/// Starts an agent thread: joinable, no stripe, no timer, every signal
/// blocked (the program's signals are never delivered to it). Returns the
/// thread, or the errno on failure.
pub fn spawn_unprofiled(job: Job) -> Result<libc::pthread_t, Errno> {
    let real = crate::lifecycle::interpose::real_pthread_create().ok_or(Errno(libc::ENOSYS))?;
    let boxed = Box::into_raw(Box::new(job));
    with_signals_blocked(|| {
        // SAFETY: the attribute is initialised by libc before use; `real`
        // is the next pthread_create; `boxed` goes to the new thread, or is
        // taken back here if none starts.
        unsafe {
            let mut attr: libc::pthread_attr_t = std::mem::zeroed();
            libc::pthread_attr_init(&mut attr);
            libc::pthread_attr_setstacksize(&mut attr, 256 * 1024);
            let mut t: libc::pthread_t = 0;
            let rc = real(&mut t, &attr, unprofiled_start, boxed as *mut libc::c_void);
            libc::pthread_attr_destroy(&mut attr);
            if rc != 0 {
                drop(Box::from_raw(boxed));
                return Err(Errno(rc));
            }
            Ok(t)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_slot_is_per_thread_at_a_fixed_offset() {
        let off = tls_offset();
        assert!(off < 0 && off > i32::MIN as i64);
        let mut x = 5u64;
        set_stripe(&mut x);
        assert_eq!(stripe(), &mut x as *mut u64);
        std::thread::spawn(move || {
            assert_eq!(tls_offset(), off);
            assert!(stripe().is_null(), "new thread starts without a stripe");
        })
        .join()
        .unwrap();
        set_stripe(std::ptr::null_mut());
    }
}
