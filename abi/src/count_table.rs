//! A bounded table of counts by a 64-bit key, wherever its memory lives:
//! in the agent (counts by place in a function), or in the counter
//! segment (samples by thread and function, which rtprofd reads). Fixed
//! size, no allocation, no lock: threads' signal handlers add to it at
//! once (CPU-time timers expire together, at the same scheduler tick), and
//! a handler that is preempted must not make the others wait or drop. An
//! entry's key is claimed with one compare-and-swap, its count added to
//! atomically; a key is never moved or removed while the process counts,
//! so readers in other processes may scan the table at any time.

use std::sync::atomic::{compiler_fence, AtomicU32, AtomicU64, Ordering};

/// The table's state, laid out as [`crate::layout::TableHead`].
#[repr(C)]
pub struct Meta {
    /// Unused (0).
    reserved: AtomicU32,
    len: AtomicU32,
    /// One bit per 1/64 of the entries that an entry was written in: set
    /// before the entry is, so a clear (or a reader) that looks at the
    /// marked parts covers every entry in use, even one a fork caught half
    /// written.
    dirty: AtomicU64,
    dropped: AtomicU64,
    /// Entries: a power of two, at least 64.
    cap: u32,
    pad: u32,
}

const _: () =
    assert!(std::mem::size_of::<Meta>() == std::mem::size_of::<crate::layout::TableHead>());
const _: () = assert!(
    std::mem::offset_of!(Meta, dirty) == std::mem::offset_of!(crate::layout::TableHead, dirty)
);
const _: () =
    assert!(std::mem::offset_of!(Meta, cap) == std::mem::offset_of!(crate::layout::TableHead, cap));

impl Meta {
    pub const fn new(cap: u32) -> Meta {
        assert!(cap.is_power_of_two() && cap >= 64);
        Meta {
            reserved: AtomicU32::new(0),
            len: AtomicU32::new(0),
            dirty: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            cap,
            pad: 0,
        }
    }
}

/// (key, count); key 0 is a free entry.
#[repr(C)]
pub struct Entry {
    key: AtomicU64,
    count: AtomicU64,
}

impl Entry {
    pub const fn new() -> Entry {
        Entry {
            key: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }
}

impl Default for Entry {
    fn default() -> Entry {
        Entry::new()
    }
}

/// Distinct keys kept at most, of `cap` entries: filled to 3/4 at most so
/// that probes stay short.
pub const fn limit(cap: u32) -> u32 {
    cap / 4 * 3
}

/// Gives memory to a part of the entries before its first entry is
/// written (a segment on a full tmpfs would raise SIGBUS): whether it has
/// some. `(start, bytes)`.
pub type Back = fn(*mut u8, usize) -> bool;

/// A table over its state and entries.
#[derive(Clone, Copy)]
pub struct Table<'a> {
    meta: &'a Meta,
    entries: &'a [Entry],
    back: Option<Back>,
}

impl<'a> Table<'a> {
    /// `entries`: a power of two of them, at least 64 (what `meta.cap`
    /// says, if the memory is still the table's).
    pub fn new(meta: &'a Meta, entries: &'a [Entry], back: Option<Back>) -> Table<'a> {
        assert!(entries.len().is_power_of_two() && entries.len() >= 64);
        Table {
            meta,
            entries,
            back,
        }
    }

    fn per_bit(&self) -> usize {
        self.entries.len() / 64
    }

    /// Adds `n` to `key` (not 0). Async-signal-safe, lock-free.
    #[inline]
    pub fn add(&self, key: u64, n: u64) {
        if !self.insert(key, n) {
            self.meta.dropped.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Whether entry `i`'s part of the table was ever written (the rest is
    /// zero, and not read: on a full tmpfs its page may have no memory).
    fn written(&self, i: usize) -> bool {
        self.meta.dirty.load(Ordering::Acquire) & 1 << (i / self.per_bit()) != 0
    }

    fn insert(&self, k: u64, n: u64) -> bool {
        let cap = self.entries.len();
        let bits = cap.trailing_zeros();
        // Fibonacci hashing: nearby keys spread over the table.
        let mut i = (k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)) as usize;
        let mut steps = 0;
        while steps < cap {
            let e = &self.entries[i];
            let at = if self.written(i) {
                e.key.load(Ordering::Acquire)
            } else {
                0
            };
            if at == 0 {
                match self.claim(i, k) {
                    Ok(()) => {
                        e.count.fetch_add(n, Ordering::Relaxed);
                        return true;
                    }
                    Err(false) => return false,
                    // Taken meanwhile (for this key or another): looked
                    // at again.
                    Err(true) => continue,
                }
            }
            if at == k {
                e.count.fetch_add(n, Ordering::Relaxed);
                return true;
            }
            i = (i + 1) & (cap - 1);
            steps += 1;
        }
        false
    }

    /// Claims free entry `i` for key `k`: `Ok` if it is now `k`'s,
    /// `Err(true)` if another thread took it first (for `k` or another
    /// key), `Err(false)` if the table is full or its part has no memory.
    fn claim(&self, i: usize, k: u64) -> Result<(), bool> {
        let cap = self.entries.len();
        if self.meta.len.fetch_add(1, Ordering::Relaxed) >= limit(cap as u32) {
            self.meta.len.fetch_sub(1, Ordering::Relaxed);
            return Err(false);
        }
        let bit = 1u64 << (i / self.per_bit());
        if self.meta.dirty.load(Ordering::Acquire) & bit == 0 {
            let first = (i / self.per_bit()) * self.per_bit();
            let part = &self.entries[first..first + self.per_bit()];
            let backed = self
                .back
                .is_none_or(|back| back(part.as_ptr() as *mut u8, std::mem::size_of_val(part)));
            if !backed {
                self.meta.len.fetch_sub(1, Ordering::Relaxed);
                return Err(false);
            }
            self.meta.dirty.fetch_or(bit, Ordering::AcqRel);
        }
        // The mark first, even to a fork between the two stores.
        compiler_fence(Ordering::SeqCst);
        let e = &self.entries[i];
        match e
            .key
            .compare_exchange(0, k, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(()),
            Err(_) => {
                self.meta.len.fetch_sub(1, Ordering::Relaxed);
                Err(true)
            }
        }
    }

    /// Counts left out: the table was full.
    pub fn dropped(&self) -> u64 {
        self.meta.dropped.load(Ordering::Relaxed)
    }

    /// Every (key, count). Allocates.
    pub fn entries(&self) -> Vec<(u64, u64)> {
        let mut v = Vec::new();
        self.each(|k, n| v.push((k, n)));
        v
    }

    /// Calls `f(key, count)` for every key (allocation-free).
    pub fn each(&self, mut f: impl FnMut(u64, u64)) {
        self.each_dirty(|e| {
            let k = e.key.load(Ordering::Acquire);
            if k != 0 {
                f(k, e.count.load(Ordering::Relaxed));
            }
        });
    }

    /// Zeroes the counts of every key `pick` chooses; the keys stay (in
    /// use again when counted again), so nothing moves under a reader or
    /// a concurrent add of another key.
    pub fn zero_where(&self, pick: impl Fn(u64) -> bool) {
        self.each_dirty(|e| {
            let k = e.key.load(Ordering::Acquire);
            if k != 0 && pick(k) && e.count.load(Ordering::Relaxed) != 0 {
                e.count.store(0, Ordering::Relaxed);
            }
        });
    }

    /// Which parts of the table were written (bit `b`: entries `b *
    /// part_len()..`), and how many entries a part holds.
    pub fn written_parts(&self) -> (u64, usize) {
        (self.meta.dirty.load(Ordering::Acquire), self.per_bit())
    }

    fn each_dirty(&self, mut f: impl FnMut(&Entry)) {
        let dirty = self.meta.dirty.load(Ordering::Acquire);
        for (bit, part) in self.entries.chunks(self.per_bit()).enumerate() {
            if dirty & 1 << bit != 0 {
                part.iter().for_each(&mut f);
            }
        }
    }

    /// Empties it (a new attach; in a forked child, allocation-free):
    /// zeroes the parts written only (a forked child touches, and copies,
    /// only those). A count added meanwhile may stay or go.
    pub fn clear(&self) {
        self.meta.dropped.store(0, Ordering::Relaxed);
        self.each_dirty(|e| {
            e.key.store(0, Ordering::Relaxed);
            e.count.store(0, Ordering::Relaxed);
        });
        self.meta.dirty.store(0, Ordering::Relaxed);
        self.meta.len.store(0, Ordering::Relaxed);
    }

    /// Forgets every entry without touching them: for a table whose
    /// entries were just replaced by zero memory (a forked child's new
    /// segment).
    pub fn forget_in_child(&self) {
        self.meta.len.store(0, Ordering::Relaxed);
        for a in [&self.meta.dirty, &self.meta.dropped] {
            a.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: u32 = 256;

    fn table() -> (Box<Meta>, Vec<Entry>) {
        (
            Box::new(Meta::new(CAP)),
            (0..CAP).map(|_| Entry::new()).collect(),
        )
    }

    #[test]
    fn keys_are_counted_apart_and_bounded() {
        let (m, e) = table();
        let t = Table::new(&m, &e, None);
        t.add(5, 1);
        t.add(5, 2);
        t.add(7 << 32 | 0x40, 5);
        let mut got = t.entries();
        got.sort();
        assert_eq!(got, [(5, 3), (7 << 32 | 0x40, 5)]);
        // Full at three quarters: new keys dropped, known ones still counted.
        for k in 1..=CAP as u64 {
            t.add(1 << 40 | k, 1);
        }
        assert_eq!(t.entries().len(), limit(CAP) as usize);
        let dropped = t.dropped();
        assert!(dropped > 0);
        t.add(5, 1);
        assert_eq!(t.dropped(), dropped);
        t.clear();
        assert_eq!((t.entries().len(), t.dropped()), (0, 0));
    }

    /// A part of the entries that cannot be given memory takes no entry:
    /// its counts are dropped, the parts that can still count.
    #[test]
    fn a_part_without_memory_drops_its_counts() {
        let (m, e) = table();
        let t = Table::new(&m, &e, Some(|_, _| false));
        t.add(9, 4);
        assert_eq!((t.entries().len(), t.dropped()), (0, 4));
        let t = Table::new(&m, &e, Some(|_, len| len == 4 * 16));
        t.add(9, 4);
        assert_eq!(t.entries(), [(9, 4)]);
    }

    /// Counts zeroed for some keys start again from zero; the others keep
    /// theirs.
    #[test]
    fn zeroed_keys_count_again_from_zero() {
        let (m, e) = table();
        let t = Table::new(&m, &e, None);
        for k in 1..=100u64 {
            t.add(k, k);
        }
        t.zero_where(|k| k % 2 == 0);
        t.add(2, 5);
        let got: std::collections::HashMap<u64, u64> = t.entries().into_iter().collect();
        assert_eq!(got.len(), 100, "the keys stay");
        assert_eq!((got[&1], got[&2], got[&4], got[&99]), (1, 5, 0, 99));
    }

    /// Threads adding at once (as timer handlers do) lose nothing.
    #[test]
    fn threads_adding_at_once_lose_nothing() {
        let (m, e) = table();
        let t = Table::new(&m, &e, None);
        std::thread::scope(|s| {
            for th in 0..4u64 {
                s.spawn(move || {
                    for i in 0..20_000u64 {
                        t.add(1 + (i % 50) + th * 7, 1);
                    }
                });
            }
        });
        let got = t.entries();
        assert_eq!(got.iter().map(|e| e.1).sum::<u64>(), 80_000);
        let mut keys: Vec<u64> = got.iter().map(|e| e.0).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), got.len(), "a key claimed twice");
        assert_eq!(t.dropped(), 0);
    }
}
