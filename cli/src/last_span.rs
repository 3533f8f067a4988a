//! `rtprof report`: the last span from a running `rtprofd`, once.

use crate::export::{model, Output, OutputArgs};
use crate::presentation::{age_text, open, stale_text};
use clap::Args;
use rtprof_abi::escape::escape_text;
use rtprof_abi::present::{now_ns, read_view, ProcView, RowView, View};
use rtprof_shared::json::JsonWriter;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct ReportArgs {
    /// The daemon's presentation segment.
    #[arg(long, default_value = rtprof_abi::protocol::DEFAULT_PRESENT)]
    present: PathBuf,
    /// Only this process.
    #[arg(long)]
    pid: Option<u32>,
    /// JSON on stdout instead of text.
    #[arg(long, conflicts_with = "output")]
    json: bool,
    #[command(flatten)]
    output: OutputArgs,
    /// Rows per process (0: all).
    #[arg(long, default_value_t = 10)]
    top: usize,
}

fn row_json(w: &mut JsonWriter, r: &RowView, span_ns: u64) {
    w.begin_object();
    w.string_field("name", &r.name);
    w.string_field("module", &r.module);
    w.key("counted");
    w.bool(r.counted);
    if r.estimated {
        w.key("estimated");
        w.bool(true);
    }
    if r.agent {
        // What rtprof itself cost the process over the span.
        w.key("rtprof_cost");
        w.bool(true);
    }
    if r.at_least {
        // Too uncertain to estimate: the calls counted in bursts.
        w.key("at_least");
        w.bool(true);
    }
    if r.accelerated {
        w.key("accelerated");
        w.bool(true);
    }
    if r.counting_off {
        w.string_field("counting", "off");
    }
    w.uint_field("calls", r.calls);
    w.uint_field("samples", r.samples);
    w.uint_field("time_ns", r.time_ns);
    w.uint_field("total_calls", r.total_calls);
    w.key("calls_per_s");
    w.float(r.calls_per_s(span_ns));
    if let Some(n) = r.ns_per_call() {
        w.key("ns_per_call");
        w.float(n);
    }
    w.end_object();
}

/// `"functions": [...]` of `rows`, over a span of `span_ns`.
fn rows_json(w: &mut JsonWriter, rows: &[RowView], span_ns: u64) {
    w.key("functions");
    w.begin_array();
    for r in rows {
        row_json(w, r, span_ns);
    }
    w.end_array();
}

fn json(v: &View, procs: &[&ProcView], now: u64) -> String {
    let (age, stale) = v.age(now);
    let mut w = JsonWriter::new();
    w.begin_object();
    w.uint_field("generation", v.generation);
    w.uint_field("span_end_ns", v.span_end_ns);
    w.uint_field("span_ns", v.span_ns);
    w.uint_field("publish_ns", v.publish_ns);
    w.uint_field("age_ns", age);
    w.uint_field("tick_ns", v.tick_ns);
    w.key("stale");
    w.bool(stale);
    w.key("processes");
    w.begin_array();
    for p in procs {
        w.begin_object();
        w.uint_field("pid", p.pid as u64);
        w.string_field("exe", &p.exe);
        // Only what the process's own segment says: never its identity.
        if let Some(c) = &p.claimed {
            w.string_field("claimed", c);
        }
        w.key("ended");
        w.bool(p.ended);
        w.uint_field("span_ns", p.span_ns);
        w.uint_field("samples", p.samples);
        w.uint_field("period_ns", p.period_ns);
        w.uint_field("lost", p.lost);
        rows_json(&mut w, &v.rows[p.rows.clone()], p.span_ns);
        // Rows per thread (`rtprofd --thread-rows N`), as rtprofd has them.
        if !p.threads.is_empty() {
            w.key("threads");
            w.begin_array();
            for t in &p.threads {
                w.begin_object();
                w.uint_field("tid", t.tid as u64);
                w.string_field("name", &t.name);
                w.uint_field("calls", t.calls);
                w.uint_field("samples", t.samples);
                w.uint_field("time_ns", t.time_ns);
                rows_json(&mut w, &v.rows[t.rows.clone()], p.span_ns);
                w.end_object();
            }
            w.end_array();
        }
        w.end_object();
    }
    w.end_array();
    w.end_object();
    w.finish()
}

pub fn text(v: &View, procs: &[&ProcView], top: usize, now: u64) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "span of {:.1} s, {} process(es), published {} ago",
        v.span_ns as f64 / 1e9,
        procs.len(),
        age_text(v.age(now).0)
    );
    if let Some(s) = stale_text(v, now) {
        let _ = writeln!(out, "{s}");
    }
    for p in procs {
        let claim = p
            .claimed
            .as_ref()
            .map(|c| format!(" (claims to be {})", escape_text(c)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "pid {} {}{claim}{}: {} samples over {:.1} s",
            p.pid,
            escape_text(&p.exe),
            if p.ended { " (ended)" } else { "" },
            p.samples,
            p.span_ns as f64 / 1e9
        );
        let rows = &v.rows[p.rows.clone()];
        let n = if top == 0 {
            rows.len()
        } else {
            top.min(rows.len())
        };
        for r in &rows[..n] {
            let per_call = r.ns_per_call().map_or("-".into(), |x| format!("{x:.1}"));
            let _ = writeln!(
                out,
                "  {:>12.1} calls/s {:>9.1} ms {:>10} ns/call  {}  {}{}",
                r.calls_per_s(p.span_ns),
                r.time_ns as f64 / 1e6,
                per_call,
                escape_text(&rtprof_shared::names::readable(&r.name)),
                escape_text(&r.module),
                escape_text(&route_note(r, rows))
            );
        }
        for t in &p.threads {
            let hottest = t
                .hottest(v)
                .map(|r| rtprof_shared::names::readable(&r.name).into_owned())
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  thread {} {}: {:.1} ms, {} calls, hottest {}",
                t.tid,
                escape_text(&t.name),
                t.time_ns as f64 / 1e6,
                t.calls,
                escape_text(&hottest)
            );
        }
    }
    out
}

/// What a row says of routes: an offered function lists its
/// implementations and which runs its calls now; an implementation says
/// whether it does.
fn route_note(r: &RowView, rows: &[RowView]) -> String {
    if r.implementation {
        return if r.active {
            "  (runs the calls)"
        } else {
            "  (offered)"
        }
        .into();
    }
    if !r.offered {
        return String::new();
    }
    let prefix = format!("{} [", r.name);
    let offers: Vec<&str> = rows
        .iter()
        .filter(|x| x.implementation)
        .filter_map(|x| x.name.strip_prefix(&prefix)?.strip_suffix(']'))
        .collect();
    let runs = rows
        .iter()
        .filter(|x| x.implementation && x.active)
        .find_map(|x| x.name.strip_prefix(&prefix)?.strip_suffix(']'))
        .unwrap_or(rtprof_abi::route::ORIGINAL);
    format!("  (offers {}; calls go to {runs})", offers.join(", "))
}

pub fn run(a: ReportArgs) -> ExitCode {
    let output = match Output::from_args(&a.output) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("rtprof: {e}");
            return ExitCode::from(2);
        }
    };
    let seg = match open(&a.present) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("rtprof: {e}");
            return ExitCode::from(1);
        }
    };
    let v = match read_view(&seg.map) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("rtprof: {}: {e}", a.present.display());
            return ExitCode::from(1);
        }
    };
    let now = now_ns();
    // The text says so itself; JSON on a pipe, or a file, should not go
    // unnoticed.
    if let Some(s) = stale_text(&v, now).filter(|_| a.json || output.is_some()) {
        eprintln!("rtprof: {}: {s}", a.present.display());
    }
    let procs: Vec<&ProcView> = v
        .procs
        .iter()
        .filter(|p| a.pid.is_none_or(|pid| p.pid == pid))
        .collect();
    if let Some(o) = output {
        let written = o.write(|| json(&v, &procs, now), || model::from_view(&v, &procs));
        if !written {
            return ExitCode::from(1);
        }
    } else if a.json {
        println!("{}", json(&v, &procs, now));
    } else {
        print!("{}", text(&v, &procs, a.top, now));
    }
    ExitCode::SUCCESS
}
