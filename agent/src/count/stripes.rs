//! Which thread counts in which stripe of the counter segment, and how the
//! stripes of ended threads are folded into sums: the agent's
//! thread-lifecycle policy over the segment's stripes. The segment's ABI
//! (`rtprof_abi::layout::stripe_state`) says what a reader counts; this is
//! how the agent hands stripes out, ends them, folds them (so memory stays
//! bounded by the threads alive at once, and a kill at any point leaves a
//! segment that sums exactly) and starts a forked child's.

use rtprof_abi::layout::{keeps_sum_stripes, stripe_state, SUM_STRIPES};
use rtprof_abi::writer::Counters;
use std::sync::atomic::{AtomicU64, Ordering};

/// The stripe policy, on the segment's lock-free handle.
pub(crate) trait Stripes {
    /// Hands out a stripe for thread `tid`: a folded one if any, else a
    /// never-used one; `None` when all are taken. Lock-free.
    fn alloc_stripe(&self, tid: u32) -> Option<u32>;

    /// Marks stripe `i` as its thread's no more: still counted, by one
    /// store (a kill just after leaves every count in place), until
    /// [`Stripes::fold_ended`] moves it into a sum. The owner must no
    /// longer count into it.
    fn end_stripe(&self, i: u32);

    /// Stripes whose thread ended and that no fold has moved yet.
    fn ended_stripes(&self) -> u32;

    /// As [`Counters::stripe_counts`], for a stripe no thread counts in
    /// any more (its thread is ending): scanned 8 counters at a time.
    fn ended_stripe_counts(&self, i: u32) -> Vec<(u32, u64)>;

    /// Moves every ended thread's stripe into a new sum and frees them for
    /// reuse, so memory stays bounded by the threads alive at once. The
    /// fold writes the spare one of [`SUM_STRIPES`] as the current sum plus
    /// the ended stripes, then takes effect in one store to `fold_seq`;
    /// the old sum and the ended stripes are zeroed after. Killed at any
    /// point, the segment still sums exactly. `back(p, bytes)` gives memory
    /// to the first `bytes` of the new sum before it is written (false:
    /// nothing is folded; the ended stripes stay counted); the stripes it
    /// reads have memory for every function already. If another thread is
    /// folding, it is asked to fold again and this returns at once (ending
    /// threads never wait for each other) unless `wait` (a new thread that
    /// needs a stripe the fold frees). Returns the stripes freed here.
    fn fold_ended(&self, wait: bool, back: impl FnMut(*mut u64, u64) -> bool) -> u32;

    /// Ends stripe `i` and folds it at once (memory for the sum taken as
    /// given: for segments in ordinary memory).
    #[cfg(test)]
    fn fold_stripe(&self, i: u32);

    /// Hands back a stripe nothing was counted in (its memory could not be
    /// reserved): freed without reading it, since its pages may have no
    /// memory behind them.
    fn release_unused_stripe(&self, i: u32);

    /// Stripes other than the shared one that are not FREE: held by a
    /// thread, ended, the sums and their spares (all that may be read or
    /// written before they are FREE again).
    fn stripes_not_free(&self) -> Vec<u32>;

    /// Turns a copy of a parent's metadata into a forked child's: new
    /// identity, running, no samples, and no stripes but the shared one and
    /// `keep` (the forking thread's; the others do not exist in the child).
    /// The caller provides zeroed counters. Only call while the process has
    /// a single thread.
    fn reset_for_child(&self, keep: Option<u32>, pid: u32, ppid: u32, start_ns: u64);
}

impl Stripes for Counters {
    fn alloc_stripe(&self, tid: u32) -> Option<u32> {
        for i in 1..self.stripe_count() {
            let (st, t) = self.stripe_slot(i);
            // Claimed first, its thread set, then LIVE: whoever finds it
            // LIVE finds its new thread's id.
            if st
                .compare_exchange(
                    stripe_state::FREE,
                    stripe_state::CLAIMED,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                t.store(tid, Ordering::Relaxed);
                // The samples of the thread before are not the new one's
                // (its by function only if it had any).
                if self.stripe_samples(i).swap(0, Ordering::Relaxed) != 0 {
                    self.thread_samples(None)
                        .zero_where(|k| k >> 32 == i as u64);
                }
                st.store(stripe_state::LIVE, Ordering::Release);
                return Some(i);
            }
        }
        self.append_stripe(tid)
    }

    fn end_stripe(&self, i: u32) {
        if i != 0 && i < self.layout().caps.stripes {
            // SeqCst, as the count in `ended_stripes`: of threads ending at
            // once, the last to count sees every other's end.
            self.stripe_slot(i)
                .0
                .store(stripe_state::ENDED, Ordering::SeqCst);
        }
    }

    fn ended_stripes(&self) -> u32 {
        (1..self.stripe_count())
            .filter(|&i| self.stripe_slot(i).0.load(Ordering::SeqCst) == stripe_state::ENDED)
            .count() as u32
    }

    fn ended_stripe_counts(&self, i: u32) -> Vec<(u32, u64)> {
        let counters = self.stripe_counters(i, self.func_count());
        nonzero(counters)
            .filter_map(|k| {
                let v = counters[k].load(Ordering::Relaxed);
                (v != 0).then_some((k as u32, v))
            })
            .collect()
    }

    fn fold_ended(&self, wait: bool, mut back: impl FnMut(*mut u64, u64) -> bool) -> u32 {
        if !keeps_sum_stripes(self.layout().caps.stripes) {
            return 0;
        }
        let lock = self.fold_lock();
        let again = self.fold_again();
        // A read-modify-write: whichever request the holder takes, it sees
        // every ENDED store made before any of them.
        again.swap(1, Ordering::SeqCst);
        let mut freed = 0;
        loop {
            if lock
                .compare_exchange(0, 1, Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
            {
                if wait {
                    std::thread::yield_now();
                    continue;
                }
                // The holder sees the request: before it lets go, or just
                // after (below).
                return freed;
            }
            while again.swap(0, Ordering::SeqCst) == 1 {
                freed += fold_locked(self, &mut back, || {});
            }
            lock.store(0, Ordering::SeqCst);
            if again.load(Ordering::SeqCst) == 0 {
                return freed;
            }
        }
    }

    #[cfg(test)]
    fn fold_stripe(&self, i: u32) {
        self.end_stripe(i);
        self.fold_ended(true, |_, _| true);
    }

    fn release_unused_stripe(&self, i: u32) {
        if i != 0 && i < self.layout().caps.stripes {
            self.stripe_slot(i)
                .0
                .store(stripe_state::FREE, Ordering::Release);
        }
    }

    fn stripes_not_free(&self) -> Vec<u32> {
        (1..self.stripe_count())
            .filter(|&i| self.stripe_slot(i).0.load(Ordering::Acquire) != stripe_state::FREE)
            .collect()
    }

    fn reset_for_child(&self, keep: Option<u32>, pid: u32, ppid: u32, start_ns: u64) {
        for i in 1..self.stripe_count() {
            if keeps_sum_stripes(self.layout().caps.stripes) && SUM_STRIPES.contains(&i) {
                // The caller's counters are zero: no sum yet.
                self.stripe_slot(i)
                    .0
                    .store(stripe_state::SPARE, Ordering::Release);
            } else if Some(i) != keep {
                self.stripe_slot(i)
                    .0
                    .store(stripe_state::FREE, Ordering::Release);
            } else {
                // The forking thread is the child's only one: its id is
                // the child's pid (its end folds the stripe by that id).
                self.stripe_slot(i).1.store(pid, Ordering::Relaxed);
            }
        }
        // No thread was sampled yet; the table's entries are new zero
        // memory (not copied), only its head is the parent's.
        for i in 0..self.layout().caps.stripes {
            self.stripe_samples(i).store(0, Ordering::Relaxed);
        }
        self.thread_samples(None).forget_in_child();
        // A fold another thread had begun at fork time never ends here.
        self.fold_lock().store(0, Ordering::Relaxed);
        self.fold_again().store(0, Ordering::Relaxed);
        // An ended stripe of the parent is zero here (FREE above); an odd
        // sequence could only come from a version 4 parent.
        let seq = self.fold_seq();
        seq.store(seq.load(Ordering::Relaxed) & !1, Ordering::Release);
        self.restart(pid, ppid, start_ns);
    }
}

/// The fold, with the fold lock held. `step` is called after every
/// store a reader could see: where a kill could leave the segment.
fn fold_locked(
    c: &Counters,
    mut back: impl FnMut(*mut u64, u64) -> bool,
    mut step: impl FnMut(),
) -> u32 {
    let seq = c.fold_seq();
    let g = seq.load(Ordering::Acquire) / 2;
    let next = (g as u32).wrapping_add(1);
    // The ended stripes, marked: counted before (ENDED) and after
    // (FOLDING into `next`) alike.
    let mut sources = Vec::new();
    for i in SUM_STRIPES[1] + 1..c.stripe_count() {
        let (st, t) = c.stripe_slot(i);
        if st.load(Ordering::Acquire) != stripe_state::ENDED {
            continue;
        }
        t.store(next, Ordering::Relaxed);
        step();
        st.store(stripe_state::FOLDING, Ordering::Release);
        step();
        sources.push(i);
    }
    let folding = sources.len() as u32;
    if folding == 0 {
        return 0;
    }
    let is = |i: u32, state: u32| c.stripe_slot(i).0.load(Ordering::Acquire) == state;
    let old = SUM_STRIPES.into_iter().find(|&i| {
        is(i, stripe_state::SUM) && c.stripe_slot(i).1.load(Ordering::Relaxed) == g as u32
    });
    let new = SUM_STRIPES
        .into_iter()
        .find(|&i| Some(i) != old)
        .unwrap_or(SUM_STRIPES[0]);
    let n = c.func_count();
    // The new sum's pages get memory (on a full tmpfs a page without
    // would fault); the sources were given theirs as functions were
    // added (the agent's `reserve_records`).
    if !is(new, stripe_state::SPARE) || !back(c.stripe_ptr(new), n as u64 * 8) {
        // Left as they were: counted, folded by a later fold.
        for &i in &sources {
            c.stripe_slot(i)
                .0
                .store(stripe_state::ENDED, Ordering::Release);
        }
        return 0;
    }
    sources.extend(old);
    // The new sum is zero (SPARE), and only this fold writes it: each
    // source is added in one pass over its counters, most of them zero.
    // The counters found non-zero, by source: zeroed below without a
    // second scan.
    let mut found: Vec<Vec<u32>> = Vec::with_capacity(sources.len());
    let sum = c.stripe_counters(new, n);
    for &i in &sources {
        let from = c.stripe_counters(i, n);
        let mut nz = Vec::new();
        for k in nonzero(from) {
            let v = from[k].load(Ordering::Relaxed);
            if v != 0 {
                let d = &sum[k];
                d.store(d.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
                nz.push(k as u32);
                step();
            }
        }
        found.push(nz);
    }
    let (st, t) = c.stripe_slot(new);
    t.store(next, Ordering::Relaxed);
    step();
    st.store(stripe_state::SUM, Ordering::Release);
    step();
    // Takes effect: from here the new sum counts, the old one and the
    // folded stripes do not.
    seq.fetch_add(2, Ordering::AcqRel);
    step();
    // A reader that sees a zero written below sees the store above.
    std::sync::atomic::fence(Ordering::Release);
    for (&i, nz) in sources.iter().zip(&found) {
        let from = c.stripe_counters(i, n);
        for &k in nz {
            from[k as usize].store(0, Ordering::Relaxed);
            step();
        }
        let free = if Some(i) == old {
            stripe_state::SPARE
        } else {
            stripe_state::FREE
        };
        c.stripe_slot(i).0.store(free, Ordering::Release);
        step();
    }
    folding
}

/// Indices of `counters` that may be non-zero: those of each run of 8
/// with a non-zero one. Only for counters no thread writes meanwhile
/// (an ending or ended thread's, a sum under the fold lock): they are scanned
/// with plain loads, 8 at a time, as most of them are zero.
fn nonzero(counters: &[AtomicU64]) -> impl Iterator<Item = usize> + '_ {
    // SAFETY: AtomicU64 and u64 have the same size and alignment; no
    // thread writes these counters while the fold runs (the caller's
    // contract), so plain loads race with no store.
    let plain: &[u64] =
        unsafe { std::slice::from_raw_parts(counters.as_ptr() as *const u64, counters.len()) };
    plain
        .chunks(8)
        .enumerate()
        .filter(|(_, c)| c.iter().fold(0, |a, &v| a | v) != 0)
        .flat_map(|(i, c)| i * 8..i * 8 + c.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtprof_abi::layout::{cost, Capacities, Layout};
    use rtprof_abi::{read_snapshot, SegmentWriter};

    fn buffer(layout: &Layout) -> Vec<u64> {
        vec![0u64; (layout.total_size / 8) as usize]
    }

    #[test]
    fn a_forked_child_owns_the_forking_threads_stripe_by_its_own_id() {
        let layout = Layout::new(Capacities {
            modules: 1,
            functions: 1,
            strings: 16,
            stripes: 6,
        });
        let mut buf = buffer(&layout);
        // SAFETY: the test's buffer: zeroed, 8-aligned, the layout's size, and alive as long as
        // `w`.
        let w = unsafe { SegmentWriter::init(buf.as_mut_ptr() as *mut u8, layout, 1, 0, 0) };
        let c = w.counters();
        let (a, b) = (c.alloc_stripe(11).unwrap(), c.alloc_stripe(12).unwrap());
        assert_eq!(c.stripe_held_at(c.stripe_ptr(b), 12), Some(b));
        assert_eq!(c.stripe_held_at(c.stripe_ptr(b), 11), None, "another's");
        assert_eq!(
            c.stripe_held_at(c.stripe_ptr(0), 12),
            None,
            "the shared one"
        );
        // Thread 12 forks: in child 40 it is thread 40, and the only one.
        c.reset_for_child(Some(b), 40, 1, 0);
        assert_eq!(c.stripe_held_at(c.stripe_ptr(b), 40), Some(b));
        assert_eq!(c.stripe_held_at(c.stripe_ptr(a), 11), None, "freed");
    }

    #[test]
    fn a_child_never_inherits_a_fold_in_progress() {
        let layout = Layout::new(Capacities {
            modules: 1,
            functions: 1,
            strings: 16,
            stripes: 4,
        });
        let mut buf = buffer(&layout);
        // SAFETY: the test's buffer: zeroed, 8-aligned, the layout's size, and alive as long as
        // `w`.
        let w = unsafe { SegmentWriter::init(buf.as_mut_ptr() as *mut u8, layout, 1, 0, 0) };
        // As a fork would copy it mid-fold: lock held, sequence odd.
        w.counters().fold_lock().store(1, Ordering::Relaxed);
        w.counters().fold_seq().store(7, Ordering::Relaxed);
        // What the agent cost the parent.
        w.counters()
            .cost(cost::IN_STUBS)
            .store(5, Ordering::Relaxed);
        w.counters()
            .cost(cost::PROCESS_CPU_NS)
            .store(9, Ordering::Relaxed);
        w.counters().reset_for_child(None, 2, 1, 0);
        for i in 0..cost::WORDS {
            assert_eq!(w.counters().cost(i).load(Ordering::Relaxed), 0, "word {i}");
        }
        assert_eq!(w.counters().fold_lock().load(Ordering::Relaxed), 0);
        assert_eq!(w.counters().fold_seq().load(Ordering::Relaxed) % 2, 0);
        let s = w.counters().alloc_stripe(3).unwrap();
        w.counters().fold_stripe(s); // would spin forever on an inherited lock
        assert_eq!(w.counters().pid(), 2);
    }

    #[test]
    fn folded_stripes_keep_their_counts_and_are_reused() {
        let layout = Layout::new(Capacities {
            modules: 1,
            functions: 3,
            strings: 64,
            stripes: 5,
        });
        let mut buf = buffer(&layout);
        // SAFETY: the test's buffer: zeroed, 8-aligned, the layout's size, and alive as long as
        // `w`.
        let mut w = unsafe { SegmentWriter::init(buf.as_mut_ptr() as *mut u8, layout, 1, 0, 0) };
        w.add_module(b"m", 0).unwrap();
        for n in [b"a", b"b", b"c"] {
            w.add_function(n, 0, 1).unwrap();
        }
        let s1 = w.counters().alloc_stripe(1).unwrap();
        let s2 = w.counters().alloc_stripe(2).unwrap();
        assert_eq!(w.counters().alloc_stripe(3), None, "all taken");
        // SAFETY: slots below func_count of stripes handed out, inside the buffer; no other
        // thread uses it.
        unsafe {
            *w.counters().stripe_ptr(s1).add(1) = 5;
            *w.counters().stripe_ptr(0).add(1) = 2;
        }
        // Its thread's samples, all and by function, stay readable after
        // its end, and are not the next thread's.
        let c = *w.counters();
        c.stripe_samples(s1).store(3, Ordering::Relaxed);
        c.thread_samples(None).add((s1 as u64) << 32 | 1, 3);
        c.thread_samples(None).add((s2 as u64) << 32 | 1, 4);
        w.counters().fold_stripe(s1);
        assert_eq!(c.stripe_samples(s1).load(Ordering::Relaxed), 3);
        // SAFETY: the buffer's own bytes, borrowed while it lives.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, buf.len() * 8) };
        let snap = read_snapshot(bytes).unwrap();
        assert_eq!(snap.functions[1].calls, 7, "no count lost or doubled");
        assert_eq!(
            w.counters().alloc_stripe(4),
            Some(s1),
            "a folded stripe is reused"
        );
        assert_eq!(c.stripe_samples(s1).load(Ordering::Relaxed), 0);
        let mut by = c.thread_samples(None).entries();
        by.sort();
        let key = |s: u32| (s as u64) << 32 | 1;
        assert_eq!(by, [(key(s1), 0), (key(s2), 4)]);
        assert_eq!(
            // SAFETY: slots below func_count of stripes handed out, inside the buffer; no other
            // thread uses it.
            unsafe { *w.counters().stripe_ptr(s1).add(1) },
            0,
            "and starts from zero"
        );
        let _ = s2;
    }

    /// A process killed anywhere in a fold (here: stopped after each store
    /// of it) leaves a segment that reads, and sums exactly.
    #[test]
    fn a_fold_stopped_after_any_store_sums_exactly() {
        let layout = Layout::new(Capacities {
            modules: 1,
            functions: 3,
            strings: 64,
            stripes: 7,
        });
        let mut buf = buffer(&layout);
        // SAFETY: the test's buffer: zeroed, 8-aligned, the layout's size, and alive as long as
        // `w`.
        let mut w = unsafe { SegmentWriter::init(buf.as_mut_ptr() as *mut u8, layout, 1, 0, 0) };
        w.add_module(b"m", 0).unwrap();
        for n in [b"a", b"b", b"c"] {
            w.add_function(n, 0, 1).unwrap();
        }
        let c = *w.counters();
        let base = buf.as_ptr() as *const u8;
        let len = buf.len() * 8;
        let calls = || {
            // SAFETY: the buffer's bytes; the fold only stores into them
            // atomically, from this same thread.
            let bytes = unsafe { std::slice::from_raw_parts(base, len) };
            let snap = read_snapshot(bytes).expect("one moment's sum");
            snap.functions.iter().map(|f| f.calls).collect::<Vec<_>>()
        };
        let bump = |s: u32, k: u32, n: u64| c.counter(s, k).fetch_add(n, Ordering::Relaxed);
        bump(0, 0, 1);
        // Three folds: the first makes a sum, the next two add to it from
        // the other spare (with two stripes at once in the third).
        let mut expect = vec![1, 0, 0];
        for (round, threads) in [&[(5, 7, 0)][..], &[(1, 0, 4)], &[(2, 2, 2), (0, 9, 1)]]
            .into_iter()
            .enumerate()
        {
            for &(x, y, z) in threads {
                let s = c.alloc_stripe(100 + round as u32).unwrap();
                assert!(!SUM_STRIPES.contains(&s), "a sum is never a thread's");
                for (k, n) in [x, y, z].into_iter().enumerate() {
                    bump(s, k as u32, n);
                    expect[k] += n;
                }
                c.end_stripe(s);
            }
            assert_eq!(calls(), expect, "ended, before round {round}");
            let mut steps = 0;
            let freed = fold_locked(
                &c,
                |_, _| true,
                || {
                    steps += 1;
                    assert_eq!(calls(), expect, "round {round}, after store {steps}");
                },
            );
            assert_eq!(freed as usize, threads.len());
            assert!(steps > 4, "{steps} stores");
            assert_eq!(calls(), expect, "after round {round}");
        }
        // Exactly one sum counts; the other spare is zero and free for the next.
        let sums: Vec<u32> = SUM_STRIPES
            .into_iter()
            .filter(|&i| c.stripe_slot(i).0.load(Ordering::Relaxed) == stripe_state::SUM)
            .collect();
        assert_eq!(sums.len(), 1);
        // Without memory for the sum nothing moves, and nothing is lost.
        let s = c.alloc_stripe(9).unwrap();
        bump(s, 2, 3);
        expect[2] += 3;
        c.end_stripe(s);
        assert_eq!(c.fold_ended(true, |_, _| false), 0);
        assert_eq!(
            c.stripe_slot(s).0.load(Ordering::Relaxed),
            stripe_state::ENDED
        );
        assert_eq!(calls(), expect);
        assert_eq!(c.fold_ended(true, |_, _| true), 1);
        assert_eq!(calls(), expect);
        assert_eq!((0..3).map(|k| c.calls(k)).collect::<Vec<_>>(), expect);
    }

    /// Threads ending at once never wait for each other's folds, and
    /// nothing is left unfolded: a fold asked for while another runs is
    /// made by that one.
    #[test]
    fn folds_asked_for_at_once_are_all_made() {
        let layout = Layout::new(Capacities {
            modules: 1,
            functions: 64,
            strings: 1024,
            stripes: 12,
        });
        let mut buf = buffer(&layout);
        // SAFETY: the test's buffer: zeroed, 8-aligned, the layout's size, and alive as long as
        // `w`.
        let mut w = unsafe { SegmentWriter::init(buf.as_mut_ptr() as *mut u8, layout, 1, 0, 0) };
        w.add_module(b"m", 0).unwrap();
        for k in 0..64u32 {
            w.add_function(format!("f{k}").as_bytes(), 0, 1).unwrap();
        }
        let c = *w.counters();
        let rounds = 2000u64;
        std::thread::scope(|s| {
            for t in 0..4u32 {
                s.spawn(move || {
                    for r in 0..rounds {
                        let st = loop {
                            if let Some(st) = c.alloc_stripe(t) {
                                break st;
                            }
                            std::thread::yield_now();
                        };
                        c.counter(st, (r % 64) as u32)
                            .fetch_add(1, Ordering::Relaxed);
                        c.end_stripe(st);
                        c.fold_ended(false, |_, _| true);
                    }
                });
            }
        });
        let ended = (0..c.stripe_count())
            .filter(|&i| c.stripe_slot(i).0.load(Ordering::Relaxed) == stripe_state::ENDED)
            .count();
        assert_eq!(ended, 0, "every ended stripe folded");
        let total: u64 = (0..64).map(|k| c.calls(k)).sum();
        assert_eq!(total, 4 * rounds);
        assert!(
            (0..64).all(|k| c.calls(k) == 4 * (rounds / 64 + u64::from(k < (rounds % 64) as u32)))
        );
    }
}
