//! Events in reports: each event asked for, whether it ran (and why not),
//! its counts per function (with the count per call, where calls are
//! counted), per module and per thread, and ratios of two events where
//! both ran (instructions per cycle).

use super::{function_fields, module_name};
use crate::json::JsonWriter;
use crate::names;
use rtprof_abi::escape::escape_text;
use rtprof_abi::reader::{EventCounts, EventStatus};
use rtprof_abi::Snapshot;
use std::fmt::Write as _;

/// Ratios of two events, (name, numerator, denominator), shown where both ran.
const RATIOS: &[(&str, &str, &str)] = &[
    ("instructions per cycle", "instructions", "cycles"),
    (
        "cache misses per reference",
        "cache-misses",
        "cache-references",
    ),
    ("branch misses per branch", "branch-misses", "branches"),
];

/// Why an event did not run, in words.
fn why_not(e: &EventCounts) -> String {
    match e.status {
        EventStatus::Unavailable if e.errno != 0 => format!(
            "unavailable: {}",
            std::io::Error::from_raw_os_error(e.errno as i32)
        ),
        s => s.name().to_string(),
    }
}

/// Functions with samples of `e`, most first.
fn rows(e: &EventCounts) -> Vec<(u32, u64)> {
    let mut v = e.functions.clone();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

/// Each ratio whose two events ran: (name, value).
fn ratios(s: &Snapshot) -> Vec<(&'static str, f64)> {
    let ran = |n: &str| {
        s.events
            .events
            .iter()
            .find(|e| e.name == n && e.status == EventStatus::Ran)
    };
    RATIOS
        .iter()
        .filter_map(|&(name, num, den)| {
            let (num, den) = (ran(num)?, ran(den)?);
            let d = den.estimate(den.samples());
            (d > 0).then(|| (name, num.estimate(num.samples()) as f64 / d as f64))
        })
        .collect()
}

/// The events section of a process's text report (nothing if no event
/// was asked for).
pub(super) fn text(out: &mut String, s: &Snapshot, top: usize) {
    if s.events.events.is_empty() {
        return;
    }
    out.push_str("  events:\n");
    for e in &s.events.events {
        if e.status != EventStatus::Ran {
            let _ = writeln!(out, "    {}: {}", escape_text(&e.name), why_not(e));
            continue;
        }
        let samples = e.samples();
        let _ = writeln!(
            out,
            "    {} (one sample every {}{}): {} in all{}",
            escape_text(&e.name),
            e.period,
            if e.user_only { ", user mode only" } else { "" },
            e.estimate(samples),
            if e.lost > 0 {
                format!(", {} samples lost", e.lost)
            } else {
                String::new()
            }
        );
        let rows = rows(e);
        let shown = if top == 0 {
            rows.len()
        } else {
            top.min(rows.len())
        };
        for &(slot, n) in &rows[..shown] {
            let f = &s.functions[slot as usize];
            let count = e.estimate(n);
            // Calls counted over the whole run only.
            let per_call = if f.calls > 0 && !f.counting_off {
                format!("{:>12.2}", count as f64 / f.calls as f64)
            } else {
                format!("{:>12}", "-")
            };
            let _ = writeln!(
                out,
                "      {count:>12} {per_call} per call  {}",
                escape_text(&names::function(&f.name))
            );
        }
    }
    for (name, v) in ratios(s) {
        let _ = writeln!(out, "    {name}: {v:.3}");
    }
}

/// The `events` of a process's JSON report (nothing if none was asked for).
pub(super) fn json(w: &mut JsonWriter, s: &Snapshot) {
    if s.events.events.is_empty() {
        return;
    }
    w.key("events");
    w.begin_array();
    for e in &s.events.events {
        w.begin_object();
        w.string_field("name", &e.name);
        w.key("ran");
        w.bool(e.status == EventStatus::Ran);
        if e.status != EventStatus::Ran {
            w.string_field("why", &why_not(e));
            w.uint_field("errno", e.errno as u64);
            w.end_object();
            continue;
        }
        w.uint_field("period", e.period);
        w.key("user_only");
        w.bool(e.user_only);
        let samples = e.samples();
        w.uint_field("samples", samples);
        w.uint_field("count", e.estimate(samples));
        w.uint_field("lost", e.lost);
        w.key("functions");
        w.begin_array();
        for (slot, n) in rows(e) {
            let f = &s.functions[slot as usize];
            w.begin_object();
            function_fields(w, s, f);
            w.uint_field("samples", n);
            w.uint_field("count", e.estimate(n));
            if f.calls > 0 && !f.counting_off {
                w.key("per_call");
                w.float(e.estimate(n) as f64 / f.calls as f64);
            }
            w.end_object();
        }
        w.end_array();
        w.key("modules");
        w.begin_array();
        for &(m, n) in &e.modules {
            w.begin_object();
            w.string_field("module", module_name(s, m));
            w.uint_field("count", e.estimate(n));
            w.end_object();
        }
        w.end_array();
        w.uint_field("unknown", e.estimate(e.unknown));
        w.key("threads");
        w.begin_array();
        for &(tid, n) in &e.threads {
            w.begin_object();
            w.uint_field("tid", tid as u64);
            w.uint_field("count", e.estimate(n));
            w.end_object();
        }
        w.end_array();
        w.end_object();
    }
    w.end_array();
    w.uint_field("events_threads_dropped", s.events.threads_dropped);
    let r = ratios(s);
    if !r.is_empty() {
        w.key("ratios");
        w.begin_object();
        for (name, v) in r {
            w.key(name);
            w.float(v);
        }
        w.end_object();
    }
}
