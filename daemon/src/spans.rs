//! Span statistics for one process. The names are read once (again only
//! when the process adds functions); every tick only the counters are
//! read, and what changed since the previous tick is kept as a sparse
//! delta. The span's totals are kept as running sums: a new delta is added,
//! one that falls out of the span is subtracted.

use crate::slots::Slots;
use crate::thread_spans::ThreadSpans;
use rtprof_abi::layout::function_flags;
use rtprof_abi::layout::Header;
use rtprof_abi::present::{
    IdRow, ProcRows, AGENT_MODULE, ROW_ACCELERATED, ROW_ACTIVE, ROW_AGENT, ROW_AT_LEAST,
    ROW_COUNTED, ROW_COUNTING_OFF, ROW_ESTIMATED, ROW_IMPLEMENTATION, ROW_OFFERED, UNKNOWN_MODULE,
};
use rtprof_abi::reader::{read_samples, sum_calls};
use rtprof_abi::{read_cost, read_function_flags, read_snapshot, SegmentError, Snapshot};
use std::collections::VecDeque;

/// What a process's segment names, read when it changes: each function's
/// and module's row id (names are kept once per executable, in [`Slots`]),
/// module and flags.
#[derive(Default)]
struct Meta {
    func_count: u32,
    module_count: u32,
    strings_len: u32,
    /// Each function slot: what names a row of the span's table (read
    /// for the few rows a table shows; its counts are in [`FuncCounts`]).
    funcs: Vec<FuncSlot>,
    /// Module file names, and the row ids of their buckets (`[libc.so.6]`).
    modules: Vec<String>,
    buckets: Vec<u32>,
    /// Row id of `[unknown]`.
    unknown: Option<u32>,
    /// Row id of `[rtprof]`, what the agent costs the process.
    agent: Option<u32>,
    /// Offered functions and their implementations' rows: shown in every
    /// span, called or not, so that a scheduler sees what it may route to.
    offered: Vec<u32>,
    /// The offered functions among them.
    offered_functions: std::collections::HashSet<u32>,
}

#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct FuncSlot {
    /// Row id (names are in [`Slots`]).
    id: u32,
    module: u32,
    /// Instrumented: calls are counted.
    counted: bool,
    /// An implementation's row.
    implementation: bool,
    /// Its [`function_flags`] (estimated, accelerated, counting off).
    flags: u32,
}

impl Meta {
    /// Takes ids for the slots added since the last read (slots are only
    /// ever added; names of existing ones stay).
    fn extend(&mut self, s: &Snapshot, exe: &str, h: &Header, slots: &mut Slots) {
        self.func_count = s.functions.len() as u32;
        self.module_count = s.modules.len() as u32;
        self.strings_len = h.strings_len;
        for (i, f) in s.functions.iter().enumerate().skip(self.funcs.len()) {
            self.funcs.push(FuncSlot {
                id: slots.acquire(exe, &f.name),
                module: f.module,
                counted: false,
                implementation: f.implementation.is_some(),
                flags: 0,
            });
            if let Some(imp) = &f.implementation {
                if self.offered_functions.insert(imp.of) {
                    self.offered.push(imp.of);
                }
                self.offered.push(i as u32);
            }
        }
        for (m, f) in self.funcs.iter_mut().zip(&s.functions) {
            m.counted = f.instrumented;
        }
        for md in s.modules.iter().skip(self.modules.len()) {
            self.modules.push(md.name().to_string());
            self.buckets
                .push(slots.acquire(exe, &format!("[{}]", md.name())));
        }
        if self.unknown.is_none() {
            self.unknown = Some(slots.acquire(exe, "[unknown]"));
        }
        if self.agent.is_none() {
            self.agent = Some(slots.acquire(exe, "[rtprof]"));
        }
    }

    /// Gives back every id taken.
    fn release(&mut self, exe: &str, slots: &mut Slots) {
        let funcs = self.funcs.drain(..).map(|f| f.id);
        for id in funcs.chain(self.buckets.drain(..)) {
            slots.release(exe, id);
        }
        for id in [self.unknown.take(), self.agent.take()]
            .into_iter()
            .flatten()
        {
            slots.release(exe, id);
        }
    }

    fn stale(&self, h: &Header) -> bool {
        (h.func_count, h.module_count, h.strings_len)
            != (self.func_count, self.module_count, self.strings_len)
    }
}

/// Counters of one process as a tick reads them, indexed by slot, and
/// the order its table is sorted in: one buffer for every process, so it
/// stays in cache from one to the next.
#[derive(Default, Clone)]
pub struct Counts {
    calls: Vec<u64>,
    samples: Vec<u64>,
    rest: Rest,
    order: Vec<(u64, u32)>,
}

/// Samples outside named functions (per module and unknown), and the
/// totals: newest values, or sums over the span.
#[derive(Default, Clone)]
struct Rest {
    buckets: Vec<u64>,
    unknown: u64,
    total: u64,
    lost: u64,
    /// What the agent cost the process (ns, its own measure).
    agent: u64,
}

/// One function's newest counts, 16 bytes: every tick streams through all
/// of them (memory, not arithmetic, is what a tick costs), comparing them
/// with what it read. The same word that holds the samples says where the
/// function's span sums are, so a change reaches them without another
/// cache miss: in [`Tracked::spans`], a small table of the functions the
/// span touched, which stays in cache.
#[derive(Clone, Copy, Default)]
#[repr(C, align(16))]
struct FuncCounts {
    /// At the newest tick.
    calls: u64,
    /// Samples at the newest tick (the low [`SAMPLE_BITS`]), and its index
    /// in [`Tracked::spans`] + 1 (0: none) above them.
    packed: u64,
}

/// 2^40 samples: 35 years of one CPU at 1 kHz. A hostile segment's larger
/// counts are taken as this.
const SAMPLE_BITS: u32 = 40;
const SAMPLES_MAX: u64 = (1 << SAMPLE_BITS) - 1;
/// Span indexes fit the other 24 bits: the daemon follows processes of
/// fewer functions than this.
const MAX_FUNCTIONS: u32 = (1 << (64 - SAMPLE_BITS)) - 1;

impl FuncCounts {
    fn samples(&self) -> u64 {
        self.packed & SAMPLES_MAX
    }
    fn set_samples(&mut self, n: u64) {
        self.packed = (self.packed & !SAMPLES_MAX) | n.min(SAMPLES_MAX);
    }
    /// Its index in [`Tracked::spans`].
    fn span(&self) -> Option<usize> {
        (self.packed >> SAMPLE_BITS)
            .checked_sub(1)
            .map(|a| a as usize)
    }
    fn set_span(&mut self, at: Option<usize>) {
        let a = at.map_or(0, |a| a as u64 + 1);
        self.packed = self.samples() | a << SAMPLE_BITS;
    }
}

/// A function's sums over the span.
#[derive(Clone, Copy)]
struct SpanSums {
    slot: u32,
    calls: u64,
    samples: u64,
}

impl Counts {
    fn resize(&mut self, funcs: usize, modules: usize) {
        self.calls.resize(funcs, 0);
        self.samples.resize(funcs, 0);
        self.rest.buckets.resize(modules, 0);
    }

    /// At least this many slots (a shared buffer keeps its largest size).
    /// Each buffer is checked: the thread rows grow `calls` alone (their
    /// scratch), so a process first read with many functions left `calls`
    /// longer than `samples`, and its next tick indexed past `samples`
    /// (rtprofd ended on a panic).
    fn grow(&mut self, funcs: usize, modules: usize) {
        if self.calls.len() < funcs
            || self.samples.len() < funcs
            || self.rest.buckets.len() < modules
        {
            let (f, m) = (
                funcs.max(self.calls.len()).max(self.samples.len()),
                modules.max(self.rest.buckets.len()),
            );
            self.resize(f, m);
        }
    }
}

/// What changed over one tick, ending at `at_ns`.
struct Delta {
    at_ns: u64,
    /// (slot, calls, samples), for slots that changed.
    funcs: Vec<(u32, u64, u64)>,
    buckets: Vec<(u32, u64)>,
    unknown: u64,
    total: u64,
    lost: u64,
    agent: u64,
}

/// What the process's agent has cost it so far, by its own measure (see
/// `layout::cost`): 0 for a segment without the measure.
fn agent_cost(bytes: &[u8], h: &Header) -> u64 {
    read_cost(bytes, h).map_or(0, |c| c.running_ns(h.sample_period_ns))
}

/// Keeps the `n` first of `v` by `key` (all of them if `n` is 0), in
/// order; only those are sorted.
pub fn keep_first<T, K: Ord>(v: &mut Vec<T>, n: usize, key: impl Fn(&T) -> K) {
    if n > 0 && v.len() > n {
        v.select_nth_unstable_by_key(n - 1, &key);
        v.truncate(n);
    }
    v.sort_unstable_by_key(key);
}

/// What the daemon needs to know of a process each tick.
pub struct Seen {
    pub pid: u32,
    pub state: u32,
    /// Its counters moved since the last tick (so it ran in it).
    pub moved: bool,
}

/// One process as the daemon follows it.
pub struct Tracked {
    pub pid: u32,
    /// Its executable as the kernel said at registration: what its rows
    /// are keyed and published by.
    pub exe: String,
    /// The executable its segment names, when that differs from `exe`:
    /// the process's own claim, shown as such, never a key.
    pub claimed: Option<String>,
    pub start_ns: u64,
    pub ended: bool,
    period_ns: u64,
    meta: Meta,
    /// Each function's newest counts, and where its span sums are.
    counts: Vec<FuncCounts>,
    /// The rest of the counters at the newest tick, and their span sums.
    newest: Rest,
    sums: Rest,
    newest_ns: u64,
    /// The span: changes since `base_ns`.
    ring: VecDeque<Delta>,
    /// The sums of the functions the span touched (each one's
    /// [`FuncCounts::span`] points here), so a table costs what the span
    /// touched, not every function.
    spans: Vec<SpanSums>,
    /// A delta's list let go, for the next tick's (no allocation a tick).
    spare: Vec<(u32, u64, u64)>,
    base_ns: u64,
    /// The segment's count of function flag changes when they were read,
    /// and a buffer to read them into.
    flags_changes: u64,
    flags: Vec<u32>,
    /// The span's table, hottest first: built right after a read, while
    /// what it reads is in cache.
    rows: Vec<IdRow>,
    /// Rows per thread (`--thread-rows`): each thread's this many
    /// hottest functions (0: none).
    thread_top: usize,
    threads: ThreadSpans,
}

fn seen(h: &Header, moved: bool) -> Seen {
    Seen {
        pid: h.pid,
        state: h.state,
        moved,
    }
}

impl Tracked {
    /// How many instrumented functions have names matching `pattern`.
    pub fn matching(&self, pattern: &str, slots: &Slots) -> usize {
        let m = &self.meta;
        m.funcs
            .iter()
            .filter(|f| {
                f.counted
                    && rtprof_shared::glob_match(pattern.as_bytes(), slots.name(f.id).as_bytes())
            })
            .count()
    }

    /// Gives back the row ids it holds: once, when the daemon stops
    /// following the process.
    pub fn release(&mut self, slots: &mut Slots) {
        self.meta.release(&self.exe, slots);
    }

    /// Starts following the process whose segment is `bytes`. If it
    /// started within the span, its first span counts from its start
    /// (zero); otherwise from now.
    /// `h` is the segment's header as the caller read and checked it;
    /// `exe` the process's executable from the kernel.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        bytes: &[u8],
        h: &Header,
        exe: &str,
        now_ns: u64,
        span_ns: u64,
        slots: &mut Slots,
        scratch: &mut Counts,
    ) -> Result<(Tracked, Seen), SegmentError> {
        if h.func_count > MAX_FUNCTIONS {
            return Err(SegmentError::BadCount(
                "functions (more than rtprofd follows)",
            ));
        }
        let s = read_snapshot(bytes)?;
        let young = s.start_ns + span_ns >= now_ns;
        let mut meta = Meta::default();
        meta.extend(&s, exe, h, slots);
        let mut t = Tracked {
            pid: s.pid,
            exe: exe.to_string(),
            claimed: (s.exe != exe).then(|| s.exe.clone()),
            start_ns: s.start_ns,
            ended: false,
            period_ns: s.sample_period_ns,
            meta,
            counts: Vec::new(),
            newest: Rest::default(),
            sums: Rest::default(),
            newest_ns: now_ns,
            ring: VecDeque::new(),
            spans: Vec::new(),
            spare: Vec::new(),
            base_ns: if young {
                s.start_ns.min(now_ns)
            } else {
                now_ns
            },
            flags_changes: h.flags_changes,
            flags: Vec::new(),
            rows: Vec::new(),
            thread_top: 0,
            threads: ThreadSpans::default(),
        };
        t.read_flags(bytes, h);
        let (f, m) = (s.functions.len(), s.modules.len());
        t.resize(f, m);
        let first = Counts {
            calls: s.functions.iter().map(|f| f.calls).collect(),
            samples: s.functions.iter().map(|f| f.samples).collect(),
            rest: Rest {
                buckets: s.modules.iter().map(|m| m.samples).collect(),
                unknown: s.samples_unknown,
                total: s.samples_total,
                lost: s.samples_lost,
                agent: agent_cost(bytes, h),
            },
            order: Vec::new(),
        };
        if young {
            t.record(&first, now_ns, span_ns, true);
        } else {
            for (sl, (&calls, &samples)) in t
                .counts
                .iter_mut()
                .zip(first.calls.iter().zip(&first.samples))
            {
                sl.calls = calls;
                sl.set_samples(samples);
            }
            t.newest = first.rest;
        }
        t.build_rows(&mut scratch.order);
        Ok((t, seen(h, true)))
    }

    /// Reads the segment again at `now_ns`: names only if the process
    /// added functions or modules, counters always.
    /// `scratch` is where the counters are read into: one buffer for every
    /// process, so it stays in cache from one to the next.
    pub fn observe(
        &mut self,
        bytes: &[u8],
        h: &Header,
        now_ns: u64,
        span_ns: u64,
        slots: &mut Slots,
        scratch: &mut Counts,
    ) -> Result<Seen, SegmentError> {
        let grown = self.meta.stale(h);
        if h.func_count > MAX_FUNCTIONS {
            return Err(SegmentError::BadCount(
                "functions (more than rtprofd follows)",
            ));
        }
        if grown {
            // Slots are only ever added: anything else would leave rows
            // and ids of slots that are gone.
            if h.func_count < self.meta.func_count {
                return Err(SegmentError::Rewritten("function count"));
            }
            if h.module_count < self.meta.module_count {
                return Err(SegmentError::Rewritten("module count"));
            }
            // Validates everything again.
            let s = read_snapshot(bytes)?;
            // Its claim may change; its rows stay under the kernel's name.
            self.claimed = (s.exe != self.exe).then(|| s.exe.clone());
            self.meta.extend(&s, &self.exe, h, slots);
            // New functions' flags, whatever this tick's sums do.
            self.read_flags(bytes, h);
        }
        let (f, m) = (
            self.meta.func_count as usize,
            self.meta.module_count as usize,
        );
        self.resize(f, m);
        scratch.grow(f, m);
        if !sum_calls(bytes, h, &mut scratch.calls[..f]) {
            // No sum of one moment: this tick keeps the last counts.
            return Err(SegmentError::Busy);
        }
        // Every sample counts in the total: if it stayed, so did they all.
        let sampled = h.samples_total != self.newest.total || grown;
        if sampled {
            read_samples(
                bytes,
                h,
                &mut scratch.samples[..f],
                &mut scratch.rest.buckets[..m],
            );
            // An implementation's samples are its own: the agent counts a
            // sample in routed code for the implementation routed to.
        }
        scratch.rest.unknown = h.samples_unknown;
        scratch.rest.total = h.samples_total;
        scratch.rest.lost = h.samples_lost;
        scratch.rest.agent = agent_cost(bytes, h);
        self.period_ns = h.sample_period_ns;
        self.record(scratch, now_ns, span_ns, sampled);
        // Flags only when the agent changed some: a read touches a cache
        // line per function.
        if self.flags_changes != h.flags_changes {
            self.read_flags(bytes, h);
        }
        self.build_rows(&mut scratch.order);
        let this_tick = self.ring.back().filter(|d| d.at_ns == now_ns);
        let moved = this_tick
            .is_some_and(|d| !(d.funcs.is_empty() && d.buckets.is_empty() && d.total == 0));
        // A thread's counts moved only if the process's did.
        self.observe_threads(bytes, h, (now_ns, span_ns), (false, moved), scratch);
        Ok(seen(h, moved))
    }

    /// Publishes the `top` hottest functions of each live thread too (0:
    /// none), from this read at `now_ns` on: a process that started within
    /// the span counts its threads' calls from their start, as its own.
    pub fn follow_threads(
        &mut self,
        top: usize,
        (bytes, h): (&[u8], &Header),
        (now_ns, span_ns): (u64, u64),
        scratch: &mut Counts,
    ) {
        self.thread_top = top;
        let young = self.start_ns + span_ns >= now_ns;
        self.observe_threads(bytes, h, (now_ns, span_ns), (young, true), scratch);
    }

    fn observe_threads(
        &mut self,
        bytes: &[u8],
        h: &Header,
        (now_ns, span_ns): (u64, u64),
        (young, moved): (bool, bool),
        scratch: &mut Counts,
    ) {
        if self.thread_top == 0 {
            return;
        }
        let m = &self.meta;
        let id_of = |slot: usize| {
            let f = &m.funcs[slot];
            (f.id, f.module, f.counted)
        };
        self.threads.observe(
            bytes,
            h,
            (m.funcs.len(), &mut scratch.calls),
            (self.pid, young, moved),
            (now_ns, span_ns),
            self.thread_top,
            id_of,
        );
    }

    /// Room for `funcs` functions and `modules` modules (they only grow).
    fn resize(&mut self, funcs: usize, modules: usize) {
        self.counts.resize(funcs, FuncCounts::default());
        self.newest.buckets.resize(modules, 0);
        self.sums.buckets.resize(modules, 0);
    }

    fn read_flags(&mut self, bytes: &[u8], h: &Header) {
        self.flags_changes = h.flags_changes;
        self.flags.resize(self.meta.funcs.len(), 0);
        read_function_flags(bytes, h, &mut self.flags);
        for (m, &fl) in self.meta.funcs.iter_mut().zip(&self.flags) {
            m.flags = fl;
        }
    }

    /// Makes `new` (just read; its first slots are this process's) the
    /// newest point: its changes become a delta, added to the span's sums
    /// as they are found, and deltas older than the span are let go.
    /// Without `sampled`, samples were not read: they stayed.
    fn record(&mut self, new: &Counts, now_ns: u64, span_ns: u64, sampled: bool) {
        let (old, rest) = (&mut self.newest, &new.rest);
        let mut d = Delta {
            at_ns: now_ns,
            funcs: std::mem::take(&mut self.spare),
            buckets: Vec::new(),
            unknown: rest.unknown.saturating_sub(old.unknown),
            total: rest.total.saturating_sub(old.total),
            lost: rest.lost.saturating_sub(old.lost),
            agent: rest.agent.saturating_sub(old.agent),
        };
        let spans = &mut self.spans;
        // A change: kept in the delta and added to the span at once.
        let mut changed = |i: usize, o: &mut FuncCounts, c: u64, s: u64| {
            let at = o.span().unwrap_or_else(|| {
                spans.push(SpanSums {
                    slot: i as u32,
                    calls: 0,
                    samples: 0,
                });
                o.set_span(Some(spans.len() - 1));
                spans.len() - 1
            });
            let sums = &mut spans[at];
            sums.calls = sums.calls.wrapping_add(c);
            sums.samples = sums.samples.wrapping_add(s);
            d.funcs.push((i as u32, c, s));
        };
        // The newest point is updated in place, slot by slot: a counter
        // that went back (a hostile segment) is taken as it is, adding
        // nothing.
        if sampled {
            let read = new.calls.iter().zip(&new.samples);
            for (i, ((&n, &ns), o)) in read.zip(self.counts.iter_mut()).enumerate() {
                let ns = ns.min(SAMPLES_MAX);
                // Written only when it changed: an unchanged line stays
                // clean, with nothing to write back.
                if (n, ns) != (o.calls, o.samples()) {
                    let (c, s) = (n.saturating_sub(o.calls), ns.saturating_sub(o.samples()));
                    o.calls = n;
                    o.set_samples(ns);
                    if c | s != 0 {
                        changed(i, o, c, s);
                    }
                }
            }
            for (i, (&n, o)) in rest.buckets.iter().zip(old.buckets.iter_mut()).enumerate() {
                if n > *o {
                    d.buckets.push((i as u32, n - *o));
                }
                *o = n;
            }
        } else {
            for (i, (&n, o)) in new.calls.iter().zip(self.counts.iter_mut()).enumerate() {
                if n != o.calls {
                    let c = n.saturating_sub(o.calls);
                    o.calls = n;
                    if c != 0 {
                        changed(i, o, c, 0);
                    }
                }
            }
        }
        (old.unknown, old.total, old.lost) = (rest.unknown, rest.total, rest.lost);
        old.agent = old.agent.max(rest.agent);
        self.apply(&d, true);
        self.ring.push_back(d);
        self.newest_ns = now_ns;
        let start = now_ns.saturating_sub(span_ns);
        while self.ring.len() > 1 && self.ring[0].at_ns <= start {
            let mut d = self.ring.pop_front().unwrap();
            self.apply(&d, false);
            self.base_ns = d.at_ns;
            d.funcs.clear();
            self.spare = d.funcs;
        }
        // Functions the span no longer touches leave the table; the last
        // one takes the place of each.
        let (counts, spans) = (&mut self.counts, &mut self.spans);
        let mut k = 0;
        while k < spans.len() {
            if spans[k].calls | spans[k].samples != 0 {
                k += 1;
                continue;
            }
            let gone = spans.swap_remove(k);
            counts[gone.slot as usize].set_span(None);
            if let Some(moved) = spans.get(k) {
                counts[moved.slot as usize].set_span(Some(k));
            }
        }
    }

    /// Adds (or takes away) a delta's module buckets and totals, and takes
    /// away its functions' changes (added as they were found).
    fn apply(&mut self, d: &Delta, add: bool) {
        let op = |a: &mut u64, b: u64| {
            *a = if add {
                a.wrapping_add(b)
            } else {
                a.wrapping_sub(b)
            }
        };
        if !add {
            for &(i, c, n) in &d.funcs {
                // Sums of hostile counts may have wrapped to zero and left.
                if let Some(at) = self.counts[i as usize].span() {
                    let o = &mut self.spans[at];
                    op(&mut o.calls, c);
                    op(&mut o.samples, n);
                }
            }
        }
        let s = &mut self.sums;
        for &(i, n) in &d.buckets {
            op(&mut s.buckets[i as usize], n);
        }
        op(&mut s.unknown, d.unknown);
        op(&mut s.total, d.total);
        op(&mut s.lost, d.lost);
        op(&mut s.agent, d.agent);
    }

    /// What the tick at `now_ns` read, if it read this process: `f` gets
    /// each change as (row id, readable function, module, calls, CPU ns).
    /// Changes
    /// never go negative, so running sums of them only grow.
    pub fn each_change(
        &self,
        now_ns: u64,
        slots: &Slots,
        f: impl FnMut(u32, &str, &str, u64, u64),
    ) {
        if let Some(d) = self.ring.back().filter(|d| d.at_ns == now_ns) {
            let funcs = d.funcs.iter().map(|&(i, c, s)| (i as usize, c, s));
            let buckets = d.buckets.iter().map(|&(i, s)| (i as usize, s));
            self.each_row(slots, funcs, buckets, d.unknown, f);
        }
    }

    /// The `n` functions hottest over the span (by time, then calls), as
    /// (row id, readable function, module, calls, CPU ns) since the process
    /// started: counters that only grow while it lives.
    pub fn hottest_totals(
        &self,
        slots: &Slots,
        n: usize,
        mut f: impl FnMut(u32, &str, &str, u64, u64),
    ) {
        let (s, m) = (&self.counts, &self.meta);
        let mut hot: Vec<(u64, u64, u32)> = self
            .spans
            .iter()
            .map(|c| (c.samples, c.calls, c.slot))
            .collect();
        keep_first(&mut hot, n, |&(samples, calls, _)| {
            std::cmp::Reverse((samples, calls))
        });
        for &(_, _, i) in hot.iter().take(n) {
            let (fs, i) = (m.funcs[i as usize], i as usize);
            let calls = if fs.counted { s[i].calls } else { 0 };
            let module = m
                .modules
                .get(fs.module as usize)
                .map_or("?", |s| s.as_str());
            let ns = s[i].samples().saturating_mul(self.period_ns);
            f(fs.id, slots.readable(fs.id), module, calls, ns);
        }
    }

    /// Each offered function and each of its implementations, as
    /// (function, implementation, whether it runs the calls now): the
    /// function's own code is `original`.
    pub fn each_route(&self, slots: &Slots, mut f: impl FnMut(&str, &str, bool)) {
        let m = &self.meta;
        for &slot in &m.offered {
            let Some(fs) = m.funcs.get(slot as usize) else {
                continue;
            };
            let active = fs.flags & function_flags::ACTIVE != 0;
            let name = slots.readable(fs.id);
            if !fs.implementation {
                f(name, rtprof_abi::route::ORIGINAL, active);
            } else if let Some((function, rest)) = name.rsplit_once(" [") {
                f(function, rest.strip_suffix(']').unwrap_or(rest), active);
            }
        }
    }

    /// The span's sums, as [`Tracked::each_change`] gives a tick's.
    pub fn each_in_span(&self, slots: &Slots, f: impl FnMut(u32, &str, &str, u64, u64)) {
        let funcs = self
            .spans
            .iter()
            .map(|c| (c.slot as usize, c.calls, c.samples));
        let s = &self.sums;
        let buckets = s.buckets.iter().copied().enumerate();
        self.each_row(slots, funcs, buckets, s.unknown, f);
    }

    fn each_row(
        &self,
        slots: &Slots,
        funcs: impl Iterator<Item = (usize, u64, u64)>,
        buckets: impl Iterator<Item = (usize, u64)>,
        unknown: u64,
        mut f: impl FnMut(u32, &str, &str, u64, u64),
    ) {
        let m = &self.meta;
        let time = |samples: u64| samples.saturating_mul(self.period_ns);
        let module = |i: u32| m.modules.get(i as usize).map_or("?", |s| s.as_str());
        for (i, calls, samples) in funcs {
            let fs = m.funcs[i];
            let calls = if fs.counted { calls } else { 0 };
            if calls | samples != 0 {
                f(
                    fs.id,
                    slots.readable(fs.id),
                    module(fs.module),
                    calls,
                    time(samples),
                );
            }
        }
        for (i, samples) in buckets.filter(|&(_, s)| s > 0) {
            f(
                m.buckets[i],
                slots.readable(m.buckets[i]),
                module(i as u32),
                0,
                time(samples),
            );
        }
        if let Some(id) = m.unknown.filter(|_| unknown > 0) {
            f(id, slots.readable(id), "unknown", 0, time(unknown));
        }
    }

    /// Builds the span's table, hottest first, into `rows`. Rows carry
    /// ids, not names: the writer names them through [`Slots`].
    fn build_rows(&mut self, order: &mut Vec<(u64, u32)>) {
        let (s, m) = (&self.sums, &self.meta);
        let time = |samples: u64| samples.saturating_mul(self.period_ns);
        // Sorted as small keys (one process's samples all have its period,
        // so samples order as time does): samples and calls in one integer,
        // so a comparison is one; beyond 2^26 samples or 2^38 calls in a
        // span (far past any real one) rows tie. A function's row is its
        // index in `spans`; rows past the functions are module buckets,
        // then `[unknown]`.
        let key =
            |samples: u64, calls: u64| samples.min((1 << 26) - 1) << 38 | calls.min((1 << 38) - 1);
        let f = m.funcs.len() as u32;
        order.clear();
        for (at, c) in self.spans.iter().enumerate() {
            let calls = if m.funcs[c.slot as usize].counted {
                c.calls
            } else {
                0
            };
            if calls | c.samples != 0 {
                order.push((key(c.samples, calls), at as u32));
            }
        }
        for (i, &samples) in s.buckets.iter().enumerate().filter(|(_, &n)| n > 0) {
            order.push((key(samples, 0), f + i as u32));
        }
        if s.unknown > 0 && m.unknown.is_some() {
            order.push((key(s.unknown, 0), f + m.buckets.len() as u32));
        }
        if s.agent > 0 && m.agent.is_some() {
            // Ordered as the samples its time would make.
            let as_samples = s.agent / self.period_ns.max(1_000_000);
            order.push((key(as_samples, 0), f + m.buckets.len() as u32 + 1));
        }
        // Offers the span did not touch, last.
        let idle = f + m.buckets.len() as u32 + 2;
        for (k, &slot) in m.offered.iter().enumerate() {
            if self.counts[slot as usize].span().is_none() {
                order.push((0, idle + k as u32));
            }
        }
        order.sort_unstable_by_key(|&(k, _)| std::cmp::Reverse(k));
        let (counts, spans) = (&self.counts, &self.spans);
        // A function's row, with its sums over the span.
        let function_row = |slot: usize, calls: u64, samples: u64| {
            let (fs, c) = (&m.funcs[slot], &counts[slot]);
            let flag = |bit: u32, row: u32| if fs.flags & bit != 0 { row } else { 0 };
            IdRow {
                id: fs.id,
                module: fs.module,
                flags: if fs.counted { ROW_COUNTED } else { 0 }
                    | flag(function_flags::ESTIMATED, ROW_ESTIMATED)
                    | if function_flags::estimate(fs.flags) == Some(function_flags::AT_LEAST) {
                        ROW_AT_LEAST
                    } else {
                        0
                    }
                    | flag(function_flags::ACCELERATED, ROW_ACCELERATED)
                    | flag(function_flags::COUNTING_OFF, ROW_COUNTING_OFF)
                    | flag(function_flags::OFFERED, ROW_OFFERED)
                    | flag(function_flags::ACTIVE, ROW_ACTIVE)
                    | if fs.implementation {
                        ROW_IMPLEMENTATION
                    } else {
                        0
                    },
                calls: if fs.counted { calls } else { 0 },
                samples,
                time_ns: time(samples),
                total_calls: c.calls,
            }
        };
        let row = |&(_, i): &(u64, u32)| {
            let b = i.saturating_sub(f) as usize;
            if i < f {
                // A function's row: `i` is where its span sums are.
                let sp = &spans[i as usize];
                function_row(sp.slot as usize, sp.calls, sp.samples)
            } else if b < m.buckets.len() {
                IdRow {
                    id: m.buckets[b],
                    module: b as u32,
                    samples: s.buckets[b],
                    time_ns: time(s.buckets[b]),
                    ..IdRow::default()
                }
            } else if b == m.buckets.len() {
                IdRow {
                    // Pushed above only with an id.
                    id: m.unknown.unwrap_or_default(),
                    module: UNKNOWN_MODULE,
                    samples: s.unknown,
                    time_ns: time(s.unknown),
                    ..IdRow::default()
                }
            } else if i >= idle {
                function_row(m.offered[(i - idle) as usize] as usize, 0, 0)
            } else {
                IdRow {
                    // Pushed above only with an id.
                    id: m.agent.unwrap_or_default(),
                    module: AGENT_MODULE,
                    flags: ROW_AGENT,
                    time_ns: s.agent,
                    ..IdRow::default()
                }
            }
        };
        self.rows.clear();
        self.rows.extend(order.iter().map(row));
    }

    /// The span's table as the last read left it.
    pub fn table(&self) -> ProcRows<'_> {
        let s = &self.sums;
        ProcRows {
            pid: self.pid,
            exe: &self.exe,
            claimed: self.claimed.as_deref(),
            ended: self.ended,
            span_ns: self.newest_ns.saturating_sub(self.base_ns),
            samples: s.total,
            period_ns: self.period_ns,
            lost: s.lost,
            modules: &self.meta.modules,
            rows: &self.rows,
            threads: self.threads.tables(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtprof_abi::layout::{state, Capacities, Layout};
    use rtprof_abi::present::{key_hash, RowNames};
    use rtprof_abi::sampling::{Sampler, Why};
    use rtprof_abi::{read_header, SegmentWriter};

    const S: u64 = 1_000_000_000;

    /// A segment of pid 5 started at 1 µs, with `hot` and `cold` in /bin/app
    /// and a sampled-only libc.
    struct Seg {
        mem: Vec<u64>,
        w: SegmentWriter,
    }

    impl Seg {
        fn new() -> Seg {
            let layout = Layout::new(Capacities {
                modules: 3,
                functions: 8,
                strings: 256,
                stripes: 3,
            });
            let mut mem = vec![0u64; (layout.total_size / 8) as usize];
            // SAFETY: `mem` is the layout's size, 8-aligned, and lives as
            // long as `w` (both in `Seg`).
            let mut w =
                unsafe { SegmentWriter::init(mem.as_mut_ptr() as *mut u8, layout, 5, 1, 1_000) };
            w.set_exe(b"/bin/app").unwrap();
            w.add_module(b"/bin/app", 0).unwrap();
            for n in ["hot", "cold"] {
                let f = w.add_function(n.as_bytes(), 0, 1).unwrap();
                w.set_status(f, None);
            }
            w.add_sampled_module(b"/lib/libc.so.6", 0).unwrap();
            let c = w.counters();
            c.set_sampler(Sampler::Perf, Why::Unknown, 0, 1_000_000);
            c.set_state(state::RUNNING);
            assert_eq!(c.append_stripe(9), Some(1));
            Seg { mem, w }
        }
        fn header(&self) -> Header {
            read_header(self.bytes()).unwrap()
        }
        fn bytes(&self) -> &[u8] {
            // SAFETY: `mem` is a live allocation of `len * 8` bytes.
            unsafe {
                std::slice::from_raw_parts(self.mem.as_ptr() as *const u8, self.mem.len() * 8)
            }
        }
        /// Sets `hot`'s calls (split over two stripes) and samples, and
        /// libc's.
        fn set(&self, calls: u64, samples: u64, libc: u64) {
            let c = self.w.counters();
            // SAFETY: the stripes lie within `mem`, which nothing else
            // accesses meanwhile.
            unsafe {
                *c.stripe_ptr(0) = calls / 2;
                *c.stripe_ptr(1) = calls - calls / 2;
            }
            c.function_samples(0)
                .store(samples, std::sync::atomic::Ordering::Relaxed);
            c.module_samples(1)
                .store(libc, std::sync::atomic::Ordering::Relaxed);
            // Every sample counts in the total too, as the agent counts it.
            c.samples_total()
                .store(samples + libc, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Starts following `seg` at `now` with a span of 5 s.
    fn track(seg: &Seg, now: u64, slots: &mut Slots) -> (Tracked, Seen) {
        track_with(seg, now, slots, &mut Counts::default())
    }

    /// [`track`], reading through `scratch`.
    fn track_with(seg: &Seg, now: u64, slots: &mut Slots, scratch: &mut Counts) -> (Tracked, Seen) {
        Tracked::new(
            seg.bytes(),
            &seg.header(),
            "/bin/app",
            now,
            5 * S,
            slots,
            scratch,
        )
        .unwrap()
    }

    #[test]
    fn deltas_over_the_span() {
        let seg = Seg::new();
        let mut slots = Slots::default();
        seg.set(1000, 10, 0);
        // Seen long after it started: the first span counts from then.
        let (mut t, seen) = track(&seg, 100 * S, &mut slots);
        assert_eq!((seen.pid, seen.state), (5, state::RUNNING));
        assert!(t.table().rows.is_empty());
        for k in 1..=10u64 {
            seg.set(1000 + k * 100, 10 + k, k);
            t.observe(
                seg.bytes(),
                &seg.header(),
                (100 + k) * S,
                5 * S,
                &mut slots,
                &mut Counts::default(),
            )
            .unwrap();
        }
        let tab = t.table();
        assert_eq!(tab.span_ns, 5 * S);
        assert_eq!(tab.rows.len(), 2, "{:?}", tab.rows);
        let name = |r: &IdRow| slots.name(r.id).to_string();
        let hot = &tab.rows[0];
        assert_eq!(name(hot), "hot");
        assert_eq!((hot.calls, hot.samples, hot.total_calls), (500, 5, 2000));
        assert_eq!(hot.time_ns, 5_000_000);
        assert_eq!(slots.key(hot.id), key_hash("/bin/app", "hot"));
        let libc = &tab.rows[1];
        assert_eq!(
            (
                name(libc).as_str(),
                &tab.modules[libc.module as usize][..],
                libc.samples
            ),
            ("[libc.so.6]", "libc.so.6", 5)
        );
    }

    /// A function whose changes all leave the span leaves the table; the
    /// others keep their sums (their places in it move), and it comes
    /// back with its next change.
    #[test]
    fn functions_leave_the_span_and_come_back() {
        let seg = Seg::new();
        let mut slots = Slots::default();
        let (mut t, _) = track(&seg, 100 * S, &mut slots);
        let c = *seg.w.counters();
        let tick = |t: &mut Tracked, slots: &mut Slots, k: u64, hot: u64, cold: u64| {
            // SAFETY: slots 0 and 1 of the shared stripe, inside `mem`.
            unsafe { (*c.stripe_ptr(0), *c.stripe_ptr(0).add(1)) = (hot, cold) };
            let h = seg.header();
            t.observe(
                seg.bytes(),
                &h,
                (100 + k) * S,
                5 * S,
                slots,
                &mut Counts::default(),
            )
            .unwrap();
        };
        let calls = |t: &Tracked, slots: &Slots| {
            let mut v: Vec<(String, u64)> = t
                .table()
                .rows
                .iter()
                .map(|r| (slots.name(r.id).to_string(), r.calls))
                .collect();
            v.sort();
            v
        };
        tick(&mut t, &mut slots, 1, 100, 50);
        for k in 2..=6 {
            tick(&mut t, &mut slots, k, 100, 50 + 10 * (k - 1));
        }
        assert_eq!(calls(&t, &slots), vec![("cold".to_string(), 50)]);
        tick(&mut t, &mut slots, 7, 107, 110);
        assert_eq!(
            calls(&t, &slots),
            vec![("cold".to_string(), 50), ("hot".to_string(), 7)]
        );
        for k in 8..=13 {
            tick(&mut t, &mut slots, k, 107, 110);
        }
        assert!(t.table().rows.is_empty());
        assert!(t.spans.is_empty());
    }

    #[test]
    fn young_process_counts_from_its_start() {
        let seg = Seg::new();
        let mut slots = Slots::default();
        seg.set(300, 3, 0);
        let (t, _) = track(&seg, 2 * S, &mut slots);
        let tab = t.table();
        assert_eq!(tab.rows[0].calls, 300);
        assert_eq!(tab.span_ns, 2 * S - 1_000);
    }

    /// One scratch serves every process: a process first read with its
    /// threads followed (whose rows grow the scratch's calls alone) is
    /// read again with it without indexing past its samples (rtprofd
    /// ended on that panic).
    #[test]
    fn a_shared_scratch_serves_a_process_whose_threads_are_followed() {
        let seg = Seg::new();
        seg.set(10, 3, 1);
        let mut slots = Slots::default();
        let mut scratch = Counts::default();
        // Another process, read first, had more modules and no function.
        scratch.grow(0, 8);
        let (mut t, _) = track_with(&seg, 100 * S, &mut slots, &mut scratch);
        t.follow_threads(
            4,
            (seg.bytes(), &seg.header()),
            (100 * S, 5 * S),
            &mut scratch,
        );
        seg.set(20, 6, 1);
        t.observe(
            seg.bytes(),
            &seg.header(),
            101 * S,
            5 * S,
            &mut slots,
            &mut scratch,
        )
        .unwrap();
        let tab = t.table();
        let hot = tab.rows.iter().find(|r| slots.name(r.id) == "hot").unwrap();
        // Counted from the first read (the process is older than the span).
        assert_eq!((hot.calls, hot.samples), (10, 3));
        t.release(&mut slots);
    }

    #[test]
    fn functions_added_later_are_named_and_counted() {
        let mut seg = Seg::new();
        let mut slots = Slots::default();
        let (mut t, _) = track(&seg, 100 * S, &mut slots);
        seg.w.add_module(b"/lib/late.so", 0).unwrap();
        let f = seg.w.add_function(b"late", 0, 1).unwrap();
        seg.w.set_status(f, None);
        // SAFETY: slot `f` of stripe 0 lies within the segment's memory.
        unsafe { *seg.w.counters().stripe_ptr(0).add(f as usize) = 7 };
        t.observe(
            seg.bytes(),
            &seg.header(),
            101 * S,
            5 * S,
            &mut slots,
            &mut Counts::default(),
        )
        .unwrap();
        let tab = t.table();
        let r = &tab.rows[0];
        assert_eq!(
            (
                slots.name(r.id),
                &tab.modules[r.module as usize][..],
                r.calls,
                r.flags & ROW_COUNTED != 0
            ),
            ("late", "late.so", 7, true)
        );
        t.release(&mut slots);
        assert_eq!(slots.len(), 0, "every id given back");
    }

    /// Flags are read again when the agent changes one, samples when the
    /// total moved, and not otherwise.
    #[test]
    fn flags_and_samples_follow_their_change_counts() {
        let mut seg = Seg::new();
        let mut slots = Slots::default();
        seg.set(100, 1, 0);
        let (mut t, _) = track(&seg, 2 * S, &mut slots);
        assert_eq!(t.table().rows[0].flags & ROW_ESTIMATED, 0);
        seg.w.set_estimated(0, Some(250));
        seg.set(200, 2, 0);
        t.observe(
            seg.bytes(),
            &seg.header(),
            3 * S,
            5 * S,
            &mut slots,
            &mut Counts::default(),
        )
        .unwrap();
        let hot = &t.table().rows[0];
        assert_ne!(hot.flags & ROW_ESTIMATED, 0);
        assert_eq!(hot.flags & ROW_AT_LEAST, 0);
        assert_eq!((hot.calls, hot.samples), (200, 2));
        // Too uncertain to estimate: its calls are the counted ones.
        seg.w.set_estimated(0, Some(function_flags::AT_LEAST));
        seg.set(250, 2, 0);
        t.observe(
            seg.bytes(),
            &seg.header(),
            4 * S,
            5 * S,
            &mut slots,
            &mut Counts::default(),
        )
        .unwrap();
        let hot = &t.table().rows[0];
        assert_eq!(
            hot.flags & (ROW_ESTIMATED | ROW_AT_LEAST),
            ROW_ESTIMATED | ROW_AT_LEAST
        );
        seg.w.set_estimated(0, None);
        seg.set(300, 3, 0);
        t.observe(
            seg.bytes(),
            &seg.header(),
            4 * S + 1,
            5 * S,
            &mut slots,
            &mut Counts::default(),
        )
        .unwrap();
        let hot = &t.table().rows[0];
        assert_eq!(hot.flags & ROW_ESTIMATED, 0);
        assert_eq!((hot.calls, hot.samples), (300, 3));
    }

    /// A segment that takes back what it added (fewer functions) is
    /// refused, not read with rows of slots that are gone.
    #[test]
    fn a_segment_that_takes_back_is_refused() {
        let seg = Seg::new();
        let mut slots = Slots::default();
        seg.set(100, 1, 1);
        let (mut t, _) = track(&seg, 2 * S, &mut slots);
        assert_eq!(t.table().rows.len(), 2);
        let mut mem = seg.mem.clone();
        let bytes =
            |m: &mut Vec<u64>| -> Vec<u8> { m.iter().flat_map(|w| w.to_le_bytes()).collect() };
        let at = std::mem::offset_of!(Header, func_count) / 8;
        // func_count is the low half of its word (little-endian u32 pair).
        let off = std::mem::offset_of!(Header, func_count) % 8;
        assert!(off == 0 || off == 4);
        let shift = off * 8;
        mem[at] = (mem[at] & !(0xffff_ffffu64 << shift)) | (1u64 << shift);
        let b = bytes(&mut mem);
        let h = read_header(&b).unwrap();
        assert_eq!(
            t.observe(&b, &h, 3 * S, 5 * S, &mut slots, &mut Counts::default())
                .err(),
            Some(SegmentError::Rewritten("function count"))
        );
        t.release(&mut slots);
        assert_eq!(slots.len(), 0);
    }

    /// A segment that names another executable, at first or later, is
    /// its process's claim: rows stay under the kernel's executable.
    #[test]
    fn a_claimed_executable_is_kept_apart_from_the_kernels() {
        let mut seg = Seg::new();
        let mut slots = Slots::default();
        seg.set(100, 1, 1);
        let (mut t, _) = track(&seg, 2 * S, &mut slots);
        assert_eq!((t.exe.as_str(), t.claimed.as_deref()), ("/bin/app", None));
        seg.w.set_exe(b"/usr/sbin/cron").unwrap();
        let f = seg.w.add_function(b"late", 0, 1).unwrap();
        seg.w.set_status(f, None);
        t.observe(
            seg.bytes(),
            &seg.header(),
            3 * S,
            5 * S,
            &mut slots,
            &mut Counts::default(),
        )
        .unwrap();
        assert_eq!(t.exe, "/bin/app");
        assert_eq!(t.claimed.as_deref(), Some("/usr/sbin/cron"));
        assert_eq!(t.table().exe, "/bin/app");
        // Every row's name is held under the kernel's executable.
        t.release(&mut slots);
        assert_eq!(slots.len(), 0);
    }

    #[test]
    fn counters_that_go_backwards_count_nothing() {
        let seg = Seg::new();
        let mut slots = Slots::default();
        seg.set(1000, 0, 0);
        let (mut t, _) = track(&seg, 100 * S, &mut slots);
        seg.set(10, 0, 0);
        t.observe(
            seg.bytes(),
            &seg.header(),
            101 * S,
            5 * S,
            &mut slots,
            &mut Counts::default(),
        )
        .unwrap();
        assert!(t.table().rows.is_empty());
        seg.set(20, 0, 0);
        t.observe(
            seg.bytes(),
            &seg.header(),
            102 * S,
            5 * S,
            &mut slots,
            &mut Counts::default(),
        )
        .unwrap();
        assert_eq!(t.table().rows[0].calls, 10);
    }
}
