//! `rtprof top`: a live view of a running rtprofd's spans, redrawn every
//! span: processes and their functions by time, calls per second, time per
//! call, and a sparkline of each function's time over recent spans.

use crate::report::open;
use clap::Args;
use rtprof_shared::present::{read_view, RowView, View};
use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct TopArgs {
    /// The daemon's presentation segment.
    #[arg(long, default_value = "/run/rtprof/present")]
    present: PathBuf,
    /// Only this process.
    #[arg(long)]
    pid: Option<u32>,
    /// Only executables or functions whose name contains this.
    #[arg(long)]
    name: Option<String>,
    /// Row order.
    #[arg(long, value_enum, default_value_t = TopSort::Time)]
    sort: TopSort,
    /// Functions shown per process.
    #[arg(long, default_value_t = 10)]
    rows: usize,
    /// Stop after this many spans (0: run until interrupted).
    #[arg(long, default_value_t = 0)]
    iterations: u64,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum TopSort {
    Time,
    Calls,
    PerCall,
}

const SPARK: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
const HISTORY: usize = 16;

/// A sparkline of `v`, scaled to its maximum.
pub fn sparkline(v: &VecDeque<u64>) -> String {
    let max = v.iter().copied().max().unwrap_or(0).max(1);
    v.iter()
        .map(|&x| SPARK[((x * 7 + max / 2) / max) as usize])
        .collect()
}

fn matches(a: &TopArgs, exe: &str, r: &RowView) -> bool {
    a.name
        .as_ref()
        .is_none_or(|n| exe.contains(n.as_str()) || r.name.contains(n.as_str()))
}

fn frame(a: &TopArgs, v: &View, history: &mut HashMap<(u32, String), VecDeque<u64>>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "rtprof top: {} process(es), span {:.1} s, generation {}",
        v.procs.len(),
        v.span_ns as f64 / 1e9,
        v.generation
    );
    for p in v
        .procs
        .iter()
        .filter(|p| a.pid.is_none_or(|pid| p.pid == pid))
    {
        let mut rows: Vec<&RowView> = v.rows[p.rows.clone()]
            .iter()
            .filter(|r| matches(a, &p.exe, r))
            .collect();
        for r in &rows {
            let h = history.entry((p.pid, r.name.clone())).or_default();
            h.push_back(r.time_ns);
            if h.len() > HISTORY {
                h.pop_front();
            }
        }
        if rows.is_empty() {
            continue;
        }
        match a.sort {
            TopSort::Time => rows.sort_by_key(|r| std::cmp::Reverse(r.time_ns)),
            TopSort::Calls => rows.sort_by_key(|r| std::cmp::Reverse(r.calls)),
            TopSort::PerCall => rows.sort_by(|x, y| {
                let k = |r: &RowView| r.ns_per_call().unwrap_or(-1.0);
                k(y).total_cmp(&k(x))
            }),
        }
        let _ = writeln!(
            out,
            "\npid {} {}{}  {} samples",
            p.pid,
            p.exe,
            if p.ended { " (ended)" } else { "" },
            p.samples
        );
        let _ = writeln!(
            out,
            "  {:>10} {:>13} {:>11}  {:<16}  function",
            "time ms", "calls/s", "ns/call", "recent spans"
        );
        for r in rows.iter().take(a.rows) {
            let spark = history
                .get(&(p.pid, r.name.clone()))
                .map(sparkline)
                .unwrap_or_default();
            let per_call = r.ns_per_call().map_or("-".into(), |n| format!("{n:.1}"));
            let _ = writeln!(
                out,
                "  {:>10.1} {:>13.1} {:>11}  {:<16}  {} ({})",
                r.time_ns as f64 / 1e6,
                r.calls_per_s(p.span_ns),
                per_call,
                spark,
                r.name,
                r.module
            );
        }
    }
    // Forget processes that left.
    history.retain(|(pid, _), _| v.procs.iter().any(|p| p.pid == *pid));
    out
}

pub fn run(a: TopArgs) -> ExitCode {
    let map = match open(&a.present) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("rtprof: {e} (is rtprofd running?)");
            return ExitCode::from(1);
        }
    };
    let mut history = HashMap::new();
    let (mut last, mut shown) = (0, 0);
    loop {
        match read_view(&map) {
            Ok(v) if v.generation != last => {
                last = v.generation;
                // Clear the screen and draw from the top.
                print!("\x1b[H\x1b[2J{}", frame(&a, &v, &mut history));
                use std::io::Write;
                let _ = std::io::stdout().flush();
                shown += 1;
                if a.iterations != 0 && shown >= a.iterations {
                    return ExitCode::SUCCESS;
                }
            }
            Ok(_) => {}
            Err(e) => {
                eprintln!("rtprof: {}: {e}", a.present.display());
                return ExitCode::from(1);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparkline_scales_to_the_maximum() {
        let v: VecDeque<u64> = [0, 5, 10].into_iter().collect();
        assert_eq!(sparkline(&v), "▁▅█");
        assert_eq!(sparkline(&VecDeque::from(vec![0, 0])), "▁▁");
    }
}
