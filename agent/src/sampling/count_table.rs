//! A bounded table of counts by a 64-bit key, for what samples are
//! counted by besides their function (their place in it, their thread):
//! a fixed array, no allocation, no waiting, so a signal handler may add
//! to it. One thread at a time uses it; a count that finds it in use, or
//! full, is left out and counted as dropped.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Distinct keys kept: a power of two, filled to 3/4 at most so that
/// probes stay short. 16,384 entries of 16 bytes: 256 KiB of zero pages
/// until counts touch them.
const BITS: u32 = 14;
const CAP: usize = 1 << BITS;
pub const LIMIT: usize = CAP / 4 * 3;

struct Table {
    /// (key, count); key 0 is a free entry.
    entries: [(u64, u64); CAP],
    len: usize,
    /// One bit per 4 KiB of `entries` (256 entries) that an entry was
    /// written in: set before the entry is, so what a clear looks at
    /// covers every entry in use, even one a fork caught half written.
    dirty: u64,
}

/// Entries per bit of [`Table::dirty`].
const PER_BIT: usize = CAP / 64;

pub struct CountTable {
    busy: AtomicBool,
    table: UnsafeCell<Table>,
    /// Counts not in the table: it was in use or full.
    dropped: AtomicU64,
}

// SAFETY: `table` is only reached while `busy` is held (see `with`).
unsafe impl Sync for CountTable {}

impl Table {
    fn add(&mut self, k: u64, n: u64) -> bool {
        // Fibonacci hashing: nearby keys spread over the table.
        let mut i = (k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - BITS)) as usize;
        loop {
            let e = &mut self.entries[i];
            if e.0 == k {
                e.1 = e.1.saturating_add(n);
                return true;
            }
            if e.0 == 0 {
                if self.len >= LIMIT {
                    return false;
                }
                self.dirty |= 1 << (i / PER_BIT);
                self.len += 1;
                // The mark first, even to a fork between the two stores.
                std::sync::atomic::compiler_fence(Ordering::SeqCst);
                self.entries[i] = (k, n);
                return true;
            }
            i = (i + 1) & (CAP - 1);
        }
    }

    /// Zeroes the parts written: a forked child touches (and copies) only
    /// those, not the whole table.
    fn clear(&mut self) {
        for bit in 0..64 {
            if self.dirty & 1 << bit != 0 {
                self.entries[bit * PER_BIT..(bit + 1) * PER_BIT].fill((0, 0));
            }
        }
        self.dirty = 0;
        self.len = 0;
    }
}

impl CountTable {
    pub const fn new() -> CountTable {
        CountTable {
            busy: AtomicBool::new(false),
            table: UnsafeCell::new(Table {
                entries: [(0, 0); CAP],
                len: 0,
                dirty: 0,
            }),
            dropped: AtomicU64::new(0),
        }
    }

    /// Runs `f` on the table unless another thread (or an interrupted
    /// one on this thread) is using it.
    fn with<R>(&self, f: impl FnOnce(&mut Table) -> R) -> Option<R> {
        if self.busy.swap(true, Ordering::Acquire) {
            return None;
        }
        // SAFETY: `busy` was false and is now ours: no other reference.
        let r = f(unsafe { &mut *self.table.get() });
        self.busy.store(false, Ordering::Release);
        Some(r)
    }

    /// Adds `n` to `key` (not 0). Async-signal-safe.
    #[inline]
    pub fn add(&self, key: u64, n: u64) {
        if self.with(|t| t.add(key, n)) != Some(true) {
            self.dropped.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Every (key, count), if the table can be had soon (at exit the
    /// drain thread may be counting a last sample: waited for a little,
    /// never for ever). Allocates.
    pub fn entries(&self) -> Option<Vec<(u64, u64)>> {
        for _ in 0..1000 {
            let got = self.with(|t| {
                let v: Vec<(u64, u64)> = t.entries.iter().copied().filter(|e| e.0 != 0).collect();
                v
            });
            if got.is_some() {
                return got;
            }
            std::thread::yield_now();
        }
        None
    }

    /// Empties it. In a forked child (one thread, allocation-free): the
    /// parent's counts are not the child's, and a parent thread that held
    /// the table does not exist there.
    pub fn clear_in_child(&self) {
        self.busy.store(false, Ordering::Release);
        self.clear();
    }

    /// Empties it (a new attach), unless it is in use.
    pub fn clear(&self) {
        self.dropped.store(0, Ordering::Relaxed);
        self.with(Table::clear);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_counted_apart_and_bounded() {
        let t = Box::new(CountTable::new());
        t.add(5, 1);
        t.add(5, 2);
        t.add(7 << 32 | 0x40, 5);
        let mut e = t.entries().unwrap();
        e.sort();
        assert_eq!(e, [(5, 3), (7 << 32 | 0x40, 5)]);
        // Full at three quarters: new keys dropped, known ones still counted.
        for k in 1..=CAP as u64 {
            t.add(1 << 40 | k, 1);
        }
        assert_eq!(t.entries().unwrap().len(), LIMIT);
        let dropped = t.dropped();
        assert!(dropped > 0);
        t.add(5, 1);
        assert_eq!(t.dropped(), dropped);
        t.clear();
        assert_eq!((t.entries().unwrap().len(), t.dropped()), (0, 0));
    }
}
