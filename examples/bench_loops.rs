//! Benchmark: what counting a loop exactly (`RTPROF_LOOPS`) adds per
//! iteration, for a loop of a serial 2-3 ns body, in one thread and in two
//! threads running the same loop (its counters are shared).
//!
//! usage: bench-loops [--iterations N] [--runs R]
//! (build first: cargo build --release --workspace)
//!
//! Reports nanoseconds per iteration without the agent, with the agent
//! counting calls only, and with the loop counted too (median of R
//! alternating runs), and what the loop's counting adds.

#[path = "common.rs"]
mod common;

use common::{arg, compile_workload, here, median};
use std::path::Path;
use std::process::Command;

/// Nanoseconds per iteration, as the program measures them.
fn per_iteration(bin: &Path, n: u64, threads: u32, agent: Option<&Path>, loops: bool) -> f64 {
    let mut c = Command::new(bin);
    c.arg(n.to_string()).arg(threads.to_string());
    if let Some(a) = agent {
        // Counting alone (bench-sampling measures sampling).
        c.env("LD_PRELOAD", a).env("RTPROF_SAMPLE_HZ", "0");
        if loops {
            c.env("RTPROF_LOOPS", "spin");
        }
    }
    let out = c.output().expect("loop_cost runs");
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    s.split_whitespace().next().unwrap().parse().unwrap()
}

fn main() {
    common::check_args(
        "usage: bench-loops [--iterations N] [--runs R]\n(build first: cargo build --release --workspace)",
        &common::Takes {
            numbers: &["--iterations", "--runs"],
            texts: &[],
            flags: &[],
        },
    );
    let n = arg("--iterations", 1e8) as u64;
    let runs = arg("--runs", 7.0) as usize;
    let agent = here().join("librtprof.so");
    assert!(
        agent.exists(),
        "{} missing: cargo build --release --workspace",
        agent.display()
    );
    let dir = std::env::temp_dir().join(format!("rtprof-bench-loops-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = compile_workload("loop_cost", &dir);
    println!("loop_cost: {n} iterations per thread, median of {runs} alternating runs");
    println!(
        "{:>8} {:>10} {:>12} {:>13} {:>10} {:>7}",
        "threads", "base ns/it", "calls ns/it", "loops ns/it", "added ns", "ratio"
    );
    for threads in [1u32, 2] {
        let (mut base, mut calls, mut loops) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            base.push(per_iteration(&bin, n, threads, None, false));
            calls.push(per_iteration(&bin, n, threads, Some(&agent), false));
            loops.push(per_iteration(&bin, n, threads, Some(&agent), true));
        }
        let (b, c, l) = (median(base), median(calls), median(loops));
        println!(
            "{threads:>8} {b:>10.3} {c:>12.3} {l:>13.3} {:>10.3} {:>7.2}",
            l - c,
            l / c
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
