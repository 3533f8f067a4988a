//! Which functions a JSON report lists: by default those called or
//! sampled (or named by something else listed, such as a caller frame of
//! a sampled stack), every module saying how many of its functions were
//! left out; all of them with `--all-functions` / `RTPROF_ALL_FUNCTIONS=1`.
//! Both for `rtprof run --json` and the agent's own `RTPROF_REPORT`.

use rtprof_e2e::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// What the program says it called: name -> calls.
fn called_by_program(stdout: &[u8]) -> BTreeMap<String, u64> {
    let text = String::from_utf8_lossy(stdout);
    let mut called = BTreeMap::new();
    let mut declared = None;
    for l in text.lines() {
        match l.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["CALLED", name, n] => {
                called.insert(name.to_string(), n.parse().unwrap());
            }
            ["CALLED_FUNCTIONS", n] => declared = Some(n.parse::<usize>().unwrap()),
            _ => {}
        }
    }
    assert_eq!(Some(called.len()), declared, "{text}");
    called
}

/// The program's `f_*` functions a report's process lists: name -> calls.
fn listed_f(p: &Value) -> BTreeMap<String, u64> {
    p["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["name"].as_str().unwrap().starts_with("f_"))
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["calls"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Each instrumented module's (listed, left_out) by path.
fn module_totals(p: &Value) -> BTreeMap<String, (u64, u64)> {
    p["modules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["sampled_only"] == false)
        .map(|m| {
            (
                m["path"].as_str().unwrap().to_string(),
                (
                    m["listed"].as_u64().unwrap(),
                    m["left_out"].as_u64().unwrap(),
                ),
            )
        })
        .collect()
}

/// Rows a process lists per module file name.
fn rows_per_module(p: &Value) -> BTreeMap<String, u64> {
    let mut n = BTreeMap::new();
    for f in p["functions"].as_array().unwrap() {
        *n.entry(f["module"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    n
}

fn file_name(path: &str) -> String {
    path.rsplit('/').next().unwrap().to_string()
}

/// A report as (process of `bin`, size in bytes).
fn read(path: &Path, bin: &Path) -> (Value, usize) {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no report {}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text).unwrap();
    (process(&v, bin).clone(), text.len())
}

/// The checks of one pair of reports of the same run: `used` (the
/// default) lists exactly the `f_*` functions the program called, with
/// their calls; `all` lists all 900; each module's listed and left-out
/// functions add up to what `all` lists of it; `used` is the smaller file.
fn check(what: &str, called: &BTreeMap<String, u64>, used: (Value, usize), all: (Value, usize)) {
    let ((u, u_size), (a, a_size)) = (used, all);
    assert_eq!(&listed_f(&u), called, "{what}: default listing");
    let every = listed_f(&a);
    assert_eq!(every.len(), 900, "{what}: --all-functions lists them all");
    for (name, n) in called {
        assert_eq!(every.get(name), Some(n), "{what}: {name}");
    }
    // The default's totals against what --all-functions lists.
    let totals = module_totals(&u);
    let rows_all = rows_per_module(&a);
    let rows_used = rows_per_module(&u);
    assert!(!totals.is_empty(), "{what}");
    for (path, (listed, left_out)) in &totals {
        let name = file_name(path);
        assert_eq!(
            *listed,
            rows_used.get(&name).copied().unwrap_or(0),
            "{what}: {path} listed"
        );
        assert_eq!(
            listed + left_out,
            rows_all.get(&name).copied().unwrap_or(0),
            "{what}: {path}: listed + left out = every function"
        );
    }
    let exe = module_totals(&a)
        .into_iter()
        .find(|(p, _)| {
            Path::new(p).file_name() == Path::new(u["exe"].as_str().unwrap()).file_name()
        })
        .unwrap_or_else(|| panic!("{what}: no executable module"));
    assert_eq!(exe.1 .1, 0, "{what}: --all-functions leaves none out");
    assert!(
        u_size * 4 < a_size,
        "{what}: {u_size} bytes listing the used functions, {a_size} listing all"
    );
}

#[test]
fn only_called_functions_are_listed_unless_all_are_asked_for() {
    let dir = scratch("listing");
    let bin = compile_o2("few_called.c", &[], &dir);
    let plain = run_plain(&bin, &[]);
    let called = called_by_program(&plain.stdout);
    assert_eq!(called.len(), 9);

    // rtprof run --json, with every module instrumented.
    let run = |all: bool, json: &Path| {
        let mut c = Command::new(rtprof());
        c.args(["run", "--modules", "all"]);
        if all {
            c.arg("--all-functions");
        }
        let out = c
            .arg("--json")
            .arg(json)
            .arg("--")
            .arg(&bin)
            .output()
            .unwrap();
        assert_same_behaviour("rtprof run", &plain, &out);
    };
    let (used, all) = (dir.join("used.json"), dir.join("all.json"));
    run(false, &used);
    run(true, &all);
    check("rtprof run", &called, read(&used, &bin), read(&all, &bin));

    // The agent's own report, without rtprof.
    let agent_report = |all: bool, json: &Path| {
        let mut c = Command::new(&bin);
        c.env("LD_PRELOAD", agent())
            .env("RTPROF_MODULES", "all")
            .env("RTPROF_REPORT", json);
        if all {
            c.env("RTPROF_ALL_FUNCTIONS", "1");
        }
        let out = c.output().unwrap();
        assert_same_behaviour("RTPROF_REPORT", &plain, &out);
    };
    let (used, all) = (dir.join("agent-used.json"), dir.join("agent-all.json"));
    agent_report(false, &used);
    agent_report(true, &all);
    check(
        "RTPROF_REPORT",
        &called,
        read(&used, &bin),
        read(&all, &bin),
    );

    // The text report says how many were left out.
    let out = Command::new(rtprof())
        .args(["run", "--"])
        .arg(&bin)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines()
            .any(|l| l.contains("functions had no call and no sample: not listed")),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A sampled stack's frames are all listed, callers with no sample of
/// their own included: sampling only (no calls counted), `outer` is in
/// every stack of the spin and does nothing itself.
#[test]
fn every_function_a_stack_names_is_listed() {
    let dir = scratch("listing-stacks");
    let bin = compile_o2("few_called.c", &["-fno-omit-frame-pointer"], &dir);
    let json = dir.join("r.json");
    let out = Command::new(rtprof())
        .args(["run", "--no-calls", "--json"])
        .arg(&json)
        .arg("--")
        .arg(&bin)
        .args(["100", "spin"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let (p, _) = read(&json, &bin);
    let listed: BTreeSet<&str> = p["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["function"].as_str().unwrap())
        .collect();
    let stacks = p["stacks"]
        .as_array()
        .unwrap_or_else(|| panic!("no stacks in {p}"));
    let frames: BTreeSet<&str> = stacks
        .iter()
        .flat_map(|s| s["frames"].as_array().unwrap())
        .map(|f| f.as_str().unwrap())
        .filter(|f| !f.starts_with('['))
        .collect();
    assert!(frames.contains("outer"), "{frames:?}");
    let missing: Vec<&&str> = frames.difference(&listed).collect();
    assert!(missing.is_empty(), "frames not listed: {missing:?} in {p}");
    let outer = p["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "outer")
        .unwrap();
    assert_eq!(outer["calls"], 0, "{outer}");
    let _ = std::fs::remove_dir_all(&dir);
}
