//! Third-party proof: CPython's own regression tests pass with every
//! function of libpython and of every extension module (loaded later, by
//! dlopen) instrumented, exactly as they pass without the agent, and the
//! agent reports at least 95% of them patched.

use rtprof_e2e::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const MODULES: &[&str] = &[
    "test_list",
    "test_dict",
    "test_set",
    "test_tuple",
    "test_string",
    "test_int",
    "test_float",
    "test_math",
    "test_json",
    "test_re",
    "test_itertools",
    "test_functools",
    "test_collections",
    "test_bytes",
    "test_struct",
    "test_sort",
    "test_operator",
    "test_bool",
    "test_generators",
    "test_exceptions",
    "test_class",
    "test_scope",
    "test_weakref",
    "test_gc",
    // A process's whole life: children, threads, signals, fork.
    "test_subprocess",
    "test_threading",
    "test_signal",
    "test_os",
    "test_fork1",
    "test_threadsignals",
];

/// Test cases that fail on this machine with or without the agent (an
/// isolated interpreter here finds `threading` already imported).
const IGNORED: &[&str] = &["test_import_from_another_thread"];

/// An interpreter linked against a shared libpython. Fails loudly if none.
fn python() -> PathBuf {
    shared_python().unwrap_or_else(|tried| {
        panic!(
            "no Python with a shared libpython found; tried: {}. Set RTPROF_TEST_PYTHON.",
            tried.join(", ")
        )
    })
}

/// Runs the selected test modules; returns (passed, output). Failed test
/// cases are run once more (`--rerun`, as CPython's own CI does: some of
/// these tests race a one-second alarm against a busy machine), in both
/// runs alike; passed means they passed then.
fn run_suite(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().expect("test runner starts");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    // The runner's last word: `Result: SUCCESS`, or `Result: FAILURE then
    // SUCCESS` after a rerun that passed.
    let last = text.lines().rfind(|l| l.starts_with("Result: "));
    (
        out.status.success() && last.is_some_and(|l| l.trim_end().ends_with("SUCCESS")),
        text,
    )
}

/// The modules that failed in the end: after a rerun, those that failed
/// again; without one, those that failed.
fn final_failures(text: &str) -> Vec<String> {
    match text.find("Re-running") {
        Some(i) => {
            let mut v = Vec::new();
            let mut lines = text[i..]
                .lines()
                .skip_while(|l| !l.trim_end().ends_with("failed again:"));
            lines.next();
            for l in lines.take_while(|l| l.starts_with(' ')) {
                v.extend(l.split_whitespace().map(str::to_string));
            }
            v.sort();
            v
        }
        None => failed_modules(text),
    }
}

/// The modules that failed at their first run (before any rerun).
fn first_failures(text: &str) -> Vec<String> {
    failed_modules(&text[..text.find("Re-running").unwrap_or(text.len())])
}

/// Names of the test modules the runner reports as failed: progress lines
/// ("... test_x failed") and the summary block after "N tests failed:".
fn failed_modules(text: &str) -> Vec<String> {
    let mut v = Vec::new();
    let mut in_summary = false;
    for l in text.lines() {
        if in_summary {
            if !l.starts_with(' ') {
                in_summary = false;
            } else {
                v.extend(l.split_whitespace().map(str::to_string));
                continue;
            }
        }
        if l.trim_end().ends_with("failed:") {
            in_summary = true;
        } else if let Some((head, _)) = l.split_once(" failed") {
            if let Some(name) = head
                .split_whitespace()
                .last()
                .filter(|n| n.starts_with("test_"))
            {
                v.push(name.to_string());
            }
        }
    }
    v.sort();
    v.dedup();
    v
}

#[test]
fn cpython_regression_tests_pass_with_libpython_instrumented() {
    let py = python();
    let dir = scratch("cpython");
    let args = |c: &mut Command| {
        c.arg("-m").arg("test").arg("-j2").arg("--rerun");
        for i in IGNORED {
            c.arg("-i").arg(i);
        }
        c.args(MODULES).current_dir(&dir);
    };
    let mut plain = Command::new(&py);
    args(&mut plain);
    let t = std::time::Instant::now();
    let (plain_ok, plain_text) = run_suite(&mut plain);
    let plain_s = t.elapsed().as_secs_f64();

    let json = dir.join("report.json");
    let mut prof = Command::new(rtprof());
    // libpython, and every extension module as `import` loads it (dlopen).
    prof.arg("run")
        .arg("--modules")
        .arg("libpython*,*.cpython-*.so")
        .arg("--json")
        .arg(&json)
        .arg("--")
        .arg(&py);
    args(&mut prof);
    let t = std::time::Instant::now();
    let (prof_ok, prof_text) = run_suite(&mut prof);
    eprintln!(
        "{} CPython test modules: {plain_s:.1} s without the agent, {:.1} s with libpython and extensions instrumented",
        MODULES.len(),
        t.elapsed().as_secs_f64()
    );

    for (what, text) in [("without", &plain_text), ("with", &prof_text)] {
        let first = first_failures(text);
        if !first.is_empty() {
            eprintln!("{what} the agent, failed at first and run again: {first:?}");
        }
    }
    assert_eq!(
        (plain_ok, final_failures(&plain_text)),
        (prof_ok, final_failures(&prof_text)),
        "results differ with the agent:\n--- without ---\n{plain_text}\n--- with ---\n{prof_text}"
    );
    assert!(
        plain_ok,
        "the suite must pass on this machine without the agent:\n{plain_text}"
    );

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let procs = report["processes"].as_array().unwrap();
    // The tests also start other programs (true, echo, a shell): those are
    // profiled too, but only Python processes carry libpython.
    let exe = py.canonicalize().unwrap();
    let python: Vec<_> = procs
        .iter()
        .filter(|p| Path::new(p["exe"].as_str().unwrap()) == exe)
        .collect();
    assert!(
        python.len() > 2,
        "the runner and its workers are all reported"
    );
    let calls = |p: &serde_json::Value| -> u64 {
        p["functions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["calls"].as_u64().unwrap())
            .sum()
    };
    // A child the tests kill at once (test_subprocess does) may die while
    // its agent is still starting: its functions stay `not_attempted` and
    // `setup_ns` is 0. Those are few; every other process must be patched.
    let (started, died_starting): (Vec<&serde_json::Value>, Vec<_>) = python
        .iter()
        .copied()
        .partition(|p| p["setup_ns"].as_u64().unwrap() > 0);
    assert!(
        died_starting.len() * 10 <= python.len(),
        "{} of {} Python processes died during start-up",
        died_starting.len(),
        python.len()
    );
    for p in &started {
        let lib = p["modules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["path"].as_str().unwrap().contains("libpython"))
            .unwrap_or_else(|| panic!("libpython not instrumented in pid {}", p["pid"]));
        let (n, patched) = (
            lib["functions"].as_u64().unwrap(),
            lib["patched"].as_u64().unwrap(),
        );
        assert!(n > 3000, "libpython lists {n} functions");
        assert!(
            patched * 100 >= n * 95,
            "only {patched} of {n} libpython functions patched: {}",
            lib["refused"]
        );
    }
    // Extension modules arrive by dlopen, after start-up, and are patched too.
    // (A process killed while loading one leaves it not_attempted.)
    let extensions: Vec<&serde_json::Value> = python
        .iter()
        .flat_map(|p| p["modules"].as_array().unwrap())
        .filter(|m| m["path"].as_str().unwrap().contains(".cpython-"))
        .filter(|m| m["refused"].get("not_attempted").is_none())
        .collect();
    assert!(
        extensions.len() > 20,
        "only {} extension modules instrumented",
        extensions.len()
    );
    for m in &extensions {
        assert!(
            m["patched"].as_u64().unwrap() * 100 >= m["functions"].as_u64().unwrap() * 95,
            "{m}"
        );
    }
    // The runner (the first process) interprets a lot of Python; forked
    // helpers may do little before they exec or exit.
    let runner = calls(python[0]);
    assert!(
        runner > 1_000_000,
        "the runner made only {runner} counted calls"
    );
    // Every started process sampled itself with the default timers
    // (threads, forks, dlopen'd extensions and all), but for one whose
    // test took SIGPROF for itself (sampled until then), or a fork child
    // killed (test_subprocess kills at once) before fork() returned in it
    // and started its sampler; and the samples add up.
    let samples: u64 = started
        .iter()
        .map(|p| {
            let s = &p["sampler"];
            let killed_in_fork = p["ended"] == "abrupt" && s["why"] == "child made without fork()";
            assert!(
                s["name"] == "timer"
                    || killed_in_fork
                    || s["name"] == "off" && s["why"] == "SIGPROF taken over by the program",
                "pid {} ({}, {}): {s}",
                p["pid"],
                p["exe"],
                p["ended"]
            );
            s["samples"].as_u64().unwrap()
        })
        .sum();
    assert!(samples > 5_000, "only {samples} samples across the suite");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rerun_parsing() {
    let text = "0:00:46 [28/30] test_signal failed (1 failure)\n\
        Re-running 1 failed tests in verbose mode in subprocesses\n\
        0:00:50 [1/1] test_signal passed\n\
        == Tests result: FAILURE then SUCCESS ==\n\
        Result: FAILURE then SUCCESS\n";
    assert_eq!(first_failures(text), ["test_signal"]);
    assert!(final_failures(text).is_empty());
    let ok = |t: &str| {
        let mut c = Command::new("sh");
        c.arg("-c").arg(format!("printf '%s' '{t}'"));
        run_suite(&mut c).0
    };
    assert!(ok(text));
    assert!(ok("== Tests result: SUCCESS ==\n\nResult: SUCCESS\n"));
    assert!(!ok("== Tests result: FAILURE ==\n\nResult: FAILURE\n"));
    let again = "Re-running 2 failed tests\n2 tests failed again:\n    test_os test_signal\n\nTests result: FAILURE then FAILURE\n";
    assert_eq!(final_failures(again), ["test_os", "test_signal"]);
}

#[test]
fn failed_module_parsing() {
    let text = "0:00:01 load avg: 0.5 [ 3/24/1] test_dict failed (1 failure)\n2 tests failed:\n    test_dict test_set\n";
    assert_eq!(failed_modules(text), vec!["test_dict", "test_set"]);
}
