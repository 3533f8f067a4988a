//! Human-readable and JSON reports built from snapshots. Shared by the agent
//! (`RTPROF_REPORT`) and `rtprof run`, so both print the same thing.

mod events;
mod loops;

use crate::json::JsonWriter;
use crate::names;
use rtprof_abi::escape::escape_text;
use rtprof_abi::layout::{function_flags, state};
use rtprof_abi::reader::{Frame, SourceLine};
use rtprof_abi::{FunctionStats, Snapshot, ThreadCalls};
use std::borrow::Cow;
use std::fmt::Write as _;

/// Order of the function rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Sort {
    /// Estimated CPU time (samples x period), then calls.
    #[default]
    Time,
    Calls,
    Samples,
}

#[derive(Clone, Copy, Debug)]
pub struct TextOptions {
    /// Rows shown per process (0 = all with calls or samples).
    pub top: usize,
    /// Per-module patch statistics with refusal reasons.
    pub stats: bool,
    pub sort: Sort,
    /// One row for a function and the copies a compiler made of it
    /// (`.constprop.N`, `.cold`, ...); `false` shows each apart.
    pub merge_copies: bool,
    /// Each thread's calls after the process's rows.
    pub threads: bool,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions {
            top: 25,
            stats: false,
            sort: Sort::Time,
            merge_copies: true,
            threads: false,
        }
    }
}

/// One line of a report: a function, or the samples of a module (or of no
/// module) that fell outside every known function.
#[derive(Clone, Debug, PartialEq)]
pub struct Row<'a> {
    /// Function name, `[module]` or `[unknown]`.
    pub name: std::borrow::Cow<'a, str>,
    pub module: &'a str,
    /// `None` where calls are not counted (not instrumented, or a bucket).
    pub calls: Option<u64>,
    pub samples: u64,
    /// Where the function is defined, where known.
    pub source: Option<&'a SourceLine>,
}

impl Row<'_> {
    /// Estimated self time in nanoseconds.
    pub fn time_ns(&self, s: &Snapshot) -> u64 {
        self.samples.saturating_mul(s.sample_period_ns)
    }
    /// Estimated time per call in nanoseconds.
    pub fn ns_per_call(&self, s: &Snapshot) -> Option<f64> {
        match self.calls {
            Some(c) if c > 0 && self.samples > 0 && s.sample_period_ns > 0 => {
                Some(self.time_ns(s) as f64 / c as f64)
            }
            _ => None,
        }
    }
    /// Share of the process's samples, in percent.
    pub fn share(&self, s: &Snapshot) -> f64 {
        if s.samples_total == 0 {
            0.0
        } else {
            100.0 * self.samples as f64 / s.samples_total as f64
        }
    }
}

/// An estimate's bound (hundredths of a percent) as text: `0.5%`.
pub fn bound_text(b: u16) -> String {
    format!("{}%", b as f64 / 100.0)
}

/// A row's mark for an estimate with bound `b`.
fn estimate_mark(b: u16) -> String {
    if b == function_flags::AT_LEAST {
        "[at least: counted in bursts]".to_string()
    } else {
        format!("[estimated ±{}]", bound_text(b))
    }
}

/// An estimate's bound in calls, for `calls` estimated.
pub fn bound_calls(calls: u64, b: u16) -> u64 {
    (calls as u128 * b as u128).div_ceil(10_000) as u64
}

/// One report row's functions: a function and, merged, its copies.
struct Merged<'a> {
    name: Cow<'a, str>,
    module: u32,
    copies: usize,
    calls: Option<u64>,
    samples: u64,
    counting_off: bool,
    estimated: Option<u16>,
    trapped: bool,
    source: Option<&'a SourceLine>,
}

/// The called or sampled functions, demangled; with `merge`, a function's
/// copies and parts in one entry with it (in the same module).
fn merged(s: &Snapshot, merge: bool) -> Vec<Merged<'_>> {
    let mut v: Vec<Merged> = Vec::new();
    let mut at: std::collections::HashMap<(u32, Cow<str>), usize> = Default::default();
    for f in s.functions.iter().filter(|f| f.calls > 0 || f.samples > 0) {
        let name = if merge {
            names::function(&f.name)
        } else {
            names::readable(&f.name)
        };
        let one = Merged {
            name: name.clone(),
            module: f.module,
            copies: 1,
            calls: f.instrumented.then_some(f.calls),
            samples: f.samples,
            counting_off: f.counting_off,
            estimated: f.estimated,
            trapped: f.trapped,
            source: f.source.as_ref(),
        };
        match merge.then(|| at.get(&(f.module, name.clone()))).flatten() {
            Some(&i) => {
                let m = &mut v[i];
                m.copies += 1;
                m.calls = match (m.calls, one.calls) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                };
                m.samples += one.samples;
                m.counting_off |= one.counting_off;
                m.estimated = m.estimated.max(one.estimated);
                m.trapped |= one.trapped;
                m.source = m.source.or(one.source);
            }
            None => {
                at.insert((f.module, name), v.len());
                v.push(one);
            }
        }
    }
    v
}

/// Every function that was called or sampled, plus sample buckets, sorted;
/// with `merge_copies`, a function's copies count in its row.
pub fn rows(s: &Snapshot, sort: Sort, merge_copies: bool) -> Vec<Row<'_>> {
    let mut v: Vec<Row> = merged(s, merge_copies)
        .into_iter()
        .map(|f| {
            let copies = match f.copies {
                1 => String::new(),
                2 => " [+1 copy]".to_string(),
                n => format!(" [+{} copies]", n - 1),
            };
            Row {
                // Its calls stopped being counted at some point: say so.
                name: match (f.counting_off, f.estimated, copies.is_empty()) {
                    (true, _, _) => format!("{}{copies} [counting off]", f.name).into(),
                    (false, Some(b), _) => {
                        format!("{}{copies} {}", f.name, estimate_mark(b)).into()
                    }
                    // Exact, but each call cost a trap.
                    (false, None, _) if f.trapped => format!("{}{copies} [trap]", f.name).into(),
                    (false, None, true) => f.name,
                    (false, None, false) => format!("{}{copies}", f.name).into(),
                },
                module: module_name(s, f.module),
                calls: f.calls,
                samples: f.samples,
                source: f.source,
            }
        })
        .collect();
    for m in s.modules.iter().filter(|m| m.samples > 0) {
        v.push(Row {
            name: format!("[{}]", m.name()).into(),
            module: m.name(),
            calls: None,
            samples: m.samples,
            source: None,
        });
    }
    if s.samples_unknown > 0 {
        v.push(Row {
            name: "[unknown]".into(),
            module: "?",
            calls: None,
            samples: s.samples_unknown,
            source: None,
        });
    }
    let calls = |r: &Row| r.calls.unwrap_or(0);
    v.sort_by(|a, b| {
        let primary = match sort {
            Sort::Time | Sort::Samples => b.samples.cmp(&a.samples).then(calls(b).cmp(&calls(a))),
            Sort::Calls => calls(b).cmp(&calls(a)).then(b.samples.cmp(&a.samples)),
        };
        primary.then(a.name.cmp(&b.name))
    });
    v
}

/// Which functions a JSON report lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Listing {
    /// Those called or sampled or switched off (`"counting": "off"`: their
    /// calls are not known), and any other that something listed names
    /// (a caller frame of a stack, an exact caller, a thread's, a loop's
    /// or an event's function): a process loading large libraries has tens
    /// of thousands of functions, nearly all never called.
    #[default]
    Used,
    /// Every function of every instrumented module, called or not, and of
    /// the others those sampled or named (`--all-functions`).
    All,
}

/// For each function slot of `s`, whether `listing` lists it.
pub fn listed(s: &Snapshot, listing: Listing) -> Vec<bool> {
    let mut keep: Vec<bool> = s
        .functions
        .iter()
        .map(|f| match listing {
            // A function switched off may have been called uncounted.
            Listing::Used => {
                f.calls > 0
                    || f.samples > 0
                    || f.counting_off
                    || f.offered
                    || f.implementation.is_some()
            }
            Listing::All => f.instrumented || f.samples > 0,
        })
        .collect();
    let mut mark = |slot: u32| {
        if let Some(k) = keep.get_mut(slot as usize) {
            *k = true;
        }
    };
    for st in &s.stacks.stacks {
        for &f in &st.frames {
            if let Frame::Function(slot) = f {
                mark(slot);
            }
        }
    }
    for e in &s.callers.edges {
        mark(e.callee);
        if let Frame::Function(slot) = e.caller {
            mark(slot);
        }
    }
    for t in &s.threads.threads {
        for &(slot, _) in t.calls.iter().chain(&t.function_samples) {
            mark(slot);
        }
    }
    for l in &s.loops {
        mark(l.function);
    }
    for e in &s.events.events {
        for &(slot, _) in &e.functions {
            mark(slot);
        }
    }
    keep
}

/// Per module of `s`: its functions that `keep` lists, and those it
/// leaves out.
fn module_listing(s: &Snapshot, keep: &[bool]) -> Vec<(u32, u32)> {
    let mut v = vec![(0u32, 0u32); s.modules.len()];
    for (f, &k) in s.functions.iter().zip(keep) {
        if let Some(m) = v.get_mut(f.module as usize) {
            if k {
                m.0 += 1;
            } else {
                m.1 += 1;
            }
        }
    }
    v
}

/// Functions with their slots, ordered by calls (then samples, then
/// name), most called first.
pub fn by_calls(s: &Snapshot) -> Vec<(u32, &FunctionStats)> {
    let mut v: Vec<(u32, &FunctionStats)> = (0..).zip(&s.functions).collect();
    v.sort_by(|(_, a), (_, b)| {
        b.calls
            .cmp(&a.calls)
            .then(b.samples.cmp(&a.samples))
            .then(a.name.cmp(&b.name))
    });
    v
}

fn module_name(s: &Snapshot, idx: u32) -> &str {
    s.modules.get(idx as usize).map_or("?", |m| m.name())
}

/// A function's `name`, readable `function` and `module` fields, in the
/// JSON object being written.
fn function_fields(w: &mut JsonWriter, s: &Snapshot, f: &FunctionStats) {
    w.string_field("name", &f.name);
    w.string_field("function", &names::function(&f.name));
    w.string_field("module", module_name(s, f.module));
}

/// How the process (image) ended: "exit", "exec" or "abrupt" (a signal,
/// `_exit`, or death during start-up); or how its profile did:
/// "detached" (`rtprof detach`, the process runs on).
pub fn ending(s: &Snapshot) -> &'static str {
    match s.state {
        state::EXITED => "exit",
        state::DETACHED => "detached",
        _ if s.replaced_by_exec => "exec",
        _ => "abrupt",
    }
}

fn state_text(s: &Snapshot) -> String {
    match (ending(s), s.state) {
        ("exit", _) => format!("exited with status {}", s.exit_status),
        ("exec", _) => "replaced itself (exec)".to_string(),
        (_, state::RUNNING) => "ended without running exit handlers".to_string(),
        ("detached", _) => "detached, still running".to_string(),
        _ => "ended during start-up".to_string(),
    }
}

fn duration_s(s: &Snapshot) -> Option<f64> {
    (s.end_ns > s.start_ns).then(|| (s.end_ns - s.start_ns) as f64 / 1e9)
}

/// A thread's functions, most calls first (then by slot).
/// A thread's functions as (slot, calls, samples): those it called or was
/// sampled in, most calls first, then most samples.
fn thread_rows(t: &ThreadCalls) -> Vec<(u32, u64, u64)> {
    let mut rows: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
    for &(slot, calls) in &t.calls {
        let r = rows.entry(slot).or_default();
        r.0 = r.0.saturating_add(calls);
    }
    for &(slot, samples) in &t.function_samples {
        let r = rows.entry(slot).or_default();
        r.1 = r.1.saturating_add(samples);
    }
    let mut rows: Vec<(u32, u64, u64)> = rows.into_iter().map(|(s, (c, n))| (s, c, n)).collect();
    rows.sort_by_key(|&(slot, calls, samples)| {
        (std::cmp::Reverse(calls), std::cmp::Reverse(samples), slot)
    });
    rows
}

/// Each thread's calls: a line per thread, its functions with the most
/// calls under it (`top` of them, 0: all).
fn threads_text(out: &mut String, s: &Snapshot, top: usize) {
    let th = &s.threads;
    if th.threads.is_empty() {
        out.push_str("  threads: none recorded\n");
        return;
    }
    let _ = writeln!(out, "  threads ({}):", th.threads.len());
    for t in &th.threads {
        let _ = writeln!(
            out,
            "    tid {} {:?}{}: {} calls, {:.1} ms of {} ({} samples)",
            t.tid,
            escape_text(&t.name),
            if t.ended { " (ended)" } else { "" },
            t.total(),
            t.samples.saturating_mul(s.sample_period_ns) as f64 / 1e6,
            sampled_time(s),
            t.samples
        );
        let rows = thread_rows(t);
        let shown = if top == 0 {
            rows.len()
        } else {
            top.min(rows.len())
        };
        for &(slot, calls, samples) in &rows[..shown] {
            let f = &s.functions[slot as usize];
            let _ = writeln!(
                out,
                "      {calls:>12} calls {samples:>8} samples  {}",
                escape_text(&names::function(&f.name))
            );
        }
        if shown < rows.len() {
            let _ = writeln!(out, "      ... {} more", rows.len() - shown);
        }
    }
    if th.dropped > 0 {
        let _ = writeln!(
            out,
            "    {} more threads ended past the kept number: in the totals only",
            th.dropped
        );
    }
}

/// The text report: per process, its heading, its rows and what was
/// patched, then the sections its profile has (call stacks, exact
/// callers, threads, loops, events) and, with `opts.stats`, its modules.
pub fn text(procs: &[Snapshot], opts: TextOptions) -> String {
    let mut out = String::new();
    for s in procs {
        heading_text(&mut out, s);
        rows_text(&mut out, s, opts);
        let listing = patched_text(&mut out, s);
        if !s.stacks.stacks.is_empty() {
            call_graph_text(&mut out, s);
        }
        if !s.callers.edges.is_empty() {
            callers_text(&mut out, s);
        }
        if opts.threads {
            threads_text(&mut out, s, opts.top.min(10));
        }
        loops::text(&mut out, s, opts.top.min(10));
        events::text(&mut out, s, opts.top.min(10));
        if opts.stats {
            module_stats_text(&mut out, s, &listing);
        }
    }
    out
}

/// A process's first lines: which process, how it ended and after how
/// long, its sampler, and what rtprof cost it where that was measured.
fn heading_text(out: &mut String, s: &Snapshot) {
    let _ = write!(
        out,
        "rtprof: pid {} (parent {}) {}: {}",
        s.pid,
        s.ppid,
        escape_text(&s.exe),
        state_text(s)
    );
    if let Some(d) = duration_s(s) {
        let _ = write!(out, ", {d:.3} s");
    }
    out.push('\n');
    let _ = writeln!(out, "  sampler: {}", sampler_text(s));
    if let Some(c) = cost_text(s) {
        let _ = writeln!(out, "  rtprof's cost: {c}");
    }
}

/// The table of rows in `opts.sort` order, `opts.top` of them (0: all),
/// saying how many more there are.
fn rows_text(out: &mut String, s: &Snapshot, opts: TextOptions) {
    let rows = rows(s, opts.sort, opts.merge_copies);
    let shown = if opts.top == 0 {
        rows.len()
    } else {
        opts.top.min(rows.len())
    };
    if rows.is_empty() {
        out.push_str("  no instrumented function was called and nothing was sampled\n");
        return;
    }
    let _ = writeln!(
        out,
        "  {:>14}  {:>8}  {:>10}  {:>6}  {:>10}  {:<40}  module",
        "calls", "samples", "time ms", "share", "ns/call", "function"
    );
    for r in &rows[..shown] {
        row_text(out, s, r);
    }
    if shown < rows.len() {
        let _ = writeln!(
            out,
            "  ... {} more rows (--top 0 shows all)",
            rows.len() - shown
        );
    }
}

/// One line of the table: `-` for what is not known (calls not counted,
/// no time per call), the source line where known.
fn row_text(out: &mut String, s: &Snapshot, r: &Row) {
    let calls = r.calls.map_or("-".to_string(), |c| c.to_string());
    let per_call = r
        .ns_per_call(s)
        .map_or("-".to_string(), |n| format!("{n:.1}"));
    let _ = write!(
        out,
        "  {:>14}  {:>8}  {:>10.1}  {:>5.1}%  {:>10}  {:<40}  {}",
        calls,
        r.samples,
        r.time_ns(s) as f64 / 1e6,
        r.share(s),
        per_call,
        escape_text(&r.name),
        escape_text(r.module)
    );
    if let Some(at) = r.source {
        let _ = write!(out, "  {}:{}", escape_text(&at.file), at.line);
    }
    out.push('\n');
}

/// How many functions of the instrumented modules were patched (and how
/// many through traps), and how many were left out of the rows for having
/// no call and no sample. Returns per module its functions (listed, left
/// out) by the rows, for `module_stats_text`.
fn patched_text(out: &mut String, s: &Snapshot) -> Vec<(u32, u32)> {
    let instrumented = || s.modules.iter().filter(|m| !m.sampled_only);
    let total: u32 = instrumented().map(|m| m.functions).sum();
    let patched: u32 = instrumented().map(|m| m.patched).sum();
    let trapped = s.functions.iter().filter(|f| f.trapped).count();
    let _ = writeln!(
        out,
        "  patched {patched} of {total} functions ({:.1}%) in {} module(s){}",
        percent(patched, total),
        instrumented().count(),
        match trapped {
            0 => String::new(),
            n => format!(", {n} through a trap (a signal per call)"),
        }
    );
    // Text rows are the called and sampled functions alone.
    let used: Vec<bool> = s
        .functions
        .iter()
        .map(|f| f.calls > 0 || f.samples > 0)
        .collect();
    let idle = module_listing(s, &used);
    let left_out: u32 = idle.iter().map(|m| m.1).sum();
    if left_out > 0 {
        let _ = writeln!(
            out,
            "  {left_out} of {} functions had no call and no sample: not listed",
            s.functions.len()
        );
    }
    idle
}

/// `--stats`: per instrumented module its patch statistics and refusal
/// reasons, with `listing`'s count of functions not listed; then the
/// modules not instrumented that say why.
fn module_stats_text(out: &mut String, s: &Snapshot, listing: &[(u32, u32)]) {
    let instrumented = s
        .modules
        .iter()
        .zip(listing)
        .filter(|(m, _)| !m.sampled_only);
    for (m, (_, left_out)) in instrumented {
        let _ = write!(
            out,
            "    {}: {} functions, {} patched ({:.1}%), {left_out} not listed",
            escape_text(&m.path),
            m.functions,
            m.patched,
            percent(m.patched, m.functions)
        );
        if !m.refused.is_empty() {
            out.push_str(", refused:");
            for (r, n) in &m.refused {
                let _ = write!(out, " {r} {n}");
            }
        }
        if let Some(note) = m.note {
            let _ = write!(out, " ({note})");
        }
        out.push('\n');
    }
    for m in s.modules.iter().filter(|m| m.sampled_only) {
        if let Some(note) = m.note {
            let _ = writeln!(
                out,
                "    {}: not instrumented: {note}",
                escape_text(&m.path)
            );
        }
    }
}

/// Each called function's exact callers by readable name, most calls
/// first.
fn callers_by_callee(s: &Snapshot) -> std::collections::HashMap<u32, Vec<(Cow<'_, str>, u64)>> {
    use std::collections::HashMap;
    let mut by: HashMap<u32, HashMap<Cow<str>, u64>> = HashMap::new();
    for e in &s.callers.edges {
        *by.entry(e.callee)
            .or_default()
            .entry(frame_name(s, e.caller))
            .or_default() += e.calls;
    }
    by.into_iter()
        .map(|(callee, from)| {
            let mut v: Vec<(Cow<str>, u64)> = from.into_iter().collect();
            v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            (callee, v)
        })
        .collect()
}

/// The most called functions' exact callers.
fn callers_text(out: &mut String, s: &Snapshot) {
    let by = callers_by_callee(s);
    let mut top: Vec<(&u32, u64)> = by
        .iter()
        .map(|(c, from)| (c, from.iter().map(|f| f.1).sum()))
        .collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let _ = write!(out, "  exact callers of the most called functions");
    if s.callers.dropped > 0 {
        let _ = write!(out, " ({} calls not kept)", s.callers.dropped);
    }
    out.push_str(":\n");
    for (callee, total) in top.into_iter().take(5) {
        let name = frame_name(s, Frame::Function(*callee));
        let from: Vec<String> = by[callee]
            .iter()
            .take(4)
            .map(|(n, k)| format!("{} {k}", escape_text(n)))
            .collect();
        let _ = writeln!(
            out,
            "    {:>12}  {}  <- {}",
            total,
            escape_text(&name),
            from.join(", ")
        );
    }
}

/// The readable name of a stack frame: its function's (copies merged), or
/// `[module]`, or `[unknown]`.
pub fn frame_name(s: &Snapshot, f: Frame) -> Cow<'_, str> {
    match f {
        Frame::Function(slot) => s
            .functions
            .get(slot as usize)
            .map_or(Cow::Borrowed("[unknown]"), |f| names::function(&f.name)),
        Frame::Module(i) => Cow::Owned(format!("[{}]", module_name(s, i))),
        Frame::Unknown => Cow::Borrowed("[unknown]"),
    }
}

/// Callers and callees of the functions most present in the sampled
/// stacks, by share of the samples they were in.
fn call_graph_text(out: &mut String, s: &Snapshot) {
    use std::collections::HashMap;
    let total: u64 = s.stacks.stacks.iter().map(|st| st.samples).sum();
    if total == 0 {
        return;
    }
    let mut inclusive: HashMap<Cow<str>, u64> = HashMap::new();
    let mut callers: HashMap<Cow<str>, HashMap<Cow<str>, u64>> = HashMap::new();
    let mut callees: HashMap<Cow<str>, HashMap<Cow<str>, u64>> = HashMap::new();
    for st in &s.stacks.stacks {
        let names: Vec<Cow<str>> = st.frames.iter().map(|&f| frame_name(s, f)).collect();
        let mut seen: Vec<&Cow<str>> = Vec::new();
        for (i, n) in names.iter().enumerate() {
            // Recursion: a function counts once per stack.
            if !seen.contains(&n) {
                seen.push(n);
                *inclusive.entry(n.clone()).or_default() += st.samples;
            }
            if let Some(caller) = names.get(i + 1) {
                *callers
                    .entry(n.clone())
                    .or_default()
                    .entry(caller.clone())
                    .or_default() += st.samples;
                *callees
                    .entry(caller.clone())
                    .or_default()
                    .entry(n.clone())
                    .or_default() += st.samples;
            }
        }
    }
    let mut top: Vec<(&Cow<str>, &u64)> = inclusive
        .iter()
        .filter(|(n, _)| !n.starts_with('['))
        .collect();
    top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let shares = |m: Option<&HashMap<Cow<str>, u64>>, of: u64| {
        let mut v: Vec<(&Cow<str>, &u64)> = m.map(|m| m.iter().collect()).unwrap_or_default();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        v.iter()
            .take(4)
            .map(|(n, k)| format!("{} {:.0}%", escape_text(n), 100.0 * **k as f64 / of as f64))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        out,
        "  call stacks: {total} samples in {} stacks{}; functions by share of them, <- callers, -> callees:",
        s.stacks.stacks.len(),
        match (s.stacks.truncated, s.stacks.dropped) {
            (0, 0) => String::new(),
            (t, d) => format!(" ({t} cut at 32 frames, {d} not kept)"),
        }
    );
    for (name, n) in top.into_iter().take(5) {
        let _ = write!(
            out,
            "    {:>5.1}%  {}",
            100.0 * *n as f64 / total as f64,
            escape_text(name)
        );
        let from = shares(callers.get(name), *n);
        if !from.is_empty() {
            let _ = write!(out, "  <- {from}");
        }
        let to = shares(callees.get(name), *n);
        if !to.is_empty() {
            let _ = write!(out, "  -> {to}");
        }
        out.push('\n');
    }
}

/// What the agent cost the process, as it measured it: "0.42% of its CPU
/// time: set-up 1.2 ms, counting 3.1 ms (as sampled: 3 samples in
/// stubs), sampling 0.4 ms, budget 0.1 ms, threads held 0.2 ms".
fn cost_text(s: &Snapshot) -> Option<String> {
    let c = s.cost?;
    let ms = |ns: u64| ns as f64 / 1e6;
    let mut t = String::new();
    if let Some(share) = cost_share(s) {
        let _ = write!(t, "{:.2}% of its CPU time: ", share * 100.0);
    }
    let _ = write!(t, "set-up {:.1} ms", ms(s.setup_ns));
    if s.sample_period_ns > 0 {
        let _ = write!(
            t,
            ", counting {:.1} ms (as sampled: {} in stubs)",
            ms(c.counting_ns(s.sample_period_ns)),
            c.in_stubs
        );
    } else {
        t.push_str(", counting not measured (sampling off)");
    }
    for (what, ns) in [
        ("sampling", c.sampling_ns),
        ("budget", c.budget_ns),
        ("threads held", c.held_ns),
        ("attach control", c.control_ns),
    ] {
        if ns > 0 {
            let _ = write!(t, ", {what} {:.1} ms", ms(ns));
        }
    }
    Some(t)
}

/// The agent's measured cost as a share of the process's CPU time.
fn cost_share(s: &Snapshot) -> Option<f64> {
    let c = s.cost?;
    let total = s.setup_ns.saturating_add(c.running_ns(s.sample_period_ns));
    (c.process_cpu_ns > 0).then(|| total as f64 / c.process_cpu_ns as f64)
}

/// "timer (default), 1000 Hz, 2301 samples (3 lost), 2.301 s of CPU": the
/// timers count CPU time, system calls too; the perf sampler user time.
pub fn sampler_text(s: &Snapshot) -> String {
    let d = rtprof_abi::sampling::Described {
        sampler: s.sampler,
        why: s.sampler_why,
        errno: s.sampler_errno,
    };
    if s.sampler == rtprof_abi::sampling::Sampler::Off || s.sample_period_ns == 0 {
        return d.to_string();
    }
    let mut t = format!(
        "{d}, {} Hz, {} samples",
        1_000_000_000 / s.sample_period_ns,
        s.samples_total
    );
    if s.samples_lost > 0 {
        let _ = write!(t, " ({} lost)", s.samples_lost);
    }
    let _ = write!(
        t,
        ", {:.3} s of {}",
        s.samples_total as f64 * s.sample_period_ns as f64 / 1e9,
        sampled_time(s)
    );
    t
}

/// What a sampling period is of: the perf sampler's events exclude the
/// kernel; the timers run on each thread's CPU clock, system calls too.
fn sampled_time(s: &Snapshot) -> &'static str {
    match s.sampler {
        rtprof_abi::sampling::Sampler::Timer => "CPU",
        _ => "user CPU",
    }
}

fn percent(a: u32, b: u32) -> f64 {
    if b == 0 {
        0.0
    } else {
        100.0 * a as f64 / b as f64
    }
}

/// The JSON report: `{"processes": [...]}`, with the functions `listing`
/// names; each module says how many of its functions were left out.
pub fn json(procs: &[Snapshot], listing: Listing) -> String {
    let mut w = JsonWriter::new();
    w.begin_object();
    w.key("tool");
    w.string("rtprof");
    w.key("version");
    w.string(env!("CARGO_PKG_VERSION"));
    w.key("processes");
    w.begin_array();
    for s in procs {
        process_json(&mut w, s, listing);
    }
    w.end_array();
    w.end_object();
    w.finish()
}

/// One process's object: who it was, what rtprof cost it, its sampler,
/// then its functions and the sections its profile has, its modules last.
fn process_json(w: &mut JsonWriter, s: &Snapshot, listing: Listing) {
    w.begin_object();
    w.key("pid");
    w.uint(s.pid as u64);
    w.key("ppid");
    w.uint(s.ppid as u64);
    w.string_field("exe", &s.exe);
    w.key("exited");
    w.bool(s.state == state::EXITED);
    w.string_field("ended", ending(s));
    w.key("exit_status");
    w.int(s.exit_status as i64);
    w.uint_field("start_ns", s.start_ns);
    w.uint_field("end_ns", s.end_ns);
    w.uint_field("setup_ns", s.setup_ns);
    cost_json(w, s);
    w.uint_field("stripes", s.stripes as u64);
    sampler_json(w, s);
    let keep = listed(s, listing);
    functions_json(w, s, &keep);
    stacks_json(w, s);
    threads_json(w, s);
    loops::json(w, s);
    events::json(w, s);
    modules_json(w, s, &keep);
    w.end_object();
}

/// `rtprof_cost`: what the agent cost the process, as it measured it
/// (counting only where the sampler could see it); nothing if it did not.
fn cost_json(w: &mut JsonWriter, s: &Snapshot) {
    let Some(c) = s.cost else {
        return;
    };
    w.key("rtprof_cost");
    w.begin_object();
    w.uint_field("process_cpu_ns", c.process_cpu_ns);
    w.uint_field("setup_ns", s.setup_ns);
    if s.sample_period_ns > 0 {
        w.uint_field("counting_ns", c.counting_ns(s.sample_period_ns));
    }
    w.uint_field("samples_in_stubs", c.in_stubs);
    w.uint_field("sampling_ns", c.sampling_ns);
    w.uint_field("budget_ns", c.budget_ns);
    w.uint_field("held_ns", c.held_ns);
    w.uint_field("control_ns", c.control_ns);
    if let Some(share) = cost_share(s) {
        w.key("share");
        w.float(share);
    }
    w.end_object();
}

/// `sampler`: which sampler ran and why, its period and samples.
fn sampler_json(w: &mut JsonWriter, s: &Snapshot) {
    w.key("sampler");
    w.begin_object();
    w.string_field("name", s.sampler.name());
    w.string_field("why", s.sampler_why.name());
    w.uint_field("errno", s.sampler_errno as u64);
    w.uint_field("period_ns", s.sample_period_ns);
    // What a period is of, for either sampler.
    w.string_field("time", sampled_time(s));
    w.uint_field("samples", s.samples_total);
    w.uint_field("lost", s.samples_lost);
    w.uint_field("unknown", s.samples_unknown);
    w.end_object();
}

/// `functions`: those `keep` lists, most called first, each with its exact
/// callers where they were counted.
fn functions_json(w: &mut JsonWriter, s: &Snapshot, keep: &[bool]) {
    let callers_of = callers_by_callee(s);
    w.key("functions");
    w.begin_array();
    for (slot, f) in by_calls(s)
        .into_iter()
        .filter(|&(slot, _)| keep[slot as usize])
    {
        function_json(w, s, f, callers_of.get(&slot).map(Vec::as_slice));
    }
    w.end_array();
}

/// One function's object: its names, counts and place, its source line
/// and exact callers where known, then how its calls were counted.
fn function_json(
    w: &mut JsonWriter,
    s: &Snapshot,
    f: &FunctionStats,
    callers: Option<&[(Cow<str>, u64)]>,
) {
    w.begin_object();
    // The symbol as the file names it; readable names beside it.
    w.key("name");
    w.string(&f.name);
    w.key("demangled");
    w.string(&names::readable(&f.name));
    w.key("function");
    w.string(&names::function(&f.name));
    w.key("module");
    w.string(module_name(s, f.module));
    w.key("calls");
    w.uint(f.calls);
    w.key("samples");
    w.uint(f.samples);
    w.key("time_ns");
    w.uint(f.samples.saturating_mul(s.sample_period_ns));
    w.key("instrumented");
    w.bool(f.instrumented);
    w.key("vaddr");
    w.uint(f.vaddr);
    w.key("size");
    w.uint(f.size as u64);
    w.key("patched");
    w.bool(f.instrumented && f.refused.is_none());
    if let Some(at) = &f.source {
        w.string_field("file", &at.file);
        w.uint_field("line", at.line as u64);
    }
    if let Some(from) = callers {
        // Exact callers (RTPROF_CALLERS=1), most calls first.
        w.key("callers");
        w.begin_array();
        for (name, n) in from {
            w.begin_object();
            w.string_field("function", name);
            w.uint_field("calls", *n);
            w.end_object();
        }
        w.end_array();
    }
    counting_json(w, f);
    implementation_json(w, s, f);
    w.end_object();
}

/// For a function the program offered other implementations of, and for
/// those implementations' rows: which implementation the row counts, and
/// whether it runs the function's calls now.
fn implementation_json(w: &mut JsonWriter, s: &Snapshot, f: &FunctionStats) {
    let name = |slot: u32| {
        s.functions
            .get(slot as usize)
            .map_or("", |f| f.name.as_str())
    };
    match &f.implementation {
        Some(imp) => {
            w.string_field("implementation", &imp.name);
            w.string_field("implements", name(imp.of));
            w.string_field("address", &format!("{:#x}", imp.address));
            if let Some(code) = imp.code {
                // Where its samples are counted.
                w.string_field("code", name(code));
            }
        }
        None if f.offered => w.string_field("implementation", rtprof_abi::route::ORIGINAL),
        None => return,
    }
    w.key("active");
    w.bool(f.active);
}

/// How a function's calls were counted, where not plainly: switched off,
/// estimated (with its bound in calls), through a trap; or why it was not
/// patched.
fn counting_json(w: &mut JsonWriter, f: &FunctionStats) {
    if f.counting_off {
        w.key("counting");
        w.string("off");
    }
    if let Some(b) = f.estimated {
        // Counted in bursts under an overhead budget.
        w.key("estimated");
        w.bool(true);
        if b == function_flags::AT_LEAST {
            // Too uncertain between bursts: the calls counted.
            w.key("at_least");
            w.bool(true);
        } else {
            w.key("error_bound");
            w.uint(bound_calls(f.calls, b));
        }
    }
    if f.trapped {
        // Entered through a trap (RTPROF_TRAPS=1).
        w.key("entry");
        w.string("trap");
    }
    if let Some(r) = f.refused {
        w.key("refused");
        w.string(r.name());
    }
}

/// `stacks`: the sampled call stacks, leaf first, by readable function
/// name, and how many samples' stacks were cut or not kept (nothing if no
/// stack was recorded).
fn stacks_json(w: &mut JsonWriter, s: &Snapshot) {
    if s.stacks.stacks.is_empty() {
        return;
    }
    w.key("stacks");
    w.begin_array();
    for st in &s.stacks.stacks {
        w.begin_object();
        w.key("frames");
        w.begin_array();
        for &f in &st.frames {
            w.string(&frame_name(s, f));
        }
        w.end_array();
        w.uint_field("samples", st.samples);
        w.end_object();
    }
    w.end_array();
    w.uint_field("stacks_truncated", s.stacks.truncated);
    w.uint_field("stacks_dropped", s.stacks.dropped);
}

/// `threads`: exact calls and samples per thread, its functions with the
/// most calls first, and what was not kept (nothing if no thread was
/// recorded).
fn threads_json(w: &mut JsonWriter, s: &Snapshot) {
    if s.threads.threads.is_empty() {
        return;
    }
    w.key("threads");
    w.begin_array();
    for t in &s.threads.threads {
        w.begin_object();
        w.uint_field("tid", t.tid as u64);
        w.string_field("name", &t.name);
        w.key("ended");
        w.bool(t.ended);
        w.uint_field("calls", t.total());
        w.uint_field("samples", t.samples);
        w.uint_field("time_ns", t.samples.saturating_mul(s.sample_period_ns));
        w.key("functions");
        w.begin_array();
        for (slot, calls, samples) in thread_rows(t) {
            let f = &s.functions[slot as usize];
            w.begin_object();
            function_fields(w, s, f);
            w.uint_field("calls", calls);
            w.uint_field("samples", samples);
            w.uint_field("time_ns", samples.saturating_mul(s.sample_period_ns));
            w.end_object();
        }
        w.end_array();
        w.end_object();
    }
    w.end_array();
    w.uint_field("threads_dropped", s.threads.dropped);
    w.uint_field(
        "thread_function_samples_dropped",
        s.threads.function_samples_dropped,
    );
}

/// `modules`: each module's patch statistics and refusal reasons, and how
/// many of its functions `keep` lists and leaves out.
fn modules_json(w: &mut JsonWriter, s: &Snapshot, keep: &[bool]) {
    w.key("modules");
    w.begin_array();
    for (m, (shown, left_out)) in s.modules.iter().zip(module_listing(s, keep)) {
        w.begin_object();
        w.key("path");
        w.string(&m.path);
        w.key("functions");
        w.uint(m.functions as u64);
        // Of its functions named in the segment: those listed above,
        // and those left out (no call, no sample, named by nothing).
        w.uint_field("listed", shown as u64);
        w.uint_field("left_out", left_out as u64);
        w.key("patched");
        w.uint(m.patched as u64);
        w.key("sampled_only");
        w.bool(m.sampled_only);
        if !m.sampled_only && m.patched > 0 {
            // Where its patched code came from: a page image in the plan
            // cache, or written in this process.
            w.key("code");
            w.string(if m.code_from_image {
                "image"
            } else {
                "written"
            });
        }
        w.key("samples");
        w.uint(m.samples);
        w.key("refused");
        w.begin_object();
        for (r, n) in &m.refused {
            w.key(r.name());
            w.uint(*n as u64);
        }
        w.end_object();
        if let Some(note) = m.note {
            w.key("note");
            w.string(note);
        }
        w.end_object();
    }
    w.end_array();
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rtprof_abi::{AgentCost, ModuleStats, Refusal};

    pub(crate) fn snap() -> Snapshot {
        Snapshot {
            cost: None,
            pid: 7,
            ppid: 1,
            exe: "/bin/a\"b".into(),
            state: state::EXITED,
            exit_status: 3,
            start_ns: 0,
            end_ns: 0,
            sample_period_ns: 1_000_000,
            samples_total: 10,
            samples_lost: 0,
            samples_unknown: 1,
            sampler: rtprof_abi::sampling::Sampler::Perf,
            sampler_why: rtprof_abi::sampling::Why::Default,
            sampler_errno: 0,
            setup_ns: 0,
            replaced_by_exec: false,
            stripes: 1,
            modules: vec![ModuleStats {
                path: "/bin/a".into(),
                base: 0,
                functions: 3,
                patched: 2,
                refused: vec![(Refusal::TooSmall, 1)],
                sampled_only: false,
                code_from_image: false,
                samples: 2,
                note: None,
            }],
            functions: ["lo", "hi", "zero"]
                .iter()
                .zip([5u64, 50, 0])
                .map(|(n, c)| FunctionStats {
                    name: n.to_string(),
                    module: 0,
                    vaddr: 0,
                    size: 1,
                    refused: (*n == "zero").then_some(Refusal::TooSmall),
                    instrumented: true,
                    calls: c,
                    samples: if *n == "lo" { 7 } else { 0 },
                    counting_off: false,
                    estimated: None,
                    trapped: false,
                    offered: false,
                    active: false,
                    implementation: None,
                    source: None,
                })
                .collect(),
            stacks: Default::default(),
            callers: Default::default(),
            threads: Default::default(),
            events: Default::default(),
            offsets: Default::default(),
            loop_counts: Default::default(),
            loops: Vec::new(),
        }
    }

    #[test]
    fn text_sorts_by_calls_and_hides_uncalled() {
        let t = text(
            &[snap()],
            TextOptions {
                top: 10,
                stats: true,
                sort: Sort::Calls,
                merge_copies: true,
                threads: false,
            },
        );
        let hi = t.find(" hi ").unwrap();
        let lo = t.find(" lo ").unwrap();
        assert!(hi < lo, "{t}");
        assert!(!t.contains("zero"));
        assert!(t.contains("exited with status 3"));
        assert!(t.contains("too_small 1"));
        assert!(t.contains("patched 2 of 3"));
    }

    /// A function whose counting was switched off says so, in text and
    /// JSON.
    #[test]
    fn switched_off_functions_are_marked() {
        let mut s = snap();
        s.functions[1].counting_off = true;
        let t = text(std::slice::from_ref(&s), TextOptions::default());
        assert!(t.contains("hi [counting off]"), "{t}");
        assert!(!t.contains("lo [counting off]"), "{t}");
        let j = json(std::slice::from_ref(&s), Listing::Used);
        assert_eq!(j.matches("\"counting\":\"off\"").count(), 1, "{j}");
    }

    /// A function counted in bursts says so, with its bound, in text and
    /// JSON (the bound in calls).
    #[test]
    fn trap_entries_are_flagged() {
        let mut s = snap();
        s.functions[1].trapped = true;
        let t = text(std::slice::from_ref(&s), TextOptions::default());
        assert!(t.contains("hi [trap]"), "{t}");
        assert!(!t.contains("lo [trap]"), "{t}");
        assert!(t.contains(", 1 through a trap"), "{t}");
        let j = json(std::slice::from_ref(&s), Listing::Used);
        assert_eq!(j.matches(r#""entry":"trap""#).count(), 1, "{j}");
    }

    #[test]
    fn estimated_functions_show_their_bound() {
        let mut s = snap();
        s.functions[1].estimated = Some(250);
        let t = text(std::slice::from_ref(&s), TextOptions::default());
        assert!(t.contains("hi [estimated ±2.5%]"), "{t}");
        assert!(!t.contains("lo [estimated"), "{t}");
        let j = json(std::slice::from_ref(&s), Listing::Used);
        assert_eq!(j.matches("\"estimated\":true").count(), 1, "{j}");
        // 2.5% of 50 calls, rounded up.
        assert!(j.contains("\"error_bound\":2"), "{j}");
        // Too uncertain to estimate: the calls counted, marked, no bound.
        s.functions[1].estimated = Some(function_flags::AT_LEAST);
        let t = text(std::slice::from_ref(&s), TextOptions::default());
        assert!(t.contains("hi [at least: counted in bursts]"), "{t}");
        let j = json(std::slice::from_ref(&s), Listing::Used);
        assert!(j.contains("\"at_least\":true"), "{j}");
        assert!(!j.contains("error_bound"), "{j}");
    }

    #[test]
    fn time_order_buckets_and_derived_figures() {
        let s = snap();
        let t = text(std::slice::from_ref(&s), TextOptions::default());
        let lo = t.find(" lo ").unwrap();
        let bucket = t.find("[a]").unwrap();
        let unknown = t.find("[unknown]").unwrap();
        assert!(
            lo < bucket && bucket < unknown && t.find(" hi ").unwrap() > bucket,
            "{t}"
        );
        assert!(
            t.contains("sampler: perf (default), 1000 Hz, 10 samples"),
            "{t}"
        );
        let r = rows(&s, Sort::Time, true);
        assert_eq!(r[0].name, "lo");
        // 7 samples x 1 ms over 5 calls.
        assert_eq!(r[0].time_ns(&s), 7_000_000);
        assert_eq!(r[0].ns_per_call(&s), Some(1_400_000.0));
        assert!((r[0].share(&s) - 70.0).abs() < 1e-9);
        assert_eq!((r[1].calls, r[1].samples), (None, 2));
        assert!(t.contains("1400000.0"), "{t}");
    }

    #[test]
    fn reports_escape_every_name() {
        let mut s = snap();
        s.exe = "/bin/\x1b]0;title\x07".into();
        s.modules[0].path = "/lib/\x1b[31m.so".into();
        s.functions[0].name = "lo\x1b[2J\u{9b}H".into();
        s.threads.threads.push(ThreadCalls {
            tid: 9,
            name: "t\x1b[2J".into(),
            ended: false,
            samples: 0,
            calls: vec![(0, 1)],
            function_samples: vec![(0, 2)],
        });
        let t = text(
            &[s],
            TextOptions {
                top: 0,
                stats: true,
                sort: Sort::Time,
                merge_copies: true,
                threads: true,
            },
        );
        assert!(t.contains("tid 9 "), "{t}");
        assert!(!t.contains(['\x1b', '\x07', '\u{9b}']), "{t:?}");
        for want in [
            "/bin/\\x1b]0;title\\x07:",
            "lo\\x1b[2J\\u{9b}H ",
            "/lib/\\x1b[31m.so:",
        ] {
            assert!(t.contains(want), "{want} in {t}");
        }
    }

    /// The heading gives how long the process ran only where its end is
    /// known, and rtprof's cost only where it was measured.
    #[test]
    fn heading_gives_duration_and_cost_where_known() {
        let mut s = snap();
        let mut out = String::new();
        heading_text(&mut out, &s);
        assert_eq!(
            out,
            "rtprof: pid 7 (parent 1) /bin/a\"b: exited with status 3\n  \
             sampler: perf (default), 1000 Hz, 10 samples, 0.010 s of user CPU\n"
        );
        s.end_ns = 2_500_000_000;
        s.cost = Some(AgentCost {
            process_cpu_ns: 1_000_000_000,
            ..AgentCost::default()
        });
        let mut out = String::new();
        heading_text(&mut out, &s);
        assert!(
            out.starts_with("rtprof: pid 7 (parent 1) /bin/a\"b: exited with status 3, 2.500 s\n"),
            "{out}"
        );
        assert!(out.ends_with("\n  rtprof's cost: 0.00% of its CPU time: set-up 0.0 ms, counting 0.0 ms (as sampled: 0 in stubs)\n"), "{out}");
    }

    /// `top` cuts the table and says how many rows it left out; a process
    /// with no row says so instead of a bare header.
    #[test]
    fn rows_table_is_cut_at_top() {
        let mut s = snap();
        let mut out = String::new();
        let top = |top| TextOptions {
            top,
            ..TextOptions::default()
        };
        rows_text(&mut out, &s, top(1));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines[1].contains(" lo "), "{out}");
        assert_eq!(lines[2], "  ... 3 more rows (--top 0 shows all)");
        let mut out = String::new();
        rows_text(&mut out, &s, top(0));
        assert_eq!(out.lines().count(), 5, "{out}");
        for f in &mut s.functions {
            (f.calls, f.samples) = (0, 0);
        }
        (s.modules[0].samples, s.samples_unknown) = (0, 0);
        let mut out = String::new();
        rows_text(&mut out, &s, top(1));
        assert_eq!(
            out,
            "  no instrumented function was called and nothing was sampled\n"
        );
    }

    /// What is not known shows as `-`; the source line follows where known.
    #[test]
    fn row_line_marks_what_is_not_known() {
        let s = snap();
        let at = SourceLine {
            file: "x.c".into(),
            line: 4,
        };
        let r = Row {
            name: "[a]".into(),
            module: "a",
            calls: None,
            samples: 2,
            source: Some(&at),
        };
        let mut out = String::new();
        row_text(&mut out, &s, &r);
        assert_eq!(
            out,
            format!(
                "  {:>14}  {:>8}  {:>10}  {:>6}  {:>10}  {:<40}  a  x.c:4\n",
                "-", 2, "2.0", "20.0%", "-", "[a]"
            )
        );
    }

    /// The patched line counts functions entered through traps; the
    /// functions with no call and no sample are counted, per module too.
    #[test]
    fn patched_line_counts_traps_and_unlisted_functions() {
        let mut s = snap();
        s.functions[1].trapped = true;
        let mut out = String::new();
        assert_eq!(patched_text(&mut out, &s), [(2, 1)]);
        assert_eq!(
            out,
            "  patched 2 of 3 functions (66.7%) in 1 module(s), 1 through a trap (a signal per call)\n  \
             1 of 3 functions had no call and no sample: not listed\n"
        );
    }

    /// `--stats` lists instrumented modules with refusals and notes; a
    /// module not instrumented only where it says why.
    #[test]
    fn module_stats_say_why_a_module_is_not_instrumented() {
        let mut s = snap();
        let quiet = ModuleStats {
            path: "/lib/quiet.so".into(),
            sampled_only: true,
            code_from_image: false,
            ..s.modules[0].clone()
        };
        let vdso = ModuleStats {
            path: "vdso".into(),
            note: Some("the kernel's vDSO"),
            ..quiet.clone()
        };
        s.modules.extend([quiet, vdso]);
        let mut out = String::new();
        module_stats_text(&mut out, &s, &[(2, 1), (0, 0), (0, 0)]);
        assert_eq!(
            out,
            "    /bin/a: 3 functions, 2 patched (66.7%), 1 not listed, refused: too_small 1\n    \
             vdso: not instrumented: the kernel's vDSO\n"
        );
    }

    /// What one step writes into an object of its own (without the line
    /// end `finish` adds).
    fn object(f: impl FnOnce(&mut JsonWriter)) -> String {
        let mut w = JsonWriter::new();
        w.begin_object();
        f(&mut w);
        w.end_object();
        w.finish().trim_end().to_string()
    }

    /// No cost without its measure; counting's cost is given only where
    /// the sampler could see it, the share only where the process's CPU
    /// time is known.
    #[test]
    fn cost_json_leaves_out_what_was_not_measured() {
        let mut s = snap();
        assert_eq!(object(|w| cost_json(w, &s)), "{}");
        let c = AgentCost {
            in_stubs: 2,
            ..AgentCost::default()
        };
        (s.cost, s.sample_period_ns) = (Some(c), 0);
        let j = object(|w| cost_json(w, &s));
        assert!(!j.contains("counting_ns") && !j.contains("share"), "{j}");
        s.sample_period_ns = 1_000;
        s.cost = Some(AgentCost {
            process_cpu_ns: 4_000,
            ..c
        });
        let j = object(|w| cost_json(w, &s));
        assert!(j.contains(r#""counting_ns":2000,"#), "{j}");
        assert!(j.ends_with(r#""share":0.5}}"#), "{j}");
    }

    /// A function counted plainly adds nothing; each other way of counting
    /// says itself, an estimate with its bound in calls.
    #[test]
    fn counting_json_marks_how_calls_were_counted() {
        let mut f = snap().functions[1].clone();
        assert_eq!(object(|w| counting_json(w, &f)), "{}");
        f.counting_off = true;
        f.estimated = Some(1000);
        f.trapped = true;
        f.refused = Some(Refusal::TooSmall);
        assert_eq!(
            object(|w| counting_json(w, &f)),
            r#"{"counting":"off","estimated":true,"error_bound":5,"entry":"trap","refused":"too_small"}"#
        );
    }

    /// Sections of stacks and threads are left out without them; a
    /// thread's time is its samples', its functions most called first.
    #[test]
    fn threads_json_gives_each_threads_functions() {
        let mut s = snap();
        assert_eq!(object(|w| stacks_json(w, &s)), "{}");
        assert_eq!(object(|w| threads_json(w, &s)), "{}");
        s.threads.threads.push(ThreadCalls {
            tid: 9,
            name: "w".into(),
            ended: true,
            samples: 3,
            calls: vec![(0, 1), (1, 4)],
            function_samples: vec![(0, 3)],
        });
        let j = object(|w| threads_json(w, &s));
        assert!(j.starts_with(r#"{"threads":[{"tid":9,"name":"w","ended":true,"calls":5,"samples":3,"time_ns":3000000,"functions":[{"name":"hi","#), "{j}");
        assert!(
            j.contains(r#""function":"lo","module":"a","calls":1,"samples":3,"time_ns":3000000}"#),
            "{j}"
        );
        assert!(
            j.ends_with(r#""threads_dropped":0,"thread_function_samples_dropped":0}"#),
            "{j}"
        );
    }

    /// Each module counts its functions listed and left out by `keep`.
    #[test]
    fn modules_json_counts_listed_and_left_out() {
        let s = snap();
        assert_eq!(
            object(|w| modules_json(w, &s, &[true, false, false])),
            r#"{"modules":[{"path":"/bin/a","functions":3,"listed":1,"left_out":2,"patched":2,"sampled_only":false,"code":"written","samples":2,"refused":{"too_small":1}}]}"#
        );
    }

    #[test]
    fn json_lists_every_function_with_status() {
        let j = json(&[snap()], Listing::All);
        assert!(j.contains(r#""exe":"/bin/a\"b""#), "{j}");
        assert!(
            j.contains(
                r#""name":"zero","demangled":"zero","function":"zero","module":"a","calls":0"#
            ),
            "{j}"
        );
        assert!(j.contains(r#""refused":"too_small""#));
        assert!(j.contains(r#""refused":{"too_small":1}"#));
        assert!(j.contains(r#""listed":3,"left_out":0"#), "{j}");
    }

    /// By default a function with no call and no sample is left out and
    /// counted for its module, unless something listed names it.
    #[test]
    fn json_leaves_out_what_nothing_used() {
        use rtprof_abi::reader::{Stack, Stacks};
        let mut s = snap();
        let j = json(std::slice::from_ref(&s), Listing::Used);
        assert!(!j.contains(r#""name":"zero""#), "{j}");
        assert!(j.contains(r#""name":"hi""#), "{j}");
        assert!(j.contains(r#""listed":2,"left_out":1"#), "{j}");
        let t = text(std::slice::from_ref(&s), TextOptions::default());
        assert!(
            t.contains("1 of 3 functions had no call and no sample: not listed"),
            "{t}"
        );
        // A caller frame: inclusive samples, none of its own.
        s.stacks = Stacks {
            stacks: vec![Stack {
                frames: vec![Frame::Function(0), Frame::Function(2)],
                samples: 1,
            }],
            truncated: 0,
            dropped: 0,
        };
        let j = json(&[s], Listing::Used);
        assert!(j.contains(r#""name":"zero""#), "{j}");
        assert!(j.contains(r#""listed":3,"left_out":0"#), "{j}");
    }

    /// A C++ function and its compiler copies: one demangled row by
    /// default, with their calls and samples summed; apart on request.
    #[test]
    fn copies_merge_under_their_demangled_function() {
        let mut s = snap();
        for (name, calls, samples) in [
            ("_Z4deepi.constprop.0", 10, 1),
            ("_Z4deepi.constprop.1", 20, 2),
            ("_Z4deepi", 5, 0),
            ("_Z4deepi.cold", 0, 1),
        ] {
            s.functions.push(FunctionStats {
                name: name.into(),
                calls,
                samples,
                ..s.functions[0].clone()
            });
        }
        let r = rows(&s, Sort::Calls, true);
        let deep = r.iter().find(|r| r.name.starts_with("deep(int)")).unwrap();
        assert_eq!(deep.name, "deep(int) [+3 copies]");
        assert_eq!((deep.calls, deep.samples), (Some(35), 4));
        let apart = rows(&s, Sort::Calls, false);
        let names: Vec<&str> = apart.iter().map(|r| r.name.as_ref()).collect();
        for want in [
            "deep(int) [clone .constprop.1]",
            "deep(int) [clone .constprop.0]",
            "deep(int)",
            "deep(int) [clone .cold]",
        ] {
            assert!(names.contains(&want), "{want} in {names:?}");
        }
        let j = json(&[s], Listing::All);
        assert!(
            j.contains(r#""name":"_Z4deepi.constprop.0","demangled":"deep(int) [clone .constprop.0]","function":"deep(int)""#),
            "{j}"
        );
    }

    /// Sampled stacks: callers and callees in text, stacks leaf first in
    /// JSON.
    #[test]
    fn stacks_give_callers_and_callees() {
        use rtprof_abi::reader::{Stack, Stacks};
        let mut s = snap();
        let f = |i| Frame::Function(i);
        s.stacks = Stacks {
            stacks: vec![
                Stack {
                    frames: vec![f(0), f(1)],
                    samples: 3,
                },
                Stack {
                    frames: vec![f(0), f(2)],
                    samples: 1,
                },
            ],
            truncated: 0,
            dropped: 0,
        };
        let t = text(std::slice::from_ref(&s), TextOptions::default());
        assert!(t.contains("call stacks: 4 samples in 2 stacks"), "{t}");
        assert!(t.contains("100.0%  lo  <- hi 75%, zero 25%"), "{t}");
        assert!(t.contains("75.0%  hi  -> lo 100%"), "{t}");
        let j = json(&[s], Listing::All);
        assert!(
            j.contains(r#""stacks":[{"frames":["lo","hi"],"samples":3},{"frames":["lo","zero"],"samples":1}]"#),
            "{j}"
        );
    }
}
