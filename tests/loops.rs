//! Loop profiles: a program with nested loops, with two loops of known
//! relative cost and with a loop whose rarely taken code the compiler
//! moves out of line, built three ways, has each loop found where its
//! source says, nested as written, and its share of its function's
//! samples within sampling noise of what its iterations make it; calls
//! stay exact and the program's output unchanged. With `--loops`, every
//! loop of the functions named is counted exactly at every optimisation
//! level: executions and iterations equal to the trip counts the program
//! runs, with its output unchanged, cached plan or not, in a library
//! loaded by `dlopen` too; and on gzip and
//! xz's liblzma, each loop's header runs equal valgrind's count of its
//! header instruction.

use rtprof_e2e::*;
use serde_json::Value;
use std::collections::HashMap;
use std::process::Command;

/// The line of `tests/c/loops.c` marked `/* MARK */`.
fn line_of(mark: &str) -> u64 {
    let src = std::fs::read_to_string(root().join("tests/c/loops.c")).unwrap();
    let at = src
        .lines()
        .position(|l| l.contains(&format!("/* {mark} */")))
        .unwrap_or_else(|| panic!("no {mark} in loops.c"));
    at as u64 + 1
}

/// The loops of function `f` in report `p`, in the order of their headers.
fn loops_of<'a>(p: &'a Value, f: &str) -> Vec<&'a Value> {
    let mut v: Vec<&Value> = p["loops"]
        .as_array()
        .unwrap_or_else(|| panic!("loops in the report: {p}"))
        .iter()
        .filter(|l| l["function"] == f)
        .collect();
    v.sort_by_key(|l| l["header"].as_u64());
    v
}

#[test]
fn loops_are_found_nested_and_charged_their_share() {
    let dir = scratch("loops");
    let rounds = "8";
    for v in [
        Variant {
            opt: "-O2",
            cf_protection: false,
            pie: true,
            strip: false,
        },
        Variant {
            opt: "-O1",
            cf_protection: false,
            pie: false,
            strip: false,
        },
        Variant {
            opt: "-Os",
            cf_protection: true,
            pie: true,
            strip: false,
        },
    ] {
        let tag = v.tag();
        let (bin, _) = compile("loops.c", &v, &["-g"], &dir);
        let plain = run_plain(&bin, &[rounds]);
        let json = dir.join(format!("loops-{tag}.json"));
        let out = Command::new(rtprof())
            .args(["run", "--output"])
            .arg(&json)
            .arg("--")
            .arg(&bin)
            .arg(rounds)
            .output()
            .unwrap();
        assert_same_behaviour(&tag, &plain, &out);
        let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let p = &report["processes"][0];
        for f in ["nested", "two_loops", "with_cold"] {
            assert_eq!(function_named(p, f)["calls"].as_u64(), Some(8), "{tag} {f}");
        }
        let share = |l: &Value| l["function_share"].as_f64().unwrap();
        let line = |l: &Value| l["line"].as_u64();

        // two_loops: 3n iterations, then n of the same body.
        let two = loops_of(p, "two_loops");
        assert_eq!(two.len(), 2, "{tag}: {two:?}");
        assert_eq!(line(two[0]), Some(line_of("FIRST")), "{tag}: {two:?}");
        assert_eq!(line(two[1]), Some(line_of("SECOND")), "{tag}: {two:?}");
        assert!(two.iter().all(|l| l["depth"] == 1), "{tag}: {two:?}");
        // At about 1,300 samples in the function, a share's noise is
        // about 1.2 points: these bounds are many of them wide.
        assert!((0.67..0.83).contains(&share(two[0])), "{tag}: {two:?}");
        assert!((0.17..0.33).contains(&share(two[1])), "{tag}: {two:?}");
        assert!(share(two[0]) + share(two[1]) > 0.95, "{tag}: {two:?}");

        // nested: the inner loop does all the work, inside the outer one.
        let nest = loops_of(p, "nested");
        assert_eq!(nest.len(), 2, "{tag}: {nest:?}");
        let (outer, inner) = (nest[0], nest[1]);
        assert_eq!(line(outer), Some(line_of("OUTER")), "{tag}: {nest:?}");
        assert_eq!(line(inner), Some(line_of("INNER")), "{tag}: {nest:?}");
        assert_eq!(
            (outer["depth"].as_u64(), inner["depth"].as_u64()),
            (Some(1), Some(2))
        );
        let range = |l: &Value| l["start"].as_u64().unwrap()..l["end"].as_u64().unwrap();
        let (o, i) = (range(outer), range(inner));
        assert!(o.start <= i.start && i.end <= o.end, "{tag}: {nest:?}");
        assert!(share(inner) > 0.9, "{tag}: {nest:?}");
        let samples = |l: &Value| l["samples"].as_u64().unwrap();
        assert!(samples(outer) >= samples(inner), "{tag}: {nest:?}");
        assert_eq!(
            outer["samples"].as_u64().unwrap() - outer["self_samples"].as_u64().unwrap(),
            inner["samples"].as_u64().unwrap(),
            "{tag}: an outer loop's samples are its own and its inner loop's"
        );
        // with_cold: one loop, its rarely taken block moved out of line
        // (past the return, jumping back) is part of it, not a loop.
        let cold = loops_of(p, "with_cold");
        assert_eq!(cold.len(), 1, "{tag}: {cold:?}");
        assert_eq!(line(cold[0]), Some(line_of("COLD")), "{tag}: {cold:?}");
        assert_eq!(cold[0]["depth"], 1);
        assert!(share(cold[0]) > 0.9, "{tag}: {cold:?}");

        // Shares of the process: of all its samples.
        let total = p["sampler"]["samples"].as_f64().unwrap();
        for l in two.iter().chain(&nest).chain(&cold) {
            let want = samples(l) as f64 / total;
            assert!((l["process_share"].as_f64().unwrap() - want).abs() < 1e-9);
        }
        assert_eq!(p["offsets_dropped"].as_u64(), Some(0), "{tag}");

        // The text report lists them too.
        let text = Command::new(rtprof())
            .args(["run", "--"])
            .arg(&bin)
            .arg("2")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&text.stderr);
        assert!(err.contains("hot loops"), "{tag}: {err}");
        assert!(
            err.contains(&format!("loops.c:{}", line_of("INNER"))),
            "{tag}: {err}"
        );
    }
}

/// The counts of `loops` (in header order) as (executions, iterations).
fn counts(tag: &str, loops: &[&Value]) -> Vec<(u64, u64)> {
    loops
        .iter()
        .map(|l| {
            let (e, i) = (l["executions"].as_u64(), l["iterations"].as_u64());
            match (e, i) {
                (Some(e), Some(i)) => (e, i),
                _ => panic!("{tag}: not counted: {l}"),
            }
        })
        .collect()
}

#[test]
fn loops_are_counted_exactly_at_every_level() {
    let dir = scratch("loop-counts");
    let (rounds, divisor) = (3u64, 100u64);
    let (n, m) = (20_000_000 / divisor, 20_000 / divisor);
    let variants = [
        ("-O0", false, false),
        ("-O1", false, false),
        ("-O2", true, false),
        ("-O3", true, true),
        ("-Os", true, true),
    ];
    for (opt, pie, cf_protection) in variants {
        let v = Variant {
            opt,
            cf_protection,
            pie,
            strip: false,
        };
        let tag = v.tag();
        let (bin, _) = compile("loops.c", &v, &["-g"], &dir);
        let (r, d) = (rounds.to_string(), divisor.to_string());
        let args = [r.as_str(), d.as_str()];
        let plain = run_plain(&bin, &args);
        // Twice: the module's plan is cached after the first run; loop
        // probes are planned afresh each time.
        for run in 0..2 {
            let json = dir.join(format!("counts-{tag}-{run}.json"));
            let out = Command::new(rtprof())
                .args(["run", "--loops", "nested,two_*,with_cold", "--output"])
                .arg(&json)
                .arg("--")
                .arg(&bin)
                .args(args)
                .output()
                .unwrap();
            assert_same_behaviour(&tag, &plain, &out);
            let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
            let p = &report["processes"][0];
            for f in ["nested", "two_loops", "with_cold"] {
                assert_eq!(
                    function_named(p, f)["calls"].as_u64(),
                    Some(rounds),
                    "{tag} {f}"
                );
            }
            // Outer: once per call, 1000 times round; inner: once per
            // outer iteration, m times round (inner first at -O0, whose
            // outer header is its test at the bottom).
            let mut nest = counts(&tag, &loops_of(p, "nested"));
            nest.sort();
            assert_eq!(
                nest,
                [(rounds, rounds * 1000), (rounds * 1000, rounds * 1000 * m)],
                "{tag}"
            );
            assert_eq!(
                counts(&tag, &loops_of(p, "two_loops")),
                [(rounds, rounds * 3 * n), (rounds, rounds * n)],
                "{tag}"
            );
            let cold = loops_of(p, "with_cold");
            match cold[0]["not_counted"].as_str() {
                // At -O0 the loop's last block ends in the call to its
                // cold path: no probe can take it.
                Some("unmovable") if opt == "-O0" => {}
                _ => assert_eq!(counts(&tag, &cold), [(rounds, rounds * n)], "{tag}"),
            }
            let per = loops_of(p, "two_loops")[1]["iterations_per_execution"].as_f64();
            assert_eq!(per, Some(n as f64), "{tag}");
        }
        // The text report says the same.
        let text = Command::new(rtprof())
            .args(["run", "--loops", "two_loops", "--"])
            .arg(&bin)
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&text.stderr);
        let line = err
            .lines()
            .find(|l| l.contains(&format!(" {} ", rounds * 3 * n)))
            .unwrap_or_else(|| panic!("{tag}: {err}"));
        assert!(line.contains(&format!("{:.1}", 3 * n)), "{tag}: {line}");
        assert!(err.contains("loops counted exactly"), "{tag}: {err}");
    }
}

#[test]
fn counted_loops_keep_their_share_of_the_samples() {
    // Samples in a loop's probes count for the block they stand for: the
    // first loop of two_loops still has three quarters of its function's.
    let dir = scratch("loop-counts-shares");
    let v = Variant {
        opt: "-O2",
        cf_protection: false,
        pie: true,
        strip: false,
    };
    let (bin, _) = compile("loops.c", &v, &["-g"], &dir);
    let json = dir.join("shares.json");
    let out = Command::new(rtprof())
        .args(["run", "--loops", "two_loops", "--output"])
        .arg(&json)
        .arg("--")
        .arg(&bin)
        .arg("3")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let p = &report["processes"][0];
    let two = loops_of(p, "two_loops");
    assert_eq!(counts("O2", &two), [(3, 180_000_000), (3, 60_000_000)]);
    let share = |l: &Value| l["function_share"].as_f64().unwrap();
    assert!((0.67..0.83).contains(&share(two[0])), "{two:?}");
    assert!((0.17..0.33).contains(&share(two[1])), "{two:?}");
    assert!(share(two[0]) + share(two[1]) > 0.95, "{two:?}");
    // Stacks sampled in a probe are whole: unwound from the code the
    // probe stands for.
    let folded = dir.join("shares.folded");
    let out = Command::new(rtprof())
        .args(["run", "--loops", "two_loops", "--output"])
        .arg(&folded)
        .arg("--")
        .arg(&bin)
        .arg("2")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&folded).unwrap();
    let mut seen = 0;
    for line in text.lines().filter(|l| l.contains("two_loops")) {
        assert!(line.contains(";main;two_loops "), "cut: {line}\n{text}");
        seen += 1;
    }
    assert!(seen > 0, "{text}");
}

#[test]
fn loops_are_counted_exactly_across_threads_and_a_fork() {
    // Threads count in arrays of their own, folded in when they end; a
    // forked child starts from zero.
    let dir = scratch("loop-threads");
    for opt in ["-O2", "-Os"] {
        let v = Variant {
            opt,
            cf_protection: false,
            pie: true,
            strip: false,
        };
        let tag = v.tag();
        let (bin, _) = compile("loop_threads.c", &v, &["-pthread"], &dir);
        let plain = run_plain(&bin, &[]);
        let json = dir.join(format!("threads-{tag}.json"));
        let out = Command::new(rtprof())
            .args(["run", "--loops", "work", "--output"])
            .arg(&json)
            .arg("--")
            .arg(&bin)
            .output()
            .unwrap();
        assert_same_behaviour(&tag, &plain, &out);
        let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let procs = report["processes"].as_array().unwrap();
        assert_eq!(procs.len(), 2, "{tag}: parent and child");
        // (calls of work, its loop's executions and iterations)
        let got: Vec<(u64, Vec<(u64, u64)>)> = procs
            .iter()
            .map(|p| {
                let calls = function_named(p, "work")["calls"].as_u64().unwrap();
                (calls, counts(&tag, &loops_of(p, "work")))
            })
            .collect();
        let threads: u64 = (0..8).map(|t| (1000 + t) * 10).sum();
        let parent = (85, vec![(85, threads + 5 * 7)]);
        let child = (3, vec![(3, 3 * 11)]);
        assert!(
            got == [parent.clone(), child.clone()] || got == [child, parent],
            "{tag}: {got:?}"
        );
    }
}

/// A library loaded with `dlopen` while four threads run gets loop probes
/// too: its loop counted exactly across the threads, then again in a
/// second load after a `dlclose` (a module of its own, with its own
/// counts), at three optimisation levels.
#[test]
fn loops_of_libraries_loaded_later_are_counted() {
    let dir = scratch("loop-dlopen");
    let bin = compile_o2("dlopen_main.c", &["-pthread", "-ldl"], &dir);
    for opt in ["-O2", "-O0", "-Os"] {
        let lib = dir.join(format!("libplugin{opt}.so"));
        let o = Command::new("gcc")
            .arg(opt)
            .args(["-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(root().join("tests/c/plugin.c"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let lib_arg = lib.to_str().unwrap();
        let plain = run_plain(&bin, &[lib_arg]);
        let env = [
            ("RTPROF_MODULES", "libplugin*"),
            ("RTPROF_LOOPS", "plugin_*"),
        ];
        let prof = run_profiled(&bin, &[lib_arg], &env, &dir);
        assert_same_behaviour(opt, &plain, &prof.output);
        let p = &prof.report["processes"][0];
        let mut got = counts(opt, &loops_of(p, "plugin_entry"));
        got.sort();
        // Four threads' 50,000 iterations each, then one call of 10.
        assert_eq!(got, [(1, 10), (4, 4 * 50_000)], "{opt}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each instruction's executions in a callgrind output written with
/// `--dump-instr=yes`, by (object file name, address as the file has it).
/// A cost line is `<instr> <line> <Ir> ...`, its instruction absolute
/// (`0x..`), relative to the last cost line's (`+n`, `-n`) or the same
/// (`*`); the line after `calls=` is the call's inclusive cost, and the
/// line after `jump=`/`jcnd=` a branch's source: neither counts nor moves
/// the position. Object names are numbered once (`ob=(n) name`, then
/// `ob=(n)`), `cob=` sharing the numbers.
fn callgrind_counts(text: &str) -> HashMap<(String, u64), u64> {
    let mut names: HashMap<String, String> = HashMap::new();
    let mut out = HashMap::new();
    let (mut ob, mut last, mut skip) = (String::new(), 0u64, false);
    for line in text.lines() {
        let Some(c) = line.chars().next() else {
            continue;
        };
        if c.is_ascii_digit() || "+-*".contains(c) {
            let mut it = line.split_whitespace();
            let pos = it.next().unwrap();
            let at = match pos {
                "*" => last,
                p if p.starts_with('+') => last + p[1..].parse::<u64>().unwrap(),
                p if p.starts_with('-') => last - p[1..].parse::<u64>().unwrap(),
                p => u64::from_str_radix(p.trim_start_matches("0x"), 16).unwrap(),
            };
            if std::mem::take(&mut skip) {
                continue;
            }
            let ir: u64 = it.nth(1).map_or(0, |v| v.parse().unwrap());
            last = at;
            *out.entry((ob.clone(), at)).or_insert(0) += ir;
        } else if let Some(v) = line
            .strip_prefix("ob=")
            .or_else(|| line.strip_prefix("cob="))
        {
            let name = match v.split_once(") ") {
                Some((id, name)) => {
                    names.insert(id.to_string(), name.to_string());
                    name.to_string()
                }
                None => names
                    .get(v.trim_end_matches(')'))
                    .cloned()
                    .unwrap_or(v.to_string()),
            };
            if line.starts_with("ob=") {
                ob = name.rsplit('/').next().unwrap_or(&name).to_string();
            }
        } else if line.starts_with("calls=")
            || line.starts_with("jump=")
            || line.starts_with("jcnd=")
        {
            skip = true;
        }
    }
    out
}

/// Text of about `n` bytes: words from a fixed generator, so that gzip and
/// xz have matches to find.
fn words(n: usize) -> Vec<u8> {
    let dict = [
        "loop",
        "count",
        "exact",
        "header",
        "branch",
        "back",
        "entry",
        "probe",
        "thread",
        "sample",
        "the",
        "of",
        "and",
        "a",
        "in",
        "profile",
        "function",
        "iteration",
        "execution",
        "window",
    ];
    let (mut x, mut out) = (0x9e37_79b9u32, Vec::with_capacity(n + 16));
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        out.extend_from_slice(dict[(x % 20) as usize].as_bytes());
        out.push(if x % 11 == 0 { b'\n' } else { b' ' });
    }
    out
}

#[test]
fn loop_counts_match_callgrind_on_gzip_and_xz() {
    // Real programs as Debian builds them: every loop rtprof counts has
    // its header run (executions + branches back) exactly as often as
    // valgrind counts its header's first instruction.
    let dir = scratch("loops-callgrind");
    let input = dir.join("in.txt");
    std::fs::write(&input, words(300_000)).unwrap();
    let runs: [(&str, &[&str], &[&str]); 2] = [
        ("gzip", &[], &["/usr/bin/gzip", "-9", "-c"]),
        (
            "liblzma.so.5",
            &["--modules", "liblzma*"],
            &["/usr/bin/xz", "-1", "-T1", "-c"],
        ),
    ];
    for (module, extra, cmd) in runs {
        let plain = Command::new(cmd[0])
            .args(&cmd[1..])
            .arg(&input)
            .output()
            .unwrap();
        assert!(plain.status.success(), "{cmd:?}");
        let json = dir.join(format!("{module}.json"));
        let out = Command::new(rtprof())
            .args(["run", "--loops", "*"])
            .args(extra)
            .arg("--output")
            .arg(&json)
            .arg("--")
            .args(cmd)
            .arg(&input)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{module}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout == plain.stdout, "{module}: output changed");
        let cg = dir.join(format!("{module}.cg"));
        let vg = Command::new("valgrind")
            .args(["-q", "--tool=callgrind", "--dump-instr=yes"])
            .arg(format!("--callgrind-out-file={}", cg.display()))
            .args(cmd)
            .arg(&input)
            .output()
            .expect("valgrind runs");
        assert!(
            vg.stdout == plain.stdout,
            "{module}: output under callgrind"
        );
        let counts = callgrind_counts(&std::fs::read_to_string(&cg).unwrap());
        // valgrind names a library by its file (liblzma.so.5.4.1), rtprof
        // by the name it was loaded as (liblzma.so.5).
        let object = counts
            .keys()
            .map(|k| k.0.clone())
            .find(|o| o == module || o.starts_with(&format!("{module}.")))
            .unwrap_or_else(|| panic!("{module} not in callgrind's output"));
        let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let p = &report["processes"][0];
        let (mut compared, mut ran) = (0, 0);
        for l in p["loops"].as_array().unwrap() {
            let (Some(e), Some(b)) = (l["executions"].as_u64(), l["branches_back"].as_u64()) else {
                continue;
            };
            if l["module"] != module {
                continue;
            }
            let header = l["header"].as_u64().unwrap();
            let cg_runs = counts.get(&(object.clone(), header)).copied().unwrap_or(0);
            assert_eq!(
                e + b,
                cg_runs,
                "{module}: loop at {header:#x} in {}: {l}",
                l["name"]
            );
            compared += 1;
            ran += (cg_runs > 0) as u32;
        }
        assert!(
            compared >= 100 && ran >= 20,
            "{module}: {compared} loops, {ran} ran"
        );
    }
}

#[test]
fn loops_with_cold_parts_short_tops_and_exits_are_refused_or_exact() {
    // Each loop of these shapes is either left uncounted (with a reason)
    // or counted exactly, and the program behaves as without rtprof: a
    // `.cold` part jumps back into its loop's bytes, a loop's short test
    // runs on into the code after it, a call in the block back to the
    // header never returns.
    let dir = scratch("loop-edges");
    for (opt, pie) in [
        ("-O0", false),
        ("-O2", false),
        ("-O3", true),
        ("-Os", false),
    ] {
        let v = Variant {
            opt,
            cf_protection: false,
            pie,
            strip: false,
        };
        let tag = v.tag();
        let (bin, _) = compile("loop_edges.c", &v, &[], &dir);
        let run = |mode: &str, n: &str| {
            let plain = run_plain(&bin, &[mode, n]);
            let json = dir.join(format!("{tag}-{mode}.json"));
            let out = Command::new(rtprof())
                .args(["run", "--loops", "scan*,f,loop", "--output"])
                .arg(&json)
                .arg("--")
                .arg(&bin)
                .args([mode, n])
                .output()
                .unwrap();
            assert_same_behaviour(&format!("{tag} {mode}"), &plain, &out);
            let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
            (plain, report["processes"][0].clone())
        };
        let (_, p) = run("cold", "100");
        for l in loops_of(&p, "scan") {
            if let Some(e) = l["executions"].as_u64() {
                assert_eq!((e, l["iterations"].as_u64()), (1, Some(100)), "{tag}: {l}");
            }
        }
        let (plain, p) = run("top", "60");
        let want: u64 = String::from_utf8_lossy(&plain.stdout)
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        for l in loops_of(&p, "f") {
            if let Some(it) = l["iterations"].as_u64() {
                assert_eq!(it, want, "{tag}: {l}");
            }
        }
        let (plain, p) = run("exit", "40");
        assert_eq!(plain.status.code(), Some(3));
        for l in loops_of(&p, "loop") {
            if let Some(e) = l["executions"].as_u64() {
                assert_eq!(
                    (e, l["branches_back"].as_u64()),
                    (1, Some(40)),
                    "{tag}: {l}"
                );
            }
        }
    }
}
