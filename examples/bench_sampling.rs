//! Benchmark: rtprof's sampler next to `perf record`, and what sampling costs.
//!
//! usage: bench-sampling [--runs R] [--scale S]
//! (build first: cargo build --release --workspace; needs `perf` from linux-perf)
//!
//! 1. Accuracy: the CPU-bound `mix` workload (examples/workloads/mix.c) is
//!    profiled R times by rtprof (sampling only, 1 kHz) and R times by
//!    `perf record -e cpu-clock:u -c 1000000` (the same event and period).
//!    For perf's top five functions, the median sample share of each tool.
//! 2. Overhead: run time of `mix` alone, under the agent with sampling only
//!    (no entry patched), and under the agent with sampling and counting,
//!    alternating, R runs each: medians and ratios to the plain run.

use serde_json::Value;
use std::collections::HashMap;
#[path = "common.rs"]
mod common;

use common::{arg, here, median};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn compile(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/mix.c");
    let bin = dir.join("mix");
    let st = Command::new("gcc")
        .args(["-O2", "-g", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("gcc runs");
    assert!(st.success(), "compiling mix.c failed");
    bin
}

/// A function as both tools can name it: (module file name, ELF address).
type Shares = Vec<(String, u64, String, f64)>;

/// perf's shares by symbol: (dso file name, an address inside, name, %).
fn perf_shares(bin: &Path, scale: &str, dir: &Path) -> Shares {
    let data = dir.join("perf.data");
    let st = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock:u", "-c", "1000000", "-o"])
        .arg(&data)
        .arg("--")
        .arg(bin)
        .arg(scale)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("perf runs");
    assert!(st.success(), "perf record failed");
    let out = Command::new("perf")
        .args(["report", "--stdio", "--sort", "dso,sym", "-v", "-i"])
        .arg(&data)
        .output()
        .expect("perf report runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut v = Vec::new();
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        // "  27.76%  /usr/lib/.../libc.so.6  0x3f9c9  D [.] msort_with_tmp.part.0"
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.len() < 6 || !w[0].ends_with('%') {
            continue;
        }
        let pct: f64 = w[0].trim_end_matches('%').parse().unwrap_or(0.0);
        let dso = w[1].rsplit('/').next().unwrap_or(w[1]).to_string();
        let addr = u64::from_str_radix(w[2].trim_start_matches("0x"), 16).unwrap_or(0);
        let name = w[5..].join(" ");
        v.push((dso, addr, name, pct));
    }
    v
}

/// rtprof's process section for one run of `bin` (sampling only).
fn rtprof_run(bin: &Path, scale: &str, dir: &Path) -> Value {
    let json = dir.join("rtprof.json");
    let st = Command::new(here().join("rtprof"))
        .args(["run", "--no-calls", "--sampler", "perf", "--json"])
        .arg(&json)
        .arg("--")
        .arg(bin)
        .arg(scale)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("rtprof runs");
    assert!(st.success());
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    v["processes"][0].clone()
}

/// rtprof's share of the function of `module` that contains `addr`.
fn rtprof_share(p: &Value, module: &str, addr: u64) -> Option<(String, f64)> {
    let total = p["sampler"]["samples"].as_f64()?;
    p["functions"].as_array()?.iter().find_map(|f| {
        let (va, size) = (f["vaddr"].as_u64()?, f["size"].as_u64()?);
        (f["module"] == module && va <= addr && addr < va + size).then(|| {
            (
                f["name"].as_str().unwrap_or("?").to_string(),
                100.0 * f["samples"].as_f64().unwrap_or(0.0) / total,
            )
        })
    })
}

fn timed(bin: &Path, scale: &str, env: &[(&str, String)]) -> f64 {
    let mut c = Command::new(bin);
    c.arg(scale).stdout(std::process::Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let t = Instant::now();
    let st = c.status().expect("mix runs");
    assert!(st.success());
    t.elapsed().as_secs_f64()
}

fn main() {
    let runs = arg("--runs", 7.0) as usize;
    let scale = format!("{}", arg("--scale", 2.0));
    let agent = here().join("librtprof.so");
    assert!(
        agent.exists() && here().join("rtprof").exists(),
        "build first: cargo build --release --workspace"
    );
    let dir = std::env::temp_dir().join(format!("rtprof-bench-sampling-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = compile(&dir);
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("machine: {cpus} CPUs, {}", std::env::consts::ARCH);

    let have_perf = Command::new("perf")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if have_perf {
        // Per function: perf shares and rtprof shares over the runs.
        let mut perf_runs: Vec<Shares> = Vec::new();
        let mut ours: Vec<Value> = Vec::new();
        for _ in 0..runs {
            perf_runs.push(perf_shares(&bin, &scale, &dir));
            ours.push(rtprof_run(&bin, &scale, &dir));
        }
        let top: Vec<_> = perf_runs[0].iter().take(5).cloned().collect();
        println!(
            "\nsample shares, mix {scale}: median of {runs} runs each, cpu-clock 1 kHz, user space"
        );
        println!(
            "{:<28} {:<12} {:>8} {:>8} {:>7}",
            "function (perf's name)", "module", "perf %", "rtprof %", "diff"
        );
        let mut worst: f64 = 0.0;
        for (dso, addr, name, _) in &top {
            let perf_pct = median(
                perf_runs
                    .iter()
                    .map(|r| {
                        r.iter()
                            .find(|s| &s.2 == name && &s.0 == dso)
                            .map_or(0.0, |s| s.3)
                    })
                    .collect(),
            );
            let ours_pct = median(
                ours.iter()
                    .map(|p| rtprof_share(p, dso, *addr).map_or(0.0, |s| s.1))
                    .collect(),
            );
            let d = ours_pct - perf_pct;
            worst = worst.max(d.abs());
            println!("{name:<28} {dso:<12} {perf_pct:>8.2} {ours_pct:>8.2} {d:>+7.2}");
        }
        println!("largest difference: {worst:.2} percentage points");
    } else {
        println!(
            "perf not found (Debian: apt-get install linux-perf): accuracy comparison skipped"
        );
    }

    // Overhead, alternating the configurations run by run.
    let preload = agent.to_string_lossy().into_owned();
    let configs: Vec<(&str, Vec<(&str, String)>)> = vec![
        ("plain", vec![]),
        (
            "sampling only (1 kHz)",
            vec![
                ("LD_PRELOAD", preload.clone()),
                ("RTPROF_INSTRUMENT", "0".into()),
            ],
        ),
        (
            "counting only",
            vec![
                ("LD_PRELOAD", preload.clone()),
                ("RTPROF_SAMPLE_HZ", "0".into()),
            ],
        ),
        ("counting + sampling", vec![("LD_PRELOAD", preload.clone())]),
    ];
    let mut times: HashMap<&str, Vec<f64>> = HashMap::new();
    timed(&bin, &scale, &[]); // warm the page cache
    for _ in 0..runs {
        for (name, env) in &configs {
            times
                .entry(name)
                .or_default()
                .push(timed(&bin, &scale, env));
        }
    }
    let base = median(times["plain"].clone());
    println!("\nrun time of mix {scale}: median of {runs} alternating runs");
    println!(
        "{:<24} {:>9} {:>9} {:>9} {:>8}",
        "configuration", "median s", "min s", "max s", "ratio"
    );
    for (name, _) in &configs {
        let v = &times[name];
        let min = v.iter().cloned().fold(f64::MAX, f64::min);
        let max = v.iter().cloned().fold(0.0, f64::max);
        let m = median(v.clone());
        println!(
            "{name:<24} {m:>9.4} {min:>9.4} {max:>9.4} {:>8.4}",
            m / base
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
