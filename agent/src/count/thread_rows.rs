//! Exact counts per thread. Each thread counts in a stripe of its own;
//! when it ends, what it counted (its non-zero slots) is kept here with its
//! id and name before the stripe is folded into the ended threads' sum and
//! reused.
//! At exit they go beside the segment, with the live threads', for the
//! report (`<segment>.threads`, read by `Threads::parse`). Samples are
//! counted per stripe too, so each thread's CPU time is known, and by
//! (stripe, function), so each thread's time in each function is.

use crate::count::stripes::Stripes;
use crate::lifecycle::lock::{Guard, Lock};
use crate::Agent;
use rtprof_abi::count_table::Table;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Samples by (stripe, function slot), in the segment (rtprofd reads them
/// for its rows per thread). A stripe's keys stay when its thread ends:
/// the next thread given the stripe finds their counts zeroed (see
/// `Stripes::alloc_stripe`), so the keys in use are bounded by the
/// stripes ever used times the functions sampled, however many threads
/// come and go. Its pages get memory as samples reach them.
fn by_function(a: &Agent) -> Table<'_> {
    a.segment
        .counters
        .thread_samples(Some(crate::count::segment::back_pages))
}

fn key(stripe: u32, slot: u32) -> u64 {
    (stripe as u64) << 32 | slot as u64
}

/// Counts `n` samples of the thread holding `stripe` (not the shared
/// one, which threads without their own use) in function `slot`.
/// Async-signal-safe.
fn add_function_samples(a: &Agent, stripe: u32, slot: Option<u32>, n: u64) {
    if let (Some(slot), true) = (slot, stripe != 0) {
        by_function(a).add(key(stripe, slot), n);
    }
}

/// Attached by `rtprof attach`, which reads them at detach.
static FOR_ATTACH: AtomicBool = AtomicBool::new(false);

/// Detached: threads that end from now on are not kept.
pub fn stop_attached() {
    FOR_ATTACH.store(false, Ordering::Release);
}

/// Attaching (again): threads are kept from now on for rtprof to read at
/// detach; those of an earlier attach are not this one's (the segment,
/// and its samples per thread, are new).
pub fn start_attached() {
    FOR_ATTACH.store(true, Ordering::Release);
    if let Some(mut v) = ended() {
        v.clear();
    }
    DROPPED.store(0, Ordering::Relaxed);
}

fn add_samples(a: &Agent, stripe: u32, n: u64) {
    let c = &a.segment.counters;
    if stripe < c.layout().caps.stripes {
        c.stripe_samples(stripe).fetch_add(n, Ordering::Relaxed);
    }
}

/// The stripe the calling thread counts in (0: the shared one), if it is
/// one of the segment's (in its signal handler: allocation-free, no
/// system call).
pub fn stripe_here(a: &Agent) -> Option<u32> {
    let p = crate::count::threads::stripe();
    if p.is_null() {
        Some(0)
    } else {
        a.segment.counters.stripe_index(p)
    }
}

/// `n` samples of the calling thread, in function `slot` if in one (in its
/// signal handler: allocation-free, no system call).
pub fn sampled_here(a: &Agent, slot: Option<u32>, n: u64) {
    if let Some(i) = stripe_here(a) {
        sampled_in(a, i, slot, n);
    }
}

/// The stripe the calling thread counts in and the thread holding it (0
/// for the shared stripe), as [`sampled_later`] takes them.
pub fn owner_here(a: &Agent) -> Option<(u32, u32)> {
    let i = stripe_here(a)?;
    match i {
        0 => Some((0, 0)),
        _ => Some((i, a.segment.counters.stripe_holder(i)?)),
    }
}

/// `n` samples taken earlier on the thread that held `stripe` then
/// ([`owner_here`]), in function `slot` if in one: counted for that
/// thread if it still holds it (an ended thread's stripe may be another's
/// by now: then only the process's totals have them).
pub fn sampled_later(a: &Agent, (stripe, tid): (u32, u32), slot: Option<u32>, n: u64) {
    if stripe == 0 || a.segment.counters.stripe_holds(stripe, tid) {
        sampled_in(a, stripe, slot, n);
    }
}

/// `n` samples of the thread counting in `stripe`, in function `slot` if
/// in one.
pub fn sampled_in(a: &Agent, stripe: u32, slot: Option<u32>, n: u64) {
    // The function's count first: a reader that sees the stripe's total
    // move reads the table after it (see rtprofd's threads).
    add_function_samples(a, stripe, slot, n);
    add_samples(a, stripe, n);
}

/// Recent (thread id, stripe) pairs of the perf drain, by thread id: a
/// sample finds its thread's stripe without a walk of the stripe table.
/// Only the drain writes them (one drain at a time); a pair is checked
/// against the table before use.
static RECENT: [AtomicU64; 256] = [const { AtomicU64::new(0) }; 256];

/// `n` samples of thread `tid` (from a perf ring: by the stripe it
/// holds), in function `slot` if in one.
pub fn sampled(a: &Agent, tid: u32, slot: Option<u32>, n: u64) {
    let c = &a.segment.counters;
    let recent = &RECENT[tid as usize % RECENT.len()];
    let (t, i) = {
        let v = recent.load(Ordering::Relaxed);
        ((v >> 32) as u32, v as u32)
    };
    let stripe = if t == tid && c.stripe_holds(i, tid) {
        i
    } else {
        let i = c.stripe_of_thread(tid).unwrap_or(0);
        recent.store((tid as u64) << 32 | i as u64, Ordering::Relaxed);
        i
    };
    add_function_samples(a, stripe, slot, n);
    add_samples(a, stripe, n);
}

/// Stripe `i`'s samples (its thread is ending): all of them, and by
/// function. Left in place for readers until the stripe's next thread.
fn samples_of(a: &Agent, i: u32) -> (u64, Vec<(u32, u64)>) {
    let all = a.segment.counters.stripe_samples(i).load(Ordering::Relaxed);
    let mut by = Vec::new();
    // A thread never sampled (most short ones) has nothing in the table.
    if all != 0 {
        by_function(a).each(|k, n| {
            if k >> 32 == i as u64 && n != 0 {
                by.push((k as u32, n));
            }
        });
        by.sort_unstable();
    }
    (all, by)
}

/// Ended threads kept, and (function, calls) pairs kept over all of them
/// (16 MiB): threads that end past either are only in the totals.
const MAX_KEPT: usize = 4096;
const MAX_PAIRS: usize = 1 << 20;
/// Calls kept per ended thread are its non-zero slots: bounded by the
/// functions it called.
struct Ended {
    /// The process it ended in (a forked child inherits the list).
    pid: u32,
    tid: u32,
    name: [u8; 16],
    counts: Vec<(u32, u64)>,
    samples: u64,
    /// (function slot, samples) of the functions it was sampled in.
    sampled: Vec<(u32, u64)>,
}

/// The ended threads kept, with how many of them and how many pairs are
/// this process's (a forked child inherits its parent's: counted again
/// once when the pid differs), so a thread's end does not walk the list.
struct Kept {
    list: Vec<Ended>,
    tally: Tally,
}

#[derive(Clone, Copy)]
struct Tally {
    pid: u32,
    threads: usize,
    pairs: usize,
}

impl Kept {
    fn tally(&mut self, pid: u32) -> Tally {
        if self.tally.pid != pid {
            let mine = self.list.iter().filter(|e| e.pid == pid);
            self.tally = Tally {
                pid,
                threads: mine.clone().count(),
                pairs: mine.map(|e| e.counts.len() + e.sampled.len()).sum(),
            };
        }
        self.tally
    }

    fn push(&mut self, e: Ended) {
        let t = self.tally(e.pid);
        self.tally = Tally {
            threads: t.threads + 1,
            pairs: t.pairs + e.counts.len() + e.sampled.len(),
            ..t
        };
        self.list.push(e);
    }

    fn clear(&mut self) {
        self.list.clear();
        self.tally.pid = 0;
    }
}

static ENDED: Lock<Kept> = Lock::new(Kept {
    list: Vec::new(),
    tally: Tally {
        pid: 0,
        threads: 0,
        pairs: 0,
    },
});
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// The list (`None` if this thread holds it already).
fn ended() -> Option<Guard<'static, Kept>> {
    ENDED.lock()
}

/// Whether a report will read them (`rtprof run`, `RTPROF_REPORT`): the
/// rest of a machine's processes neither keep nor walk them.
pub fn wanted(a: &Agent) -> bool {
    a.segment.has_run_dir() || a.config.report.is_some() || FOR_ATTACH.load(Ordering::Acquire)
}

/// This thread's name (`PR_GET_NAME`).
fn own_name() -> [u8; 16] {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL included, into the
    // buffer it is given.
    unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    name
}

/// Thread `tid` of this process's name, from /proc.
fn name_of(tid: u32) -> [u8; 16] {
    let mut name = [0u8; 16];
    if let Ok(s) = std::fs::read(format!("/proc/self/task/{tid}/comm")) {
        let s = s.strip_suffix(b"\n").unwrap_or(&s);
        let n = s.len().min(15);
        name[..n].copy_from_slice(&s[..n]);
    }
    name
}

/// Thread `tid`, ending, counted in stripe `stripe`: keeps what it counted
/// and retires the stripe into the ended threads' sum, both under the list's lock
/// (a report taken meanwhile finds the thread either live or ended, once).
pub fn thread_ending(a: &Agent, stripe: u32, tid: u32) {
    let c = &a.segment.counters;
    if wanted(a) {
        // Its samples still in the perf rings are its own only while it
        // holds its stripe (a later drain finds no thread with its id).
        // Signals are held meanwhile: a handler that exits would drain
        // again, waiting for this drain for ever. A drain under way (the
        // drain thread's) is waited for: the samples it holds and those it
        // has not reached yet would be counted after the copy below. It
        // waits for nothing this thread holds, unless it names modules on
        // demand (the agent's lock). This one names none.
        crate::count::threads::with_signals_blocked(|| {
            crate::sampling::drain(a, crate::sampling::Wait::UnlessNaming, false)
        });
        // Its thread counts no more (its stripe pointer is null).
        let counts = c.ended_stripe_counts(stripe);
        let (samples, sampled) = samples_of(a, stripe);
        let pid = std::process::id();
        if let Some(mut v) = ended() {
            let kept = v.tally(pid);
            let more = counts.len() + sampled.len();
            if kept.threads < MAX_KEPT && kept.pairs + more <= MAX_PAIRS {
                v.push(Ended {
                    pid,
                    tid,
                    name: own_name(),
                    counts,
                    samples,
                    sampled,
                });
                a.segment.retire_stripe(stripe);
                return;
            }
        }
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
    a.segment.retire_stripe(stripe);
}

/// In a forked child: the parent's ended threads are not the child's (its
/// entries are told apart by pid; the count of those not kept restarts).
/// Its samples per thread start from zero with its own segment.
pub fn forget_in_child() {
    ENDED.reset_in_child();
    DROPPED.store(0, Ordering::Relaxed);
}

fn hex(name: &[u8; 16]) -> String {
    let n = name.iter().position(|&b| b == 0).unwrap_or(16);
    name[..n].iter().map(|b| format!("{b:02x}")).collect()
}

/// Every thread's counts as text: `rtprof-threads 1 <ended threads not
/// kept>`, then per thread `t <tid> <0 live|1 ended> <name in hex>
/// <samples>`, `<slot> <calls>` per function it called and `s <slot>
/// <samples>` per function it was sampled in; first, `d <samples>` if
/// some were not counted by thread and function.
pub fn text(a: &Agent) -> String {
    use std::fmt::Write as _;
    let mut out = format!("rtprof-threads 1 {}\n", DROPPED.load(Ordering::Relaxed));
    // Samples the (thread, function) table had no room for.
    let table = by_function(a);
    let dropped = table.dropped();
    if dropped > 0 {
        let _ = writeln!(out, "d {dropped}");
    }
    // Live threads' samples by stripe, then function: each found by search.
    let mut by_function = table.entries();
    by_function.sort_unstable();
    let mut put = |tid: u32,
                   ended: bool,
                   name: &[u8; 16],
                   samples: u64,
                   counts: &mut dyn Iterator<Item = (u32, u64)>,
                   sampled: &mut dyn Iterator<Item = (u32, u64)>| {
        let _ = writeln!(out, "t {tid} {} {} {samples}", ended as u8, hex(name));
        for (slot, calls) in counts {
            let _ = writeln!(out, "{slot} {calls}");
        }
        for (slot, n) in sampled.filter(|e| e.1 != 0) {
            let _ = writeln!(out, "s {slot} {n}");
        }
    };
    let pid = std::process::id();
    // Held until the live threads are listed too: a thread that ends
    // meanwhile waits, so it is listed once.
    let kept = ended();
    if let Some(v) = &kept {
        for e in v.list.iter().filter(|e| e.pid == pid) {
            put(
                e.tid,
                true,
                &e.name,
                e.samples,
                &mut e.counts.iter().copied(),
                &mut e.sampled.iter().copied(),
            );
        }
    }
    let c = &a.segment.counters;
    for (stripe, tid) in c.live_stripes() {
        let first = by_function.partition_point(|&(k, _)| k < key(stripe, 0));
        let rows = by_function[first..].iter();
        put(
            tid,
            false,
            &name_of(tid),
            c.stripe_samples(stripe).load(Ordering::Relaxed),
            &mut c.stripe_counts(stripe),
            &mut rows
                .take_while(|e| e.0 >> 32 == stripe as u64)
                .map(|&(k, n)| (k as u32, n)),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(pid: u32, calls: usize) -> Ended {
        Ended {
            pid,
            tid: 1,
            name: [0; 16],
            counts: (0..calls as u32).map(|k| (k, 1)).collect(),
            samples: 0,
            sampled: vec![(0, 1)],
        }
    }

    /// The tally of kept threads follows each push, and a forked child
    /// (another pid) counts only its own, the parent's left in the list.
    #[test]
    fn the_tally_is_the_processs_own() {
        let mut k = Kept {
            list: Vec::new(),
            tally: Tally {
                pid: 0,
                threads: 0,
                pairs: 0,
            },
        };
        k.push(ended(10, 3));
        k.push(ended(10, 5));
        let t = k.tally(10);
        assert_eq!((t.threads, t.pairs), (2, 10));
        let child = k.tally(11);
        assert_eq!((child.threads, child.pairs), (0, 0));
        k.push(ended(11, 2));
        let child = k.tally(11);
        assert_eq!((child.threads, child.pairs), (1, 3));
        assert_eq!(k.list.len(), 3);
        k.clear();
        let t = k.tally(11);
        assert_eq!((t.threads, t.pairs), (0, 0));
    }
}
