//! The agent's one lock type: a value behind an owner word, reached
//! through a guard that lets go when dropped (also when unwinding).
//!
//! - `lock` waits: it spins briefly, then sleeps on the owner word
//!   (futex), since the holder may be a thread reading files, descheduled
//!   on a busy machine. The owner word holds the holder's thread id, so a
//!   thread that holds the lock already (the loader hook re-entered from
//!   inside our own handler) is told so instead of waiting for itself.
//! - `try_lock` never waits and makes no system call: for signal handlers
//!   and for work that goes on without the value rather than wait.
//! - `reset_in_child` frees it in a forked child, whose only thread is not
//!   the parent's thread that may have held it at fork time (see
//!   `fork::CHILD_FORGETS`). A std `Mutex` held by another thread at fork
//!   time would stay locked in the child for ever.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, Ordering};

/// The owner word of a lock taken by `try_lock` (no thread id asked for:
/// that is a system call). No thread has this id.
const ANONYMOUS: u32 = u32::MAX;

/// Tries before sleeping: the locks are usually held for microseconds.
const SPINS: u32 = 200;

pub struct Lock<T> {
    /// 0: free; else the holder's thread id, or [`ANONYMOUS`].
    owner: AtomicU32,
    /// Threads asleep (or about to sleep) on `owner`.
    sleepers: AtomicU32,
    value: UnsafeCell<T>,
}

// SAFETY: `value` is only reached through a `Guard`, which exists while
// `owner` is held for it: one thread at a time, which may be another than
// the one that made the value (hence `T: Send`).
unsafe impl<T: Send> Sync for Lock<T> {}

impl<T> Lock<T> {
    pub const fn new(value: T) -> Lock<T> {
        Lock {
            owner: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            value: UnsafeCell::new(value),
        }
    }

    /// Waits for the lock; `None` if this thread holds it already.
    pub fn lock(&self) -> Option<Guard<'_, T>> {
        let me = crate::count::threads::gettid();
        let mut spins = 0u32;
        loop {
            match self
                .owner
                .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return Some(Guard { lock: self }),
                Err(owner) if owner == me => return None,
                Err(_) if spins < SPINS => {
                    spins += 1;
                    std::hint::spin_loop()
                }
                Err(owner) => self.sleep_while(owner),
            }
        }
    }

    /// The lock if it is free now. Async-signal-safe.
    pub fn try_lock(&self) -> Option<Guard<'_, T>> {
        self.owner
            .compare_exchange(0, ANONYMOUS, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| Guard { lock: self })
    }

    /// Runs `f` on the value if the lock is free now (see `try_lock`).
    pub fn try_with<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.try_lock().map(|mut g| f(&mut g))
    }

    /// Sleeps until the lock's owner is no longer `owner` (returns at once
    /// if it already changed; a spurious wake-up only loops again).
    fn sleep_while(&self, owner: u32) {
        // SeqCst with the unlock's store then load: either the holder sees
        // this sleeper, or this sleeper's futex sees the lock released.
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        if self.owner.load(Ordering::SeqCst) == owner {
            // SAFETY: FUTEX_WAIT on a live, aligned u32 of this process; it
            // sleeps only while the word still holds `owner`.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.owner.as_ptr(),
                    libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                    owner,
                    std::ptr::null::<libc::timespec>(),
                )
            };
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    fn unlock(&self) {
        self.owner.store(0, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) != 0 {
            // SAFETY: FUTEX_WAKE on a live, aligned u32 of this process.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.owner.as_ptr(),
                    libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                    i32::MAX,
                )
            };
        }
    }

    /// In a forked child, the only thread: a parent's thread that held the
    /// lock does not exist here. (What it was doing to the value may be
    /// half done: the value's owner decides whether to trust it.)
    pub fn reset_in_child(&self) {
        self.owner.store(0, Ordering::Release);
        self.sleepers.store(0, Ordering::Release);
    }
}

pub struct Guard<'a, T> {
    lock: &'a Lock<T>,
}

impl<T> std::ops::Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock (see `Lock`).
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> std::ops::DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as above, and `&mut self` makes this the only borrow.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        self.lock.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_and_no_waiting_for_oneself() {
        let l = Lock::new(0u32);
        let mut g = l.lock().expect("free");
        *g = 7;
        assert!(
            l.lock().is_none(),
            "held by this thread: told, not deadlocked"
        );
        assert!(l.try_lock().is_none());
        drop(g);
        let g = l.try_lock().expect("let go with the guard");
        assert_eq!(*g, 7);
        // Taken without an id: a waiter waits for it like any other.
        assert_eq!(l.owner.load(Ordering::Relaxed), ANONYMOUS);
        drop(g);
        assert!(l.lock().is_some());
    }

    #[test]
    fn a_panic_lets_go_and_a_child_reset_frees() {
        let l = Lock::new(());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _g = l.lock().unwrap();
            panic!("inside");
        }));
        assert!(r.is_err());
        let g = l.lock().unwrap();
        // As a fork child finds a lock its parent's other thread held.
        std::mem::forget(g);
        assert!(l.try_lock().is_none());
        l.reset_in_child();
        assert!(l.try_lock().is_some());
    }

    /// Holders that sleep make waiters sleep too (on the futex); every
    /// waiter still gets in, one at a time, and so do those that only try.
    #[test]
    fn waiters_that_sleep_are_woken_one_holder_at_a_time() {
        use std::sync::atomic::AtomicBool;
        let l = Lock::new(0u32);
        let inside = AtomicBool::new(false);
        let tried = AtomicU32::new(0);
        std::thread::scope(|s| {
            for t in 0..4 {
                let (l, inside, tried) = (&l, &inside, &tried);
                s.spawn(move || {
                    for i in 0..200 {
                        let g = match t {
                            3 => match l.try_lock() {
                                Some(g) => g,
                                None => continue,
                            },
                            _ => l.lock().expect("not held by this thread"),
                        };
                        assert!(!inside.swap(true, Ordering::SeqCst), "two holders");
                        if (i + t) % 50 == 0 {
                            std::thread::sleep(std::time::Duration::from_millis(2));
                        }
                        inside.store(false, Ordering::SeqCst);
                        let mut g = g;
                        *g += 1;
                        if t == 3 {
                            tried.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(*l.lock().unwrap(), 600 + tried.load(Ordering::Relaxed));
        assert_eq!(l.sleepers.load(Ordering::SeqCst), 0);
    }
}
