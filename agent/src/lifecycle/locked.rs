//! What changes after start-up, behind one lock: the stub map (libraries
//! loaded and unloaded), the modules known, the counter segment's metadata
//! writer, and the overhead budget's controller. Held by the loader hook, the drain thread naming modules,
//! counting switches and the budget; a guard gives `&mut` access and lets
//! go when dropped (also when unwinding).
//!
//! The lock holds its owner's thread id: the loader hook may re-enter (a
//! library loaded from inside our handler), and is told so instead of
//! waiting for itself. A forked child resets it (a thread of the parent
//! may have held it at fork time).
//!
//! A waiter spins briefly, then sleeps on the owner word (futex): the
//! holder may be the drain thread reading files, descheduled on a busy
//! machine, while the program's exit waits for it.

use crate::lifecycle::loader::Known;
use crate::options::budget::Controller;
use crate::patch::install::StubMap;
use rtprof_shared::SegmentWriter;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, Ordering};

/// The state the lock guards.
pub struct Locked {
    pub stubs: StubMap,
    pub known: Known,
    pub budget: Option<Controller>,
    /// Module and function records: one writer, so `&mut` through the guard.
    pub writer: SegmentWriter,
}

pub struct StateLock {
    owner: AtomicU32,
    /// Threads asleep (or about to sleep) on `owner`.
    sleepers: AtomicU32,
    state: UnsafeCell<Locked>,
}

// SAFETY: `state` is only reached through a `Guard`, which exists while
// `owner` holds its thread's id: one thread at a time.
unsafe impl Sync for StateLock {}

impl StateLock {
    pub fn new(state: Locked) -> StateLock {
        StateLock {
            owner: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            state: UnsafeCell::new(state),
        }
    }

    /// Waits for the lock; `None` if this thread holds it already.
    pub fn lock(&self) -> Option<Guard<'_>> {
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
    /// lock does not exist here.
    pub fn reset_in_child(&self) {
        self.owner.store(0, Ordering::Release);
        self.sleepers.store(0, Ordering::Release);
    }
}

/// Tries before sleeping: the lock is usually held for microseconds.
const SPINS: u32 = 200;

pub struct Guard<'a> {
    lock: &'a StateLock,
}

impl std::ops::Deref for Guard<'_> {
    type Target = Locked;
    fn deref(&self) -> &Locked {
        // SAFETY: this guard's thread holds the lock (see `StateLock`).
        unsafe { &*self.lock.state.get() }
    }
}

impl std::ops::DerefMut for Guard<'_> {
    fn deref_mut(&mut self) -> &mut Locked {
        // SAFETY: as above, and `&mut self` makes this the only borrow.
        unsafe { &mut *self.lock.state.get() }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.lock.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock() -> StateLock {
        let layout = rtprof_shared::Layout::new(rtprof_shared::Capacities {
            modules: 1,
            functions: 1,
            strings: 8,
            stripes: 1,
        });
        let mem = vec![0u64; layout.total_size as usize / 8].leak();
        // SAFETY: zeroed, 8-aligned, as long as the layout, and leaked:
        // mapped for the rest of the test process.
        let writer = unsafe { SegmentWriter::init(mem.as_mut_ptr().cast(), layout, 1, 0, 0) };
        StateLock::new(Locked {
            stubs: StubMap::default(),
            known: Known(Vec::new()),
            budget: None,
            writer,
        })
    }

    #[test]
    fn one_holder_and_no_waiting_for_oneself() {
        let l = lock();
        let g = l.lock().expect("free");
        assert!(
            l.lock().is_none(),
            "held by this thread: told, not deadlocked"
        );
        drop(g);
        assert!(l.lock().is_some(), "let go with the guard");
    }

    #[test]
    fn a_panic_lets_go() {
        let l = lock();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _g = l.lock().unwrap();
            panic!("inside");
        }));
        assert!(r.is_err());
        assert!(l.lock().is_some());
    }

    /// Holders that sleep make waiters sleep too (on the futex); every
    /// waiter still gets in, one at a time.
    #[test]
    fn waiters_that_sleep_are_woken_one_holder_at_a_time() {
        use std::sync::atomic::AtomicBool;
        let l = lock();
        let inside = AtomicBool::new(false);
        let entries = AtomicU32::new(0);
        std::thread::scope(|s| {
            for t in 0..4 {
                let (l, inside, entries) = (&l, &inside, &entries);
                s.spawn(move || {
                    for i in 0..200 {
                        let g = l.lock().expect("not held by this thread");
                        assert!(!inside.swap(true, Ordering::SeqCst), "two holders");
                        if (i + t) % 50 == 0 {
                            std::thread::sleep(std::time::Duration::from_millis(2));
                        }
                        inside.store(false, Ordering::SeqCst);
                        entries.fetch_add(1, Ordering::Relaxed);
                        drop(g);
                    }
                });
            }
        });
        assert_eq!(entries.load(Ordering::Relaxed), 800);
        assert_eq!(l.sleepers.load(Ordering::SeqCst), 0);
    }
}
