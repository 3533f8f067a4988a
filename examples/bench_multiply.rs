//! Benchmark: the `multiply` worst case with and without the agent, and the
//! agent's start-up cost on libpython.
//!
//! usage: bench-multiply [--calls N] [--runs R]
//! (build first: cargo build --release --workspace)
//!
//! Reports nanoseconds added per call (median of R alternating runs,
//! single-threaded and with two threads calling the same function), what
//! counting exact callers (`RTPROF_CALLERS=1`) adds on top, and the
//! start-up time spent reading, analysing and patching libpython, per 1,000
//! functions.

#[path = "common.rs"]
mod common;

use common::{arg, compile_workload, here, median};
use std::path::Path;
use std::process::Command;

/// Loop time in ns reported by the program itself.
/// With `callers`, exact callers are counted too (`RTPROF_CALLERS=1`).
fn loop_ns(bin: &Path, calls: u64, threads: u32, agent: Option<&Path>, callers: bool) -> f64 {
    let mut c = Command::new(bin);
    c.arg(calls.to_string()).arg(threads.to_string());
    if let Some(a) = agent {
        // Counting alone: the cost per call (bench-sampling measures sampling).
        c.env("LD_PRELOAD", a).env("RTPROF_SAMPLE_HZ", "0");
        if callers {
            c.env("RTPROF_CALLERS", "1");
        }
    }
    let out = c.output().expect("multiply runs");
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    s.split_whitespace().next().unwrap().parse().unwrap()
}

fn main() {
    common::check_args(
        "usage: bench-multiply [--calls N] [--runs R]\n(build first: cargo build --release --workspace)",
        &common::Takes {
            numbers: &["--calls", "--runs"],
            texts: &[],
            flags: &[],
        },
    );
    let calls = arg("--calls", 1e8) as u64;
    let runs = arg("--runs", 7.0) as usize;
    let agent = here().join("librtprof.so");
    assert!(
        agent.exists(),
        "{} missing: cargo build --release --workspace",
        agent.display()
    );
    let dir = std::env::temp_dir().join(format!("rtprof-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = compile_workload("multiply", &dir);

    println!("multiply: {calls} calls per thread, median of {runs} alternating runs");
    println!(
        "{:>8} {:>12} {:>12} {:>10} {:>9} {:>14} {:>12}",
        "threads",
        "base ns/call",
        "agent ns/call",
        "added ns",
        "ratio",
        "callers ns/call",
        "callers add"
    );
    for threads in [1u32, 2] {
        let (mut base, mut with, mut callers) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            base.push(loop_ns(&bin, calls, threads, None, false) / calls as f64);
            with.push(loop_ns(&bin, calls, threads, Some(&agent), false) / calls as f64);
            callers.push(loop_ns(&bin, calls, threads, Some(&agent), true) / calls as f64);
        }
        let (b, w, c) = (median(base), median(with), median(callers));
        println!(
            "{threads:>8} {b:>12.3} {w:>12.3} {:>10.3} {:>9.3} {c:>14.3} {:>12.3}",
            w - b,
            w / b,
            c - w
        );
    }

    // Start-up on libpython: the agent records its own set-up time.
    let py = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if let Some(py) = py.filter(|p| !p.is_empty()) {
        let mut per_k = Vec::new();
        let mut funcs = 0;
        for i in 0..runs {
            let report = dir.join(format!("py{i}.json"));
            let st = Command::new(&py)
                .args(["-c", "pass"])
                .env("LD_PRELOAD", &agent)
                .env("RTPROF_MODULES", "libpython*")
                .env("RTPROF_REPORT", &report)
                .status()
                .expect("python runs");
            assert!(st.success());
            let text = std::fs::read_to_string(&report).expect("report written");
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            let p = &v["processes"][0];
            funcs = p["modules"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["sampled_only"] == false)
                .map(|m| m["functions"].as_u64().unwrap())
                .sum();
            let ns = p["setup_ns"].as_u64().unwrap() as f64;
            per_k.push(ns / 1e6 / (funcs as f64 / 1000.0));
        }
        println!(
            "start-up with libpython instrumented: {funcs} functions, {:.2} ms per 1,000 functions (median of {runs})",
            median(per_k)
        );
    } else {
        println!("python3 not found: start-up measurement skipped");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
