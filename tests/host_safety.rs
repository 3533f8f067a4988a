//! The agent never breaks its host: entries reached by a jump with the red
//! zone live, split-off fragments, entries another tool changed before the
//! agent started, and a run directory whose tmpfs fills while threads start.

use rtprof_e2e::*;
use std::path::Path;
use std::process::Command;

/// Every `EXPECT name count` of the plain run holds in the report.
fn assert_counts(what: &str, plain_stdout: &[u8], proc_: &serde_json::Value) {
    let exp = expectations(plain_stdout);
    assert!(!exp.counts.is_empty(), "{what}: program declared no counts");
    for (name, n) in exp.counts {
        let f = function_named(proc_, &name);
        assert_eq!(f["calls"].as_u64(), Some(n), "{what}: calls of {name}: {f}");
    }
}

#[test]
fn red_zone_entries_and_split_fragments() {
    let dir = scratch("redzone");
    for opt in ["-O0", "-O2"] {
        for pie in [true, false] {
            for strip in [false, true] {
                let v = Variant {
                    opt,
                    cf_protection: false,
                    pie,
                    strip,
                };
                let (bin, _) = compile("redzone.c", &v, &[], &dir);
                let what = format!("redzone {}", v.tag());
                let plain = run_plain(&bin, &["200000"]);
                assert!(plain.status.success(), "{what}: plain run failed");
                let prof = run_profiled(&bin, &["200000"], &[], &dir);
                assert_same_behaviour(&what, &plain, &prof.output);
                let p = process(&prof.report, &bin);
                let names: Vec<&str> = p["functions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|f| f["instrumented"] == true)
                    .filter_map(|f| f["name"].as_str())
                    .collect();
                assert!(
                    !names.iter().any(|n| n.contains(".warm")),
                    "{what}: a .warm fragment listed as a function: {names:?}"
                );
                if strip {
                    // Without names, code only ever jumped to is a part of a
                    // function, not one: nothing to compare by name.
                    continue;
                }
                // rz_tail is patched and entered by a jump with data in the
                // red zone: its count and the program's result prove the
                // stub wrote nothing there.
                let tail = function_named(p, "rz_tail");
                assert_eq!(tail["patched"], true, "{what}: {tail}");
                assert_counts(&what, &plain.stdout, p);
            }
        }
    }
}

#[test]
fn entry_changed_before_start_up_is_left_alone() {
    let dir = scratch("patched-entry");
    let bin = compile_o2("patched_entry.c", &["-rdynamic"], &dir);
    let lib = dir.join("libentry_patcher.so");
    let st = Command::new("gcc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(root().join("tests/c/entry_patcher.c"))
        .status()
        .unwrap();
    assert!(st.success());
    // The agent first: its constructor runs after the patcher's.
    let preload = format!("{} {}", agent().display(), lib.display());
    let json = dir.join("report.json");
    let out = Command::new(&bin)
        .env("LD_PRELOAD", &preload)
        .env("RTPROF_REPORT", &json)
        // never_called is never called: listed only when all are.
        .env("RTPROF_ALL_FUNCTIONS", "1")
        .output()
        .unwrap();
    let plain = Command::new(&bin).env("LD_PRELOAD", &lib).output().unwrap();
    assert_same_behaviour("patched entry", &plain, &out);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let p = &report["processes"][0];
    let f = function_named(p, "never_called");
    assert_eq!(f["refused"], "modified_in_memory", "{f}");
    // The byte it found is still there, and the rest was instrumented.
    assert_eq!(function_named(p, "used")["patched"], true);
    assert_counts("patched entry", &plain.stdout, p);
}

/// Runs `sh -c script` in a private mount namespace (so a tmpfs mounted
/// there vanishes with it), with `envs`.
fn in_private_mounts(script: &str, envs: &[(&str, &Path)]) -> std::process::Output {
    let mut c = Command::new("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c", script]);
    for (k, v) in envs {
        c.env(k, v);
    }
    c.output().expect("unshare runs (tests need root)")
}

/// Also after a thread ended and a library added more than a page of
/// counters per stripe (`PLUGIN`): the ended threads' sum got memory for
/// them before the tmpfs filled, or reading it at exit would fault.
#[test]
fn tmpfs_filling_while_threads_start() {
    let dir = scratch("fill-tmpfs");
    let bin = compile_o2("fill_tmpfs.c", &["-pthread", "-ldl"], &dir);
    let lib = dir.join("libmany.so");
    let o = Command::new("gcc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(root().join("tests/c/many_functions.c"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mnt = dir.join("tmp");
    std::fs::create_dir_all(&mnt).unwrap();
    let json = dir.join("report.json");
    for plugin in ["", lib.to_str().unwrap()] {
        tmpfs_filling(&bin, &mnt, &json, plugin);
    }
}

fn tmpfs_filling(bin: &Path, mnt: &Path, json: &Path, plugin: &str) {
    let _ = std::fs::remove_file(json);
    let plugin = Path::new(plugin);
    let set = if plugin.as_os_str().is_empty() {
        ""
    } else {
        r#"export PLUGIN="$LIB" RTPROF_MODULES='libmany*';"#
    };
    let plain = in_private_mounts(
        &format!(r#"{set} mount -t tmpfs -o size=4m tmpfs "$MNT" && FILL="$MNT/fill" "$BIN""#),
        &[("MNT", mnt), ("BIN", bin), ("LIB", plugin)],
    );
    assert!(plain.status.success(), "plain: {plain:?}");
    let prof = in_private_mounts(
        &format!(
            r#"{set} mount -t tmpfs -o size=4m tmpfs "$MNT" &&
           TMPDIR="$MNT" FILL="$MNT/fill" "$RTPROF" run --json "$JSON" -- "$BIN""#
        ),
        &[
            ("MNT", mnt),
            ("BIN", bin),
            ("JSON", json),
            ("RTPROF", &rtprof()),
            ("LIB", plugin),
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        String::from_utf8_lossy(&prof.stdout)
    );
    assert!(
        prof.status.success(),
        "rtprof run: {:?} {}",
        prof.status,
        String::from_utf8_lossy(&prof.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    // Threads found no memory for stripes of their own and counted in the
    // shared one: every call is there.
    assert_counts("fill tmpfs", &plain.stdout, process(&report, bin));
}

/// A library loaded with `dlopen` that finds no room in the counter segment
/// is still listed, says why, and its samples still count for it; every
/// module without functions says why.
#[test]
fn library_without_room_is_listed_with_its_reason() {
    let dir = scratch("no-room");
    let python = Path::new("/usr/bin/python3");
    assert!(python.exists(), "apt-get install python3");
    // Time in libcrypto: samples land there.
    let script = [
        "-c",
        "import hashlib\nh = hashlib.sha256()\nfor _ in range(300): h.update(b'x' * 10**6)\nprint(h.hexdigest())",
    ];
    let plain = run_plain(python, &script);
    let env = [("RTPROF_SPARE_FUNCTIONS", "100")];
    for modules in ["all", ""] {
        let mut env = env.to_vec();
        if !modules.is_empty() {
            env.push(("RTPROF_MODULES", modules));
        } else {
            // Sampled only: a library is named when its first sample
            // lands, and libcrypto's finds no room then.
            env.push(("RTPROF_SAMPLER", "timer"));
        }
        let prof = run_profiled(python, &script, &env, &dir);
        assert_same_behaviour("python with no room", &plain, &prof.output);
        let p = &prof.report["processes"][0];
        let mods = p["modules"].as_array().unwrap();
        let crypto = mods
            .iter()
            .find(|m| m["path"].as_str().unwrap().contains("libcrypto.so"))
            .unwrap_or_else(|| panic!("libcrypto listed: {}", p["modules"]));
        assert_eq!(crypto["functions"], 0, "{crypto}");
        if modules == "all" {
            let refused = crypto["refused"]["no_counter_space"].as_u64().unwrap_or(0);
            assert!(
                refused > 1000,
                "its functions refused for want of room: {crypto}"
            );
        } else {
            assert_eq!(
                crypto["note"], "no room for its function names in the counter segment",
                "{crypto}"
            );
        }
        for m in mods {
            let empty = m["functions"] == 0 && m["refused"].as_object().unwrap().is_empty();
            assert!(
                !empty || m["note"].is_string(),
                "says why it has no functions: {m}"
            );
        }
    }
}

/// Code running on a coroutine's stack, with an inaccessible page right
/// above its top, sampled by both samplers with stacks: the timer's
/// handler, which unwinds in place, must not read past that stack (it
/// leaves such samples without a stack); output and status unchanged.
#[test]
fn coroutine_stacks_are_not_read_past_their_end() {
    let dir = scratch("coroutine");
    let bin = compile_o2("coroutine.c", &[], &dir);
    let plain = run_plain(&bin, &[]);
    assert!(plain.status.success(), "{plain:?}");
    for sampler in ["timer", "perf"] {
        let prof = run_profiled(&bin, &[], &[("RTPROF_SAMPLER", sampler)], &dir);
        assert_same_behaviour(&format!("coroutine, {sampler}"), &plain, &prof.output);
        let p = process(&prof.report, &bin);
        assert_eq!(p["sampler"]["name"], sampler);
        assert!(
            function_named(p, "spin")["samples"].as_u64().unwrap() > 100,
            "{p}"
        );
    }
}
