//! Benchmark: what a thread's start and end cost under the agent, in a
//! program of 20,000 functions (an ending thread's counters are folded
//! into the ended threads' sum, a pass over every function).
//!
//! usage: bench-threads [--ms MS] [--spawners S] [--runs R] [--other-agent PATH]
//! (build first: cargo build --release --workspace)
//!
//! Reports threads started and ended per second without the agent, with it
//! counting calls (`LD_PRELOAD`), and under `rtprof run` (which also keeps
//! each ended thread's counts for the report), the median of R
//! alternating runs, and each as a ratio to the program alone. With
//! `--other-agent`, another build's `librtprof.so` is measured in the same
//! runs (before and after a change).

#[path = "common.rs"]
mod common;

use common::{arg, arg_text, compile_workload, here, median};
use std::path::{Path, PathBuf};
use std::process::Command;

enum How<'a> {
    Alone,
    Preloaded(&'a Path),
    Run,
}

/// Threads per second, as the program measures them.
fn rate(bin: &Path, ms: u64, spawners: u32, how: &How) -> f64 {
    let mut c = match how {
        How::Run => {
            let mut c = Command::new(here().join("rtprof"));
            let json = std::env::temp_dir()
                .join(format!("rtprof-bench-threads-{}.json", std::process::id()));
            c.arg("run").arg("--json").arg(json).arg("--").arg(bin);
            c
        }
        _ => Command::new(bin),
    };
    c.arg(ms.to_string()).arg(spawners.to_string());
    if let How::Preloaded(agent) = how {
        // Counting alone (bench-sampling measures sampling).
        c.env("LD_PRELOAD", agent).env("RTPROF_SAMPLE_HZ", "0");
    }
    if let How::Run = how {
        c.env("RTPROF_SAMPLE_HZ", "0");
    }
    let out = c.output().expect("thread_churn runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8_lossy(&out.stdout);
    s.split_whitespace().next().unwrap().parse().unwrap()
}

fn main() {
    common::check_args(
        "usage: bench-threads [--ms MS] [--spawners S] [--runs R] [--other-agent PATH]\n(build first: cargo build --release --workspace)",
        &common::Takes {
            numbers: &["--ms", "--spawners", "--runs"],
            texts: &["--other-agent"],
            flags: &[],
        },
    );
    let ms = arg("--ms", 1000.0) as u64;
    let spawners = arg("--spawners", 2.0) as u32;
    let runs = arg("--runs", 5.0) as usize;
    let agent = here().join("librtprof.so");
    assert!(
        agent.exists(),
        "{} missing: cargo build --release --workspace",
        agent.display()
    );
    let other = arg_text("--other-agent").map(PathBuf::from);
    let dir = std::env::temp_dir().join(format!("rtprof-bench-threads-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = compile_workload("thread_churn", &dir);
    let mut cases: Vec<(String, How)> = vec![
        ("alone".into(), How::Alone),
        ("agent".into(), How::Preloaded(&agent)),
        ("rtprof run".into(), How::Run),
    ];
    if let Some(o) = &other {
        cases.push((format!("{}", o.display()), How::Preloaded(o)));
    }
    println!(
        "thread_churn: {spawners} spawners for {ms} ms, 20,000 functions, \
         median of {runs} alternating runs"
    );
    let mut rates = vec![Vec::new(); cases.len()];
    for _ in 0..runs {
        for (r, (_, how)) in rates.iter_mut().zip(&cases) {
            r.push(rate(&bin, ms, spawners, how));
        }
    }
    let base = median(rates[0].clone());
    println!("{:>12} {:>10}", "threads/s", "ratio");
    for (r, (name, _)) in rates.into_iter().zip(&cases) {
        let m = median(r);
        println!("{m:>12.0} {:>10.3}  {name}", m / base);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
