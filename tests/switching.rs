//! Counting switched per function while threads run: the C API switching
//! one function on and off between rounds of calls (exact counts) and
//! 10,000 times while eight threads call it (no crash, output unchanged,
//! counts within what was called), and `RTPROF_COUNT` / `RTPROF_NOCOUNT`.

use rtprof_e2e::*;

/// The number after `key ` in the program's stderr.
fn said(stderr: &[u8], key: &str) -> u64 {
    String::from_utf8_lossy(stderr)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key} ")))
        .unwrap_or_else(|| panic!("no {key} line"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn counting_switched_while_threads_call() {
    let dir = scratch("switch");
    let inc = format!("-I{}", root().join("abi/include").display());
    let bin = compile_o2("switch.c", &["-pthread", &inc], &dir);
    // 8 threads; 2,000 rounds of 50 calls each, switched before every
    // round; then 10,000 switches while the threads call without pause.
    let args = ["8", "2000", "50", "10000"];
    let plain = run_plain(&bin, &args);
    assert!(plain.status.success(), "{plain:?}");
    let prof = run_profiled(&bin, &args, &[], &dir);
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        String::from_utf8_lossy(&prof.output.stdout)
    );
    assert!(prof.output.status.success(), "{:?}", prof.output);
    let expected = said(&prof.output.stderr, "expected");
    let stress = said(&prof.output.stderr, "stress");
    assert_eq!(expected, 1000 * 50 * 8, "half the rounds counted");
    let hot = function_named(&prof.report["processes"][0], "hot");
    assert_eq!(hot["patched"], true, "{hot}");
    let calls = hot["calls"].as_u64().unwrap();
    assert!(
        (expected..=expected + stress).contains(&calls),
        "{calls} calls counted: the exact rounds give {expected}, the stress phase made {stress} more"
    );
    assert!(hot.get("counting").is_none(), "ends switched on: {hot}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn count_and_nocount_at_start() {
    let dir = scratch("nocount");
    let bin = compile_o2("calls.c", &[], &dir);
    let plain = run_plain(&bin, &[]);
    let want = expectations(&plain.stdout).counts;
    let (first, _) = want[0].clone();
    for (var, counted) in [
        (
            "RTPROF_NOCOUNT",
            Box::new(|n: &str| n != first) as Box<dyn Fn(&str) -> bool>,
        ),
        ("RTPROF_COUNT", Box::new(|n: &str| n == first)),
    ] {
        let prof = run_profiled(&bin, &[], &[(var, first.as_str())], &dir);
        assert_same_behaviour(var, &plain, &prof.output);
        let p = process(&prof.report, &bin);
        for (name, n) in &want {
            let f = function_named(p, name);
            if f["patched"] != true {
                continue;
            }
            if counted(name) {
                assert_eq!(f["calls"].as_u64(), Some(*n), "{var}: {f}");
                assert!(f.get("counting").is_none(), "{var}: {f}");
            } else {
                assert_eq!(f["calls"], 0, "{var}: {f}");
                assert_eq!(f["counting"], "off", "{var}: {f}");
            }
        }
    }
    // Nothing counted at all, libc's functions included: stubs are written
    // switched off, before any call could count.
    let env = [("RTPROF_MODULES", "all"), ("RTPROF_NOCOUNT", "*")];
    let prof = run_profiled(&bin, &[], &env, &dir);
    assert_same_behaviour("all off", &plain, &prof.output);
    for p in prof.report["processes"].as_array().unwrap() {
        let fs = p["functions"].as_array().unwrap();
        let calls: u64 = fs.iter().filter_map(|f| f["calls"].as_u64()).sum();
        assert_eq!(calls, 0, "{}", p["exe"]);
        assert!(fs.iter().any(|f| f["counting"] == "off"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `rtprof run --nocount` passes the globs on to the agent.
#[test]
fn rtprof_run_nocount_switches_the_function_off() {
    let dir = scratch("run-nocount");
    let bin = compile_o2("calls.c", &[], &dir);
    let plain = run_plain(&bin, &[]);
    let (first, _) = expectations(&plain.stdout).counts[0].clone();
    let json = dir.join("r.json");
    let out = std::process::Command::new(rtprof())
        .args(["run", "--nocount", &first, "--json"])
        .arg(&json)
        .arg("--")
        .arg(&bin)
        .output()
        .unwrap();
    assert_same_behaviour("rtprof run --nocount", &plain, &out);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let f = function_named(process(&report, &bin), &first);
    assert_eq!(
        (&f["calls"], &f["counting"]),
        (&0.into(), &"off".into()),
        "{f}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
