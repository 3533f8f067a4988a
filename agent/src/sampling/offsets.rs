//! Where inside its function each sample landed: a bounded table of
//! (function slot, offset from the function's first byte) -> samples.
//! `rtprof run` turns it into loop profiles, each sample charged to the
//! innermost loop around its offset. It is counted where the sample is
//! (the drain thread, or the timer's signal handler): a fixed array, no
//! allocation, no waiting. One thread at a time uses it; a sample that
//! finds it in use, or full, is left out and counted as dropped. Written
//! beside the segment at exit as `<segment>.offsets`.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Distinct (function, offset) pairs kept: a power of two, filled to 3/4
/// at most so that probes stay short. 16,384 entries of 16 bytes: 256 KiB
/// of zero pages until samples touch them.
const CAP: usize = 1 << 14;
const LIMIT: usize = CAP / 4 * 3;

struct Table {
    /// (key, samples); key 0 is a free entry.
    entries: [(u64, u64); CAP],
    len: usize,
}

struct Shared {
    busy: AtomicBool,
    table: UnsafeCell<Table>,
}

// SAFETY: `table` is only reached while `busy` is held (see `with`).
unsafe impl Sync for Shared {}

static SHARED: Shared = Shared {
    busy: AtomicBool::new(false),
    table: UnsafeCell::new(Table {
        entries: [(0, 0); CAP],
        len: 0,
    }),
};
/// Samples not in the table: it was in use or full.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Runs `f` on the table unless another thread (or an interrupted
/// one on this thread) is using it.
fn with<R>(f: impl FnOnce(&mut Table) -> R) -> Option<R> {
    if SHARED.busy.swap(true, Ordering::Acquire) {
        return None;
    }
    // SAFETY: `busy` was false and is now ours: no other reference.
    let r = f(unsafe { &mut *SHARED.table.get() });
    SHARED.busy.store(false, Ordering::Release);
    Some(r)
}

fn key(slot: u32, offset: u32) -> u64 {
    (slot as u64 + 1) << 32 | offset as u64
}

impl Table {
    fn add(&mut self, k: u64, n: u64) -> bool {
        // Fibonacci hashing: nearby offsets spread over the table.
        let mut i = (k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - 14)) as usize;
        loop {
            let e = &mut self.entries[i];
            if e.0 == k {
                e.1 += n;
                return true;
            }
            if e.0 == 0 {
                if self.len >= LIMIT {
                    return false;
                }
                *e = (k, n);
                self.len += 1;
                return true;
            }
            i = (i + 1) & (CAP - 1);
        }
    }

    fn clear(&mut self) {
        if self.len > 0 {
            self.entries.fill((0, 0));
            self.len = 0;
        }
    }
}

/// Counts `n` samples at `offset` bytes into function `slot`.
/// Async-signal-safe.
#[inline]
pub fn record(slot: u32, offset: u32, n: u64) {
    if with(|t| t.add(key(slot, offset), n)) != Some(true) {
        DROPPED.fetch_add(n, Ordering::Relaxed);
    }
}

/// The table as text: `rtprof-offsets 1 <dropped>`, then one line per
/// entry, `<slot> <offset> <samples>`; `None` if nothing was sampled (or
/// the table stayed busy).
pub fn text() -> Option<String> {
    // At exit the drain thread may be counting a last sample: waited for
    // a little, never for ever.
    for _ in 0..1000 {
        if let Some(t) =
            with(|t| (t.len > 0 || DROPPED.load(Ordering::Relaxed) > 0).then(|| t.text()))
        {
            return t;
        }
        std::thread::yield_now();
    }
    None
}

impl Table {
    fn text(&self) -> String {
        use std::fmt::Write as _;
        let mut out = format!("rtprof-offsets 1 {}\n", DROPPED.load(Ordering::Relaxed));
        for &(k, n) in self.entries.iter().filter(|e| e.0 != 0) {
            let _ = writeln!(out, "{} {} {n}", (k >> 32) - 1, k as u32);
        }
        out
    }
}

/// In a forked child (one thread, allocation-free): the parent's samples
/// are not the child's, and a parent thread that held the table does not
/// exist here.
pub fn forget_in_child() {
    SHARED.busy.store(false, Ordering::Release);
    DROPPED.store(0, Ordering::Relaxed);
    with(Table::clear);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_counted_apart_and_bounded() {
        let mut t = Table {
            entries: [(0, 0); CAP],
            len: 0,
        };
        assert!(t.add(key(0, 0), 1) && t.add(key(0, 0), 2) && t.add(key(7, 0x40), 5));
        assert_eq!(t.len, 2);
        let text = t.text();
        let mut lines: Vec<&str> = text.lines().skip(1).collect();
        lines.sort();
        assert_eq!(lines, ["0 0 3", "7 64 5"]);
        // Full at three quarters: new keys refused, known ones still counted.
        for i in 0..CAP as u32 {
            t.add(key(1, i), 1);
        }
        assert_eq!(t.len, LIMIT);
        assert!(!t.add(key(2, 0), 1));
        assert!(t.add(key(7, 0x40), 1));
        t.clear();
        assert_eq!(
            (t.len, t.entries.iter().filter(|e| e.0 != 0).count()),
            (0, 0)
        );
    }
}
