//! Human-readable and JSON reports built from snapshots. Shared by the agent
//! (`RTPROF_REPORT`) and `rtprof run`, so both print the same thing.

use crate::json::JsonWriter;
use crate::layout::state;
use crate::{FunctionStats, Snapshot};
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug)]
pub struct TextOptions {
    /// Functions shown per process (0 = all called functions).
    pub top: usize,
    /// Per-module patch statistics with refusal reasons.
    pub stats: bool,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions {
            top: 25,
            stats: false,
        }
    }
}

/// Functions ordered by calls (then samples, then name), most called first.
pub fn by_calls(s: &Snapshot) -> Vec<&FunctionStats> {
    let mut v: Vec<&FunctionStats> = s.functions.iter().collect();
    v.sort_by(|a, b| {
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

/// How the process (image) ended: "exit", "exec" or "abrupt" (a signal,
/// `_exit`, or death during start-up).
pub fn ending(s: &Snapshot) -> &'static str {
    match s.state {
        state::EXITED => "exit",
        _ if s.replaced_by_exec => "exec",
        _ => "abrupt",
    }
}

fn state_text(s: &Snapshot) -> String {
    match (ending(s), s.state) {
        ("exit", _) => format!("exited with status {}", s.exit_status),
        ("exec", _) => "replaced itself (exec)".to_string(),
        (_, state::RUNNING) => "ended without running exit handlers".to_string(),
        _ => "ended during start-up".to_string(),
    }
}

fn duration_s(s: &Snapshot) -> Option<f64> {
    (s.end_ns > s.start_ns).then(|| (s.end_ns - s.start_ns) as f64 / 1e9)
}

pub fn text(procs: &[Snapshot], opts: TextOptions) -> String {
    let mut out = String::new();
    for s in procs {
        let _ = write!(
            out,
            "rtprof: pid {} (parent {}) {}: {}",
            s.pid,
            s.ppid,
            s.exe,
            state_text(s)
        );
        if let Some(d) = duration_s(s) {
            let _ = write!(out, ", {d:.3} s");
        }
        out.push('\n');
        let called: Vec<_> = by_calls(s).into_iter().filter(|f| f.calls > 0).collect();
        let shown = if opts.top == 0 {
            called.len()
        } else {
            opts.top.min(called.len())
        };
        if called.is_empty() {
            out.push_str("  no instrumented function was called\n");
        } else {
            let _ = writeln!(out, "  {:>14}  {:<40}  module", "calls", "function");
            for f in &called[..shown] {
                let _ = writeln!(
                    out,
                    "  {:>14}  {:<40}  {}",
                    f.calls,
                    f.name,
                    module_name(s, f.module)
                );
            }
            if shown < called.len() {
                let _ = writeln!(
                    out,
                    "  ... {} more functions called (--top 0 shows all)",
                    called.len() - shown
                );
            }
        }
        let total: u32 = s.modules.iter().map(|m| m.functions).sum();
        let patched: u32 = s.modules.iter().map(|m| m.patched).sum();
        let _ = writeln!(
            out,
            "  patched {patched} of {total} functions ({:.1}%) in {} module(s)",
            percent(patched, total),
            s.modules.len()
        );
        if opts.stats {
            for m in &s.modules {
                let _ = write!(
                    out,
                    "    {}: {} functions, {} patched ({:.1}%)",
                    m.path,
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
                out.push('\n');
            }
        }
    }
    out
}

fn percent(a: u32, b: u32) -> f64 {
    if b == 0 {
        0.0
    } else {
        100.0 * a as f64 / b as f64
    }
}

/// The JSON report: `{"processes": [...]}`. Every function is listed, called
/// or not, so tools can check patch status by name.
pub fn json(procs: &[Snapshot]) -> String {
    let mut w = JsonWriter::new();
    w.begin_object();
    w.key("tool");
    w.string("rtprof");
    w.key("version");
    w.string(env!("CARGO_PKG_VERSION"));
    w.key("processes");
    w.begin_array();
    for s in procs {
        w.begin_object();
        w.key("pid");
        w.uint(s.pid as u64);
        w.key("ppid");
        w.uint(s.ppid as u64);
        w.key("exe");
        w.string(&s.exe);
        w.key("exited");
        w.bool(s.state == state::EXITED);
        w.key("ended");
        w.string(ending(s));
        w.key("exit_status");
        w.int(s.exit_status as i64);
        w.key("start_ns");
        w.uint(s.start_ns);
        w.key("end_ns");
        w.uint(s.end_ns);
        w.key("setup_ns");
        w.uint(s.setup_ns);
        w.key("stripes");
        w.uint(s.stripes as u64);
        w.key("functions");
        w.begin_array();
        for f in by_calls(s) {
            w.begin_object();
            w.key("name");
            w.string(&f.name);
            w.key("module");
            w.string(module_name(s, f.module));
            w.key("calls");
            w.uint(f.calls);
            w.key("samples");
            w.uint(f.samples);
            w.key("vaddr");
            w.uint(f.vaddr);
            w.key("size");
            w.uint(f.size as u64);
            w.key("patched");
            w.bool(f.refused.is_none());
            if let Some(r) = f.refused {
                w.key("refused");
                w.string(r.name());
            }
            w.end_object();
        }
        w.end_array();
        w.key("modules");
        w.begin_array();
        for m in &s.modules {
            w.begin_object();
            w.key("path");
            w.string(&m.path);
            w.key("functions");
            w.uint(m.functions as u64);
            w.key("patched");
            w.uint(m.patched as u64);
            w.key("refused");
            w.begin_object();
            for (r, n) in &m.refused {
                w.key(r.name());
                w.uint(*n as u64);
            }
            w.end_object();
            w.end_object();
        }
        w.end_array();
        w.end_object();
    }
    w.end_array();
    w.end_object();
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ModuleStats, Refusal};

    fn snap() -> Snapshot {
        Snapshot {
            pid: 7,
            ppid: 1,
            exe: "/bin/a\"b".into(),
            state: state::EXITED,
            exit_status: 3,
            start_ns: 0,
            end_ns: 0,
            sample_period_ns: 0,
            samples_total: 0,
            samples_lost: 0,
            setup_ns: 0,
            replaced_by_exec: false,
            stripes: 1,
            modules: vec![ModuleStats {
                path: "/bin/a".into(),
                base: 0,
                functions: 3,
                patched: 2,
                refused: vec![(Refusal::TooSmall, 1)],
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
                    calls: c,
                    samples: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn text_sorts_by_calls_and_hides_uncalled() {
        let t = text(
            &[snap()],
            TextOptions {
                top: 10,
                stats: true,
            },
        );
        let hi = t.find("hi").unwrap();
        let lo = t.find(" lo ").unwrap();
        assert!(hi < lo, "{t}");
        assert!(!t.contains("zero"));
        assert!(t.contains("exited with status 3"));
        assert!(t.contains("too_small 1"));
        assert!(t.contains("patched 2 of 3"));
    }

    #[test]
    fn json_lists_every_function_with_status() {
        let j = json(&[snap()]);
        assert!(j.contains(r#""exe":"/bin/a\"b""#), "{j}");
        assert!(j.contains(r#""name":"zero","module":"a","calls":0"#), "{j}");
        assert!(j.contains(r#""refused":"too_small""#));
        assert!(j.contains(r#""refused":{"too_small":1}"#));
    }
}
