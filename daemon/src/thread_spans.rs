//! Calls per thread over the span (`rtprofd --thread-rows N`): each live
//! thread of a process counts in a stripe of its own, so its calls of
//! each function are exact. Every tick reads those stripes; what changed
//! is kept as a sparse delta, as for the process's own rows, and each
//! thread's `N` hottest functions become its rows. A thread that ended has
//! left its stripe (its counts fold into the process's shared stripe): its
//! rows go with it, and its calls stay in the process's rows.

use rtprof_shared::layout::Header;
use rtprof_shared::present::{IdRow, ThreadRows, ROW_COUNTED};
use rtprof_shared::reader::{live_stripes, stripe_calls};
use std::collections::VecDeque;

/// One thread, by the stripe it counts in.
struct Thread {
    stripe: u32,
    tid: u32,
    /// Its stripe's counts at the newest tick.
    newest: Vec<u64>,
    /// Its calls over the span, per function.
    sums: Vec<u64>,
    /// (tick, [(slot, calls)]): what each tick added.
    ring: VecDeque<(u64, Vec<(u32, u64)>)>,
    /// Ticks until its name is read again (threads name themselves after
    /// they start).
    rename_in: u32,
    rows: ThreadRows,
}

/// A process's threads, followed tick by tick.
#[derive(Default)]
pub struct ThreadSpans {
    threads: Vec<Thread>,
    /// Tables, kept in step with `threads`, for the writer.
    tables: Vec<ThreadRows>,
    live: Vec<(u32, u32)>,
    scratch: Vec<u64>,
    /// Read once at least: threads seen from now on started since.
    observed: bool,
}

/// The name the kernel has for thread `tid` of `pid` (empty if gone).
fn thread_name(pid: u32, tid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|s| s.trim_end_matches('\n').to_string())
        .unwrap_or_default()
}

/// Names are read again this many ticks after a thread is first seen.
const RENAME_TICKS: u32 = 3;

impl ThreadSpans {
    /// Reads the live threads' stripes of the process `pid` (segment
    /// `bytes`, header `h`, its first `funcs` functions) at `now_ns`; each
    /// thread's rows are its `top` hottest functions over the span, named
    /// through `id_of` (slot -> row id, module, counted). The threads a
    /// first read finds count from then on, unless the process is `young`
    /// (it started within the span), as the process's own rows do.
    #[allow(clippy::too_many_arguments)]
    pub fn observe(
        &mut self,
        bytes: &[u8],
        h: &Header,
        funcs: usize,
        (pid, young): (u32, bool),
        (now_ns, span_ns): (u64, u64),
        top: usize,
        id_of: impl Fn(usize) -> (u32, u32, bool),
    ) {
        let funcs = funcs.min(h.func_count as usize);
        let from_now = !self.observed && !young;
        self.observed = true;
        live_stripes(bytes, h, &mut self.live);
        let live = &self.live;
        // A stripe handed to another thread is a new thread.
        self.threads
            .retain(|t| live.iter().any(|&(s, tid)| s == t.stripe && tid == t.tid));
        for &(stripe, tid) in live {
            if !self.threads.iter().any(|t| t.stripe == stripe) {
                let mut newest = Vec::new();
                if from_now {
                    newest.resize(funcs, 0);
                    stripe_calls(bytes, h, stripe, &mut newest);
                }
                self.threads.push(Thread {
                    stripe,
                    tid,
                    newest,
                    sums: Vec::new(),
                    ring: VecDeque::new(),
                    rename_in: RENAME_TICKS,
                    rows: ThreadRows {
                        tid,
                        name: thread_name(pid, tid),
                        rows: Vec::new(),
                    },
                });
            }
        }
        self.threads.sort_by_key(|t| t.tid);
        self.scratch.resize(funcs, 0);
        let start = now_ns.saturating_sub(span_ns);
        for t in &mut self.threads {
            if !stripe_calls(bytes, h, t.stripe, &mut self.scratch[..funcs]) {
                continue;
            }
            t.newest.resize(funcs, 0);
            t.sums.resize(funcs, 0);
            let mut delta = Vec::new();
            for (slot, (&n, o)) in self.scratch.iter().zip(t.newest.iter_mut()).enumerate() {
                if n != *o {
                    // A count that went back (a hostile segment) adds nothing.
                    let c = n.saturating_sub(*o);
                    *o = n;
                    if c > 0 {
                        t.sums[slot] = t.sums[slot].saturating_add(c);
                        delta.push((slot as u32, c));
                    }
                }
            }
            t.ring.push_back((now_ns, delta));
            while t.ring.len() > 1 && t.ring[0].0 <= start {
                let (_, gone) = t.ring.pop_front().unwrap_or_default();
                for (slot, c) in gone {
                    t.sums[slot as usize] = t.sums[slot as usize].saturating_sub(c);
                }
            }
            if t.rename_in > 0 {
                t.rename_in -= 1;
                if t.rename_in == 0 {
                    let name = thread_name(pid, t.tid);
                    if !name.is_empty() {
                        t.rows.name = name;
                    }
                }
            }
            let mut hot: Vec<(u64, u32)> = t
                .sums
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(slot, &c)| (c, slot as u32))
                .collect();
            let hottest = |&(c, slot): &(u64, u32)| (std::cmp::Reverse(c), slot);
            if hot.len() > top && top > 0 {
                hot.select_nth_unstable_by_key(top - 1, hottest);
                hot.truncate(top);
            }
            hot.sort_unstable_by_key(hottest);
            t.rows.rows.clear();
            t.rows.rows.extend(hot.iter().map(|&(calls, slot)| {
                let (id, module, counted) = id_of(slot as usize);
                IdRow {
                    id,
                    module,
                    flags: if counted { ROW_COUNTED } else { 0 },
                    calls,
                    total_calls: t.newest[slot as usize],
                    ..IdRow::default()
                }
            }));
        }
        self.tables.clear();
        self.tables
            .extend(self.threads.iter().map(|t| t.rows.clone()));
    }

    /// Each live thread's rows, by thread id.
    pub fn tables(&self) -> &[ThreadRows] {
        &self.tables
    }
}
