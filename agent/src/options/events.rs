//! Events besides CPU time (`RTPROF_EVENTS=page-faults,cycles`): each one
//! the machine offers is sampled per CPU like the CPU-time samples (the
//! events inherited by the process's threads), every `period` events one
//! sample, and each sample is counted for the function it lands in and
//! for its thread. Software events in kernel code (a page fault, a
//! context switch) land where the thread entered the kernel: the samples
//! carry the user registers. What ran, and why the others did not, goes
//! beside the segment at exit (`<segment>.events`, read by
//! `Events::parse`).
//!
//! The drain thread and the exit path drain the rings one at a time (the
//! sampler's drain flag), without allocating: the counts are laid out at
//! start.

use crate::error::Errno;
use crate::log::vlog;
use crate::sampling::addrmap;
use crate::sampling::perf;
use crate::sampling::ring::{field_u32, field_u64, Ring, PERF_RECORD_LOST, PERF_RECORD_SAMPLE};
use crate::sampling::stacks::MODULE;
use crate::Agent;
use perf_event::events::{Event, Hardware, Software};
use perf_event::{Builder, SampleFlag};
use rtprof_abi::sampling::Why;
use std::os::fd::IntoRawFd;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

/// Events asked for at most.
pub const MAX_EVENTS: usize = 8;
/// Ring data pages per CPU and event (256 KiB, 8,192 samples).
const RING_PAGES: u64 = 64;
/// Where locked memory for that is refused (a user's perf limit).
const SMALL_RING_PAGES: u64 = 8;
/// Threads whose counts are kept apart; later ones count in the totals.
const MAX_THREADS: usize = 1024;
/// The user registers a sample carries: ip (`perf_regs` numbering).
const REG_IP: u64 = 1 << 8;

/// An event rtprof knows by name, and its default period.
struct Known {
    name: &'static str,
    kind: Kind,
    period: u64,
}

#[derive(Clone, Copy)]
enum Kind {
    Sw(Software),
    Hw(Hardware),
}

const KNOWN: &[Known] = &[
    Known {
        name: "page-faults",
        kind: Kind::Sw(Software::PAGE_FAULTS),
        period: 1,
    },
    Known {
        name: "minor-faults",
        kind: Kind::Sw(Software::PAGE_FAULTS_MIN),
        period: 1,
    },
    Known {
        name: "major-faults",
        kind: Kind::Sw(Software::PAGE_FAULTS_MAJ),
        period: 1,
    },
    Known {
        name: "context-switches",
        kind: Kind::Sw(Software::CONTEXT_SWITCHES),
        period: 1,
    },
    Known {
        name: "cpu-migrations",
        kind: Kind::Sw(Software::CPU_MIGRATIONS),
        period: 1,
    },
    Known {
        name: "task-clock",
        kind: Kind::Sw(Software::TASK_CLOCK),
        period: 1_000_000,
    },
    Known {
        name: "cycles",
        kind: Kind::Hw(Hardware::CPU_CYCLES),
        period: 1_000_003,
    },
    Known {
        name: "instructions",
        kind: Kind::Hw(Hardware::INSTRUCTIONS),
        period: 1_000_003,
    },
    Known {
        name: "cache-references",
        kind: Kind::Hw(Hardware::CACHE_REFERENCES),
        period: 100_003,
    },
    Known {
        name: "cache-misses",
        kind: Kind::Hw(Hardware::CACHE_MISSES),
        period: 10_007,
    },
    Known {
        name: "branches",
        kind: Kind::Hw(Hardware::BRANCH_INSTRUCTIONS),
        period: 1_000_003,
    },
    Known {
        name: "branch-misses",
        kind: Kind::Hw(Hardware::BRANCH_MISSES),
        period: 10_007,
    },
];

/// What became of an event asked for: the codes in `<segment>.events`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Status {
    Ran = 0,
    /// Not an event rtprof knows.
    Unknown = 1,
    /// The kernel refused it (the errno says why: ENOENT, no such
    /// counter here; EACCES, perf_event_paranoid).
    Unavailable = 2,
    /// Events are sampled beside the perf sampler, which does not run.
    NoPerfSampler = 3,
}

/// One event asked for.
struct Opened {
    name: String,
    period: u64,
    status: Status,
    errno: i32,
    /// Counted in user mode only (kernel-mode counting refused).
    user_only: bool,
    rings: Vec<Ring>,
    /// Samples per function slot, then per module record (in modules
    /// whose functions are not listed), then outside every known module.
    counts: Box<[AtomicU64]>,
    lost: AtomicU64,
}

/// A thread's samples per event (tid 0: a free entry).
struct ThreadEvents {
    tid: AtomicU32,
    counts: [AtomicU64; MAX_EVENTS],
}

/// The events opened, published once (again in a forked child, where the
/// parent's are left as they are: their rings hold the parent's samples).
static EVENTS: AtomicPtr<Vec<Opened>> = AtomicPtr::new(std::ptr::null_mut());

/// Whether events are sampled here (their rings want draining).
pub fn active() -> bool {
    events().is_some_and(|e| e.iter().any(|o| !o.rings.is_empty()))
}

/// The events this process opened, if it did.
fn events() -> Option<&'static Vec<Opened>> {
    if FORKED.load(Ordering::Acquire) {
        return None;
    }
    let p = EVENTS.load(Ordering::Acquire);
    // SAFETY: a published list is never freed (a forked child publishes
    // its own and leaves the parent's).
    (!p.is_null()).then(|| unsafe { &*p })
}
/// Function slots in the counts (module records come after them).
static FUNCTIONS: OnceLock<u32> = OnceLock::new();
static THREADS: [ThreadEvents; MAX_THREADS] = [const {
    ThreadEvents {
        tid: AtomicU32::new(0),
        counts: [const { AtomicU64::new(0) }; MAX_EVENTS],
    }
}; MAX_THREADS];
/// Samples of threads past [`MAX_THREADS`] (in the totals only).
static THREADS_DROPPED: AtomicU64 = AtomicU64::new(0);

fn open_on(kind: Kind, cpu: usize, period: u64, user_only: bool) -> std::io::Result<i32> {
    fn build<E: Event>(e: E, cpu: usize, period: u64, user_only: bool) -> std::io::Result<i32> {
        let mut b = Builder::new(e);
        b.observe_self()
            .one_cpu(cpu)
            .inherit(true)
            .inherit_thread(true)
            .sample_period(period)
            .exclude_kernel(user_only)
            .exclude_hv(true)
            .enabled(true)
            .sample(SampleFlag::TID | SampleFlag::REGS_USER)
            .sample_regs_user(REG_IP);
        Ok(b.build()?.into_raw_fd())
    }
    match kind {
        Kind::Sw(e) => build(e, cpu, period, user_only),
        Kind::Hw(e) => build(e, cpu, period, user_only),
    }
}

/// Opens the events `a` asks for; `perf_runs` says whether the perf
/// sampler (whose drain thread drains them) runs.
pub fn start(a: &Agent, perf_runs: bool) {
    if a.config.events.is_empty() {
        return;
    }
    let caps = a.segment.counters.layout().caps;
    let (functions, slots) = (
        caps.functions,
        caps.functions as usize + caps.modules as usize + 1,
    );
    let _ = FUNCTIONS.set(functions);
    let opened = a
        .config
        .events
        .iter()
        .map(|(name, period)| {
            let known = KNOWN.iter().find(|k| k.name == name);
            let mut o = Opened {
                name: name.clone(),
                period: period.or(known.map(|k| k.period)).unwrap_or(1),
                status: Status::Unknown,
                errno: 0,
                user_only: false,
                rings: Vec::new(),
                counts: (0..slots).map(|_| AtomicU64::new(0)).collect(),
                lost: AtomicU64::new(0),
            };
            let Some(k) = known else { return o };
            if !perf_runs {
                o.status = Status::NoPerfSampler;
                return o;
            }
            // Kernel-mode counting first (a fault or a switch happens
            // there); where perf_event_paranoid refuses it, user mode.
            let open = |pages, user_only| {
                perf::open_rings(pages, |cpu| open_on(k.kind, cpu, o.period, user_only))
            };
            let mut r = open(RING_PAGES, false);
            if matches!(
                r,
                Err((Why::PerfRefused, Some(Errno(libc::EACCES | libc::EPERM))))
            ) {
                o.user_only = true;
                r = open(RING_PAGES, true);
            }
            // Locked memory for rings is bounded per user: smaller ones.
            if matches!(r, Err((Why::PerfMapFailed, _))) {
                r = open(SMALL_RING_PAGES, o.user_only);
            }
            match r {
                Ok(rings) => {
                    o.status = Status::Ran;
                    o.rings = rings;
                }
                Err((_, e)) => {
                    o.status = Status::Unavailable;
                    o.errno = e.map_or(0, |e| e.0);
                }
            }
            o
        })
        .collect::<Vec<_>>();
    for o in &opened {
        match o.status {
            Status::Ran => vlog!("event {}: every {} sampled", o.name, o.period),
            s => vlog!("event {}: not counted ({s:?}, errno {})", o.name, o.errno),
        }
    }
    EVENTS.store(Box::into_raw(Box::new(opened)), Ordering::Release);
}

/// The entry of thread `tid` in [`THREADS`], taken if free; None when full.
fn thread_entry(tid: u32) -> Option<&'static ThreadEvents> {
    let start = (tid as usize).wrapping_mul(0x9e37_79b9) % MAX_THREADS;
    for i in 0..MAX_THREADS {
        let e = &THREADS[(start + i) % MAX_THREADS];
        match e.tid.load(Ordering::Relaxed) {
            t if t == tid => return Some(e),
            0 => {
                // Only the drain writes (one drain at a time).
                e.tid.store(tid, Ordering::Relaxed);
                return Some(e);
            }
            _ => {}
        }
    }
    None
}

/// Reads every event ring once (the caller holds the sampler's drain
/// flag); returns the records read. Allocation-free.
pub fn drain(pid: u32) -> usize {
    let Some(events) = events() else {
        return 0;
    };
    let functions = FUNCTIONS.get().copied().unwrap_or(0);
    let mut n = 0;
    for (k, o) in events.iter().enumerate() {
        let unknown = o.counts.len() - 1;
        // A function's slot, a module's record (MODULE bit), or none.
        let index = |id: u32| {
            let i = if id & MODULE != 0 {
                functions as usize + (id & !MODULE) as usize
            } else {
                id as usize
            };
            i.min(unknown)
        };
        for r in &o.rings {
            n += r.drain_while(|ty, body| {
                match ty {
                    // Body: pid, tid (u32 each), the registers' ABI (u64;
                    // 0: no user registers), ip (u64).
                    PERF_RECORD_SAMPLE if field_u32(body, 0) == pid => {
                        let tid = field_u32(body, 4);
                        let mut id = [u32::MAX];
                        if field_u64(body, 8) != 0 {
                            addrmap::place_ids(&[field_u64(body, 16)], &mut id, u32::MAX);
                        }
                        o.counts[index(id[0])].fetch_add(1, Ordering::Relaxed);
                        match thread_entry(tid) {
                            Some(t) => {
                                t.counts[k].fetch_add(1, Ordering::Relaxed);
                            }
                            None => {
                                THREADS_DROPPED.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    // Body: id (u64), lost (u64).
                    PERF_RECORD_LOST => {
                        o.lost.fetch_add(field_u64(body, 8), Ordering::Relaxed);
                    }
                    _ => {}
                }
                true
            });
        }
    }
    n
}

/// In a forked child (allocation-free): the parent's rings are not mapped
/// here (a fork does not copy perf mappings) and its events are not the
/// child's (inherited by threads only), and the counts are the parent's.
/// The child neither drains nor reports them, and its threads' counts
/// start from nothing.
pub fn forget_in_child() {
    FORKED.store(true, Ordering::Release);
    for t in &THREADS {
        t.tid.store(0, Ordering::Relaxed);
        t.counts.iter().for_each(|c| c.store(0, Ordering::Relaxed));
    }
    THREADS_DROPPED.store(0, Ordering::Relaxed);
}

/// In a forked child, once `fork()` has returned (allocating is safe):
/// its own events, opened afresh, counted from nothing. `perf_runs` as
/// for [`start`].
pub fn restart_in_child(a: &Agent, perf_runs: bool) {
    if EVENTS.load(Ordering::Acquire).is_null() {
        return;
    }
    start(a, perf_runs);
    FORKED.store(false, Ordering::Release);
}

/// This process is a forked child of the one that opened the events.
static FORKED: AtomicBool = AtomicBool::new(false);

/// The events as text, if any were asked for: `rtprof-events 1
/// <threads' samples not kept apart>`, then per event `e <name> <status>
/// <errno> <period> <user only 0|1> <lost>` followed by `f <slot>
/// <samples>` per function, `m <module> <samples>` per module (samples
/// in a module whose functions are not listed), `u <samples>` outside
/// every known module, and `t <tid> <samples>` per thread.
pub fn text() -> Option<String> {
    use std::fmt::Write as _;
    let events = events()?;
    let mut out = format!(
        "rtprof-events 1 {}\n",
        THREADS_DROPPED.load(Ordering::Relaxed)
    );
    for (k, o) in events.iter().enumerate() {
        let _ = writeln!(
            out,
            "e {} {} {} {} {} {}",
            o.name,
            o.status as u8,
            o.errno,
            o.period,
            o.user_only as u8,
            o.lost.load(Ordering::Relaxed)
        );
        let functions = FUNCTIONS.get().copied().unwrap_or(0) as usize;
        let last = o.counts.len() - 1;
        for (i, c) in o.counts.iter().enumerate() {
            let c = c.load(Ordering::Relaxed);
            match i {
                _ if c == 0 => {}
                i if i < functions => {
                    let _ = writeln!(out, "f {i} {c}");
                }
                i if i < last => {
                    let _ = writeln!(out, "m {} {c}", i - functions);
                }
                _ => {
                    let _ = writeln!(out, "u {c}");
                }
            }
        }
        for t in &THREADS {
            let (tid, c) = (
                t.tid.load(Ordering::Relaxed),
                t.counts[k].load(Ordering::Relaxed),
            );
            if tid != 0 && c > 0 {
                let _ = writeln!(out, "t {tid} {c}");
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_event_has_a_distinct_name_and_a_period() {
        for (i, k) in KNOWN.iter().enumerate() {
            assert!(k.period > 0, "{}", k.name);
            assert!(KNOWN[..i].iter().all(|o| o.name != k.name), "{}", k.name);
            assert!(!k.name.contains(' '), "{}", k.name);
        }
    }

    #[test]
    fn threads_find_their_entry_again_and_the_table_bounds_them() {
        let a = thread_entry(4_000_001).unwrap() as *const ThreadEvents;
        let b = thread_entry(4_000_001).unwrap() as *const ThreadEvents;
        assert_eq!(a, b);
        assert_ne!(a, thread_entry(4_000_002).unwrap() as *const ThreadEvents);
    }
}
