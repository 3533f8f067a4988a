//! Timer samples waiting for their module's names. A module only sampled
//! is named on demand: its functions are listed when the first sample
//! lands in it, not at every process's start. The perf sampler's samples
//! wait in its rings for that; a timer sample is taken in a signal
//! handler, which cannot list functions (that allocates and reads files),
//! so it waits here: the handler holds it and wakes the drain thread,
//! which names the module and counts the sample where it belongs.
//!
//! A fixed array of entries, claimed and freed with atomics: no lock, no
//! allocation, safe in a signal handler and against the drain thread. Only
//! a module's first samples pass through it (once named, its samples are
//! counted where they land); when it is full, a sample counts for its
//! module, as one that cannot be named does.

use super::addrmap;
use super::Few;
use crate::Agent;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const FREE: u32 = 0;
/// A handler is writing it.
const WRITING: u32 = 1;
/// Written: the drain may take it.
const READY: u32 = 2;
/// Taken by the drain, being counted.
const TAKEN: u32 = 3;

struct Entry {
    state: AtomicU32,
    ip: AtomicU64,
    /// The periods the sample stands for.
    n: AtomicU64,
    /// The stripe of the thread it was taken on, and that thread.
    stripe: AtomicU32,
    tid: AtomicU32,
}

const ENTRIES: usize = 64;
static HELD: [Entry; ENTRIES] = [const {
    Entry {
        state: AtomicU32::new(FREE),
        ip: AtomicU64::new(0),
        n: AtomicU64::new(0),
        stripe: AtomicU32::new(0),
        tid: AtomicU32::new(0),
    }
}; ENTRIES];

/// Holds `n` samples at `ip` of the thread `(stripe, tid)` (see
/// `thread_rows::owner_here`); false if every entry is taken.
/// Async-signal-safe.
pub fn hold(ip: u64, n: u64, (stripe, tid): (u32, u32)) -> bool {
    for e in &HELD {
        if e.state
            .compare_exchange(FREE, WRITING, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            e.ip.store(ip, Ordering::Relaxed);
            e.n.store(n, Ordering::Relaxed);
            e.stripe.store(stripe, Ordering::Relaxed);
            e.tid.store(tid, Ordering::Relaxed);
            e.state.store(READY, Ordering::Release);
            return true;
        }
    }
    false
}

/// Whether a sample is waiting.
pub fn any() -> bool {
    HELD.iter()
        .any(|e| e.state.load(Ordering::Acquire) == READY)
}

/// Counts the samples held: first, with `name`, the modules they land in
/// are named (which allocates); without, they count for their modules.
/// Returns how many were counted. One caller at a time (the sampler's
/// drain flag).
pub fn settle(a: &Agent, name: Option<super::Namer>) -> usize {
    let mut modules = Few::default();
    let mut taken = 0;
    for e in &HELD {
        if e.state.load(Ordering::Acquire) != READY {
            continue;
        }
        let module = addrmap::named_on_demand_at(e.ip.load(Ordering::Relaxed));
        // More modules than one naming takes: left for the next.
        if let (Some(m), Some(_)) = (module, name) {
            if !modules.add(m) {
                continue;
            }
        }
        if e.state
            .compare_exchange(READY, TAKEN, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            taken += 1;
        }
    }
    if taken == 0 {
        return 0;
    }
    if let (Some(name), false) = (name, modules.as_slice().is_empty()) {
        name(modules.as_slice());
    }
    for e in &HELD {
        if e.state.load(Ordering::Acquire) != TAKEN {
            continue;
        }
        let (ip, n) = (e.ip.load(Ordering::Relaxed), e.n.load(Ordering::Relaxed));
        let slot = match addrmap::count(ip, n) {
            addrmap::Counted::Function(slot) => Some(slot),
            _ => None,
        };
        let owner = (
            e.stripe.load(Ordering::Relaxed),
            e.tid.load(Ordering::Relaxed),
        );
        crate::count::thread_rows::sampled_later(a, owner, slot, n);
        e.state.store(FREE, Ordering::Release);
    }
    super::stacks::held_settled();
    taken
}

/// In a forked child: the samples held are the parent's (it counts them),
/// and one half-written by another thread of the parent never becomes
/// ready here.
pub fn forget_in_child() {
    for e in &HELD {
        e.state.store(FREE, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full table refuses (the sample then counts for its module), and
    /// a forked child starts with it empty.
    #[test]
    fn a_full_table_refuses_and_a_child_starts_empty() {
        let held = (0..ENTRIES + 3)
            .filter(|&i| hold(0x1000 + i as u64, 1, (0, 0)))
            .count();
        assert_eq!(held, ENTRIES);
        assert!(any());
        forget_in_child();
        assert!(!any());
        assert!(hold(0x2000, 4, (1, 77)));
        let e = HELD
            .iter()
            .find(|e| e.state.load(Ordering::Acquire) == READY)
            .unwrap();
        assert_eq!(
            (
                e.ip.load(Ordering::Relaxed),
                e.n.load(Ordering::Relaxed),
                e.stripe.load(Ordering::Relaxed)
            ),
            (0x2000, 4, 1)
        );
        forget_in_child();
    }
}
