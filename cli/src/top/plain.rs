//! `rtprof top` as plain text, for a pipe or a file (or `--plain`): the
//! whole screen redrawn every span, no keys.

use super::model::{functions, processes, sparkline, thread_functions, threads, History};
use super::source::{Reading, Source};
use super::TopArgs;
use crate::presentation::{age_text, stale_text};
use rtprof_abi::escape::escape_text;
use rtprof_abi::present::{now_ns, RowView, View};
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn frame(a: &TopArgs, v: &View, history: &History, now: u64, notice: Option<&str>) -> String {
    let filter = a.name.as_deref().unwrap_or("");
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
    // Processes in the sort's order (by rtprof's cost with --sort rtprof).
    for s in processes(v, filter, a.sort)
        .iter()
        .filter(|s| a.pid.is_none_or(|pid| s.pid == pid))
    {
        let Some(p) = v.procs.iter().find(|p| p.pid == s.pid) else {
            continue;
        };
        let rows = functions(v, p, filter, a.sort);
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "\npid {} {}{}  {} samples{}",
            p.pid,
            escape_text(&p.exe),
            if p.ended { " (ended)" } else { "" },
            p.samples,
            s.rtprof_share().map_or(String::new(), |x| format!(
                ", rtprof's cost {:.1}%",
                x * 100.0
            ))
        );
        let _ = writeln!(
            out,
            "  {:>10} {:>13} {:>11}  {:<16}  function",
            "time ms", "calls/s", "ns/call", "recent spans"
        );
        let line = |out: &mut String, r: &RowView, spark: String| {
            let per_call = r.ns_per_call().map_or("-".into(), |n| format!("{n:.1}"));
            let _ = writeln!(
                out,
                "  {:>10.1} {:>13.1} {:>11}  {:<16}  {} ({})",
                r.time_ns as f64 / 1e6,
                r.calls_per_s(p.span_ns),
                per_call,
                spark,
                escape_text(&super::model::shown_name(r)),
                escape_text(&r.module)
            );
        };
        for r in rows.iter().take(a.rows) {
            let spark = history
                .function(p.pid, &r.name)
                .map(sparkline)
                .unwrap_or_default();
            line(&mut out, r, spark);
        }
        if !a.threads {
            continue;
        }
        if p.threads.is_empty() {
            let _ = writeln!(out, "  (no rows per thread: rtprofd --thread-rows N)");
        }
        for t in threads(v, p, filter, a.sort) {
            let _ = writeln!(
                out,
                "  thread {} {}: {:.1} ms, {} calls",
                t.tid,
                escape_text(&t.name),
                t.time_ns as f64 / 1e6,
                t.calls
            );
            for r in thread_functions(v, p, t.tid, filter, a.sort)
                .iter()
                .take(a.rows)
            {
                line(&mut out, r, String::new());
            }
        }
    }
    out
}

pub fn run(a: TopArgs) -> ExitCode {
    let mut source = match Source::open(&a.present) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rtprof: {e}");
            return ExitCode::from(1);
        }
    };
    let mut history = History::default();
    let (mut last, mut shown) = (0, 0);
    let mut drawn: Option<Instant> = None;
    let mut notice: Option<String> = None;
    loop {
        let (reading, restarted) = source.read();
        if restarted {
            history.clear();
            last = 0;
            notice = Some(format!(
                "rtprofd restarted: re-opened {}",
                escape_text(&a.present.to_string_lossy())
            ));
        }
        match reading {
            Reading::View(v) => {
                let now = now_ns();
                let new_span = v.generation != last;
                if v.generation < last {
                    // The segment was re-initialised in place.
                    history.clear();
                }
                if new_span {
                    history.record(&v);
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
            Reading::Busy => {}
            // Only a source that was never opened is absent.
            Reading::Absent(why) => {
                eprintln!("rtprof: {why}");
                return ExitCode::from(1);
            }
            Reading::Failed(e) => {
                eprintln!("rtprof: {}: {e}", a.present.display());
                return ExitCode::from(1);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
