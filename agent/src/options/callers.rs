//! Exact callers (`RTPROF_CALLERS=1`): each patched function's stub, after
//! counting the call, calls [`note`] with the function's slot and the
//! return address at its entry, and the pair is counted in one
//! process-wide table: an atomic compare-and-swap claims an entry, an
//! atomic add counts. At exit the table is written beside the counter
//! segment, where `rtprof run` names each return address by the function
//! it lies in.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// Entries in the table (16 bytes each: 1 MiB).
const ENTRIES: usize = 1 << 16;
/// Entries probed for a pair before it is counted as dropped.
const PROBES: usize = 32;
/// Return addresses are user-space addresses, below 2^47; slots take the
/// 17 bits above (plus one, so no key is 0).
const ADDRESS_BITS: u32 = 47;
const MAX_SLOT: u32 = (1 << (64 - ADDRESS_BITS)) - 2;

#[repr(C)]
struct Entry {
    /// `(slot + 1) << 47 | return address`; 0: free.
    key: AtomicU64,
    count: AtomicU64,
}

static TABLE: AtomicPtr<Entry> = AtomicPtr::new(std::ptr::null_mut());
/// Calls not counted for their caller (table full, or out of range).
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Maps the table (start-up, before any stub is written) if callers are
/// to be counted.
pub fn start(on: bool) {
    if on && TABLE.load(Ordering::Acquire).is_null() {
        let p = map_table(std::ptr::null_mut());
        TABLE.store(p, Ordering::Release);
    }
}

fn map_table(at: *mut Entry) -> *mut Entry {
    let fixed = if at.is_null() { 0 } else { libc::MAP_FIXED };
    // SAFETY: an anonymous private mapping; at `at` only in a forked
    // child, replacing the parent's table of the same size.
    let p = unsafe {
        libc::mmap(
            at.cast(),
            ENTRIES * std::mem::size_of::<Entry>(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | fixed,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        p.cast()
    }
}

/// The address stubs call, or 0 when callers are not counted.
pub fn hook() -> u64 {
    if TABLE.load(Ordering::Acquire).is_null() {
        0
    } else {
        note as extern "C" fn(u32, u64) as usize as u64
    }
}

fn entries() -> Option<&'static [Entry]> {
    let t = TABLE.load(Ordering::Acquire);
    // SAFETY: mapped once with ENTRIES zeroed entries and never unmapped
    // (a forked child's replacement is mapped at the same address); the
    // fields are atomics.
    (!t.is_null()).then(|| unsafe { std::slice::from_raw_parts(t, ENTRIES) })
}

/// Counts a call of function `slot` from `ret`. Runs at every patched
/// function's entry with only the argument registers saved: no libc, no
/// allocation, no lock.
extern "C" fn note(slot: u32, ret: u64) {
    let Some(t) = entries() else { return };
    if slot > MAX_SLOT || ret >> ADDRESS_BITS != 0 {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let key = ((slot as u64 + 1) << ADDRESS_BITS) | ret;
    // Fibonacci hashing spreads nearby return addresses.
    let h = (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 48) as usize;
    for i in 0..PROBES {
        let e = &t[(h + i) & (ENTRIES - 1)];
        let k = e.key.load(Ordering::Relaxed);
        let mine = k == key
            || (k == 0
                && match e
                    .key
                    .compare_exchange(0, key, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => true,
                    Err(other) => other == key,
                });
        if mine {
            e.count.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
    DROPPED.fetch_add(1, Ordering::Relaxed);
}

/// The callers counted so far, as text: `rtprof-callers 1 <dropped>`,
/// then `<slot> <return address> <calls>` per pair.
pub fn text() -> Option<String> {
    use std::fmt::Write as _;
    let t = entries()?;
    let mut out = format!("rtprof-callers 1 {}\n", DROPPED.load(Ordering::Relaxed));
    for e in t {
        let (k, n) = (
            e.key.load(Ordering::Relaxed),
            e.count.load(Ordering::Relaxed),
        );
        if k != 0 && n != 0 {
            let slot = (k >> ADDRESS_BITS) - 1;
            let _ = writeln!(out, "{slot} {} {n}", k & ((1 << ADDRESS_BITS) - 1));
        }
    }
    Some(out)
}

/// In a forked child (one thread, allocation-free): the parent's callers
/// are not the child's; a fresh table at the same place.
pub fn forget_in_child() {
    let t = TABLE.load(Ordering::Acquire);
    if !t.is_null() {
        if map_table(t).is_null() {
            TABLE.store(std::ptr::null_mut(), Ordering::Release);
        }
        DROPPED.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_counted_exactly_and_out_of_range_dropped() {
        start(true);
        assert_ne!(hook(), 0);
        for _ in 0..5 {
            note(7, 0x5555_0000_1234);
        }
        note(7, 0x5555_0000_5678);
        note(MAX_SLOT + 1, 0x1000);
        note(1, 1 << 50);
        let t = text().unwrap();
        assert!(t.contains(&format!("7 {} 5\n", 0x5555_0000_1234u64)), "{t}");
        assert!(t.contains(&format!("7 {} 1\n", 0x5555_0000_5678u64)), "{t}");
        assert!(DROPPED.load(Ordering::Relaxed) >= 2);
    }
}
