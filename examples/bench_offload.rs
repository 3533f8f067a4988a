//! Benchmark: the closed loop. Two instances of `examples/offload` (a hot
//! kernel in a plain and a vectorised implementation, offered to rtprof)
//! compete for one accelerator slot; their hot phases alternate (A: hot,
//! idle, hot, ...; B: idle, hot, idle, ...). Each run tries, in turn:
//!
//! - `none`: both under the agent and rtprofd, nothing routed;
//! - `static`: A's kernel routed to the offered implementation as soon as
//!   rtprofd follows it, B's never (a fixed assignment of the slot);
//! - `acting`: `scheduler --act --slots 1` moves the slot as it sees fit.
//!
//! It reports the work done (kernel calls, both programs) in each, as the
//! median over runs and as a ratio to `none`, and each program's own
//! counts of calls per implementation beside rtprof's (its exit report's
//! rows `kernel` and `kernel [NAME]`), which must be equal.
//!
//! usage: bench-offload [--runs 3] [--phase-s 2] [--phases 4]
//!                      [--tick-ms 100] [--span-ms 500]
//! (build first: cargo build --release --workspace)

#[path = "common.rs"]
mod common;

use common::{arg, here, median};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CONFIGS: [&str; 3] = ["none", "static", "acting"];

/// What one program said and its report counted.
struct Outcome {
    work: u64,
    /// Its own counts: (original, offered).
    own: (u64, u64),
    /// rtprof's rows: (`kernel`, `kernel [NAME]`).
    rtprof: (u64, u64),
    wrong: u64,
}

fn compile(dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let bin = dir.join("offload");
    let st = Command::new("cc")
        .args(["-O2", "-I"])
        .arg(root.join("abi/include"))
        .arg("-o")
        .arg(&bin)
        .arg(root.join("examples/offload/offload.c"))
        .status()
        .expect("cc runs");
    assert!(st.success(), "compiling offload.c failed");
    bin
}

fn phases(first_hot: bool, n: usize) -> Vec<&'static str> {
    (0..n)
        .map(|i| {
            if (i % 2 == 0) == first_hot {
                "hot"
            } else {
                "idle"
            }
        })
        .collect()
}

fn start(bin: &Path, phase_s: f64, phases: &[&str], socket: &Path, report: &Path) -> Child {
    Command::new(bin)
        .arg(phase_s.to_string())
        .args(phases)
        .env("LD_PRELOAD", here().join("librtprof.so"))
        .env("RTPROF_DAEMON_SOCKET", socket)
        .env("RTPROF_REPORT", report)
        .stdout(Stdio::piped())
        .spawn()
        .expect("offload starts")
}

fn number_after(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key:?} in {text}"))
}

fn finish(c: Child, report: &Path) -> Outcome {
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let calls = text
        .lines()
        .find(|l| l.starts_with("calls original"))
        .unwrap();
    let n: Vec<u64> = calls
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    let fs = r["processes"][0]["functions"].as_array().unwrap();
    let row = |pred: &dyn Fn(&str) -> bool| {
        fs.iter()
            .filter(|f| pred(f["name"].as_str().unwrap_or("")))
            .filter_map(|f| f["calls"].as_u64())
            .sum::<u64>()
    };
    Outcome {
        work: number_after(&text, "work "),
        own: (n[0], n[1]),
        rtprof: (row(&|n| n == "kernel"), row(&|n| n.starts_with("kernel ["))),
        wrong: number_after(&text, "wrong "),
    }
}

/// Routes A's kernel to its offer as soon as rtprofd follows A.
fn route_when_followed(socket: &Path, pid: u32) {
    let t = Instant::now();
    for name in ["avx2", "sse2"].iter().cycle() {
        match rtprof_abi::protocol::route(socket, pid, "kernel", name) {
            Ok(_) => return,
            Err(e) if t.elapsed() > Duration::from_secs(10) => panic!("static route: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Runs both programs under configuration `cfg`: what each did, and the
/// scheduler's log (acting).
fn run(cfg: &str, bin: &Path, dir: &Path, (phase_s, n): (f64, usize)) -> (Vec<Outcome>, String) {
    let (socket, present) = (dir.join("sock"), dir.join("present"));
    let reports = [
        dir.join(format!("{cfg}-a.json")),
        dir.join(format!("{cfg}-b.json")),
    ];
    let scheduler = (cfg == "acting").then(|| {
        Command::new(here().join("scheduler"))
            .args(["--act", "--slots", "1", "--socket"])
            .arg(&socket)
            .arg("--present")
            .arg(&present)
            .stdout(std::fs::File::create(dir.join("scheduler.log")).unwrap())
            .spawn()
            .expect("scheduler starts")
    });
    let a = start(bin, phase_s, &phases(true, n), &socket, &reports[0]);
    let b = start(bin, phase_s, &phases(false, n), &socket, &reports[1]);
    if cfg == "static" {
        route_when_followed(&socket, a.id());
    }
    let out = vec![finish(a, &reports[0]), finish(b, &reports[1])];
    let mut log = String::new();
    if let Some(mut s) = scheduler {
        let _ = s.kill();
        let _ = s.wait();
        log = std::fs::read_to_string(dir.join("scheduler.log")).unwrap_or_default();
    }
    (out, log)
}

fn main() {
    common::check_args(
        "usage: bench-offload [--runs 3] [--phase-s 2] [--phases 4]\n                     [--tick-ms 100] [--span-ms 500]\n(build first: cargo build --release --workspace)",
        &common::Takes {
            numbers: &["--runs", "--phase-s", "--phases", "--tick-ms", "--span-ms"],
            texts: &[],
            flags: &[],
        },
    );
    let runs = arg("--runs", 3.0) as usize;
    let phase_s = arg("--phase-s", 2.0);
    let n = arg("--phases", 4.0) as usize;
    let dir = std::env::temp_dir().join(format!("rtprof-bench-offload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = compile(&dir);
    let mut daemon = Command::new(here().join("rtprofd"))
        .args(["--tick", &arg("--tick-ms", 100.0).to_string()])
        .args(["--span", &arg("--span-ms", 500.0).to_string()])
        .arg("--socket")
        .arg(dir.join("sock"))
        .arg("--present")
        .arg(dir.join("present"))
        .stderr(Stdio::null())
        .spawn()
        .expect("rtprofd starts");
    let t = Instant::now();
    while !dir.join("sock").exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "rtprofd did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "two programs, {n} phases of {phase_s} s each, hot phases alternating; one slot; {runs} run(s)"
    );
    let mut work: Vec<Vec<f64>> = vec![Vec::new(); CONFIGS.len()];
    let mut counts_equal = true;
    for r in 0..runs {
        // Alternating order: no configuration always runs first.
        let order: Vec<usize> = if r % 2 == 0 {
            vec![0, 1, 2]
        } else {
            vec![2, 1, 0]
        };
        for k in order {
            let (out, log) = run(CONFIGS[k], &bin, &dir, (phase_s, n));
            let total: u64 = out.iter().map(|o| o.work).sum();
            work[k].push(total as f64);
            println!("run {} {:<7} work {total}", r + 1, CONFIGS[k]);
            for (name, o) in ["A", "B"].iter().zip(&out) {
                let equal = o.own == o.rtprof;
                counts_equal &= equal && o.wrong == 0;
                println!(
                    "  {name}: work {:>9}; its own calls original {:>9} offered {:>9}; rtprof's {:>9} {:>9} ({}); wrong results {}",
                    o.work,
                    o.own.0,
                    o.own.1,
                    o.rtprof.0,
                    o.rtprof.1,
                    if equal { "equal" } else { "DIFFER" },
                    o.wrong
                );
            }
            if !log.is_empty() {
                println!("  the scheduler's decisions:");
                for l in log.lines() {
                    println!("    {l}");
                }
            }
        }
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    let base = median(work[0].clone());
    println!("\nconfiguration  work (kernel calls, median)  vs none");
    for (k, cfg) in CONFIGS.iter().enumerate() {
        let m = median(work[k].clone());
        println!("{cfg:<14} {m:>27.0}  {:>6.2}x", m / base);
    }
    println!(
        "own counts per implementation equal rtprof's in every run: {}",
        if counts_equal { "yes" } else { "NO" }
    );
    let _ = std::fs::remove_dir_all(&dir);
    if !counts_equal {
        std::process::exit(1);
    }
}
