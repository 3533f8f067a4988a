//! `rtprof top`: a live view of a running rtprofd's spans, redrawn every
//! span: processes and their functions by time, calls per second, time per
//! call, and a sparkline of each function's time over recent spans. When
//! the daemon stops publishing the view says how old it is; when it
//! restarts (a new segment file at the same path) the view follows it.

use crate::presentation::{age_text, open, stale_text, Segment};
use clap::Args;
use rtprof_shared::present::{now_ns, read_view, PresentError, RowView, View};
use rtprof_shared::report::escape_text;
use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct TopArgs {
    /// The daemon's presentation segment.
    #[arg(long, default_value = rtprof_shared::protocol::DEFAULT_PRESENT)]
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
    /// Stop after this many screens (0: run until interrupted). A screen is
    /// drawn for every new span, and once a second while the spans are stale.
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

type History = HashMap<(u32, String), VecDeque<u64>>;

/// Adds a new span's times to the sparklines.
fn record(a: &TopArgs, v: &View, history: &mut History) {
    for p in v
        .procs
        .iter()
        .filter(|p| a.pid.is_none_or(|pid| p.pid == pid))
    {
        for r in v.rows[p.rows.clone()]
            .iter()
            .filter(|r| matches(a, &p.exe, r))
        {
            let h = history.entry((p.pid, r.name.clone())).or_default();
            h.push_back(r.time_ns);
            if h.len() > HISTORY {
                h.pop_front();
            }
        }
    }
    // Forget processes that left.
    history.retain(|(pid, _), _| v.procs.iter().any(|p| p.pid == *pid));
}

fn frame(a: &TopArgs, v: &View, history: &History, now: u64, notice: Option<&str>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "rtprof top: {} process(es), span {:.1} s, generation {}, published {} ago",
        v.procs.len(),
        v.span_ns as f64 / 1e9,
        v.generation,
        age_text(v.age(now).0)
    );
    if let Some(n) = notice {
        let _ = writeln!(out, "{n}");
    }
    if let Some(s) = stale_text(v, now) {
        let _ = writeln!(out, "{s}");
    }
    for p in v
        .procs
        .iter()
        .filter(|p| a.pid.is_none_or(|pid| p.pid == pid))
    {
        let mut rows: Vec<&RowView> = v.rows[p.rows.clone()]
            .iter()
            .filter(|r| matches(a, &p.exe, r))
            .collect();
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
            escape_text(&p.exe),
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
                escape_text(&rtprof_shared::names::readable(&r.name)),
                escape_text(&r.module)
            );
        }
    }
    out
}

/// The segment now at `path`, if it is another file than `current` and
/// already published: a restarted daemon. A new daemon's segment that has
/// nothing in it yet is left for the next look.
fn replaced(path: &Path, current: &Segment) -> Option<Segment> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    if (m.dev(), m.ino()) == current.id {
        return None;
    }
    let s = open(path).ok()?;
    read_view(&s.map).is_ok().then_some(s)
}

/// Consecutive `Busy` reads (100 ms apart) before giving up.
const BUSY_LIMIT: u32 = 50;

pub fn run(a: TopArgs) -> ExitCode {
    let mut seg = match open(&a.present) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("rtprof: {e}");
            return ExitCode::from(1);
        }
    };
    let mut history = History::new();
    let (mut last, mut shown, mut busy) = (0, 0, 0);
    let mut drawn: Option<Instant> = None;
    let mut notice: Option<String> = None;
    loop {
        if let Some(s) = replaced(&a.present, &seg) {
            seg = s;
            history.clear();
            last = 0;
            notice = Some(format!(
                "rtprofd restarted: re-opened {}",
                escape_text(&a.present.to_string_lossy())
            ));
        }
        match read_view(&seg.map) {
            Ok(v) => {
                busy = 0;
                let now = now_ns();
                let new_span = v.generation != last;
                if v.generation < last {
                    // The segment was re-initialised in place.
                    history.clear();
                }
                if new_span {
                    record(&a, &v, &mut history);
                }
                // A stale view is redrawn every second, so its age counts up.
                let stale = v.age(now).1;
                if new_span
                    || (stale && drawn.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)))
                {
                    last = v.generation;
                    // Clear the screen and draw from the top.
                    print!(
                        "\x1b[H\x1b[2J{}",
                        frame(&a, &v, &history, now, notice.as_deref())
                    );
                    use std::io::Write;
                    let _ = std::io::stdout().flush();
                    drawn = Some(Instant::now());
                    if new_span {
                        notice = None;
                    }
                    shown += 1;
                    if a.iterations != 0 && shown >= a.iterations {
                        return ExitCode::SUCCESS;
                    }
                }
            }
            // The daemon rewrote the buffer under every attempt: try again
            // at the next poll, but not for ever.
            Err(PresentError::Busy) if busy < BUSY_LIMIT => busy += 1,
            Err(e) => {
                eprintln!("rtprof: {}: {e}", a.present.display());
                return ExitCode::from(1);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
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
