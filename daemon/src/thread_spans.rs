//! Calls and samples per thread over the span (`rtprofd --thread-rows
//! N`): each live thread of a process counts in a stripe of its own, so
//! its calls of each function are exact; its samples are counted by
//! stripe (its CPU time) and by (stripe, function) in the segment.
//! Every tick reads them; what changed is kept as a sparse delta, as for
//! the process's own rows, and each thread's `N` hottest functions (by
//! time, then calls) become its rows. A thread that ended has left its
//! stripe (its counts fold into the process's ended threads' sum): its rows go
//! with it, and its calls and samples stay in the process's rows.
//!
//! What is kept per thread is proportional to the functions it ran, not
//! to the process's functions, and at most [`MAX_THREADS`] threads of a
//! process are followed.

use crate::spans::keep_first;
use rtprof_abi::layout::Header;
use rtprof_abi::present::{IdRow, ThreadRows, ROW_COUNTED};
use rtprof_abi::reader::{
    fold_seq, live_stripes, stripe_calls, stripe_samples, thread_function_samples,
};
use std::collections::{HashMap, VecDeque};

/// Threads of one process followed at most (those in its first stripes).
pub const MAX_THREADS: usize = 64;
/// A thread's name is read again this often, in ticks (threads name
/// themselves once started, thread pools when they take work).
const RENAME_TICKS: u32 = 16;

/// A function's (calls, samples).
type Pair = (u64, u64);

/// What one tick added to a thread: per function it ran, and its samples
/// in all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Tick {
    at_ns: u64,
    funcs: Vec<(u32, Pair)>,
    samples: u64,
}

/// A thread's counters at one read: (slot, calls, samples) of the
/// functions it ran, by slot, and its samples in all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Reading {
    funcs: Vec<(u32, Pair)>,
    samples: u64,
}

/// One thread, by the stripe it counts in.
struct Thread {
    stripe: u32,
    tid: u32,
    /// Its counters at the newest tick.
    newest: Reading,
    /// Its calls and samples over the span, per function it ran in it.
    sums: HashMap<u32, Pair>,
    /// Its samples over the span.
    samples: u64,
    ring: VecDeque<Tick>,
    /// Ticks until its name is read again.
    rename_in: u32,
    /// Its stripe was read at least once.
    read: bool,
    rows: ThreadRows,
}

/// A process's threads, followed tick by tick.
#[derive(Default)]
pub struct ThreadSpans {
    threads: Vec<Thread>,
    /// The rows of the threads with calls in the span, for the writer.
    tables: Vec<ThreadRows>,
    live: Vec<(u32, u32)>,
    /// Threads live at the last read but beyond [`MAX_THREADS`]: one that
    /// is followed later counts from then on, as a thread seen late does.
    unfollowed: Vec<(u32, u32)>,
    /// Read once at least: threads seen from now on started since.
    observed: bool,
    /// Threads followed at most (0: [`MAX_THREADS`]).
    max: usize,
    /// The fold sequence at the last read.
    last_seq: Option<u64>,
    /// (stripe, slot, samples) of the followed threads at this read.
    sampled: Vec<(u32, u32, u64)>,
    /// (stripe, samples) of the live threads at this read.
    totals: Vec<(u32, u64)>,
}

/// The name the kernel has for thread `tid` of `pid` (empty if gone).
fn thread_name(pid: u32, tid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|s| s.trim_end_matches('\n').to_string())
        .unwrap_or_default()
}

/// A reading of `calls` (every function's, by slot) and `samples` (the
/// functions sampled, by slot), and `total` samples.
fn reading(calls: &[u64], samples: &[(u32, u64)], total: u64) -> Reading {
    let mut funcs = Vec::new();
    let mut s = samples.iter().peekable();
    for (slot, &c) in calls.iter().enumerate() {
        let slot = slot as u32;
        // Slots past the calls read (a hostile table): not the process's.
        let mut n = 0;
        while let Some(&&(k, v)) = s.peek() {
            if k > slot {
                break;
            }
            if k == slot {
                n = v;
            }
            s.next();
        }
        if c != 0 || n != 0 {
            funcs.push((slot, (c, n)));
        }
    }
    Reading {
        funcs,
        samples: total,
    }
}

impl Thread {
    fn new(stripe: u32, tid: u32, name: String) -> Thread {
        Thread {
            stripe,
            tid,
            newest: Reading::default(),
            sums: HashMap::new(),
            samples: 0,
            ring: VecDeque::new(),
            rename_in: RENAME_TICKS,
            read: false,
            rows: ThreadRows {
                tid,
                name,
                ..ThreadRows::default()
            },
        }
    }

    /// Takes the thread's counters now: what rose since the last read is
    /// this tick's delta. A count that went down means another thread has
    /// the stripe (the kernel gave the ended one's id again) or the
    /// stripe is being folded: it starts over, from zero.
    fn take(&mut self, now: Reading, at_ns: u64) {
        let mut delta = Vec::new();
        let mut old = self.newest.funcs.iter().peekable();
        let mut went_back = now.samples < self.newest.samples;
        for &(slot, (c, n)) in &now.funcs {
            let mut was = (0, 0);
            while let Some(&&(k, v)) = old.peek() {
                if k > slot {
                    break;
                }
                if k == slot {
                    was = v;
                } else {
                    // Counted before, not now.
                    went_back = true;
                }
                old.next();
            }
            went_back |= c < was.0 || n < was.1;
            let d = (c.saturating_sub(was.0), n.saturating_sub(was.1));
            if d != (0, 0) {
                delta.push((slot, d));
            }
        }
        went_back |= old.next().is_some();
        let mut samples = now.samples.saturating_sub(self.newest.samples);
        if went_back {
            self.sums.clear();
            self.ring.clear();
            self.samples = 0;
            self.rename_in = 0;
            delta = now.funcs.clone();
            samples = now.samples;
        }
        self.newest = now;
        for &(slot, (c, n)) in &delta {
            let s = self.sums.entry(slot).or_insert((0, 0));
            *s = (s.0.saturating_add(c), s.1.saturating_add(n));
        }
        self.samples = self.samples.saturating_add(samples);
        self.ring.push_back(Tick {
            at_ns,
            funcs: delta,
            samples,
        });
    }

    /// Lets go of what fell out of the span (ticks at or before `start`);
    /// whether anything did.
    fn expire(&mut self, start: u64) -> bool {
        let before = self.ring.len();
        while self.ring.len() > 1 && self.ring[0].at_ns <= start {
            let gone = self.ring.pop_front().unwrap_or_default();
            self.samples = self.samples.saturating_sub(gone.samples);
            for (slot, (c, n)) in gone.funcs {
                if let Some(s) = self.sums.get_mut(&slot) {
                    *s = (s.0.saturating_sub(c), s.1.saturating_sub(n));
                    if *s == (0, 0) {
                        self.sums.remove(&slot);
                    }
                }
            }
        }
        self.ring.len() != before
    }
}

/// What one read of the segment found, for reading each thread's stripe:
/// the fold sequence it was read under, each live thread's samples and
/// the samples by (stripe, function) of those followed.
struct Scan<'a> {
    bytes: &'a [u8],
    h: &'a Header,
    seq: u64,
    /// (stripe, samples), as [`ThreadSpans::totals`].
    totals: &'a [(u32, u64)],
    /// (stripe, slot, samples), sorted, as [`ThreadSpans::sampled`].
    sampled: &'a [(u32, u32, u64)],
}

impl Scan<'_> {
    /// A reading of the thread in `stripe` from its calls in `calls`
    /// (read from its stripe just before) and its samples.
    fn reading(&self, stripe: u32, calls: &[u64]) -> Reading {
        reading(
            calls,
            &samples_of(self.sampled, stripe),
            total_of(self.totals, stripe),
        )
    }
}

/// The samples of the thread in `stripe` in all, in `totals` (stripe,
/// samples); 0 if it has none there.
fn total_of(totals: &[(u32, u64)], stripe: u32) -> u64 {
    totals.iter().find(|t| t.0 == stripe).map_or(0, |t| t.1)
}

/// The (slot, samples) of the thread in `stripe`, out of `sampled`
/// (stripe, slot, samples), sorted.
fn samples_of(sampled: &[(u32, u32, u64)], stripe: u32) -> Vec<(u32, u64)> {
    let first = sampled.partition_point(|e| e.0 < stripe);
    let n = sampled[first..].partition_point(|e| e.0 == stripe);
    sampled[first..first + n]
        .iter()
        .map(|&(_, slot, n)| (slot, n))
        .collect()
}

impl Thread {
    /// Moves the thread on to `now_ns` (read from `scan`, through
    /// `calls`, unless `quiet`); ticks at or before `start` leave its
    /// span. Whether its rows are to be made again: not when nothing left
    /// the span on a quiet tick, nor when its stripe could not be read.
    fn advance(
        &mut self,
        scan: &Scan,
        calls: &mut [u64],
        quiet: bool,
        (now_ns, start): (u64, u64),
    ) -> bool {
        if quiet && self.read {
            // Nothing new (this tick added nothing); the rows change only
            // if counts left the span.
            self.ring.push_back(Tick {
                at_ns: now_ns,
                ..Tick::default()
            });
            return self.expire(start);
        }
        if !stripe_calls(scan.bytes, scan.h, self.stripe, calls) || {
            // The stripe read before the sequence is read again.
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            fold_seq(scan.bytes) != scan.seq
        } {
            // Not read while a fold began: this thread and the rest wait
            // for the next tick (their last rows stay).
            return false;
        }
        self.take(scan.reading(self.stripe, calls), now_ns);
        self.read = true;
        self.expire(start);
        true
    }

    /// Reads the thread's name again every [`RENAME_TICKS`] ticks it
    /// moves on, keeping the one it had if it is gone.
    fn rename_if_due(&mut self, pid: u32) {
        self.rename_in = self.rename_in.saturating_sub(1);
        if self.rename_in == 0 {
            self.rename_in = RENAME_TICKS;
            let name = thread_name(pid, self.tid);
            if !name.is_empty() {
                self.rows.name = name;
            }
        }
    }

    /// Makes the thread's rows: its `top` hottest functions over the span
    /// (by time, then calls, as the process's rows), named through `id_of`
    /// (slot -> row id, module, counted), their time at `period` ns a
    /// sample.
    fn rank(&mut self, top: usize, period: u64, id_of: impl Fn(usize) -> (u32, u32, bool)) {
        let mut hot: Vec<(Pair, u32)> = self.sums.iter().map(|(&slot, &c)| (c, slot)).collect();
        keep_first(&mut hot, top, |&((c, n), slot)| {
            (std::cmp::Reverse((n, c)), slot)
        });
        let f = &self.newest.funcs;
        let total = |slot: u32| {
            f.binary_search_by_key(&slot, |e| e.0)
                .map_or(0, |i| f[i].1 .0)
        };
        self.rows.samples = self.samples;
        self.rows.rows.clear();
        self.rows
            .rows
            .extend(hot.iter().map(|&((calls, samples), slot)| {
                let (id, module, counted) = id_of(slot as usize);
                IdRow {
                    id,
                    module,
                    flags: if counted { ROW_COUNTED } else { 0 },
                    calls,
                    samples,
                    time_ns: samples.saturating_mul(period),
                    total_calls: total(slot),
                }
            }));
    }
}

impl ThreadSpans {
    /// Reads the live threads' counters of the process `pid` (segment
    /// `bytes`, header `h`, its first `funcs` functions, read through
    /// `scratch`) at `now_ns`; each thread's rows are its `top` hottest
    /// functions over the span, named through `id_of` (slot -> row id,
    /// module, counted). The threads a first read finds count from then
    /// on, unless the process is `young` (it started within the span), as
    /// the process's own rows do. Unless the process's counts `moved`
    /// since the last read (or a thread ended), no thread's did: their
    /// counters are not read again, only their spans move on.
    #[allow(clippy::too_many_arguments)]
    pub fn observe(
        &mut self,
        bytes: &[u8],
        h: &Header,
        (funcs, scratch): (usize, &mut Vec<u64>),
        (pid, young, moved): (u32, bool, bool),
        (now_ns, span_ns): (u64, u64),
        top: usize,
        id_of: impl Fn(usize) -> (u32, u32, bool),
    ) {
        let funcs = funcs.min(h.func_count as usize);
        // A stripe being folded (its thread ended; in a version 4
        // segment, while the sequence is odd) is read another tick:
        // half-zeroed, it would look like a new thread's. In version 5 it
        // is not LIVE, and is zeroed only after the sequence moves.
        let seq = fold_seq(bytes);
        if seq % 2 == 1 {
            return;
        }
        let from_now = !self.observed && !young;
        self.observed = true;
        let beyond = self.read_live(bytes, h);
        let quiet = self.read_samples(bytes, h, funcs, seq, moved);
        scratch.resize(scratch.len().max(funcs), 0);
        let calls = &mut scratch[..funcs];
        let scan = Scan {
            bytes,
            h,
            seq,
            totals: &self.totals,
            sampled: &self.sampled,
        };
        for &(stripe, tid) in &self.live {
            if !self.threads.iter().any(|t| t.stripe == stripe) {
                let seen_before = self.unfollowed.contains(&(stripe, tid));
                let t = Self::follow(
                    &scan,
                    calls,
                    (stripe, tid, pid),
                    from_now || seen_before,
                    now_ns,
                );
                self.threads.push(t);
            }
        }
        self.unfollowed = beyond;
        self.threads.sort_by_key(|t| t.tid);
        let start = now_ns.saturating_sub(span_ns);
        self.tables.clear();
        for t in &mut self.threads {
            if t.advance(&scan, calls, quiet, (now_ns, start)) {
                t.rename_if_due(pid);
                t.rank(top, h.sample_period_ns, &id_of);
            }
            // A thread that neither called nor ran a function in the
            // span has no rows.
            if !t.rows.rows.is_empty() {
                self.tables.push(t.rows.clone());
            }
        }
    }

    /// Reads which threads are live (their stripes and ids) into
    /// [`Self::live`], the first [`MAX_THREADS`] (or `max`) of them, and
    /// lets go of the followed threads no longer there; returns those
    /// beyond the cap.
    fn read_live(&mut self, bytes: &[u8], h: &Header) -> Vec<(u32, u32)> {
        live_stripes(bytes, h, &mut self.live);
        let max = if self.max == 0 { MAX_THREADS } else { self.max };
        let beyond = self.live.split_off(self.live.len().min(max));
        let live = &self.live;
        // A stripe handed to another thread is a new thread.
        self.threads
            .retain(|t| live.iter().any(|&(s, tid)| s == t.stripe && tid == t.tid));
        beyond
    }

    /// Reads the live threads' samples, in all and, unless nothing moved,
    /// by function (of the first `funcs`), at fold sequence `seq`;
    /// whether nothing moved (the tick is quiet): not the process's
    /// counts (`moved`), the sequence, nor any followed thread's samples.
    fn read_samples(
        &mut self,
        bytes: &[u8],
        h: &Header,
        funcs: usize,
        seq: u64,
        moved: bool,
    ) -> bool {
        // Each thread's samples before the table: a sample is counted in
        // the table before its stripe's total, so every sample a total
        // read here has is in the table read after it.
        self.totals.clear();
        self.totals.extend(
            self.live
                .iter()
                .map(|&(s, _)| (s, stripe_samples(bytes, h, s))),
        );
        let totals = &self.totals;
        // Quiet: nothing moved since the last read, not even a thread's
        // samples (the process's total moves before them).
        let quiet = !moved
            && self.last_seq == Some(seq)
            && self
                .threads
                .iter()
                .all(|t| !t.read || total_of(totals, t.stripe) == t.newest.samples);
        self.last_seq = Some(seq);
        // Samples by (stripe, function) of the threads followed: one scan
        // of the segment's table, unless nothing moved.
        let mut stripes: Vec<u32> = self.live.iter().map(|&(s, _)| s).collect();
        stripes.sort_unstable();
        self.sampled.clear();
        if !quiet {
            let sampled = &mut self.sampled;
            thread_function_samples(bytes, h, |stripe, slot, n| {
                if (slot as usize) < funcs && stripes.binary_search(&stripe).is_ok() {
                    sampled.push((stripe, slot, n));
                }
            });
            sampled.sort_unstable();
        }
        quiet
    }

    /// Starts following thread `tid` of `pid`, new in `stripe`. If it
    /// counted before it was followed (`counted_before`: seen by a first
    /// read of an older process, or by an earlier read that did not follow
    /// it), its counts so far are taken as its start, not as this tick's.
    fn follow(
        scan: &Scan,
        calls: &mut [u64],
        (stripe, tid, pid): (u32, u32, u32),
        counted_before: bool,
        now_ns: u64,
    ) -> Thread {
        let mut t = Thread::new(stripe, tid, thread_name(pid, tid));
        if counted_before && stripe_calls(scan.bytes, scan.h, stripe, calls) {
            t.take(scan.reading(stripe, calls), now_ns);
            t.sums.clear();
            t.ring.clear();
            t.samples = 0;
            t.read = true;
        }
        t
    }

    /// The rows of each live thread with calls in the span, by thread id.
    pub fn tables(&self) -> &[ThreadRows] {
        &self.tables
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtprof_abi::layout::{stripe_state, Capacities, Layout};
    use rtprof_abi::{read_header, SegmentWriter};

    /// A segment of 4 functions and room for 4 threads' stripes (after
    /// the shared one and the two sums of ended threads).
    fn segment() -> (Vec<u64>, SegmentWriter) {
        let layout = Layout::new(Capacities {
            modules: 1,
            functions: 4,
            strings: 64,
            stripes: 7,
        });
        let mut mem = vec![0u64; (layout.total_size / 8) as usize];
        // SAFETY: `mem` is zeroed, 8-aligned, the layout's size, and kept
        // by the caller as long as the writer.
        let mut w = unsafe { SegmentWriter::init(mem.as_mut_ptr() as *mut u8, layout, 5, 1, 0) };
        w.add_module(b"/bin/app", 0).unwrap();
        for n in ["a", "b", "c", "d"] {
            w.add_function(n.as_bytes(), 0, 1).unwrap();
        }
        (mem, w)
    }

    fn bytes(mem: &[u64]) -> &[u8] {
        // SAFETY: the bytes of `mem`, borrowed as long as it is.
        unsafe { std::slice::from_raw_parts(mem.as_ptr() as *const u8, mem.len() * 8) }
    }

    /// One tick of a young process (pid 5, 4 functions, a span of 1,000
    /// ns, 4 rows per thread) at `at`; rows of slot `s` have id `s`, and
    /// are counted unless `s` is 3.
    fn observe(t: &mut ThreadSpans, mem: &[u64], at: u64, moved: bool) {
        let h = read_header(bytes(mem)).unwrap();
        t.observe(
            bytes(mem),
            &h,
            (4, &mut Vec::new()),
            (5, true, moved),
            (at, 1_000),
            4,
            |s| (s as u32, 0, s != 3),
        );
    }

    /// Ticks where the process's counts did not move read no stripe, and
    /// still let calls leave the span.
    #[test]
    fn quiet_ticks_read_nothing_and_calls_still_leave_the_span() {
        let (mem, w) = segment();
        let c = *w.counters();
        let s = c.append_stripe(100).unwrap();
        // SAFETY: slot 1 of a stripe inside `mem`.
        unsafe { *c.stripe_ptr(s).add(1) = 7 };
        let mut t = ThreadSpans::default();
        let read = |t: &mut ThreadSpans, at: u64, moved: bool| {
            observe(t, &mem, at, moved);
            t.tables()
                .iter()
                .map(|r| (r.tid, r.rows[0].calls))
                .collect::<Vec<_>>()
        };
        assert_eq!(read(&mut t, 2_000, true), vec![(100, 7)]);
        // A call the process's counts would have shown: not read when
        // they say nothing moved.
        // SAFETY: as above.
        unsafe { *c.stripe_ptr(s).add(1) = 8 };
        assert_eq!(read(&mut t, 2_500, false), vec![(100, 7)]);
        assert_eq!(read(&mut t, 3_500, false), vec![], "out of the span");
        assert_eq!(read(&mut t, 3_600, true), vec![(100, 1)]);
    }

    /// A thread first followed after others ended (the cap let it in)
    /// counts from then on; its calls before are not the span's.
    #[test]
    fn a_thread_followed_late_counts_from_then_on() {
        let (mem, w) = segment();
        let c = *w.counters();
        let stripes: Vec<u32> = (0..3).map(|t| c.append_stripe(100 + t).unwrap()).collect();
        for &s in &stripes {
            // SAFETY: slot 2 of a stripe inside `mem`.
            unsafe { *c.stripe_ptr(s).add(2) = 1000 };
        }
        let mut t = ThreadSpans {
            max: 1,
            ..ThreadSpans::default()
        };
        let read = |t: &mut ThreadSpans, at: u64| observe(t, &mem, at, true);
        // A young process: its one followed thread from its start.
        read(&mut t, 10);
        let calls = |t: &ThreadSpans| -> Vec<(u32, u64)> {
            t.tables()
                .iter()
                .map(|r| (r.tid, r.rows[0].calls))
                .collect()
        };
        assert_eq!(calls(&t), vec![(100, 1000)]);
        // Thread 100 ends (the agent's end of a thread: its stripe ENDED,
        // counted but no one's, until a fold).
        c.stripe_slot(stripes[0])
            .0
            .store(stripe_state::ENDED, std::sync::atomic::Ordering::Release);
        read(&mut t, 20);
        assert_eq!(
            calls(&t),
            vec![],
            "its 1000 calls came before it was followed"
        );
        // SAFETY: as above.
        unsafe { *c.stripe_ptr(stripes[1]).add(2) = 1010 };
        read(&mut t, 30);
        assert_eq!(calls(&t), vec![(101, 10)]);
    }

    /// Deltas over the span, kept for the functions that ran only; a
    /// stripe whose counts go down starts over from zero.
    #[test]
    fn deltas_leave_the_span_and_a_new_occupant_starts_over() {
        let mut t = Thread::new(1, 7, String::new());
        let last = |t: &Thread| t.ring.back().unwrap().funcs.clone();
        t.take(reading(&[0, 5, 0, 2], &[(2, 3)], 4), 1);
        assert_eq!(last(&t), vec![(1, (5, 0)), (2, (0, 3)), (3, (2, 0))]);
        t.take(reading(&[0, 8, 0, 2], &[(2, 3), (3, 1)], 6), 2);
        assert_eq!(last(&t), vec![(1, (3, 0)), (3, (0, 1))]);
        assert_eq!(t.newest.funcs, vec![(1, (8, 0)), (2, (0, 3)), (3, (2, 1))]);
        assert_eq!(
            t.sums,
            HashMap::from([(1, (8, 0)), (2, (0, 3)), (3, (2, 1))])
        );
        assert_eq!(t.samples, 6);
        t.expire(1);
        assert_eq!(t.sums, HashMap::from([(1, (3, 0)), (3, (0, 1))]));
        assert_eq!(t.samples, 2);
        // The kernel gave the ended thread's id again, and its stripe.
        t.take(reading(&[4, 9, 0, 2], &[], 1), 3);
        assert_eq!(last(&t), vec![(0, (4, 0)), (1, (9, 0)), (3, (2, 0))]);
        assert_eq!(t.sums.len(), 3);
        assert_eq!((t.ring.len(), t.samples), (1, 1));
    }

    /// One stripe's samples by function, out of those of all; a stripe
    /// not there has none.
    #[test]
    fn a_stripes_samples_are_its_run_of_the_sorted_table() {
        let sampled = [(1, 0, 5), (2, 1, 7), (2, 3, 1), (4, 0, 2)];
        assert_eq!(samples_of(&sampled, 2), [(1, 7), (3, 1)]);
        assert_eq!(samples_of(&sampled, 3), []);
        assert_eq!(samples_of(&sampled, 4), [(0, 2)]);
        assert_eq!(total_of(&[(3, 9), (5, 2)], 5), 2);
        assert_eq!(total_of(&[(3, 9), (5, 2)], 4), 0);
    }

    /// A thread's rows are its hottest functions over the span, by time
    /// then calls, the first `top`; each with its calls in the span and
    /// since the thread began.
    #[test]
    fn rows_rank_the_span_by_time_then_calls() {
        let mut t = Thread::new(1, 7, String::new());
        t.take(reading(&[4, 9, 1, 0], &[(2, 3)], 3), 1);
        t.take(reading(&[6, 9, 1, 2], &[(2, 3), (3, 1)], 4), 2);
        t.expire(1);
        t.rank(2, 10, |s| (100 + s as u32, 0, s != 3));
        let rows: Vec<_> = t
            .rows
            .rows
            .iter()
            .map(|r| (r.id, r.flags, r.calls, r.samples, r.time_ns, r.total_calls))
            .collect();
        assert_eq!(
            rows,
            [(103, 0, 2, 1, 10, 2), (100, ROW_COUNTED, 2, 0, 0, 6)]
        );
        assert_eq!(t.rows.samples, 1);
    }

    /// Samples by (thread, function) in the segment reach each thread's
    /// rows, ranked by time before calls; a thread that only ran (no call
    /// counted) has rows too, and its head carries all its samples.
    #[test]
    fn samples_per_thread_rank_the_rows() {
        let (mem, w) = segment();
        let c = *w.counters();
        let (a, b) = (c.append_stripe(100).unwrap(), c.append_stripe(101).unwrap());
        // SAFETY: slots 0 and 1 of a stripe inside `mem`.
        unsafe {
            *c.stripe_ptr(a) = 50;
            *c.stripe_ptr(a).add(1) = 2;
        }
        let table = c.thread_samples(None);
        let key = |stripe: u32, slot: u64| (stripe as u64) << 32 | slot;
        table.add(key(a, 1), 7);
        table.add(key(b, 3), 4);
        // A stripe no thread holds, and a slot past the functions.
        table.add(key(6, 1), 5);
        table.add(key(b, 9), 5);
        c.stripe_samples(a)
            .store(9, std::sync::atomic::Ordering::Relaxed);
        c.stripe_samples(b)
            .store(4, std::sync::atomic::Ordering::Relaxed);
        let mut t = ThreadSpans::default();
        observe(&mut t, &mem, 10, true);
        // (tid, samples, [(row id, calls, samples)]) per thread.
        type Seen = (u32, u64, Vec<(u32, u64, u64)>);
        let rows: Vec<Seen> = t
            .tables()
            .iter()
            .map(|r| {
                let f = r.rows.iter().map(|r| (r.id, r.calls, r.samples));
                (r.tid, r.samples, f.collect())
            })
            .collect();
        assert_eq!(
            rows,
            vec![
                (100, 9, vec![(1, 2, 7), (0, 50, 0)]),
                (101, 4, vec![(3, 0, 4)])
            ]
        );
    }
}
