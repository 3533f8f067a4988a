//! `--output FILE [--format F]`: a run's profile as pprof, folded stacks,
//! a flame graph (SVG) and a speedscope file, read back by what people open
//! them with (go tool pprof, an XML parser, a JSON parser), with the same
//! totals as the JSON report of the same run; `rtprof report --output`
//! exports rtprofd's last span the same way.

use rtprof_e2e::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `go`, for `go tool pprof`.
fn go() -> PathBuf {
    for go in ["go", "/usr/bin/go", "/usr/lib/go/bin/go"] {
        if Command::new(go).arg("version").output().is_ok() {
            return go.into();
        }
    }
    panic!("go is missing: install Go (Debian: apt-get install golang-go) for go tool pprof");
}

fn ok(what: &str, o: Output) -> String {
    assert!(o.status.success(), "{what}: {o:?}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `go tool pprof -top` of `file` for one sample type: the total it
/// prints, and each function's flat value.
fn pprof_top(file: &Path, sample_index: &str) -> (u64, Vec<(String, u64)>) {
    let o = Command::new(go())
        .args(["tool", "pprof", "-top", "-nodefraction=0"])
        .arg(format!("-sample_index={sample_index}"))
        .arg(file)
        .output()
        .expect("go tool pprof runs");
    let text = ok("go tool pprof", o);
    // "Duration: 380ms, Total samples = 160005 "
    let total = text
        .lines()
        .find_map(|l| l.split_once("Total samples = ").map(|(_, n)| n))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no total in {text}"));
    // "     80000 50.00% 50.00%      80000 50.00%  heavy"
    let rows = text
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let flat = cols.first()?.parse().ok()?;
            (cols.len() == 6).then(|| (cols[5].to_string(), flat))
        })
        .collect();
    (total, rows)
}

/// Runs the test program under `rtprof run --json report.json` and the
/// `output` options; the report's process for it.
fn run(bin: &Path, output: &[&str], dir: &Path) -> Value {
    let json = dir.join("report.json");
    let o = Command::new(rtprof())
        .arg("run")
        .arg("--json")
        .arg(&json)
        .args(output)
        .arg("--")
        .arg(bin)
        .output()
        .expect("rtprof runs");
    let stdout = ok("rtprof run", o);
    // The program's own count of calls.
    assert!(stdout.contains("CALLS heavy 80000"), "{stdout}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    process(&report, bin).clone()
}

/// The report's totals for a process: samples (in functions, outside them
/// in modules, outside every module) and calls.
fn totals(p: &Value) -> (u64, u64) {
    let sum = |list: &str, field: &str| -> u64 {
        p[list]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x[field].as_u64().unwrap())
            .sum()
    };
    let unknown = p["sampler"]["unknown"].as_u64().unwrap();
    let samples = sum("functions", "samples") + sum("modules", "samples") + unknown;
    assert_eq!(samples, p["sampler"]["samples"], "{p}");
    (samples, sum("functions", "calls"))
}

fn samples_of(p: &Value, function: &str) -> u64 {
    function_named(p, function)["samples"].as_u64().unwrap()
}

fn program(dir: &Path) -> PathBuf {
    compile_o2("formats.c", &["-g"], dir)
}

/// A stack export's samples against the report's total. A timer sample
/// taken in the agent's own exit work, just before its timers stop, can
/// be stacked and not counted (about 1 run in 5, a few samples of
/// hundreds, with this agent and the one before): at most 2% apart.
fn assert_near(stacked: u64, counted: u64, what: &str) {
    assert!(
        stacked.abs_diff(counted) <= 2.max(counted / 50),
        "{stacked} samples stacked, {counted} counted: {what}"
    );
}

#[test]
fn pprof_totals_are_the_json_reports() {
    let dir = scratch("formats-pprof");
    let bin = program(&dir);
    let file = dir.join("cpu.pb.gz");
    let p = run(&bin, &["--output", file.to_str().unwrap()], &dir);
    let (samples, calls) = totals(&p);
    assert!(samples_of(&p, "heavy") > 0, "{p}");

    let (total, rows) = pprof_top(&file, "calls");
    assert_eq!(total, calls, "{rows:?}");
    for f in ["heavy", "light"] {
        let flat = rows.iter().find(|r| r.0 == f).map(|r| r.1);
        assert_eq!(flat, Some(80000), "{f}: {rows:?}");
    }
    let (total, rows) = pprof_top(&file, "samples");
    assert_eq!(total, samples, "{rows:?}");
    let heavy = rows.iter().find(|r| r.0 == "heavy").map(|r| r.1);
    assert_eq!(heavy, Some(samples_of(&p, "heavy")), "{rows:?}");

    // The executable's mapping: its path and the build ID readelf reads.
    let raw = ok(
        "go tool pprof -raw",
        Command::new(go())
            .args(["tool", "pprof", "-raw"])
            .arg(&file)
            .output()
            .unwrap(),
    );
    let notes = ok(
        "readelf",
        Command::new("readelf")
            .arg("-n")
            .arg(&bin)
            .output()
            .unwrap(),
    );
    let build_id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("gcc gives the program a build ID");
    let exe = bin.canonicalize().unwrap();
    let mapping = format!("{} {build_id} [FN]", exe.display());
    assert!(raw.contains(&mapping), "{mapping} in {raw}");
    // Functions carry their source file and line (the program has DWARF).
    let source = std::fs::read_to_string(root().join("tests/c/formats.c")).unwrap();
    let line = 1 + source
        .lines()
        .position(|l| l.contains("heavy(") && !l.trim_end().ends_with(';'))
        .expect("heavy is defined");
    let at = format!(
        " heavy {}:{line} s={line}",
        root().join("tests/c/formats.c").display()
    );
    assert!(raw.contains(&at), "{at} in {raw}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn folded_svg_and_speedscope_weigh_the_samples() {
    let dir = scratch("formats-flame");
    let bin = program(&dir);
    let exe = bin.file_name().unwrap().to_str().unwrap().to_string();

    let folded = dir.join("stacks.folded");
    let p = run(&bin, &["--output", folded.to_str().unwrap()], &dir);
    let text = std::fs::read_to_string(&folded).unwrap();
    // Samples by the function they were taken in (a stack's last frame),
    // every stack rooted at the executable.
    let mut counts = std::collections::HashMap::new();
    for l in text.lines() {
        let (stack, n) = l.rsplit_once(' ').unwrap();
        assert!(stack.starts_with(&format!("{exe};")), "{l}");
        let leaf = stack.rsplit(';').next().unwrap().to_string();
        *counts.entry(leaf).or_insert(0) += n.parse::<u64>().unwrap();
    }
    assert_near(counts.values().sum::<u64>(), totals(&p).0, &text);
    let heavy = counts.get("heavy").copied();
    assert_eq!(heavy, Some(samples_of(&p, "heavy")), "{text}");
    // Three times light's work per call.
    assert!(heavy > counts.get("light").copied(), "{text}");

    let svg = dir.join("flame.svg");
    run(&bin, &["--output", svg.to_str().unwrap()], &dir);
    ok(
        "an XML parser reads the SVG",
        Command::new("python3")
            .args([
                "-c",
                "import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])",
            ])
            .arg(&svg)
            .output()
            .unwrap(),
    );
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.contains("<title>heavy ("), "{drawn}");

    let speedscope = dir.join("prof.speedscope.json");
    let p = run(&bin, &["--output", speedscope.to_str().unwrap()], &dir);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&speedscope).unwrap()).unwrap();
    assert_eq!(
        v["$schema"],
        "https://www.speedscope.app/file-format-schema.json"
    );
    let frames = v["shared"]["frames"].as_array().unwrap();
    let heavy = frames.iter().position(|f| f["name"] == "heavy");
    let profiles = v["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 1, "{v}");
    let q = &profiles[0];
    assert_eq!(q["type"], "sampled");
    let weights: Vec<u64> = serde_json::from_value(q["weights"].clone()).unwrap();
    assert_near(weights.iter().sum::<u64>(), totals(&p).0, &v.to_string());
    let samples = q["samples"].as_array().unwrap();
    let on_heavy: u64 = samples
        .iter()
        .zip(&weights)
        .filter(|(s, _)| {
            s.as_array().unwrap().last().and_then(Value::as_u64) == heavy.map(|h| h as u64)
        })
        .map(|(_, w)| w)
        .sum();
    assert_eq!(on_heavy, samples_of(&p, "heavy"), "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The format comes from --format, else the file's name; a name that
/// says none stops rtprof before the program runs.
#[test]
fn the_format_is_named_or_taken_from_the_file_name() {
    let dir = scratch("formats-names");
    let marker = dir.join("ran");
    let o = Command::new(rtprof())
        .arg("run")
        .arg("--output")
        .arg(dir.join("prof.dat"))
        .arg("--")
        .arg("touch")
        .arg(&marker)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("prof.dat: cannot tell the format") && err.contains("--format"),
        "{err}"
    );
    assert!(!marker.exists(), "the program ran");

    // --format json to any file: the report --json writes.
    let bin = program(&dir);
    let file = dir.join("prof.dat");
    let p = run(
        &bin,
        &["--output", file.to_str().unwrap(), "--format", "json"],
        &dir,
    );
    let again: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let q = process(&again, &bin);
    assert_eq!(
        function_named(q, "heavy")["calls"],
        function_named(&p, "heavy")["calls"]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `rtprof report --output` exports the span the JSON report shows: read
/// between two JSON reports of the same span (generation), while the
/// program runs.
#[test]
fn report_exports_rtprofds_last_span() {
    let dir = scratch("formats-report");
    let bin = program(&dir);
    let mut cmd = Command::new(rtprof().with_file_name("rtprofd"));
    cmd.args(["--tick", "200", "--span", "1000"])
        .stderr(std::process::Stdio::null());
    let d = Rtprofd::start(cmd, &dir);
    // Long enough for any number of spans; killed when done (or when the
    // test fails).
    let child = Killed(
        Command::new(&bin)
            .arg("100")
            .env("LD_PRELOAD", agent())
            .env("RTPROF_DAEMON_SOCKET", &d.socket)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id().to_string();
    let report = |extra: &[&str]| {
        Command::new(rtprof())
            .args(["report", "--pid", &pid, "--present"])
            .arg(&d.present)
            .args(extra)
            .output()
            .unwrap()
    };
    // None until rtprofd's first tick has published a span.
    let json = || -> Option<Value> {
        let o = report(&["--json"]);
        if String::from_utf8_lossy(&o.stderr).contains("nothing published yet") {
            return None;
        }
        Some(serde_json::from_str(&ok("rtprof report --json", o)).unwrap())
    };
    let folded = dir.join("span.folded");
    let (before, text) = poll(
        "a span with samples of heavy, exported between two reports of it",
        std::time::Duration::from_secs(60),
        || {
            let before = json()?;
            let heavy = before["processes"][0]["functions"]
                .as_array()?
                .iter()
                .find(|f| f["name"] == "heavy")?;
            if heavy["samples"].as_u64()? == 0 {
                return None;
            }
            ok(
                "rtprof report --output",
                report(&["--output", folded.to_str().unwrap()]),
            );
            let text = std::fs::read_to_string(&folded).unwrap();
            (json()?["generation"] == before["generation"]).then_some((before, text))
        },
    );
    drop(child);
    let p = &before["processes"][0];
    let rows = p["functions"].as_array().unwrap();
    let samples: u64 = rows.iter().map(|r| r["samples"].as_u64().unwrap()).sum();
    let mut sum = 0;
    let exe = bin.file_name().unwrap().to_str().unwrap();
    for l in text.lines() {
        let (stack, n) = l.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        sum += n;
        if stack == format!("{exe};heavy") {
            let heavy = rows.iter().find(|r| r["name"] == "heavy").unwrap();
            assert_eq!(heavy["samples"], n, "{text}");
        }
    }
    assert_eq!(sum, samples, "{text} against {p}");
    assert!(text.contains(&format!("{exe};heavy ")), "{text}");
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}
