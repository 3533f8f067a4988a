//! Events besides CPU time (`rtprof run --events`): page faults counted
//! for the function that makes them and for each thread, exactly (one
//! sample per fault); an event the machine lacks and a name rtprof does
//! not know are each reported with why, and nothing else changes.

use rtprof_e2e::*;
use serde_json::Value;
use std::process::Command;

fn event<'a>(p: &'a Value, name: &str) -> &'a Value {
    p["events"]
        .as_array()
        .expect("events in the report")
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("no event {name}: {p}"))
}

/// `rtprof run --events EVENTS --output JSON -- BIN ARGS`, which must
/// succeed.
fn run_with_events(
    bin: &std::path::Path,
    args: &[&str],
    events: &str,
    json: &std::path::Path,
) -> std::process::Output {
    let out = Command::new(rtprof())
        .args(["run", "--events", events, "--output"])
        .arg(json)
        .arg("--")
        .arg(bin)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn page_faults_are_counted_per_function_and_thread_and_missing_events_say_why() {
    let dir = scratch("events");
    let bin = compile_o2("page_faults.c", &["-pthread"], &dir);
    let plain = Command::new(&bin).output().unwrap();
    assert!(plain.status.success());
    let json = dir.join("events.json");
    let out = run_with_events(&bin, &[], "page-faults,cycles,no-such-event", &json);
    let printed = String::from_utf8_lossy(&out.stdout);
    let w: Vec<&str> = printed.split_whitespace().collect();
    assert_eq!(w[..4], ["touched", "400", "1200", "2000"], "{printed}");
    // The same output as without the agent but for the thread ids.
    let plain = String::from_utf8_lossy(&plain.stdout);
    assert_eq!(plain.split_whitespace().nth(3), Some("2000"));
    let (tid_a, tid_b): (u64, u64) = (w[5].parse().unwrap(), w[6].parse().unwrap());

    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let p = &report["processes"][0];
    // Calls are exact as ever.
    assert_eq!(function_named(p, "touch")["calls"].as_u64(), Some(4), "{p}");
    assert_eq!(
        function_named(p, "compute")["calls"].as_u64(),
        Some(100),
        "{p}"
    );

    let pf = event(p, "page-faults");
    assert_eq!(pf["ran"], true, "{pf}");
    assert_eq!(pf["period"].as_u64(), Some(1));
    assert_eq!(pf["lost"].as_u64(), Some(0), "{pf}");
    let in_fn = |name: &str| {
        pf["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .map_or(0, |f| f["count"].as_u64().unwrap())
    };
    // One fault per page touched: 400 + 1200 + 1000 + 1000.
    assert_eq!(in_fn("touch"), 3600, "{pf}");
    assert_eq!(in_fn("compute"), 0, "{pf}");
    let per_call = pf["functions"][0]["per_call"].as_f64().unwrap();
    assert!((per_call - 900.0).abs() < 1e-9, "{pf}");
    // Per thread: each worker's pages, and a few of its stack's.
    let of_thread = |tid: u64| {
        pf["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tid"].as_u64() == Some(tid))
            .map_or(0, |t| t["count"].as_u64().unwrap())
    };
    let (a, b) = (of_thread(tid_a), of_thread(tid_b));
    assert!((400..400 + 64).contains(&a), "thread a: {a}: {pf}");
    assert!((1200..1200 + 64).contains(&b), "thread b: {b}: {pf}");
    let per_thread: u64 = pf["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["count"].as_u64().unwrap())
        .sum();
    assert_eq!(per_thread, pf["count"].as_u64().unwrap(), "{pf}");

    // A hardware counter: counted where the machine has it, else said why.
    let cycles = event(p, "cycles");
    if cycles["ran"] == true {
        assert!(cycles["count"].as_u64().unwrap() > 0, "{cycles}");
    } else {
        assert!(cycles["errno"].as_u64().unwrap() > 0, "{cycles}");
        assert!(
            cycles["why"].as_str().unwrap().starts_with("unavailable"),
            "{cycles}"
        );
    }
    let unknown = event(p, "no-such-event");
    assert_eq!(
        (&unknown["ran"], &unknown["why"]),
        (&Value::Bool(false), &Value::from("unknown event"))
    );

    // The text report says the same.
    let out = Command::new(rtprof())
        .args(["run", "--events", "page-faults,no-such-event", "--"])
        .arg(&bin)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("page-faults (one sample every 1):"), "{text}");
    assert!(text.contains("no-such-event: unknown event"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains("touch") && l.contains("900.00 per call")),
        "{text}"
    );
}

#[test]
fn without_events_the_report_has_none() {
    let dir = scratch("events-none");
    let bin = compile_o2("page_faults.c", &["-pthread"], &dir);
    let json = dir.join("none.json");
    let out = Command::new(rtprof())
        .args(["run", "--output"])
        .arg(&json)
        .arg("--")
        .arg(&bin)
        .output()
        .unwrap();
    assert!(out.status.success());
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert!(report["processes"][0].get("events").is_none());
}

/// A forked child samples its own events, counted from nothing: its page
/// faults in `touch` are its own 700 pages' (and at most a few of its
/// stack's, copied on write), the parent's stay exactly 3,600.
#[test]
fn a_forked_child_counts_its_own_events() {
    let dir = scratch("events-fork");
    let bin = compile_o2("page_faults.c", &["-pthread"], &dir);
    let json = dir.join("fork.json");
    let out = run_with_events(&bin, &["fork"], "page-faults", &json);
    let printed = String::from_utf8_lossy(&out.stdout);
    let child: u64 = printed
        .lines()
        .find_map(|l| l.strip_prefix("child "))
        .and_then(|l| l.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{printed}"));
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let procs = report["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2, "{report}");
    let touch_faults = |p: &Value| {
        let pf = event(p, "page-faults");
        assert_eq!(pf["ran"], true, "{pf}");
        pf["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == "touch")
            .map_or(0, |f| f["count"].as_u64().unwrap())
    };
    let (kid, parent): (Vec<&Value>, Vec<&Value>) =
        procs.iter().partition(|p| p["pid"].as_u64() == Some(child));
    assert_eq!((kid.len(), parent.len()), (1, 1), "{report}");
    assert_eq!(touch_faults(parent[0]), 3600, "{}", parent[0]);
    let k = touch_faults(kid[0]);
    assert!((700..704).contains(&k), "child: {k}: {}", kid[0]);
    assert_eq!(function_named(kid[0], "touch")["calls"].as_u64(), Some(1));
    // Its threads' counts are its own: the one thread it has.
    let threads = event(kid[0], "page-faults")["threads"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(threads.len(), 1, "{threads:?}");
    assert_eq!(threads[0]["tid"].as_u64(), Some(child));
}
