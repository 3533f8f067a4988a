//! Readable names: C++ and Rust symbols demangled in the text report and
//! beside the raw symbol in JSON; a function's compiler copies in one row
//! (or apart with `--no-merge-clones`), their calls summed exactly.

use rtprof_e2e::*;
use std::path::Path;
use std::process::Command;

/// `rtprof run [flags] -- bin`: the text report on stderr.
fn text_report(bin: &Path, flags: &[&str]) -> String {
    let out = Command::new(rtprof())
        .arg("run")
        .args(flags)
        .arg("--")
        .arg(bin)
        .output()
        .expect("rtprof runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The calls column of the report row whose function column is `name`.
fn calls_of(report: &str, name: &str) -> Option<u64> {
    report.lines().find_map(|l| {
        let cols: Vec<&str> = l
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        (cols.len() >= 7 && cols[5] == name).then(|| cols[0].parse().ok())?
    })
}

#[test]
fn cxx_names_are_demangled_with_symbols_kept_in_json() {
    let dir = scratch("names-cxx");
    let bin = compile_o2("names.cpp", &[], &dir);
    let prof = run_profiled(&bin, &[], &[], &dir);
    assert_same_behaviour("names.cpp", &run_plain(&bin, &[]), &prof.output);
    let p = process(&prof.report, &bin);
    for (symbol, readable, calls) in [
        ("_Z4leafi", "leaf(int)", 10_000),
        ("_Z6middlei", "middle(int)", 1000),
        ("_ZNK3geo5Point4normEi", "geo::Point::norm(int) const", 1000),
    ] {
        let f = function_named(p, symbol);
        assert_eq!(f["demangled"], readable, "{f}");
        assert_eq!(f["function"], readable, "{f}");
        assert_eq!(f["calls"], calls, "{f}");
    }
    let text = text_report(&bin, &[]);
    assert_eq!(calls_of(&text, "leaf(int)"), Some(10_000), "{text}");
    assert_eq!(
        calls_of(&text, "geo::Point::norm(int) const"),
        Some(1000),
        "{text}"
    );
    assert!(!text.contains("_Z4leafi"), "{text}");
}

#[test]
fn rust_names_are_demangled() {
    let dir = scratch("names-rust");
    let bin = dir.join("names_rs");
    let o = Command::new("rustc")
        .args(["-O", "-o"])
        .arg(&bin)
        .arg(root().join("tests/programs/rust/names.rs"))
        .output()
        .expect("rustc runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = text_report(&bin, &[]);
    assert_eq!(calls_of(&text, "names::hot"), Some(5000), "{text}");
    let prof = run_profiled(&bin, &[], &[], &dir);
    let p = process(&prof.report, &bin);
    let hot = p["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["demangled"] == "names::hot")
        .unwrap_or_else(|| panic!("no names::hot in {p}"));
    let raw = hot["name"].as_str().unwrap();
    assert!(raw.starts_with("_ZN5names3hot17h"), "{raw}");
}

#[test]
fn compiler_copies_are_one_row_unless_asked_apart() {
    let dir = scratch("names-clones");
    let bin = compile_o2("clones.c", &["-O3"], &dir);
    let copies: Vec<String> = symbol_addrs(&bin)
        .into_keys()
        .filter(|n| n.starts_with("deep."))
        .collect();
    assert!(
        copies.len() >= 2,
        "the compiler made copies of deep: {copies:?}"
    );
    // The program's own count of calls to deep, whatever copy ran.
    let plain = run_plain(&bin, &[]);
    let own: u64 = String::from_utf8_lossy(&plain.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("CALLS deep "))
        .and_then(|n| n.parse().ok())
        .expect("the program says how often it called deep");
    let merged = text_report(&bin, &[]);
    let row = format!(
        "deep [+{} cop{}]",
        copies.len() - 1,
        if copies.len() == 2 { "y" } else { "ies" }
    );
    assert_eq!(calls_of(&merged, &row), Some(own), "{merged}");
    let apart = text_report(&bin, &["--no-merge-clones"]);
    let sum: u64 = copies
        .iter()
        .map(|c| {
            let (_, suffix) = c.split_at(4);
            calls_of(&apart, &format!("deep [clone {suffix}]")).unwrap_or(0)
        })
        .sum();
    assert_eq!(sum, own, "{apart}");
    assert!(
        !apart.contains("copies]") && !apart.contains("copy]"),
        "{apart}"
    );
    let prof = run_profiled(&bin, &[], &[], &dir);
    let p = process(&prof.report, &bin);
    for c in &copies {
        assert_eq!(function_named(p, c)["function"], "deep");
    }
}
