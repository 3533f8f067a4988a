//! A bounded table of counts by a 64-bit key, in the agent's own memory,
//! for what samples are counted by besides their function (their place in
//! it): [`rtprof_abi::count_table`] over a static array, so a signal
//! handler may add to it.

use rtprof_abi::count_table::{Entry, Meta, Table};

/// Distinct keys kept: 16,384 entries of 16 bytes, 256 KiB of zero pages
/// until counts touch them.
const CAP: usize = 1 << 14;

pub struct CountTable {
    meta: Meta,
    entries: [Entry; CAP],
}

impl CountTable {
    pub const fn new() -> CountTable {
        CountTable {
            meta: Meta::new(CAP as u32),
            entries: [const { Entry::new() }; CAP],
        }
    }

    fn table(&self) -> Table<'_> {
        Table::new(&self.meta, &self.entries, None)
    }

    /// Adds `n` to `key` (not 0). Async-signal-safe.
    #[inline]
    pub fn add(&self, key: u64, n: u64) {
        self.table().add(key, n)
    }

    /// Counts not in the table: it was full.
    pub fn dropped(&self) -> u64 {
        self.table().dropped()
    }

    /// Every (key, count). Allocates.
    pub fn entries(&self) -> Vec<(u64, u64)> {
        self.table().entries()
    }

    /// Empties it (a new attach, a forked child).
    pub fn clear(&self) {
        self.table().clear()
    }
}
