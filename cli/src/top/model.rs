//! What `rtprof top` shows, apart from how: processes and functions of a
//! span filtered and sorted, and the history behind their sparklines.
//! Shared by the plain and the interactive view.

use rtprof_abi::present::{ProcView, RowView, ThreadView, View};
use std::cmp::Ordering;
use std::collections::{HashMap, VecDeque};

/// Row order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SortKey {
    /// Estimated CPU time over the span.
    Time,
    /// Calls over the span.
    Calls,
    /// Calls per second (the same order as calls within one process; across
    /// processes it allows for a process younger than the span).
    Rate,
    /// Time per call.
    PerCall,
    /// What rtprof itself cost the process over the span (its `[rtprof]`
    /// row); functions by time.
    Rtprof,
}

impl SortKey {
    pub fn label(self) -> &'static str {
        match self {
            SortKey::Time => "time",
            SortKey::Calls => "calls",
            SortKey::Rate => "calls/s",
            SortKey::PerCall => "ns/call",
            SortKey::Rtprof => "rtprof's cost",
        }
    }
}

/// A row's readable name, with what it is in a route: an implementation
/// that runs the calls now `(runs)`, one offered `(offered)`, an offered
/// function whose calls go to an implementation `(routed away)`.
pub fn shown_name(r: &RowView) -> String {
    let name = rtprof_shared::names::readable(&r.name);
    let note = match (r.implementation, r.offered, r.active) {
        (true, _, true) => " (runs)",
        (true, _, false) => " (offered)",
        (false, true, false) => " (routed away)",
        _ => "",
    };
    format!("{name}{note}")
}

/// Whether a function row passes `filter`: it is a substring of the
/// executable, of the function's symbol or of its readable name.
pub fn matches(filter: &str, exe: &str, r: &RowView) -> bool {
    filter.is_empty()
        || exe.contains(filter)
        || r.name.contains(filter)
        || rtprof_shared::names::readable(&r.name).contains(filter)
}

/// A process's functions that pass `filter`, in `sort` order (ties by
/// name, so rows do not swap places between spans).
pub fn functions<'v>(v: &'v View, p: &ProcView, filter: &str, sort: SortKey) -> Vec<&'v RowView> {
    sorted(&v.rows[p.rows.clone()], &p.exe, filter, sort)
}

/// Rows that pass `filter` (with their process's executable `exe`), in
/// `sort` order.
fn sorted<'v>(rows: &'v [RowView], exe: &str, filter: &str, sort: SortKey) -> Vec<&'v RowView> {
    let mut rows: Vec<&RowView> = rows.iter().filter(|r| matches(filter, exe, r)).collect();
    let key = |r: &RowView| match sort {
        SortKey::Time | SortKey::Rtprof => r.time_ns as f64,
        SortKey::Calls | SortKey::Rate => r.calls as f64,
        SortKey::PerCall => r.ns_per_call().unwrap_or(-1.0),
    };
    rows.sort_by(|x, y| descending(key(x), key(y)).then_with(|| x.name.cmp(&y.name)));
    rows
}

/// A process's threads (`rtprofd --thread-rows`) whose name or one of
/// whose functions passes `filter`, in `sort` order (ties by thread id):
/// by time, by calls (calls per second: the same order), or by time per
/// call.
pub fn threads<'v>(v: &View, p: &'v ProcView, filter: &str, sort: SortKey) -> Vec<&'v ThreadView> {
    let mut ts: Vec<&ThreadView> = p
        .threads
        .iter()
        .filter(|t| {
            filter.is_empty()
                || t.name.contains(filter)
                || v.rows[t.rows.clone()]
                    .iter()
                    .any(|r| matches(filter, &p.exe, r))
        })
        .collect();
    let key = |t: &ThreadView| match sort {
        SortKey::Time | SortKey::Rtprof => t.time_ns as f64,
        SortKey::Calls | SortKey::Rate => t.calls as f64,
        SortKey::PerCall if t.calls > 0 => t.time_ns as f64 / t.calls as f64,
        SortKey::PerCall => -1.0,
    };
    ts.sort_by(|x, y| descending(key(x), key(y)).then(x.tid.cmp(&y.tid)));
    ts
}

/// Thread `tid` of process `p`'s functions that pass `filter`, in `sort`
/// order; none if the thread is not in the span.
pub fn thread_functions<'v>(
    v: &'v View,
    p: &ProcView,
    tid: u32,
    filter: &str,
    sort: SortKey,
) -> Vec<&'v RowView> {
    p.threads
        .iter()
        .find(|t| t.tid == tid)
        .map_or_else(Vec::new, |t| {
            // A thread's own name passing the filter shows all its rows.
            let filter = if t.name.contains(filter) { "" } else { filter };
            sorted(&v.rows[t.rows.clone()], &p.exe, filter, sort)
        })
}

fn descending(x: f64, y: f64) -> Ordering {
    y.total_cmp(&x)
}

/// One process's totals over the span.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcSummary {
    pub pid: u32,
    pub exe: String,
    pub ended: bool,
    pub span_ns: u64,
    pub samples: u64,
    /// Summed over its rows (but its `[rtprof]` row: the time counting
    /// took is in its functions' rows already).
    pub time_ns: u64,
    /// What rtprof cost it over the span (its `[rtprof]` row).
    pub rtprof_ns: u64,
    pub calls: u64,
    /// Time and calls of its counted rows: what time per call is made of.
    pub counted_time_ns: u64,
    pub functions: usize,
    /// Its rows' markers (see [`process_marker`]).
    pub markers: String,
}

impl ProcSummary {
    pub fn of(v: &View, p: &ProcView) -> ProcSummary {
        let rows = &v.rows[p.rows.clone()];
        let counted = || rows.iter().filter(|r| r.counted);
        ProcSummary {
            pid: p.pid,
            exe: p.exe.clone(),
            ended: p.ended,
            span_ns: p.span_ns,
            samples: p.samples,
            time_ns: rows.iter().filter(|r| !r.agent).map(|r| r.time_ns).sum(),
            rtprof_ns: rows.iter().filter(|r| r.agent).map(|r| r.time_ns).sum(),
            calls: counted().map(|r| r.calls).sum(),
            counted_time_ns: counted().map(|r| r.time_ns).sum(),
            functions: rows.len(),
            markers: process_marker(v, p),
        }
    }
    pub fn calls_per_s(&self) -> f64 {
        if self.span_ns == 0 {
            0.0
        } else {
            self.calls as f64 * 1e9 / self.span_ns as f64
        }
    }
    /// rtprof's cost as a share of its sampled time, once it has both.
    pub fn rtprof_share(&self) -> Option<f64> {
        (self.time_ns > 0 && self.rtprof_ns > 0)
            .then(|| self.rtprof_ns as f64 / self.time_ns as f64)
    }
    /// Time per call of its counted functions, once it has both.
    pub fn ns_per_call(&self) -> Option<f64> {
        (self.calls > 0 && self.counted_time_ns > 0)
            .then(|| self.counted_time_ns as f64 / self.calls as f64)
    }
}

/// The processes with a function (or an executable) passing `filter`,
/// in `sort` order (ties by pid).
pub fn processes(v: &View, filter: &str, sort: SortKey) -> Vec<ProcSummary> {
    let mut ps: Vec<ProcSummary> = v
        .procs
        .iter()
        .filter(|p| {
            filter.is_empty()
                || p.exe.contains(filter)
                || v.rows[p.rows.clone()]
                    .iter()
                    .any(|r| matches(filter, &p.exe, r))
        })
        .map(|p| ProcSummary::of(v, p))
        .collect();
    let key = |s: &ProcSummary| match sort {
        SortKey::Time => s.time_ns as f64,
        SortKey::Calls => s.calls as f64,
        SortKey::Rate => s.calls_per_s(),
        SortKey::PerCall => s.ns_per_call().unwrap_or(-1.0),
        SortKey::Rtprof => s.rtprof_ns as f64,
    };
    ps.sort_by(|x, y| descending(key(x), key(y)).then(x.pid.cmp(&y.pid)));
    ps
}

/// Spans a sparkline covers.
pub const HISTORY: usize = 16;

/// Each function's and each process's time over the last [`HISTORY`]
/// spans, for the sparklines.
#[derive(Default)]
pub struct History {
    functions: HashMap<(u32, String), VecDeque<u64>>,
    processes: HashMap<u32, VecDeque<u64>>,
}

fn push(h: &mut VecDeque<u64>, x: u64) {
    h.push_back(x);
    if h.len() > HISTORY {
        h.pop_front();
    }
}

impl History {
    /// Adds a new span's times.
    pub fn record(&mut self, v: &View) {
        for p in &v.procs {
            let rows = &v.rows[p.rows.clone()];
            for r in rows {
                push(
                    self.functions.entry((p.pid, r.name.clone())).or_default(),
                    r.time_ns,
                );
            }
            push(
                self.processes.entry(p.pid).or_default(),
                rows.iter().map(|r| r.time_ns).sum(),
            );
        }
        // Forget processes that left.
        let here = |pid: u32| v.procs.iter().any(|p| p.pid == pid);
        self.functions.retain(|(pid, _), _| here(*pid));
        self.processes.retain(|pid, _| here(*pid));
    }
    pub fn clear(&mut self) {
        self.functions.clear();
        self.processes.clear();
    }
    pub fn function(&self, pid: u32, name: &str) -> Option<&VecDeque<u64>> {
        // A borrowed key needs the owned tuple: names are short.
        self.functions.get(&(pid, name.to_string()))
    }
    pub fn process(&self, pid: u32) -> Option<&VecDeque<u64>> {
        self.processes.get(&pid)
    }
}

const SPARK: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// A sparkline of `v`, scaled to its maximum.
pub fn sparkline(v: &VecDeque<u64>) -> String {
    let max = v.iter().copied().max().unwrap_or(0).max(1);
    v.iter()
        .map(|&x| SPARK[((x as u128 * 7 + max as u128 / 2) / max as u128) as usize])
        .collect()
}

/// The markers of a row: `A` calls added through the C API (work done
/// on an accelerator), `E` calls estimated under an overhead budget, `S`
/// sampled only (no call counts), `X` counting switched off; none for
/// calls counted one by one.
pub fn marker(r: &RowView) -> String {
    [
        (r.accelerated, 'A'),
        (r.estimated, 'E'),
        (!r.counted, 'S'),
        (r.counting_off, 'X'),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, c)| c)
    .collect()
}

/// The markers of a process: those of its rows, less `S` (almost every
/// process has sampled-only rows).
pub fn process_marker(v: &View, p: &ProcView) -> String {
    let rows = &v.rows[p.rows.clone()];
    [
        (rows.iter().any(|r| r.accelerated), 'A'),
        (rows.iter().any(|r| r.estimated), 'E'),
        (rows.iter().any(|r| r.counting_off), 'X'),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, c)| c)
    .collect()
}

#[cfg(test)]
pub mod tests {
    use super::*;

    fn row(name: &str, calls: u64, time_ns: u64) -> RowView {
        RowView {
            name: name.into(),
            module: "app".into(),
            proc_index: Some(0),
            owner: 0,
            counted: true,
            estimated: false,
            at_least: false,
            agent: false,
            accelerated: false,
            counting_off: false,
            offered: false,
            implementation: false,
            active: false,
            calls,
            samples: time_ns / 1_000_000,
            time_ns,
            total_calls: calls,
            thread: None,
        }
    }

    /// Two processes: /bin/cheap (many cheap calls) and /bin/dear (few
    /// costly calls), over a span of a second.
    pub fn view() -> View {
        let mut rows = vec![
            row("cheap", 1_000_000, 20_000_000),
            row("costly", 100, 500_000_000),
            row("middle", 10_000, 100_000_000),
            row("_ZN4core3fmt5write17h0123456789abcdefE", 50, 1_000_000),
            row("solo", 10, 900_000_000),
        ];
        rows[1].estimated = true;
        rows[2].counted = false;
        rows[2].calls = 0;
        let p = |pid, exe: &str, rows| ProcView {
            pid,
            exe: exe.into(),
            claimed: None,
            ended: false,
            span_ns: 1_000_000_000,
            samples: 0,
            period_ns: 1_000_000,
            lost: 0,
            rows,
            threads: Vec::new(),
        };
        // /bin/cheap's two threads: "worker" ran cheap and costly,
        // "idle" called cheap a little.
        let thread_row = |name: &str, calls, time_ns, tid| RowView {
            thread: Some(tid),
            ..row(name, calls, time_ns)
        };
        rows.extend([
            thread_row("costly", 60, 400_000_000, 11),
            thread_row("cheap", 900_000, 15_000_000, 11),
            thread_row("cheap", 100_000, 5_000_000, 12),
        ]);
        let calls_of = |i: usize| [60u64, 900_000, 100_000][i - 5];
        let thread = |tid, name: &str, rows: std::ops::Range<usize>, time_ns: u64| ThreadView {
            tid,
            name: name.into(),
            calls: rows.clone().map(calls_of).sum(),
            samples: time_ns / 1_000_000,
            time_ns,
            rows,
        };
        let mut cheap = p(10, "/bin/cheap", 0..4);
        cheap.threads = vec![
            thread(11, "worker", 5..7, 450_000_000),
            thread(12, "idle", 7..8, 6_000_000),
        ];
        View {
            generation: 1,
            span_end_ns: 0,
            span_ns: 1_000_000_000,
            publish_ns: 0,
            tick_ns: 1_000_000_000,
            procs: vec![cheap, p(20, "/bin/dear", 4..5)],
            rows,
            global: 8..8,
        }
    }

    fn names(rows: &[&RowView]) -> Vec<String> {
        rows.iter().map(|r| r.name.clone()).collect()
    }

    #[test]
    fn functions_sort_by_each_key() {
        let v = view();
        let p = &v.procs[0];
        let order = |k| names(&functions(&v, p, "", k));
        assert_eq!(order(SortKey::Time)[..3], ["costly", "middle", "cheap"]);
        assert_eq!(
            order(SortKey::Calls)[..3],
            ["cheap", "costly", "_ZN4core3fmt5write17h0123456789abcdefE"]
        );
        assert_eq!(order(SortKey::Rate), order(SortKey::Calls));
        // Sampled-only rows have no time per call: last.
        assert_eq!(order(SortKey::PerCall)[0], "costly");
        assert_eq!(order(SortKey::PerCall)[3], "middle");
    }

    #[test]
    fn filter_matches_executable_symbol_or_readable_name() {
        let v = view();
        let p = &v.procs[0];
        assert_eq!(names(&functions(&v, p, "cost", SortKey::Time)), ["costly"]);
        // The executable matches: every function.
        assert_eq!(functions(&v, p, "/bin/ch", SortKey::Time).len(), 4);
        // The demangled name.
        assert_eq!(functions(&v, p, "core::fmt", SortKey::Time).len(), 1);
        assert!(functions(&v, p, "nothing", SortKey::Time).is_empty());
        let pids = |f, k| -> Vec<u32> { processes(&v, f, k).iter().map(|s| s.pid).collect() };
        assert_eq!(pids("", SortKey::Time), [20, 10]);
        assert_eq!(pids("", SortKey::Calls), [10, 20]);
        assert_eq!(pids("solo", SortKey::Time), [20]);
        assert_eq!(pids("cheap", SortKey::Time), [10]);
        assert!(pids("nothing", SortKey::Time).is_empty());
    }

    #[test]
    fn threads_sort_and_filter() {
        let v = view();
        let p = &v.procs[0];
        let tids = |f, k| -> Vec<u32> { threads(&v, p, f, k).iter().map(|t| t.tid).collect() };
        assert_eq!(tids("", SortKey::Time), [11, 12]);
        assert_eq!(tids("", SortKey::Calls), [11, 12]);
        // 450 ms over 900,060 calls, against 6 ms over 100,000.
        assert_eq!(tids("", SortKey::PerCall), [11, 12]);
        assert_eq!(tids("idle", SortKey::Time), [12]);
        assert_eq!(tids("costly", SortKey::Time), [11]);
        let names = |tid, f| names(&thread_functions(&v, p, tid, f, SortKey::Time));
        assert_eq!(names(11, ""), ["costly", "cheap"]);
        assert_eq!(names(11, "cost"), ["costly"]);
        assert_eq!(
            names(12, "idle"),
            ["cheap"],
            "its name passes: all its rows"
        );
        assert!(names(99, "").is_empty());
        assert!(threads(&v, &v.procs[1], "", SortKey::Time).is_empty());
    }

    #[test]
    fn process_totals() {
        let v = view();
        let s = ProcSummary::of(&v, &v.procs[0]);
        assert_eq!(s.time_ns, 621_000_000);
        // The sampled-only row's time is not part of time per call.
        assert_eq!(s.calls, 1_000_150);
        assert_eq!(s.counted_time_ns, 521_000_000);
        assert_eq!(s.markers, "E");
        assert_eq!(s.calls_per_s(), 1_000_150.0);
        assert!((s.ns_per_call().unwrap() - 520.92).abs() < 0.01);
        let d = ProcSummary::of(&v, &v.procs[1]);
        assert_eq!(d.markers, "");
        assert_eq!(d.ns_per_call(), Some(90_000_000.0));
    }

    #[test]
    fn history_keeps_the_last_spans_of_processes_still_there() {
        let mut v = view();
        let mut h = History::default();
        for i in 0..20 {
            v.rows[0].time_ns = i;
            h.record(&v);
        }
        let cheap = h.function(10, "cheap").unwrap();
        assert_eq!(cheap.len(), HISTORY);
        assert_eq!((cheap[0], cheap[HISTORY - 1]), (4, 19));
        assert_eq!(h.process(20).unwrap().len(), HISTORY);
        v.procs.pop();
        h.record(&v);
        assert!(h.process(20).is_none() && h.function(20, "solo").is_none());
        h.clear();
        assert!(h.process(10).is_none());
    }

    #[test]
    fn sparkline_scales_to_the_maximum() {
        let v: VecDeque<u64> = [0, 5, 10].into_iter().collect();
        assert_eq!(sparkline(&v), "▁▅█");
        assert_eq!(sparkline(&VecDeque::from(vec![0, 0])), "▁▁");
        assert_eq!(sparkline(&VecDeque::from(vec![u64::MAX, 0])), "█▁");
    }

    #[test]
    fn markers() {
        let mut v = view();
        v.rows[3].accelerated = true;
        v.rows[3].counting_off = true;
        let m: Vec<_> = v.rows[..4].iter().map(marker).collect();
        assert_eq!(m, ["", "E", "S", "AX"]);
        assert_eq!(process_marker(&v, &v.procs[0]), "AEX");
        assert_eq!(process_marker(&v, &v.procs[1]), "");
    }
}
