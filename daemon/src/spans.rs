//! Span statistics for one process: a ring of its snapshots over the last
//! span, and the deltas between the oldest and the newest.

use rtprof_shared::present::{ProcTable, RowIn};
use rtprof_shared::Snapshot;
use std::collections::VecDeque;

/// Counts of one process at one moment (index = function slot).
struct Point {
    at_ns: u64,
    calls: Vec<u64>,
    samples: Vec<u64>,
    /// Samples in modules outside named functions, per module.
    buckets: Vec<u64>,
    unknown: u64,
    samples_total: u64,
    lost: u64,
}

impl Point {
    fn of(s: &Snapshot, at_ns: u64) -> Point {
        Point {
            at_ns,
            calls: s.functions.iter().map(|f| f.calls).collect(),
            samples: s.functions.iter().map(|f| f.samples).collect(),
            buckets: s.modules.iter().map(|m| m.samples).collect(),
            unknown: s.samples_unknown,
            samples_total: s.samples_total,
            lost: s.samples_lost,
        }
    }
    fn zero(at_ns: u64) -> Point {
        Point {
            at_ns,
            calls: Vec::new(),
            samples: Vec::new(),
            buckets: Vec::new(),
            unknown: 0,
            samples_total: 0,
            lost: 0,
        }
    }
}

fn at(v: &[u64], i: usize) -> u64 {
    v.get(i).copied().unwrap_or(0)
}

/// One process as the daemon follows it.
pub struct Tracked {
    pub pid: u32,
    pub exe: String,
    pub start_ns: u64,
    pub ended: bool,
    period_ns: u64,
    /// (function name, module name, instrumented) per slot.
    names: Vec<(String, String, bool)>,
    modules: Vec<String>,
    ring: VecDeque<Point>,
}

impl Tracked {
    /// Starts following a process. If it started within the span, its
    /// first span counts from its start (zero); otherwise from now.
    pub fn new(s: &Snapshot, now_ns: u64, span_ns: u64) -> Tracked {
        let mut t = Tracked {
            pid: s.pid,
            exe: s.exe.clone(),
            start_ns: s.start_ns,
            ended: false,
            period_ns: s.sample_period_ns,
            names: Vec::new(),
            modules: Vec::new(),
            ring: VecDeque::new(),
        };
        if s.start_ns + span_ns >= now_ns {
            t.ring.push_back(Point::zero(s.start_ns.min(now_ns)));
        }
        t.push(s, now_ns, span_ns);
        t
    }

    /// Adds a snapshot taken at `now_ns`; forgets points no longer needed
    /// (one at or before the span's start stays, as the baseline).
    pub fn push(&mut self, s: &Snapshot, now_ns: u64, span_ns: u64) {
        if s.functions.len() > self.names.len() {
            for f in &s.functions[self.names.len()..] {
                let module = s
                    .modules
                    .get(f.module as usize)
                    .map_or("?", |m| m.name())
                    .to_string();
                self.names.push((f.name.clone(), module, f.instrumented));
            }
        }
        if s.modules.len() > self.modules.len() {
            for m in &s.modules[self.modules.len()..] {
                self.modules.push(format!("[{}]", m.name()));
            }
        }
        self.period_ns = s.sample_period_ns;
        self.ring.push_back(Point::of(s, now_ns));
        let start = now_ns.saturating_sub(span_ns);
        while self.ring.len() > 2 && self.ring[1].at_ns <= start {
            self.ring.pop_front();
        }
    }

    /// The span's table: deltas from the baseline to the newest point.
    pub fn table(&self) -> ProcTable {
        let (Some(old), Some(new)) = (self.ring.front(), self.ring.back()) else {
            return ProcTable::default();
        };
        let mut rows = Vec::new();
        for (i, (name, module, counted)) in self.names.iter().enumerate() {
            let calls = at(&new.calls, i).saturating_sub(at(&old.calls, i));
            let samples = at(&new.samples, i).saturating_sub(at(&old.samples, i));
            if calls == 0 && samples == 0 {
                continue;
            }
            rows.push(RowIn {
                name: name.clone(),
                module: module.clone(),
                counted: *counted,
                calls: if *counted { calls } else { 0 },
                samples,
                time_ns: samples.saturating_mul(self.period_ns),
                total_calls: at(&new.calls, i),
            });
        }
        let mut bucket = |name: &str, samples: u64| {
            if samples > 0 {
                rows.push(RowIn {
                    name: name.to_string(),
                    module: name.trim_matches(['[', ']']).to_string(),
                    counted: false,
                    calls: 0,
                    samples,
                    time_ns: samples.saturating_mul(self.period_ns),
                    total_calls: 0,
                });
            }
        };
        for (i, m) in self.modules.iter().enumerate() {
            bucket(m, at(&new.buckets, i).saturating_sub(at(&old.buckets, i)));
        }
        bucket("[unknown]", new.unknown.saturating_sub(old.unknown));
        rows.sort_by(|a, b| b.time_ns.cmp(&a.time_ns).then(b.calls.cmp(&a.calls)));
        ProcTable {
            pid: self.pid,
            exe: self.exe.clone(),
            ended: self.ended,
            span_ns: new.at_ns.saturating_sub(old.at_ns),
            samples: new.samples_total.saturating_sub(old.samples_total),
            period_ns: self.period_ns,
            lost: new.lost.saturating_sub(old.lost),
            rows,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtprof_shared::sampling::{Sampler, Why};
    use rtprof_shared::{FunctionStats, ModuleStats};

    fn snap(calls: u64, samples: u64) -> Snapshot {
        Snapshot {
            pid: 5,
            ppid: 1,
            exe: "/bin/app".into(),
            state: 1,
            exit_status: 0,
            start_ns: 1_000,
            end_ns: 0,
            sample_period_ns: 1_000_000,
            samples_total: samples,
            samples_lost: 0,
            samples_unknown: 0,
            sampler: Sampler::Perf,
            sampler_why: Why::Default,
            sampler_errno: 0,
            setup_ns: 1,
            replaced_by_exec: false,
            stripes: 1,
            modules: vec![ModuleStats {
                path: "/bin/app".into(),
                base: 0,
                functions: 2,
                patched: 2,
                refused: vec![],
                sampled_only: false,
                samples: 0,
            }],
            functions: ["hot", "cold"]
                .iter()
                .map(|n| FunctionStats {
                    name: n.to_string(),
                    module: 0,
                    vaddr: 0,
                    size: 1,
                    refused: None,
                    instrumented: true,
                    calls: if *n == "hot" { calls } else { 0 },
                    samples: if *n == "hot" { samples } else { 0 },
                })
                .collect(),
        }
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn deltas_over_the_span() {
        // Seen long after it started: the first span counts from then.
        let mut t = Tracked::new(&snap(1000, 10), 100 * S, 5 * S);
        assert!(t.table().rows.is_empty());
        for k in 1..=10u64 {
            t.push(&snap(1000 + k * 100, 10 + k), (100 + k) * S, 5 * S);
        }
        let tab = t.table();
        assert_eq!(tab.span_ns, 5 * S);
        assert_eq!(tab.rows.len(), 1);
        let hot = &tab.rows[0];
        assert_eq!((hot.calls, hot.samples, hot.total_calls), (500, 5, 2000));
        assert_eq!(hot.time_ns, 5_000_000);
    }

    #[test]
    fn young_process_counts_from_its_start() {
        let t = Tracked::new(&snap(300, 3), 2 * S, 5 * S);
        let tab = t.table();
        assert_eq!(tab.rows[0].calls, 300);
        assert_eq!(tab.span_ns, 2 * S - 1_000);
    }
}
