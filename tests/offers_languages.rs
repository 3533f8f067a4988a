//! Offers from the languages hot code is written in: C++ by the name
//! reports print (`k::sum`), from the section macro with a qualified name,
//! and by address for one of two overloads; Rust through the rtprof-offer
//! crate, by function pointer and by its readable name. Each program is
//! built at test time, its calls routed through rtprofd to each offer and
//! back while a thread calls, and every implementation's own count equals
//! rtprof's row.

use rtprof_e2e::*;
use serde_json::Value;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

fn daemon(dir: &Path) -> Rtprofd {
    let mut cmd = Command::new(rtprof().with_file_name("rtprofd"));
    cmd.args(["--tick", "100", "--span", "500"])
        .stderr(Stdio::null());
    Rtprofd::start(cmd, dir)
}

/// A program answering "counts" with `name count` pairs, ended by "quit".
struct Program {
    child: Child,
    input: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Program {
    fn start(bin: &Path, d: &Rtprofd, report: &Path) -> (Program, Vec<String>) {
        let mut child = Command::new(bin)
            .env("LD_PRELOAD", agent())
            .env("RTPROF_DAEMON_SOCKET", &d.socket)
            .env("RTPROF_REPORT", report)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let input = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut p = Program { child, input, out };
        let mut said = Vec::new();
        loop {
            let l = p.line();
            if l == "ready" {
                break;
            }
            assert!(!l.is_empty(), "the program ended: {said:?}");
            said.push(l);
        }
        (p, said)
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.out.read_line(&mut l).unwrap();
        l.trim_end().to_string()
    }

    fn counts(&mut self) -> HashMap<String, u64> {
        writeln!(self.input, "counts").unwrap();
        parse_counts(&self.line())
    }

    /// Quits: the last counts, after its status is checked.
    fn quit(mut self) -> HashMap<String, u64> {
        writeln!(self.input, "quit").unwrap();
        let last = self.line();
        let rest = self.line();
        assert!(rest.is_empty(), "after the counts: {rest}");
        let status = self.child.wait().unwrap();
        let mut err = String::new();
        use std::io::Read;
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(status.success(), "{status:?}: {err}");
        parse_counts(&last)
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn parse_counts(line: &str) -> HashMap<String, u64> {
    let w: Vec<&str> = line.split_whitespace().collect();
    assert!(
        w.len().is_multiple_of(2) && !w.is_empty(),
        "not counts: {line}"
    );
    w.chunks(2)
        .map(|p| (p[0].to_string(), p[1].parse().expect(line)))
        .collect()
}

/// `rtprof route`, which must succeed.
fn route(d: &Rtprofd, pid: u32, function: &str, to: &str) {
    let o = route_when_followed(d, pid, function, to);
    assert!(o.status.success(), "route {function} {to}: {o:?}");
}

/// Routes `function` to `to` and waits until the implementation counting
/// `key` runs calls.
fn route_until_running(p: &mut Program, d: &Rtprofd, function: &str, to: &str, key: &str) {
    let pid = p.child.id();
    route(d, pid, function, to);
    let before = p.counts()[key];
    wait_until(
        &format!("{key} to run after routing {function} to {to}"),
        Duration::from_secs(20),
        || p.counts()[key] > before,
    );
}

/// The calls of the implementation row named `implementation`.
fn implementation_calls(report: &Value, implementation: &str) -> u64 {
    let rows = report["processes"][0]["functions"].as_array().unwrap();
    let found: Vec<&Value> = rows
        .iter()
        .filter(|f| f["implementation"] == implementation)
        .collect();
    assert_eq!(found.len(), 1, "rows of {implementation}: {found:?}");
    found[0]["calls"].as_u64().unwrap()
}

#[test]
fn cxx_offers_by_readable_name_section_and_address() {
    let dir = scratch("offers-cxx");
    let inc = format!("-I{}", root().join("abi/include").display());
    let bin = compile_o2("offers_cxx.cpp", &["-pthread", &inc], &dir);
    let d = daemon(&dir);
    let report = dir.join("report.json");
    let (mut p, said) = Program::start(&bin, &d, &report);
    assert_eq!(
        said,
        [
            "offer k::sum unrolled 0",
            // Two functions are k::scale without their parameters.
            "offer k::scale fast -10",
            "offer_at k::scale(long) fast 0",
        ]
    );
    route_until_running(&mut p, &d, "k::sum", "unrolled", "unrolled");
    route_until_running(&mut p, &d, "k::sum", "pairs", "pairs");
    route_until_running(&mut p, &d, "k::sum", "original", "sum");
    // By the name of either overload: the one with the offer is routed.
    route_until_running(&mut p, &d, "k::scale", "fast", "scale_fast");
    route_until_running(&mut p, &d, "k::scale(long)", "original", "scale");
    let last = p.quit();
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(implementation_calls(&r, "unrolled"), last["unrolled"]);
    assert_eq!(implementation_calls(&r, "pairs"), last["pairs"]);
    assert_eq!(implementation_calls(&r, "fast"), last["scale_fast"]);
    for key in ["unrolled", "pairs", "scale_fast"] {
        assert!(last[key] > 0, "{key}: {last:?}");
    }
}

/// A Cargo project at test time: the program of tests/programs/rust/offers
/// (crate `dot`) with the rtprof-offer crate, built offline.
fn build_rust_offers(dir: &Path) -> PathBuf {
    let project = dir.join("dot");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        project.join("Cargo.toml"),
        format!(
            "[package]\nname = \"dot\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
             [[bin]]\nname = \"dot\"\npath = \"{}\"\n\n\
             [dependencies]\nrtprof-offer = {{ path = \"{}\" }}\n\n[workspace]\n",
            root().join("tests/programs/rust/offers/main.rs").display(),
            root().join("offer").display()
        ),
    )
    .unwrap();
    let o = Command::new("cargo")
        .args(["build", "--release", "--offline", "--quiet"])
        .current_dir(&project)
        .env("CARGO_TARGET_DIR", project.join("target"))
        .output()
        .unwrap();
    assert!(o.status.success(), "cargo build: {o:?}");
    project.join("target/release/dot")
}

#[test]
fn rust_offers_by_function_pointer_and_readable_name() {
    let dir = scratch("offers-rust");
    let bin = build_rust_offers(&dir);
    let d = daemon(&dir);
    let report = dir.join("report.json");
    let (mut p, said) = Program::start(&bin, &d, &report);
    assert_eq!(said, ["offer chunks Ok(())", "offer reversed Ok(())"]);
    route_until_running(&mut p, &d, "dot::dot_plain", "chunks", "chunks");
    route_until_running(&mut p, &d, "dot::dot_plain", "reversed", "reversed");
    route_until_running(&mut p, &d, "dot::dot_plain", "original", "plain");
    let last = p.quit();
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(implementation_calls(&r, "chunks"), last["chunks"]);
    assert_eq!(implementation_calls(&r, "reversed"), last["reversed"]);
    assert!(last["chunks"] > 0 && last["reversed"] > 0, "{last:?}");
}
