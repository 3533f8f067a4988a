//! Where inside its function each sample landed: counts by (function
//! slot, offset from the function's first byte). `rtprof run` turns them
//! into loop profiles, each sample charged to the loops around its
//! offset. Counted where the sample is (the drain thread, or the timer's
//! signal handler), in a [`CountTable`]; written beside the segment at
//! exit as `<segment>.offsets`.

use super::count_table::CountTable;
use std::sync::atomic::{AtomicBool, Ordering};

static TABLE: CountTable = CountTable::new();
/// Whether `rtprof run` will read them (the process has a run directory).
static WANTED: AtomicBool = AtomicBool::new(false);

/// Set at start-up: places are counted only if `rtprof run` reads them.
pub fn set_wanted(on: bool) {
    WANTED.store(on, Ordering::Relaxed);
}

fn key(slot: u32, offset: u32) -> u64 {
    (slot as u64 + 1) << 32 | offset as u64
}

/// Counts `n` samples at `offset` bytes into function `slot`.
/// Async-signal-safe.
#[inline]
pub fn record(slot: u32, offset: u32, n: u64) {
    if WANTED.load(Ordering::Relaxed) {
        TABLE.add(key(slot, offset), n);
    }
}

/// The counts as text: `rtprof-offsets 1 <dropped>`, then one line per
/// place, `<slot> <offset> <samples>`; `None` if nothing was sampled.
pub fn text() -> Option<String> {
    let entries = TABLE.entries();
    let dropped = TABLE.dropped();
    (!entries.is_empty() || dropped > 0).then(|| lines(&entries, dropped))
}

fn lines(entries: &[(u64, u64)], dropped: u64) -> String {
    use std::fmt::Write as _;
    let mut out = format!("rtprof-offsets 1 {dropped}\n");
    for &(k, n) in entries {
        let _ = writeln!(out, "{} {} {n}", (k >> 32) - 1, k as u32);
    }
    out
}

/// Attaching (`rtprof attach`, which reads them beside the copy it gets):
/// counted from now, none of an earlier attach's.
pub fn start_attached() {
    TABLE.clear();
    set_wanted(true);
}

/// In a forked child: the parent's samples are not the child's.
pub fn forget_in_child() {
    TABLE.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_written_as_slot_offset_samples() {
        let text = lines(&[(key(0, 0), 3), (key(7, 0x40), 5)], 2);
        assert_eq!(text, "rtprof-offsets 1 2\n0 0 3\n7 64 5\n");
    }
}
