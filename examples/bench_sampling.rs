//! Benchmark: rtprof's sampler next to `perf record`, and what sampling costs.
//!
//! usage: bench-sampling [--runs R] [--scale S]
//! (build first: cargo build --release --workspace; needs `perf` from linux-perf)
//!
//! 1. Accuracy: the CPU-bound `mix` workload (examples/workloads/mix.c) is
//!    profiled R times by rtprof (sampling only, 1 kHz, with its timers, the
//!    default, and with its perf sampler) and R times by
//!    `perf record -e cpu-clock:u -c 1000000` (the same event and period).
//!    For perf's top five functions, the median sample share of each tool.
//! 2. Overhead: wall and CPU time of `mix` alone, under the agent sampling
//!    only (no entry patched) at 1 kHz with call stacks (the default) and
//!    without, with its timers (the default) and with perf (also at 250
//!    and 100 Hz), counting only, both, sampling with the software
//!    events (page faults, context switches, migrations, task-clock every
//!    1 ms) and with cycles and instructions (where the machine has
//!    them), and under `perf record` at
//!    the same event and rate, flat, with `-g` (frame pointers) and with
//!    `--call-graph=dwarf` (the cost of kernel sampling itself on this
//!    machine); R runs each, the order rotated every round: medians and
//!    ratios to the plain run. Besides the command's wall and CPU time,
//!    the program's own wall time as it measured it (without `perf
//!    record`'s start and data file, or the agent's start-up): what
//!    sampling costs while the program runs.

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
        .stderr(std::process::Stdio::null())
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
fn rtprof_run(bin: &Path, scale: &str, sampler: &str, dir: &Path) -> Value {
    let json = dir.join("rtprof.json");
    let st = Command::new(here().join("rtprof"))
        .args(["run", "--no-calls", "--sampler", sampler, "--json"])
        .arg(&json)
        .arg("--")
        .arg(bin)
        .arg(scale)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
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

/// CPU seconds (user + system) of the children reaped so far.
fn children_cpu() -> f64 {
    // SAFETY: `rusage` is integers and timevals: all zeroes is valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a live local the call fills.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// (wall seconds, CPU seconds) of one run.
/// `PERF` in a configuration's environment: run the workload under
/// `perf record` at the same event and period instead of the agent.
const PERF: &str = "PERF";

/// One run: (wall, CPU of the whole command, the program's own wall as it
/// measured it). The last leaves out what runs before and after the
/// program (`perf record`'s start and its data file, the agent's start-up
/// and report): what sampling costs the program while it runs.
fn timed(bin: &Path, scale: &str, env: &[(&str, String)], dir: &Path) -> (f64, f64, f64) {
    let mut c = if env.iter().any(|(k, _)| *k == PERF) {
        let mut c = Command::new("perf");
        c.args(["record", "-q", "-e", "cpu-clock:u", "-c", "1000000"]);
        // The configuration's value: perf's call-graph option, if any.
        for (_, v) in env.iter().filter(|(k, v)| *k == PERF && !v.is_empty()) {
            c.arg(v);
        }
        c.arg("-o")
            .arg(dir.join("overhead.data"))
            .arg("--")
            .arg(bin);
        c
    } else {
        Command::new(bin)
    };
    c.arg(scale)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env.iter().filter(|(k, _)| *k != PERF) {
        c.env(k, v);
    }
    let (t, cpu) = (Instant::now(), children_cpu());
    let out = c.output().expect("mix runs");
    let (wall, cpu) = (t.elapsed().as_secs_f64(), children_cpu() - cpu);
    assert!(out.status.success());
    let own = String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| l.strip_prefix("mix-time ")?.split(' ').next()?.parse().ok())
        .expect("mix says its time");
    (wall, cpu, own)
}

fn main() {
    common::check_args(
        "usage: bench-sampling [--runs R] [--scale S]\n(build first: cargo build --release --workspace; needs `perf` from linux-perf)",
        &common::Takes {
            numbers: &["--runs", "--scale"],
            texts: &[],
            flags: &[],
        },
    );
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
        let mut ours_perf: Vec<Value> = Vec::new();
        for _ in 0..runs {
            perf_runs.push(perf_shares(&bin, &scale, &dir));
            ours.push(rtprof_run(&bin, &scale, "timer", &dir));
            ours_perf.push(rtprof_run(&bin, &scale, "perf", &dir));
        }
        let top: Vec<_> = perf_runs[0].iter().take(5).cloned().collect();
        println!(
            "\nsample shares, mix {scale}: median of {runs} runs each, cpu-clock 1 kHz, user space"
        );
        println!("(rtprof's timers, the default, and its perf sampler; each against perf record)");
        println!(
            "{:<28} {:<12} {:>8} {:>8} {:>7} {:>8} {:>7}",
            "function (perf's name)", "module", "perf %", "timer %", "diff", "perf s.%", "diff"
        );
        let mut worst: f64 = 0.0;
        let mut worst_perf: f64 = 0.0;
        let share = |runs: &[Value], dso: &str, addr: u64| {
            median(
                runs.iter()
                    .map(|p| rtprof_share(p, dso, addr).map_or(0.0, |s| s.1))
                    .collect(),
            )
        };
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
            let ours_pct = share(&ours, dso, *addr);
            let ours_perf_pct = share(&ours_perf, dso, *addr);
            let (d, dp) = (ours_pct - perf_pct, ours_perf_pct - perf_pct);
            worst = worst.max(d.abs());
            worst_perf = worst_perf.max(dp.abs());
            println!(
                "{name:<28} {dso:<12} {perf_pct:>8.2} {ours_pct:>8.2} {d:>+7.2} {ours_perf_pct:>8.2} {dp:>+7.2}"
            );
        }
        println!(
            "largest difference: {worst:.2} percentage points (timers), {worst_perf:.2} (perf sampler)"
        );
    } else {
        println!(
            "perf not found (Debian: apt-get install linux-perf): accuracy comparison skipped"
        );
    }

    // Overhead, alternating the configurations run by run.
    let preload = agent.to_string_lossy().into_owned();
    let mut configs: Vec<(&str, Vec<(&str, String)>)> = vec![
        ("plain", vec![]),
        (
            "sampling only (1 kHz, timers)",
            vec![
                ("LD_PRELOAD", preload.clone()),
                ("RTPROF_INSTRUMENT", "0".into()),
            ],
        ),
        (
            "sampling, no stacks (timers)",
            vec![
                ("LD_PRELOAD", preload.clone()),
                ("RTPROF_INSTRUMENT", "0".into()),
                ("RTPROF_STACKS", "0".into()),
            ],
        ),
        (
            "perf sampler (1 kHz)",
            vec![
                ("LD_PRELOAD", preload.clone()),
                ("RTPROF_INSTRUMENT", "0".into()),
                ("RTPROF_SAMPLER", "perf".into()),
            ],
        ),
        (
            "perf sampler, no stacks",
            vec![
                ("LD_PRELOAD", preload.clone()),
                ("RTPROF_INSTRUMENT", "0".into()),
                ("RTPROF_SAMPLER", "perf".into()),
                ("RTPROF_STACKS", "0".into()),
            ],
        ),
        (
            "perf sampler (250 Hz)",
            vec![
                ("LD_PRELOAD", preload.clone()),
                ("RTPROF_INSTRUMENT", "0".into()),
                ("RTPROF_SAMPLER", "perf".into()),
                ("RTPROF_SAMPLE_HZ", "250".into()),
            ],
        ),
        (
            "perf sampler (100 Hz)",
            vec![
                ("LD_PRELOAD", preload.clone()),
                ("RTPROF_INSTRUMENT", "0".into()),
                ("RTPROF_SAMPLER", "perf".into()),
                ("RTPROF_SAMPLE_HZ", "100".into()),
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
        (
            "sampling + software events",
            vec![
                ("LD_PRELOAD", preload.clone()),
                ("RTPROF_INSTRUMENT", "0".into()),
                (
                    "RTPROF_EVENTS",
                    "page-faults,context-switches,cpu-migrations,task-clock".into(),
                ),
            ],
        ),
        (
            "sampling + cycles, instructions",
            vec![
                ("LD_PRELOAD", preload.clone()),
                ("RTPROF_INSTRUMENT", "0".into()),
                ("RTPROF_EVENTS", "cycles,instructions".into()),
            ],
        ),
    ];
    if have_perf {
        configs.push(("perf record (1 kHz)", vec![(PERF, String::new())]));
        configs.push(("perf record -g", vec![(PERF, "-g".into())]));
        configs.push((
            "perf record dwarf",
            vec![(PERF, "--call-graph=dwarf".into())],
        ));
    }
    let mut wall: HashMap<&str, Vec<f64>> = HashMap::new();
    let mut cpu: HashMap<&str, Vec<f64>> = HashMap::new();
    let mut own: HashMap<&str, Vec<f64>> = HashMap::new();
    timed(&bin, &scale, &[], &dir); // warm the page cache
    for round in 0..runs {
        // Each round starts with another configuration: none always runs
        // first or after the same neighbour.
        for k in 0..configs.len() {
            let (name, env) = &configs[(round + k) % configs.len()];
            let (w, c, o) = timed(&bin, &scale, env, &dir);
            wall.entry(name).or_default().push(w);
            cpu.entry(name).or_default().push(c);
            own.entry(name).or_default().push(o);
        }
    }
    println!("\nmix {scale}: median of {runs} runs per configuration, order rotated each round");
    println!(
        "(own: the program's wall time as it measured it, without what runs before and after it)"
    );
    println!(
        "{:<32} {:>8} {:>8} {:>8} {:>7} {:>8} {:>7} {:>8} {:>7}",
        "configuration", "wall s", "min", "max", "ratio", "CPU s", "ratio", "own s", "ratio"
    );
    let base = |m: &HashMap<&str, Vec<f64>>| median(m["plain"].clone());
    let (base_w, base_c, base_o) = (base(&wall), base(&cpu), base(&own));
    for (name, _) in &configs {
        let v = &wall[name];
        let min = v.iter().cloned().fold(f64::MAX, f64::min);
        let max = v.iter().cloned().fold(0.0, f64::max);
        let (m, c, o) = (
            median(v.clone()),
            median(cpu[name].clone()),
            median(own[name].clone()),
        );
        println!(
            "{name:<32} {m:>8.3} {min:>8.3} {max:>8.3} {:>7.4} {c:>8.3} {:>7.4} {o:>8.3} {:>7.4}",
            m / base_w,
            c / base_c,
            o / base_o
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
