//! `rtprof run` and plain `LD_PRELOAD` use: pass-through of stdin, exit
//! status and death by signal; reports for processes that end abruptly;
//! `RTPROF_REPORT`; clear errors for bad invocations.

use rtprof_e2e::*;
use serde_json::Value;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn build(dir: &Path) -> PathBuf {
    compile_o2("lifecycle.c", &[], dir)
}

fn rtprof_json(
    bin: &Path,
    args: &[&str],
    stdin: &[u8],
    dir: &Path,
) -> (std::process::Output, Value) {
    let p = run_profiled_with_input(bin, args, &[], stdin, dir);
    (p.output, p.report)
}

fn work_calls(report: &Value) -> u64 {
    report["processes"][0]["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "work")
        .unwrap()["calls"]
        .as_u64()
        .unwrap()
}

#[test]
fn stdin_exit_status_and_signals_pass_through() {
    let dir = scratch("cli");
    let bin = build(&dir);
    for (args, code, sig, exited) in [
        (&["exit", "42"][..], Some(42), None, true),
        (&["_exit", "7"], Some(7), None, false),
        (&["abort"], None, Some(libc::SIGABRT), false),
        (&["kill"], None, Some(libc::SIGKILL), false),
    ] {
        let (out, report) = rtprof_json(&bin, args, b"line one\nline two\n", &dir);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "line one\nline two\ns=5929\n",
            "{args:?}"
        );
        assert_eq!(out.status.code(), code, "{args:?}");
        assert_eq!(out.status.signal(), sig, "{args:?}");
        let p = &report["processes"][0];
        assert_eq!(p["exited"], exited, "{args:?}");
        if exited {
            assert_eq!(p["exit_status"], 42);
        }
        // Counts survive even when no exit handler ran.
        assert_eq!(work_calls(&report), 77, "{args:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn report_from_plain_preload() {
    let dir = scratch("preload");
    let bin = build(&dir);
    let run = |report: &str| {
        let out = Command::new(&bin)
            .env("LD_PRELOAD", agent())
            .env("RTPROF_REPORT", dir.join(report))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success());
        assert!(
            out.stderr.is_empty(),
            "agent is silent without RTPROF_VERBOSE"
        );
        out
    };
    run("r-%p.json");
    let json: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("r-"))
        .collect();
    assert_eq!(json.len(), 1, "%p expands to the pid");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json[0]).unwrap()).unwrap();
    assert_eq!(work_calls(&v), 77);
    assert!(json[0]
        .to_string_lossy()
        .ends_with(&format!("r-{}.json", v["processes"][0]["pid"])));

    run("r.txt");
    let text = std::fs::read_to_string(dir.join("r.txt")).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains(" work "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.trim_start().starts_with("77 "), "{text}");
    assert!(text.contains("patched"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn disabled_agent_stays_inert() {
    let dir = scratch("inert");
    let bin = build(&dir);
    let out = Command::new(rtprof())
        .args(["run", "--"])
        .arg(&bin)
        .env("RTPROF_DISABLE", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no profile was recorded"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_invocations_get_one_clear_message() {
    let out = Command::new(rtprof())
        .args(["run", "--", "/nonexistent/program"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot run /nonexistent/program"), "{err}");

    let out = Command::new(rtprof())
        .args(["run", "--agent", "/nonexistent.so", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot find librtprof.so"));

    let out = Command::new(rtprof()).args(["run"]).output().unwrap();
    assert!(!out.status.success(), "a command is required");
}

#[test]
fn text_report_lists_processes_of_a_tree() {
    let dir = scratch("tree");
    let bin = build(&dir);
    // A shell (instrumented too: it is the main executable of its process)
    // runs the program twice.
    let script = format!("{0} exit 3 </dev/null; {0} </dev/null", bin.display());
    let out = Command::new(rtprof())
        .args(["run", "--top", "3", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let sections: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("rtprof: pid "))
        .collect();
    assert!(sections.len() >= 3, "shell and both runs reported:\n{err}");
    assert!(
        sections.iter().any(|l| l.contains("exited with status 3")),
        "{err}"
    );
    let work_lines = err
        .lines()
        .filter(|l| l.contains(" work "))
        .collect::<Vec<_>>();
    assert_eq!(work_lines.len(), 2, "{err}");
    assert!(
        work_lines.iter().all(|l| l.trim_start().starts_with("77 ")),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn calls_of(p: &Value, name: &str) -> u64 {
    function_named(p, name)["calls"].as_u64().unwrap()
}

#[test]
fn forked_child_counts_separately() {
    let dir = scratch("fork");
    let bin = compile_o2("forks.c", &["-pthread"], &dir);
    for _ in 0..5 {
        let (out, report) = rtprof_json(&bin, &[], b"", &dir);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "child 0\n");
        let procs = report["processes"].as_array().unwrap();
        assert_eq!(procs.len(), 2, "parent and child: {report}");
        let parent = &procs[0];
        let child = &procs[1];
        assert_eq!(child["ppid"], parent["pid"]);
        assert_eq!(
            (
                calls_of(parent, "f"),
                calls_of(parent, "g"),
                calls_of(parent, "busy")
            ),
            (17, 0, 200000)
        );
        assert_eq!(
            (
                calls_of(child, "f"),
                calls_of(child, "g"),
                calls_of(child, "busy")
            ),
            (3, 5, 0)
        );
        assert_eq!(calls_of(child, "main"), 0, "the child starts from zero");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Builds `tests/c/<lib_src>` as lib<name>.so and `<main_src>` linked to it.
fn build_with_library(lib_src: &str, main_src: &str, dir: &Path) -> PathBuf {
    let name = lib_src.trim_end_matches(".c");
    let lib = dir.join(format!("lib{name}.so"));
    let o = Command::new("gcc")
        .args(["-O2", "-shared", "-fPIC", "-pthread", "-o"])
        .arg(&lib)
        .arg(root().join("tests/c").join(lib_src))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bin = dir.join(main_src.trim_end_matches(".c"));
    let o = Command::new("gcc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&bin)
        .arg(root().join("tests/c").join(main_src))
        .arg(format!("-L{}", dir.display()))
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .arg(format!("-l{name}"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    bin
}

/// A thread that already runs when the agent starts could be executing the
/// bytes being patched: the agent then leaves the process alone.
#[test]
fn threads_running_before_the_agent_mean_no_patching() {
    let dir = scratch("spinlib");
    let bin = build_with_library("spinlib.c", "spinlib_main.c", &dir);
    let want = run_plain(&bin, &[]);
    for _ in 0..20 {
        let out = Command::new(rtprof())
            .args(["run", "--verbose", "--modules", "libspinlib*", "--"])
            .arg(&bin)
            .output()
            .unwrap();
        assert_eq!(out.stdout, want.stdout);
        assert_eq!(out.status.code(), Some(0));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("threads already running at start-up"), "{err}");
        assert!(err.contains("no profile was recorded"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Fork handlers of other libraries run before and after ours: calls made
/// in the parent's prepare handler belong to the parent, calls in the
/// child's handler to the child, whichever order the handlers run in.
#[test]
fn fork_handlers_of_other_libraries_count_where_they_run() {
    let dir = scratch("forklib");
    let bin = build_with_library("forklib.c", "forklib_main.c", &dir);
    let json = dir.join("r.json");
    let out = Command::new(rtprof())
        .args(["run", "--modules", "libforklib*", "--json"])
        .arg(&json)
        .arg("--")
        .arg(&bin)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "child 0\n");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let procs = report["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2);
    assert_eq!(
        calls_of(&procs[0], "forklib_fn"),
        1001,
        "parent: its own call and its prepare handler"
    );
    assert_eq!(
        calls_of(&procs[1], "forklib_fn"),
        100000,
        "child: its handler only"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A program that closes every descriptor and opens its own files before
/// forking keeps them: the agent never closes a number it no longer owns.
#[test]
fn fork_after_closing_descriptors_leaves_program_files_alone() {
    let dir = scratch("fdclose");
    let bin = compile_o2("closefds.c", &[], &dir);
    let plain = run_plain(&bin, &[]);
    let prof = run_profiled(&bin, &[], &[], &dir);
    assert_same_behaviour("closefds", &plain, &prof.output);
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        "parent wrote 6\nchild wrote 6\n"
    );
    let procs = prof.report["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2, "both processes still reported");
    assert_eq!(calls_of(&procs[1], "child_work"), 3);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The agent keeps no descriptor open: the program's descriptor table is
/// exactly what it would be without it, before and after fork.
#[test]
fn no_descriptor_is_added() {
    let dir = scratch("fds");
    let bin = compile_o2("fds.c", &[], &dir);
    let plain = run_plain(&bin, &[]);
    let prof = run_profiled(&bin, &[], &[], &dir);
    assert_same_behaviour("fds", &plain, &prof.output);
    assert_eq!(prof.report["processes"].as_array().unwrap().len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Nor for a moment: the agent's threads read files while the program runs
/// (a module's symbols when a sample first lands in it, its unwind tables,
/// `/proc/self/maps`, cache files), and a thread of the program that lists
/// its descriptors the whole time sees none of them.
#[test]
fn files_read_by_agent_threads_never_appear_in_the_program() {
    let dir = scratch("fdwatch");
    let bin = compile_o2("fd_watch.c", &["-pthread", "-ldl"], &dir);
    let first = dir.join("libw0.so");
    let o = Command::new("gcc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&first)
        .arg(root().join("tests/c/fd_watch_lib.c"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Sixteen modules, each named on demand by the drain thread.
    let libs: Vec<String> = (0..16)
        .map(|i| {
            let l = dir.join(format!("libw{i}.so"));
            if i > 0 {
                std::fs::copy(&first, &l).unwrap();
            }
            l.to_string_lossy().into_owned()
        })
        .collect();
    let args: Vec<&str> = libs.iter().map(String::as_str).collect();
    let plain = run_plain(&bin, &args);
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        "libraries 16, sum nonzero, scanned often\n"
    );
    for env in [&[][..], &[("RTPROF_STACKS", "0")][..]] {
        let mut env = env.to_vec();
        env.push(("RTPROF_MODULES", "fd_watch"));
        let prof = run_profiled(&bin, &args, &env, &dir);
        assert_same_behaviour("fd_watch", &plain, &prof.output);
        let p = &prof.report["processes"][0];
        let named = p["functions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["name"] == "busy" && f["samples"].as_u64().unwrap_or(0) > 0)
            .count();
        assert!(named >= 8, "samples named in the libraries: {named}; {p}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// exec replaces a process's image, and the new image is profiled in turn:
/// three images of one pid, each with its own section and counts.
#[test]
fn exec_chain_is_followed() {
    let dir = scratch("exec");
    let bin = compile_o2("exec_chain.c", &[], &dir);
    let plain = run_plain(&bin, &[]);
    let prof = run_profiled(&bin, &[], &[], &dir);
    assert_same_behaviour("exec chain", &plain, &prof.output);
    assert_eq!(prof.output.status.code(), Some(5));
    let procs = prof.report["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 3, "{}", prof.report);
    for (stage, p) in procs.iter().enumerate() {
        assert_eq!(p["pid"], procs[0]["pid"], "exec keeps the pid");
        assert_eq!(calls_of(p, "stage_work"), (stage as u64 + 1) * 10);
        assert_eq!(p["ended"], if stage < 2 { "exec" } else { "exit" });
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Forks while other threads are inside the agent's slow paths, plus
/// posix_spawn and vfork children: nothing hangs, every process counts
/// exactly what it ran.
#[test]
fn fork_storm_with_threads_and_spawned_children() {
    let dir = scratch("fork-storm");
    let bin = compile_o2("fork_storm.c", &["-pthread"], &dir);
    let prof = run_profiled(&bin, &[], &[], &dir);
    assert_eq!(
        String::from_utf8_lossy(&prof.output.stdout),
        "children ok 40 spawned ok 2\n"
    );
    let procs = prof.report["processes"].as_array().unwrap();
    let forked: Vec<_> = procs
        .iter()
        .filter(|p| calls_of(p, "in_child") == 1)
        .collect();
    assert_eq!(forked.len(), 40, "every forked child reported");
    for p in &forked {
        assert_eq!(
            calls_of(p, "leaf"),
            11,
            "child: its thread's call and its own ten"
        );
        assert_eq!(calls_of(p, "churn"), 0, "nothing of the parent's threads");
        assert_eq!(p["ended"], "abrupt", "_exit runs no exit handlers");
    }
    let spawned: Vec<_> = procs.iter().filter(|p| p["exit_status"] == 3).collect();
    assert_eq!(
        spawned.len(),
        2,
        "posix_spawn and vfork children profiled in their new image"
    );
    for p in &spawned {
        assert_eq!(calls_of(p, "leaf"), 4);
    }
    let parent = &procs[0];
    assert_eq!(calls_of(parent, "in_child"), 0);
    assert_eq!(
        calls_of(parent, "short_lived"),
        calls_of(parent, "leaf"),
        "the parent's own calls are exact"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A library loaded with dlopen while four threads run, and then called by
/// all of them, is instrumented at load time and counted exactly; after
/// dlclose its counts stay in the report, and a second load counts anew.
#[test]
fn dlopen_while_threads_run() {
    let dir = scratch("dlopen");
    let lib = dir.join("libplugin.so");
    let o = Command::new("gcc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(root().join("tests/c/plugin.c"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bin = compile_o2("dlopen_main.c", &["-pthread", "-ldl"], &dir);
    let lib_arg = lib.to_str().unwrap();
    let plain = run_plain(&bin, &[lib_arg]);
    let prof = run_profiled(&bin, &[lib_arg], &[("RTPROF_MODULES", "libplugin*")], &dir);
    assert_same_behaviour("dlopen", &plain, &prof.output);
    let p = &prof.report["processes"][0];
    let loads: Vec<_> = p["modules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["path"].as_str().unwrap().ends_with("libplugin.so"))
        .collect();
    assert_eq!(
        loads.len(),
        2,
        "each load is a module of its own: {}",
        p["modules"]
    );
    for m in &loads {
        assert_eq!(m["patched"], m["functions"], "{m}");
    }
    let counts: Vec<u64> = p["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["name"] == "plugin_work")
        .map(|f| f["calls"].as_u64().unwrap())
        .collect();
    let mut counts = counts;
    counts.sort();
    assert_eq!(counts, vec![10, 4 * 50000], "first load, then the second");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `_Fork` runs no fork handlers; the agent still gives the child its own
/// segment, so the parent's counts stay exact.
#[test]
fn raw_fork_child_counts_separately() {
    let dir = scratch("raw-fork");
    let bin = compile_o2("raw_fork.c", &[], &dir);
    let prof = run_profiled(&bin, &[], &[], &dir);
    let procs = prof.report["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2);
    assert_eq!(calls_of(&procs[0], "f"), 2000);
    assert_eq!(calls_of(&procs[1], "f"), 500);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sh -c 'touch MARKER'` under `rtprof run` with `args` before `--`:
/// (exit code, stderr, whether the program ran).
fn run_marking(args: &[&str], dir: &Path) -> (Option<i32>, String, bool) {
    let marker = dir.join("ran");
    let _ = std::fs::remove_file(&marker);
    let out = Command::new(rtprof())
        .arg("run")
        .args(args)
        .args(["--", "sh", "-c", "touch \"$0\""])
        .arg(&marker)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        marker.exists(),
    )
}

/// A `--json` path that cannot be written is found before the program
/// runs: one message, exit status 2, the program not started.
#[test]
fn json_path_is_checked_before_the_program_runs() {
    let dir = scratch("json-path");
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let missing_dir = dir.join("no/such/dir/r.json");
    for (path, why) in [
        (missing_dir.to_str().unwrap(), "cannot be created"),
        (dir.to_str().unwrap(), "is a directory"),
        (fifo.to_str().unwrap(), "is a FIFO that nobody reads"),
        // procfs takes no new files, not even from root.
        ("/proc/rtprof-report.json", "cannot be created"),
    ] {
        let (code, err, ran) = run_marking(&["--json", path], &dir);
        assert_eq!(code, Some(2), "{path}: {err}");
        assert!(!ran, "{path}: the program must not run");
        assert_eq!(err.lines().count(), 1, "{path}: {err}");
        assert!(
            err.starts_with(&format!("rtprof: --json {path}: {why}"))
                && err.contains("the program was not run"),
            "{path}: {err}"
        );
    }
    // A writable path: the program runs and the report is there.
    let (code, err, ran) = run_marking(&["--json", dir.join("ok.json").to_str().unwrap()], &dir);
    assert!(code == Some(0) && ran, "{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("ok.json")).unwrap())
        .expect("a whole report");
    assert!(!v["processes"].as_array().unwrap().is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The report replaces an existing file whole (keeping its mode), goes to
/// a device as it is, and when it cannot be written (a full filesystem)
/// the old file is left untouched and no partial file remains.
#[test]
fn json_report_is_written_whole_or_not_at_all() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("json-whole");
    let bin = build(&dir);
    let json = dir.join("r.json");
    std::fs::write(&json, "previous").unwrap();
    std::fs::set_permissions(&json, std::fs::Permissions::from_mode(0o640)).unwrap();
    let out = Command::new(rtprof())
        .arg("run")
        .arg("--json")
        .arg(&json)
        .arg("--")
        .arg(&bin)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(work_calls(&v), 77);
    let meta = std::fs::metadata(&json).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o640);
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n.contains(".rtprof-")),
        "no temporary file left: {names:?}"
    );

    // To a device, in place.
    let out = Command::new(rtprof())
        .args(["run", "--json", "/dev/stdout", "--"])
        .arg(&bin)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = stdout
        .strip_prefix("s=5929\n")
        .unwrap_or_else(|| panic!("{stdout}"));
    let v: Value = serde_json::from_str(report).unwrap();
    assert_eq!(work_calls(&v), 77);
    // ... and after the program's own output when stdout is a file.
    let file = dir.join("stdout.txt");
    let st = Command::new(rtprof())
        .args(["run", "--json", "/dev/stdout", "--"])
        .arg(&bin)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&file).unwrap())
        .status()
        .unwrap();
    assert!(st.success());
    let all = std::fs::read_to_string(&file).unwrap();
    let report = all
        .strip_prefix("s=5929\n")
        .unwrap_or_else(|| panic!("{all}"));
    assert_eq!(work_calls(&serde_json::from_str(report).unwrap()), 77);

    // On a full filesystem (a small tmpfs in a mount namespace of its
    // own), the old report stays as it was.
    let mnt = dir.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let script = r#"
        mount -t tmpfs -o size=1M tmpfs "$MNT" || exit 99
        printf previous > "$MNT/r.json"
        dd if=/dev/zero of="$MNT/fill" bs=64k 2>/dev/null
        "$RTPROF" run --json "$MNT/r.json" -- "$BIN" </dev/null
        echo "status $?"
        echo "json $(cat "$MNT/r.json")"
        ls -A "$MNT"
    "#;
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", script])
        .env("MNT", &mnt)
        .env("RTPROF", rtprof())
        .env("BIN", &bin)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.contains("s=5929\nstatus 0\njson previous\n"),
        "program ran, old report kept: {stdout} {stderr}"
    );
    let listing: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("json "))
        .skip(1)
        .collect();
    assert_eq!(listing, ["fill", "r.json"], "no partial file: {stdout}");
    assert!(
        stderr.contains(&format!(
            "rtprof: cannot write the report to {}/r.json: No space left on device",
            mnt.display()
        )),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--modules` globs the agent would never match (paths, bracket or brace
/// patterns, globs separated by spaces, nothing at all) are refused before
/// the program runs; good ones pass.
#[test]
fn invalid_module_globs_are_refused() {
    let dir = scratch("modules");
    for (spec, why) in [
        ("/usr/lib/libpython*", "not its path (try 'libpython*')"),
        (
            "libc[0-9]*",
            "only * and ? are wildcards, '[' would be matched as it is",
        ),
        (
            "lib{a,b}.so",
            "only * and ? are wildcards, '{' would be matched as it is",
        ),
        ("libfoo* libbar*", "separate globs with commas, not spaces"),
        ("", "no glob given"),
        (" , ", "no glob given"),
        ("libx\x1b[2J*", "only * and ? are wildcards"),
    ] {
        let (code, err, ran) = run_marking(&["--modules", spec], &dir);
        assert_eq!(code, Some(2), "{spec:?}: {err}");
        assert!(!ran, "{spec:?}");
        assert_eq!(err.lines().count(), 1, "{spec:?}: {err}");
        assert!(
            err.starts_with("rtprof: --modules: ") && err.contains(why),
            "{spec:?}: {err}"
        );
        assert!(!err.contains('\x1b'), "{err:?}");
    }
    for spec in ["libpython*", "all", "main, libc.so.6,lib?.so", "*"] {
        let (code, err, ran) = run_marking(&["--modules", spec], &dir);
        assert!(code == Some(0) && ran, "{spec}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A full TMPDIR (a small tmpfs in a mount namespace of its own) is named
/// at start-up and the program still runs, unprofiled, with its output and
/// exit status; TMPDIR filling up during the run is named at the end
/// instead of the generic "no profile" guess.
#[test]
fn full_tmpdir_is_named_and_the_program_still_runs() {
    let dir = scratch("tmpdir-full");
    let bin = build(&dir);
    let mnt = dir.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    // `vars`: assignments for rtprof run's environment, e.g. RTPROF_DISABLE=1.
    let run = |vars: &str, fill: &str, command: &str| {
        let script = format!(
            r#"
            mount -t tmpfs -o size=4M tmpfs "$MNT" || exit 99
            {fill}
            TMPDIR="$MNT" env $VARS "$RTPROF" run -- {command} </dev/null
            echo "status $?"
            "#
        );
        let out = Command::new("unshare")
            .args(["-m", "sh", "-c", &script])
            .env("MNT", &mnt)
            .env("RTPROF", rtprof())
            .env("BIN", &bin)
            .env("VARS", vars)
            .output()
            .unwrap();
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let m = mnt.display();
    // Completely full.
    let (out, err) = run(
        "",
        r#"dd if=/dev/zero of="$MNT/fill" bs=64k 2>/dev/null"#,
        r#""$BIN" exit 3"#,
    );
    assert_eq!(out, "s=5929\nstatus 3\n", "{err}");
    assert_eq!(
        err,
        format!("rtprof: TMPDIR ({m}) is full: no free space; the program runs unprofiled\n")
    );
    // Space left, but less than a counter segment needs.
    let (out, err) = run(
        "",
        r#"dd if=/dev/zero of="$MNT/fill" bs=1M count=3 2>/dev/null"#,
        r#""$BIN" exit 3"#,
    );
    assert_eq!(out, "s=5929\nstatus 3\n", "{err}");
    assert!(
        err.starts_with(&format!(
            "rtprof: TMPDIR ({m}) is full: 1024 KiB free, a counter segment needs at least "
        )) && err.ends_with(" KiB; the program runs unprofiled\n")
            && err.lines().count() == 1,
        "{err}"
    );
    // Filled by the program itself (a shell the agent leaves alone fills
    // it, then starts the profiled program): named when the run ends.
    let (out, err) = run(
        "RTPROF_DISABLE=1",
        "",
        r#"sh -c 'dd if=/dev/zero of="$MNT/fill" bs=64k 2>/dev/null; exec env -u RTPROF_DISABLE "$BIN" exit 3'"#,
    );
    assert_eq!(out, "s=5929\nstatus 3\n", "{err}");
    assert_eq!(
        err,
        format!("rtprof: no profile was recorded: TMPDIR ({m}) is full: no free space\n")
    );
    // With room, the same program is profiled.
    let (out, err) = run("", "", r#""$BIN" exit 3"#);
    assert_eq!(out, "s=5929\nstatus 3\n", "{err}");
    assert!(err.contains(" work "), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `RTPROF_REPORT` from children of fork(): one ending by `_exit` or
/// `_Exit` writes its report as one ending by `exit` does, with its own
/// calls (ended without exit handlers: "abrupt"), though a thread of the
/// parent allocated across every fork; a vfork child's `_exit` writes
/// nothing (it shares the parent's memory and segment).
#[test]
fn forked_children_ending_by_underscore_exit_write_their_reports() {
    let dir = scratch("exit-kinds");
    let bin = compile_o2("exit_kinds.c", &["-pthread"], &dir);
    let reports = dir.join("reports");
    std::fs::create_dir(&reports).unwrap();
    let mut child = Command::new(&bin)
        .env("LD_PRELOAD", agent())
        .env("RTPROF_REPORT", reports.join("r-%p.json"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A child stuck on a lock held at fork would never end.
    let status = poll(
        "the program and its children end",
        std::time::Duration::from_secs(120),
        || child.try_wait().unwrap(),
    );
    let out = child.wait_with_output().unwrap();
    assert!(status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report_of = |pid: &str| -> Option<Value> {
        let text = std::fs::read_to_string(reports.join(format!("r-{pid}.json"))).ok()?;
        Some(serde_json::from_str(&text).unwrap())
    };
    let work = |v: &Value| -> u64 {
        v["processes"][0]["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == "work")
            .map_or(0, |f| f["calls"].as_u64().unwrap())
    };
    let mut expected_files = 0;
    for l in stdout.lines() {
        match l.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["CHILD", pid, "vfork", _] => {
                assert!(report_of(pid).is_none(), "vfork child {pid} wrote a report");
            }
            ["CHILD", pid, how, n] => {
                let v = report_of(pid)
                    .unwrap_or_else(|| panic!("no report from the child that ended by {how}"));
                let p = &v["processes"][0];
                assert_eq!(p["pid"].as_u64(), pid.parse().ok(), "{how}");
                assert_eq!(work(&v), n.parse::<u64>().unwrap(), "{how}: {p}");
                let ended = if *how == "exit" { "exit" } else { "abrupt" };
                assert_eq!(p["ended"], ended, "{how}");
                expected_files += 1;
            }
            ["PARENT", pid, n] => {
                let v = report_of(pid).expect("the parent's report");
                assert_eq!(work(&v), n.parse::<u64>().unwrap(), "parent");
                expected_files += 1;
            }
            _ => {}
        }
    }
    assert_eq!(expected_files, 4, "{stdout}");
    let files: Vec<_> = std::fs::read_dir(&reports)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(files.len(), 4, "{files:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run's counter segments live on a tmpfs unless TMPDIR says where:
/// `/dev/shm` where it is one (shared memory, not a disk whose blocks each
/// process's set-up waits for), TMPDIR when it is set. Seen from inside
/// the profiled program: the segment file its own memory maps.
#[test]
fn run_directories_go_to_a_tmpfs_unless_tmpdir_is_set() {
    let segment_dir = |tmpdir: Option<&str>| -> String {
        let mut c = Command::new(rtprof());
        c.args(["run", "--", "cat", "/proc/self/maps"]);
        match tmpdir {
            Some(t) => c.env("TMPDIR", t),
            None => c.env_remove("TMPDIR"),
        };
        let out = c.output().expect("rtprof runs");
        assert!(out.status.success(), "{out:?}");
        let maps = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = maps
            .lines()
            .find(|l| l.contains("/rtprof-run-") && l.ends_with(".seg"))
            .unwrap_or_else(|| panic!("no segment file mapped:\n{maps}"));
        let path = line.split_whitespace().last().unwrap();
        path[..path.find("/rtprof-run-").unwrap()].to_string()
    };
    let shm_is_tmpfs = Command::new("stat")
        .args(["-f", "-c", "%T", "/dev/shm"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "tmpfs");
    let expected = if shm_is_tmpfs { "/dev/shm" } else { "/tmp" };
    assert_eq!(segment_dir(None), expected);
    let own = std::env::temp_dir().join(format!("rtprof-tmpdir-{}", std::process::id()));
    std::fs::create_dir_all(&own).unwrap();
    assert_eq!(segment_dir(own.to_str()), own.to_str().unwrap());
    let _ = std::fs::remove_dir_all(&own);
}
