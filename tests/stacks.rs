//! Sampled call stacks: a program with a known call tree, built with and
//! without frame pointers, shows exactly its paths in about their shares
//! (folded stacks, JSON, the text report's callers); `RTPROF_STACKS=0`
//! samples without them.

use rtprof_e2e::*;
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

/// `rtprof run --output <dir>/<name>.folded` with `env`: the folded lines
/// as (path below `main`, samples) and the JSON report of the same run.
fn folded(
    bin: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    dir: &Path,
) -> (HashMap<String, u64>, Value) {
    let out = dir.join("stacks.folded");
    let json = dir.join("stacks.json");
    let mut c = Command::new(rtprof());
    c.arg("run")
        .arg("--output")
        .arg(&out)
        .arg("--json")
        .arg(&json)
        .arg("--")
        .arg(bin)
        .args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("rtprof runs");
    assert!(o.status.success(), "{o:?}");
    let mut paths = HashMap::new();
    for line in std::fs::read_to_string(&out).unwrap().lines() {
        let (stack, n) = line.rsplit_once(' ').expect("a count");
        let below = match stack.split_once(";main;") {
            Some((_, rest)) => rest.to_string(),
            None => format!("({stack})"),
        };
        *paths.entry(below).or_default() += n.parse::<u64>().unwrap();
    }
    let report = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (paths, report)
}

/// The call tree's three paths and nothing else of weight, in shares of
/// a half and two quarters, however the program was built and whichever
/// sampler ran.
#[test]
fn sampled_stacks_follow_the_call_tree() {
    let no_fp = &["-fomit-frame-pointer"][..];
    // A round of the program lasts about one sampling period (1 ms), so
    // samples fall at a slowly drifting phase of it: 1,600 rounds let the
    // phase cover the round several times (400 gave a;b;c shares from
    // 0.44 to 0.61, 1,600 from 0.47 to 0.52).
    for (tag, flags, sampler, rounds) in [
        ("no-frame-pointers", no_fp, "perf", "1600"),
        (
            "frame-pointers",
            &["-fno-omit-frame-pointer"][..],
            "perf",
            "1600",
        ),
        ("timer", no_fp, "timer", "1600"),
    ] {
        let dir = scratch(&format!("stacks-{tag}"));
        let bin = compile_o2("stacks.c", flags, &dir);
        let (paths, report) = folded(&bin, &[rounds], &[("RTPROF_SAMPLER", sampler)], &dir);
        assert_eq!(process(&report, &bin)["sampler"]["name"], sampler, "{tag}");
        let total: u64 = paths.values().sum();
        assert!(total > 100, "{tag}: {total} samples: {paths:?}");
        let heavy: HashMap<&str, f64> = paths
            .iter()
            .filter(|(_, &n)| n as f64 > 0.03 * total as f64)
            .map(|(p, &n)| (p.as_str(), n as f64 / total as f64))
            .collect();
        let mut found: Vec<&str> = heavy.keys().copied().collect();
        found.sort();
        assert_eq!(found, ["a;b;c", "a;c", "d;c"], "{tag}: {paths:?}");
        for (path, want) in [("a;b;c", 0.5), ("a;c", 0.25), ("d;c", 0.25)] {
            let got = heavy[path];
            assert!(
                (got - want).abs() < 0.1,
                "{tag}: {path} {got:.2} (want {want}): {paths:?}"
            );
        }
        // JSON: the same stacks, leaf first, and samples that add up.
        let p = process(&report, &bin);
        let stacks = p["stacks"].as_array().expect("stacks in JSON");
        let abc = stacks
            .iter()
            // A stack whose unwinding stopped early is shorter.
            .filter(|s| {
                s["frames"].as_array().unwrap().get(..4)
                    == Some(&["c", "b", "a", "main"].map(Value::from)[..])
            })
            .map(|s| s["samples"].as_u64().unwrap())
            .sum::<u64>();
        assert_eq!(abc, paths["a;b;c"], "{tag}");
        let in_stacks: u64 = stacks.iter().map(|s| s["samples"].as_u64().unwrap()).sum();
        assert!(in_stacks <= p["sampler"]["samples"].as_u64().unwrap());
    }
}

/// The text report says who calls the hot function.
#[test]
fn the_report_names_callers_and_callees() {
    let dir = scratch("stacks-text");
    let bin = compile_o2("stacks.c", &[], &dir);
    let o = Command::new(rtprof())
        .args(["run", "--"])
        .arg(&bin)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stderr);
    let line = text
        .lines()
        .find(|l| l.trim_start().split("  ").nth(1) == Some("c"))
        .unwrap_or_else(|| panic!("no callers of c in {text}"));
    let share = |who: &str| -> f64 {
        let at = line
            .find(&format!(" {who} "))
            .unwrap_or_else(|| panic!("{who} in {line}"));
        line[at + who.len() + 2..]
            .split('%')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!((share("b") - 50.0).abs() < 10.0, "{line}");
    assert!((share("a") - 25.0).abs() < 10.0, "{line}");
    assert!((share("d") - 25.0).abs() < 10.0, "{line}");
    let a = text
        .lines()
        .find(|l| l.trim_start().split("  ").nth(1) == Some("a"))
        .unwrap_or_else(|| panic!("no line for a in {text}"));
    assert!(a.contains("<- main 100%") && a.contains("-> b "), "{a}");
}

/// Samples in a module only sampled, taken before its functions are
/// listed (the timer sampler holds them for the names): their stacks end
/// in the function their count went to, so stacks and counts agree, in
/// the folded lines and in JSON, whichever sampler ran.
#[test]
fn stacks_of_samples_held_for_names_agree_with_the_counts() {
    let dir = scratch("stacks-held");
    let bin = compile_o2("libc_work.c", &["-g"], &dir);
    for sampler in ["timer", "perf"] {
        let (paths, report) = folded(&bin, &[], &[("RTPROF_SAMPLER", sampler)], &dir);
        let p = process(&report, &bin);
        assert_eq!(p["sampler"]["name"], sampler);
        let samples = p["sampler"]["samples"].as_u64().unwrap();
        assert!(samples > 100, "{sampler}: {samples}");
        assert_eq!(paths.values().sum::<u64>(), samples, "{sampler}: {paths:?}");
        // Every JSON stack's leaf has at least its stacks' samples.
        let mut by_leaf: HashMap<&str, u64> = HashMap::new();
        for s in p["stacks"].as_array().unwrap() {
            let leaf = s["frames"][0].as_str().unwrap();
            *by_leaf.entry(leaf).or_default() += s["samples"].as_u64().unwrap();
        }
        for (leaf, n) in by_leaf {
            let own = p["functions"]
                .as_array()
                .unwrap()
                .iter()
                .chain(p["modules"].as_array().unwrap())
                .filter(|f| {
                    f["name"] == leaf
                        || f["path"]
                            .as_str()
                            .is_some_and(|m| leaf == format!("[{}]", m.rsplit('/').next().unwrap()))
                })
                .map(|f| f["samples"].as_u64().unwrap())
                .sum::<u64>();
            assert!(
                n <= own,
                "{sampler}: {leaf}: {n} in stacks, {own} counted: {p}"
            );
        }
    }
}

/// `RTPROF_STACKS=0`: samples still count, without stacks.
#[test]
fn stacks_can_be_switched_off() {
    let dir = scratch("stacks-off");
    let bin = compile_o2("stacks.c", &[], &dir);
    let (paths, report) = folded(&bin, &[], &[("RTPROF_STACKS", "0")], &dir);
    let p = process(&report, &bin);
    assert!(p.get("stacks").is_none(), "{p}");
    assert!(p["sampler"]["samples"].as_u64().unwrap() > 100);
    // One frame below the executable: no paths through main.
    assert!(paths.keys().all(|k| k.starts_with('(')), "{paths:?}");
}

/// The agent's own report (`RTPROF_REPORT`, no `rtprof run`) has the
/// stacks too.
#[test]
fn the_agents_own_report_has_stacks() {
    let dir = scratch("stacks-report");
    let bin = compile_o2("stacks.c", &[], &dir);
    let path = dir.join("report.json");
    let o = Command::new(&bin)
        .env("LD_PRELOAD", agent())
        .env("RTPROF_REPORT", &path)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let stacks = report["processes"][0]["stacks"]
        .as_array()
        .unwrap_or_else(|| panic!("no stacks in {report}"));
    let paths: Vec<Vec<&str>> = stacks
        .iter()
        .map(|s| {
            s["frames"]
                .as_array()
                .unwrap()
                .iter()
                .take(3)
                .map(|f| f.as_str().unwrap())
                .collect()
        })
        .collect();
    for want in [["c", "b", "a"], ["c", "a", "main"], ["c", "d", "main"]] {
        assert!(paths.iter().any(|p| p == &want), "{want:?} in {paths:?}");
    }
}

/// `RTPROF_CALLERS=1`: every patched function's callers, counted exactly.
#[test]
fn exact_callers_are_counted() {
    let dir = scratch("stacks-callers");
    let bin = compile_o2("stacks.c", &[], &dir);
    let plain = run_plain(&bin, &[]);
    let prof = run_profiled(&bin, &[], &[("RTPROF_CALLERS", "1")], &dir);
    assert_same_behaviour("stacks.c with callers", &plain, &prof.output);
    let p = process(&prof.report, &bin);
    let callers = |f: &str| -> Vec<(String, u64)> {
        function_named(p, f)["callers"]
            .as_array()
            .unwrap_or_else(|| panic!("no callers of {f} in {p}"))
            .iter()
            .map(|c| {
                (
                    c["function"].as_str().unwrap().to_string(),
                    c["calls"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let own = |f: &str, n: u64| (f.to_string(), n);
    assert_eq!(callers("c"), [own("b", 800), own("a", 400), own("d", 400)]);
    assert_eq!(callers("b"), [own("a", 800)]);
    assert_eq!(callers("a"), [own("main", 400)]);
    assert_eq!(callers("d"), [own("main", 400)]);
    let o = Command::new(rtprof())
        .args(["run", "--"])
        .arg(&bin)
        .env("RTPROF_CALLERS", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(
        text.lines()
            .any(|l| l.trim_start() == "1600  c  <- b 800, a 400, d 400"),
        "{text}"
    );
    // Without it, no callers.
    let off = run_profiled(&bin, &[], &[], &dir);
    assert!(function_named(process(&off.report, &bin), "c")
        .get("callers")
        .is_none());
}
