//! Benchmark: what `rtprof attach` costs a running program per call,
//! before, while and after it is attached.
//!
//! usage: bench-attach [--rounds 3] [--phase 2]
//! (build first: cargo build --release --workspace)
//!
//! Runs `workloads/attach_rate.c` (one small function called in a tight
//! loop; it prints its call rate every 100 ms) and, `--rounds` times, lets
//! it run alone for `--phase` seconds, then attaches rtprof to it for
//! `--phase` seconds (`rtprof attach PID --duration`). Each 100 ms window
//! is classed by when it arrived: before the first attach, attached, or
//! after a detach (the program's original code again). Medians of the
//! windows of each class, from the same process, alternating.

#[path = "common.rs"]
mod common;

use common::{arg, here, median};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn main() {
    common::check_args(
        "usage: bench-attach [--rounds 3] [--phase 2]\n(build first: cargo build --release --workspace)",
        &common::Takes {
            numbers: &["--rounds", "--phase"],
            texts: &[],
            flags: &[],
        },
    );
    let rounds = arg("--rounds", 3.0) as usize;
    let phase = arg("--phase", 2.0);
    let rtprof = here().join("rtprof");
    assert!(
        rtprof.exists(),
        "build first: cargo build --release --workspace"
    );
    let dir = std::env::temp_dir().join(format!("rtprof-bench-attach-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("attach_rate");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/attach_rate.c");
    let st = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(&src)
        .status();
    assert!(
        st.is_ok_and(|s| s.success()),
        "compiling attach_rate.c failed"
    );

    let seconds = (rounds as f64 * 2.0 + 1.0) * phase + 2.0;
    let mut child = Command::new(&bin)
        .arg(seconds.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("attach_rate starts");
    let t0 = Instant::now();
    // (arrival, calls a second) of every window.
    let windows: Arc<Mutex<Vec<(Duration, f64)>>> = Arc::default();
    let stdout = child.stdout.take().unwrap();
    let w = windows.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(rate) = line.split(' ').nth(1).and_then(|r| r.parse().ok()) {
                w.lock().unwrap().push((t0.elapsed(), rate));
            }
        }
    });
    // (start, end) of each attached interval, from this side.
    let mut attached = Vec::new();
    let pause = Duration::from_secs_f64(phase);
    for _ in 0..rounds {
        std::thread::sleep(pause);
        let start = t0.elapsed();
        let out = Command::new(&rtprof)
            .args(["attach", &child.id().to_string(), "--duration"])
            .arg(phase.to_string())
            .output()
            .expect("rtprof attach runs");
        assert!(
            out.status.success(),
            "rtprof attach failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        attached.push((start, t0.elapsed()));
    }
    std::thread::sleep(pause);
    let _ = child.kill();
    let _ = child.wait();
    reader.join().unwrap();

    // Windows near an attach or a detach are left out: they mix states.
    let margin = Duration::from_millis(300);
    let (mut before, mut during, mut after) = (Vec::new(), Vec::new(), Vec::new());
    for &(at, rate) in windows.lock().unwrap().iter() {
        if at < Duration::from_millis(500) {
            continue;
        }
        let near = attached.iter().any(|&(s, e)| {
            at + margin > s && at < s + margin || at + margin > e && at < e + margin
        });
        if near {
            continue;
        }
        if attached.iter().any(|&(s, e)| at > s && at < e) {
            during.push(rate);
        } else if at < attached[0].0 {
            before.push(rate);
        } else {
            after.push(rate);
        }
    }
    assert!(
        !before.is_empty() && !during.is_empty() && !after.is_empty(),
        "too few windows: make --phase longer"
    );
    let ns = |v: Vec<f64>| 1e9 / median(v);
    let (b, d, a) = (ns(before.clone()), ns(during.clone()), ns(after.clone()));
    println!(
        "one function in a tight loop, {rounds} attach/detach rounds of {phase} s \
         (medians of 100 ms windows: {} before, {} attached, {} after):",
        before.len(),
        during.len(),
        after.len()
    );
    println!("  before any attach   {b:.2} ns/call");
    println!("  attached (counting) {d:.2} ns/call (+{:.2} ns)", d - b);
    println!(
        "  after detach        {a:.2} ns/call (after/before {:.3})",
        a / b
    );
    let _ = std::fs::remove_dir_all(&dir);
}
