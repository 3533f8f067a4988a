//! Exact loop counts (`RTPROF_LOOPS=globs`): for each loop of the functions
//! named, two counters in one process-wide table (times control came into
//! the loop, times a branch went back to its header), bumped by the loop's
//! probes with an atomic add; and the list of every such loop with its
//! counters or why it has none, written beside the counter segment at exit.

use rtprof_shared::loops::LoopRefusal;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Loops counted at most (four 8-byte counters each: 2 MiB).
const LOOPS: usize = 1 << 16;
const PER_LOOP: usize = 4;

static GLOBS: OnceLock<Vec<String>> = OnceLock::new();
/// Loops are planned for the modules present at start-up only.
static PLANNING: AtomicBool = AtomicBool::new(false);
static TABLE: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());
static CLAIMED: AtomicU32 = AtomicU32::new(0);
/// A loop of a named function: (slot, header's offset in it, its
/// counters' index or why none).
type Site = (u32, u32, Result<u32, LoopRefusal>);
/// Every loop of a named function. Written at start-up, read at exit.
static SITES: Mutex<Vec<Site>> = Mutex::new(Vec::new());

/// Sets the function name globs whose loops are counted (start-up).
pub fn select(globs: &[String]) {
    let _ = GLOBS.set(globs.to_vec());
    PLANNING.store(true, Ordering::Release);
}

/// Whether modules planned now get loop probes.
pub fn planning() -> bool {
    PLANNING.load(Ordering::Acquire) && wanted()
}

/// Start-up is over: modules loaded later get no loop probes.
pub fn end_planning() {
    PLANNING.store(false, Ordering::Release);
}

/// Whether any function's loops are to be counted.
pub fn wanted() -> bool {
    GLOBS.get().is_some_and(|g| !g.is_empty())
}

/// Whether the loops of the function named `name` are to be counted.
pub fn wanted_for(name: &str) -> bool {
    GLOBS.get().is_some_and(|g| {
        g.iter()
            .any(|p| rtprof_shared::glob_match(p.as_bytes(), name.as_bytes()))
    })
}

fn table() -> Option<&'static [AtomicU64]> {
    let mut t = TABLE.load(Ordering::Acquire);
    if t.is_null() {
        // SAFETY: an anonymous private mapping, ours alone.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LOOPS * PER_LOOP * 8,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        match TABLE.compare_exchange(
            std::ptr::null_mut(),
            p.cast(),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => t = p.cast(),
            Err(other) => {
                // SAFETY: our mapping, which nobody else has seen.
                unsafe { libc::munmap(p, LOOPS * PER_LOOP * 8) };
                t = other;
            }
        }
    }
    // SAFETY: mapped once, zeroed, PER_LOOP * LOOPS atomics, never unmapped.
    Some(unsafe { std::slice::from_raw_parts(t, LOOPS * PER_LOOP) })
}

/// One loop's counters: its index in the table and their addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counters {
    pub index: u32,
    pub arrivals: u64,
    pub back: u64,
    pub back_through: u64,
    pub top_exits: u64,
}

/// The counters of one more loop.
pub fn claim() -> Result<Counters, LoopRefusal> {
    let t = table().ok_or(LoopRefusal::NoMemory)?;
    let i = CLAIMED
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            ((n as usize) < LOOPS).then_some(n + 1)
        })
        .map_err(|_| LoopRefusal::TooMany)?;
    let c = &t[i as usize * PER_LOOP..];
    Ok(Counters {
        index: i,
        arrivals: c[0].as_ptr() as u64,
        back: c[1].as_ptr() as u64,
        back_through: c[2].as_ptr() as u64,
        top_exits: c[3].as_ptr() as u64,
    })
}

/// Records the loops of one function (slot), each with its header's
/// offset and its counter pair or why none.
pub fn note(slot: u32, loops: impl IntoIterator<Item = (u32, Result<u32, LoopRefusal>)>) {
    let mut s = SITES.lock().unwrap_or_else(|e| e.into_inner());
    s.extend(loops.into_iter().map(|(off, o)| (slot, off, o)));
}

/// The loops noted, as text: `rtprof-loops 1`, then `<slot> <header
/// offset> <entries> <back> <top exits>` or `<slot> <header offset> -
/// <reason>` per loop; `None` if no function's loops were wanted.
pub fn text() -> Option<String> {
    use std::fmt::Write as _;
    if !wanted() {
        return None;
    }
    let sites = SITES.lock().unwrap_or_else(|e| e.into_inner());
    let t = table();
    let mut out = String::from("rtprof-loops 1\n");
    for &(slot, off, o) in sites.iter() {
        let _ = match (o, t) {
            (Ok(i), Some(t)) => {
                let c = &t[i as usize * PER_LOOP..];
                let [arrivals, back, through, top] =
                    [0, 1, 2, 3].map(|k| c[k].load(Ordering::Relaxed));
                // Branches back through the header's probe arrived there too.
                let entries = arrivals.saturating_sub(through);
                let back = back.saturating_add(through);
                writeln!(out, "{slot} {off} {entries} {back} {top}")
            }
            (Err(why), _) => writeln!(out, "{slot} {off} - {}", why.name()),
            (Ok(_), None) => writeln!(out, "{slot} {off} - {}", LoopRefusal::NoMemory.name()),
        };
    }
    Some(out)
}

/// In a forked child (one thread, allocation-free): the parent's loops
/// ran in the parent; the child's counts start from zero.
pub fn forget_in_child() {
    let t = TABLE.load(Ordering::Acquire);
    if !t.is_null() {
        let n = CLAIMED.load(Ordering::Relaxed) as usize * PER_LOOP;
        // SAFETY: the table's first `n` counters, mapped for good.
        for c in unsafe { std::slice::from_raw_parts(t, n) } {
            c.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_claimed_counted_and_listed() {
        select(&["hot*".to_string()]);
        assert!(wanted() && wanted_for("hot_loop") && !wanted_for("cold"));
        let c = claim().unwrap();
        assert_eq!(
            (c.back, c.back_through, c.top_exits),
            (c.arrivals + 8, c.arrivals + 16, c.arrivals + 24)
        );
        // 3 entries, 20 branches back past the count and 10 through it.
        for (at, n) in [
            (c.arrivals, 13),
            (c.back, 20),
            (c.back_through, 10),
            (c.top_exits, 2),
        ] {
            // SAFETY: a counter claim() handed out.
            unsafe { (*(at as *const AtomicU64)).fetch_add(n, Ordering::Relaxed) };
        }
        note(7, [(16, Ok(c.index)), (48, Err(LoopRefusal::ShortLatch))]);
        let t = text().unwrap();
        assert!(t.starts_with("rtprof-loops 1\n"), "{t}");
        assert!(t.contains("7 16 3 30 2\n"), "{t}");
        assert!(t.contains("7 48 - short_latch\n"), "{t}");
        forget_in_child();
        assert!(text().unwrap().contains("7 16 0 0 0\n"));
    }
}
