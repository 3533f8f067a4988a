//! The C/C++ corpus, compiled at every optimisation level, with and without
//! CET (`-fcf-protection=full`), PIE and non-PIE, stripped and not. Under
//! the agent each program must behave exactly as without it, and every call
//! count must equal what the program knows by construction.

use rtprof_e2e::*;
use serde_json::Value;
use std::path::Path;

#[derive(Default, Debug)]
struct Tally {
    functions: u64,
    patched: u64,
    /// Of those patched, through a trap.
    trapped: u64,
}

/// The agent's environment that turns trap entries on.
const TRAPS: &[(&str, &str)] = &[("RTPROF_TRAPS", "1")];

/// Runs one compiled variant and checks behaviour and counts; returns the
/// main module's (functions, patched), not counting functions the program
/// declares unpatchable by design (and still unpatched).
fn check_variant(bin: &Path, unstripped: &Path, what: &str, args: &[&str], dir: &Path) -> Tally {
    check_variant_with(bin, unstripped, what, args, &[], dir)
}

/// As [`check_variant`], with the agent's environment `env`. With trap
/// entries on, no function the program counts may stay unpatched, and one
/// unpatchable by design may be patched only through a trap.
fn check_variant_with(
    bin: &Path,
    unstripped: &Path,
    what: &str,
    args: &[&str],
    env: &[(&str, &str)],
    dir: &Path,
) -> Tally {
    let traps = env.contains(&TRAPS[0]);
    let plain = run_plain(bin, args);
    let prof = run_profiled(bin, args, env, dir);
    // A program whose call counts depend on timing (signals) prints them in
    // EXPECT lines: everything else must match, and the counts must be the
    // ones it saw in the profiled run.
    let without_expect = |o: &std::process::Output| {
        let mut o = o.clone();
        o.stdout = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| !l.starts_with("EXPECT "))
            .map(|l| format!("{l}\n"))
            .collect::<String>()
            .into_bytes();
        o
    };
    assert_same_behaviour(what, &without_expect(&plain), &without_expect(&prof.output));
    let Expectations { counts, refused } = expectations(&prof.output.stdout);
    assert!(
        !counts.is_empty(),
        "{what}: program printed no expectations"
    );
    let addrs = symbol_addrs(unstripped);
    let p = process(&prof.report, bin);
    let lookup = |name: &str| -> &Value {
        let a = *addrs
            .get(name)
            .unwrap_or_else(|| panic!("{what}: no symbol {name}"));
        function_at(p, a)
            .unwrap_or_else(|| panic!("{what}: {name} (at {a:#x}) missing from report"))
    };
    for (name, n) in &counts {
        let f = lookup(name);
        // Only a function shorter than a jump, with no fill after it (as at
        // -Os), may stay unpatched; it then has no count.
        let too_small = !traps && f["refused"] == "too_small" && f["size"].as_u64().unwrap() < 9;
        assert!(
            f["patched"] == true || too_small,
            "{what}: {name} was not patched ({})",
            f["refused"]
        );
        let want = if too_small { 0 } else { *n };
        assert_eq!(f["calls"].as_u64(), Some(want), "{what}: calls of {name}");
    }
    let mut still_refused = 0;
    for (name, reason) in &refused {
        let f = lookup(name);
        if traps && f["entry"] == "trap" {
            assert_eq!(f["patched"], true, "{what}: {name}");
            continue;
        }
        still_refused += 1;
        assert_eq!(f["patched"], false, "{what}: {name} must be refused");
        assert_eq!(
            f["refused"].as_str(),
            Some(reason.as_str()),
            "{what}: refusal reason of {name}"
        );
        assert_eq!(
            f["calls"].as_u64(),
            Some(0),
            "{what}: a refused function has no count"
        );
    }
    // Split-off cold paths (foo.cold) are parts of functions, never
    // functions of their own, with or without symbols.
    for (name, &a) in &addrs {
        if name.contains(".cold") {
            assert!(
                function_at(p, a).is_none(),
                "{what}: fragment {name} listed as a function"
            );
        }
    }
    let m = &p["modules"][0];
    // Trap entries only with trap entries on.
    let trapped = p["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["entry"] == "trap")
        .count();
    assert!(traps || trapped == 0, "{what}: {trapped} trap entries");
    Tally {
        functions: m["functions"].as_u64().unwrap() - still_refused,
        patched: m["patched"].as_u64().unwrap(),
        trapped: trapped as u64,
    }
}

fn corpus(
    src: &str,
    extra: &[&str],
    args: &[&str],
    keep: impl Fn(&Variant) -> bool,
) -> Vec<(Variant, Tally)> {
    corpus_with(src, extra, args, &[], keep)
}

fn corpus_with(
    src: &str,
    extra: &[&str],
    args: &[&str],
    env: &[(&str, &str)],
    keep: impl Fn(&Variant) -> bool,
) -> Vec<(Variant, Tally)> {
    let dir = scratch(&format!(
        "{src}{}",
        if env.is_empty() { "" } else { "-env" }
    ));
    let mut out = Vec::new();
    for v in Variant::all().into_iter().filter(|v| keep(v)) {
        let (bin, unstripped) = compile(src, &v, extra, &dir);
        let what = format!("{src} {}", v.tag());
        let t = check_variant_with(&bin, &unstripped, &what, args, env, &dir);
        out.push((v, t));
    }
    let _ = std::fs::remove_dir_all(&dir);
    out
}

#[test]
fn calls_by_construction() {
    corpus("calls.c", &[], &["1234"], |_| true);
}

#[test]
fn entry_shapes_and_refusals() {
    corpus("asm_shapes.c", &[], &[], |_| true);
}

#[test]
fn ordinary_program_with_jump_tables() {
    corpus("workload.c", &[], &[], |_| true);
}

/// 2,000 short-lived threads: exact totals, and stripes are reused, so the
/// agent's memory is bounded by the threads alive at once, not ever made.
#[test]
fn thousands_of_short_lived_threads() {
    let dir = scratch("many-threads");
    for v in Variant::all()
        .into_iter()
        .filter(|v| !v.strip && v.opt != "-Os" && v.pie)
    {
        let (bin, unstripped) = compile("many_threads.c", &v, &["-pthread"], &dir);
        check_variant(
            &bin,
            &unstripped,
            &format!("many_threads {}", v.tag()),
            &[],
            &dir,
        );
        let prof = run_profiled(&bin, &[], &[], &dir);
        let stripes = process(&prof.report, &bin)["stripes"].as_u64().unwrap();
        assert!(
            stripes <= 64,
            "{stripes} stripes for 25 threads alive at once"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cold_fragments_are_not_functions() {
    let runs = corpus("cold.c", &[], &[], |_| true);
    // The corpus must actually contain a fragment for this test to mean anything.
    let dir = scratch("cold-check");
    let bin = compile_o2("cold.c", &[], &dir);
    assert!(
        symbol_addrs(&bin).keys().any(|n| n.contains(".cold")),
        "gcc made no .cold fragment"
    );
    assert_eq!(runs.len(), 32);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn signal_handlers_and_longjmp_through_instrumented_frames() {
    corpus("signals.c", &[], &[], |_| true);
}

#[test]
fn threads_lose_no_increment() {
    corpus("threads.c", &["-pthread"], &[], |v| !v.strip);
}

#[test]
fn cxx_exceptions_through_instrumented_frames() {
    corpus("exceptions.cpp", &[], &[], |_| true);
}

#[test]
fn backtrace_names_the_right_callers() {
    let runs = corpus("backtrace.c", &["-rdynamic"], &[], |v| !v.strip);
    assert!(!runs.is_empty());
    // Output equality is checked per variant; here, that it is meaningful.
    let dir = scratch("bt");
    let v = Variant {
        opt: "-O2",
        cf_protection: true,
        pie: true,
        strip: false,
    };
    let (bin, _) = compile("backtrace.c", &v, &["-rdynamic"], &dir);
    let out = run_profiled(&bin, &[], &[], &dir).output;
    let text = String::from_utf8_lossy(&out.stdout);
    let order: Vec<usize> = ["frame_c", "frame_b", "frame_a", "main"]
        .iter()
        .map(|n| {
            text.find(&format!(": {n}\n"))
                .unwrap_or_else(|| panic!("{n} not in backtrace:\n{text}"))
        })
        .collect();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "callers out of order:\n{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// With trap entries on (`RTPROF_TRAPS=1`), every function of the corpus
/// at -Os is patched and counted exactly: the ones too short for a jump
/// (`xor eax,eax; ret` packed against the next function) through traps.
/// At -O2 nothing needs one.
#[test]
fn every_function_at_os_through_traps() {
    let mut trapped = 0;
    for (src, extra, args) in [
        ("calls.c", &[][..], &["1234"][..]),
        ("asm_shapes.c", &[], &[]),
        ("workload.c", &[], &[]),
        ("signals.c", &[], &[]),
        ("threads.c", &["-pthread"], &[]),
    ] {
        for (v, t) in corpus_with(src, extra, args, TRAPS, |v| v.opt == "-Os" && !v.strip) {
            assert_eq!(
                t.patched,
                t.functions,
                "{src} {}: every function patched with traps",
                v.tag()
            );
            trapped += t.trapped;
        }
    }
    // calls.c's op_add and tail_caller, asm_shapes.c's shape_packed, ...
    assert!(trapped >= 3, "only {trapped} trap entries at -Os");
    let dir = scratch("traps-o2");
    let bin = compile_o2("calls.c", &[], &dir);
    let prof = run_profiled(&bin, &["1234"], TRAPS, &dir);
    let p = process(&prof.report, &bin);
    assert!(
        p["functions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["entry"] != "trap"),
        "a trap entry at -O2, where jumps fit"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// At -O2, at least 98% of the corpus's functions are patched, as the tool
/// itself reports (functions that are unpatchable by design excluded).
#[test]
fn patch_rate_at_o2() {
    let mut total = Tally::default();
    for (src, extra, args) in [
        ("calls.c", &[][..], &["10"][..]),
        ("workload.c", &[], &[]),
        ("threads.c", &["-pthread"], &[]),
        ("exceptions.cpp", &[], &[]),
        ("backtrace.c", &["-rdynamic"], &[]),
        ("asm_shapes.c", &[], &[]),
        ("cold.c", &[], &[]),
        ("signals.c", &[], &[]),
    ] {
        for (_, t) in corpus(src, extra, args, |v| v.opt == "-O2") {
            total.functions += t.functions;
            total.patched += t.patched;
        }
    }
    let rate = total.patched as f64 / total.functions as f64;
    eprintln!(
        "-O2 corpus: {} of {} functions patched ({:.2}%)",
        total.patched,
        total.functions,
        rate * 100.0
    );
    assert!(
        rate >= 0.98,
        "patch rate {:.2}% below 98% ({total:?})",
        rate * 100.0
    );
}
