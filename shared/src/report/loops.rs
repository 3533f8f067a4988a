//! Loops in reports: the hottest loops of sampled functions, each with its
//! share of the process's samples and of its function's, its depth and
//! where it is (source line, or its addresses); and the loops counted
//! exactly (`RTPROF_LOOPS`), with their executions and iterations.

use super::function_fields;
use crate::json::JsonWriter;
use crate::names;
use rtprof_abi::escape::escape_text;
use rtprof_abi::loops::{LoopCount, LoopStats};
use rtprof_abi::Snapshot;
use std::fmt::Write as _;

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// Loops, hottest first (samples, then address).
fn hottest(s: &Snapshot) -> Vec<&LoopStats> {
    let mut v: Vec<&LoopStats> = s.loops.iter().collect();
    v.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.header.cmp(&b.header)));
    v
}

fn place(l: &LoopStats) -> String {
    let at = format!("{:#x}-{:#x}", l.start, l.end);
    match &l.source {
        Some(src) => format!("{}:{} ({at})", src.file, src.line),
        None => at,
    }
}

/// Iterations per execution (0 for none).
fn per_execution(iterations: u64, entries: u64) -> f64 {
    if entries == 0 {
        0.0
    } else {
        iterations as f64 / entries as f64
    }
}

/// The loops section of a process's text report: every loop counted
/// exactly, in address order, then its `top` hottest loops (nothing if no
/// loop was counted or sampled).
pub(super) fn text(out: &mut String, s: &Snapshot, top: usize) {
    // Most iterations first, those not counted last.
    let mut counted: Vec<&LoopStats> = s.loops.iter().filter(|l| l.count.is_some()).collect();
    counted.sort_by_key(|l| {
        let it = l.count.and_then(|c| c.iterations());
        (it.is_none(), std::cmp::Reverse(it), l.function, l.header)
    });
    let more = counted.len().saturating_sub(top);
    if !counted.is_empty() {
        let _ = writeln!(
            out,
            "  loops counted exactly (an iteration is a run of the loop's body):
    \
             {:>12} {:>14} {:>12} {:>5}  function  loop at",
            "executions", "iterations", "per exec", "depth"
        );
    }
    for l in counted.into_iter().take(top) {
        let f = &s.functions[l.function as usize];
        let what = match (l.count, l.count.and_then(|c| c.iterations())) {
            (Some(LoopCount::Counted { entries, .. }), Some(it)) => format!(
                "{:>12} {:>14} {:>12.1}",
                entries,
                it,
                per_execution(it, entries)
            ),
            (Some(LoopCount::Refused(why)), _) => {
                format!("{:>40}", format!("not counted: {}", why.name()))
            }
            _ => continue,
        };
        let _ = writeln!(
            out,
            "    {what} {:>5}  {}  {}",
            l.depth,
            escape_text(&names::function(&f.name)),
            escape_text(&place(l))
        );
    }
    if more > 0 {
        let _ = writeln!(
            out,
            "    ... and {more} more (all of them in the JSON report)"
        );
    }
    if s.loops.iter().all(|l| l.samples == 0) {
        return;
    }
    let _ = writeln!(
        out,
        "  hot loops (sampled; a loop's samples include its nested loops'):\n    \
         {:>7} {:>8} {:>8} {:>5}  function  loop at",
        "of proc", "of func", "samples", "depth"
    );
    for l in hottest(s).into_iter().filter(|l| l.samples > 0).take(top) {
        let f = &s.functions[l.function as usize];
        let _ = writeln!(
            out,
            "    {:>6.1}% {:>7.1}% {:>8} {:>5}  {}  {}",
            share(l.samples, s.samples_total),
            share(l.samples, f.samples),
            l.samples,
            l.depth,
            escape_text(&names::function(&f.name)),
            escape_text(&place(l))
        );
    }
}

/// The `loops` of a process's JSON report, hottest first, and the
/// samples not placed in their function (nothing if no sample was).
pub(super) fn json(w: &mut JsonWriter, s: &Snapshot) {
    if s.loops.is_empty() && s.offsets.samples.is_empty() && s.offsets.dropped == 0 {
        return;
    }
    w.key("loops");
    w.begin_array();
    for l in hottest(s) {
        let f = &s.functions[l.function as usize];
        w.begin_object();
        function_fields(w, s, f);
        w.uint_field("header", l.header);
        w.uint_field("start", l.start);
        w.uint_field("end", l.end);
        w.uint_field("depth", l.depth as u64);
        w.uint_field("samples", l.samples);
        w.uint_field("self_samples", l.self_samples);
        w.key("function_share");
        w.float(share(l.samples, f.samples) / 100.0);
        w.key("process_share");
        w.float(share(l.samples, s.samples_total) / 100.0);
        if let Some(src) = &l.source {
            w.string_field("file", &src.file);
            w.uint_field("line", src.line as u64);
        }
        match l.count {
            Some(
                c @ LoopCount::Counted {
                    entries,
                    back,
                    top_exits,
                },
            ) => {
                let it = c.iterations().unwrap_or(0);
                w.uint_field("executions", entries);
                w.uint_field("iterations", it);
                w.key("iterations_per_execution");
                w.float(per_execution(it, entries));
                w.uint_field("branches_back", back);
                w.uint_field("top_exits", top_exits);
            }
            Some(LoopCount::Refused(why)) => w.string_field("not_counted", why.name()),
            None => {}
        }
        w.end_object();
    }
    w.end_array();
    w.uint_field("offsets_dropped", s.offsets.dropped);
}

#[cfg(test)]
mod tests {
    use crate::report::tests::snap;
    use rtprof_abi::loops::LoopStats;
    use rtprof_abi::reader::SourceLine;

    #[test]
    fn hottest_loops_first_with_their_shares() {
        let mut s = snap();
        s.samples_total = 100;
        s.functions[0].samples = 80;
        let l = |start, samples, source: Option<SourceLine>| LoopStats {
            function: 0,
            header: start,
            start,
            end: start + 0x20,
            depth: 1,
            samples,
            self_samples: samples,
            source,
            count: None,
        };
        let src = SourceLine {
            file: "x.c".into(),
            line: 12,
        };
        s.loops = vec![l(0x100, 20, None), l(0x200, 40, Some(src))];
        let mut out = String::new();
        super::text(&mut out, &s, 10);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].contains("hot loops"), "{out}");
        assert!(
            lines[2].contains("40.0%") && lines[2].contains("50.0%"),
            "{out}"
        );
        assert!(lines[2].contains("x.c:12 (0x200-0x220)"), "{out}");
        assert!(
            lines[3].contains("0x100-0x120") && lines[3].contains("25.0%"),
            "{out}"
        );
        let mut w = crate::json::JsonWriter::default();
        w.begin_object();
        super::json(&mut w, &s);
        w.end_object();
        let j = w.finish();
        assert!(
            j.contains(r#""start":512,"end":544,"depth":1,"samples":40"#),
            "{j}"
        );
        assert!(j.contains(r#""file":"x.c","line":12"#), "{j}");
    }

    #[test]
    fn counted_loops_show_executions_and_iterations() {
        use rtprof_abi::loops::{LoopCount, LoopRefusal};
        let mut s = snap();
        let l = |header, count| LoopStats {
            function: 0,
            header,
            start: header,
            end: header + 0x10,
            depth: 1,
            samples: 0,
            self_samples: 0,
            source: None,
            count: Some(count),
        };
        s.loops = vec![
            l(0x300, LoopCount::Refused(LoopRefusal::ShortLatch)),
            l(
                0x100,
                LoopCount::Counted {
                    entries: 8,
                    back: 7992,
                    top_exits: 0,
                },
            ),
        ];
        let mut out = String::new();
        super::text(&mut out, &s, 10);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].contains("loops counted exactly"), "{out}");
        assert!(
            lines[2].contains("8") && lines[2].contains("8000") && lines[2].contains("1000.0"),
            "{out}"
        );
        assert!(lines[3].contains("not counted: short_latch"), "{out}");
        assert!(!out.contains("hot loops"), "{out}");
        let mut out = String::new();
        super::text(&mut out, &s, 1);
        assert!(
            out.contains("1000.0") && !out.contains("short_latch"),
            "{out}"
        );
        assert!(out.contains("... and 1 more"), "{out}");
        let mut w = crate::json::JsonWriter::default();
        w.begin_object();
        super::json(&mut w, &s);
        w.end_object();
        let j = w.finish();
        assert!(
            j.contains(r#""executions":8,"iterations":8000,"iterations_per_execution":1000"#),
            "{j}"
        );
        assert!(j.contains(r#""not_counted":"short_latch""#), "{j}");
    }
}
