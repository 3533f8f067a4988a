//! Programs that drop privileges or sandbox themselves, with the agent in
//! every process (`/etc/ld.so.preload`, in a private mount namespace with
//! a copy of /etc) and under `rtprof run`: they run exactly as without
//! it, and what they call is still counted.

use rtprof_e2e::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The agent in every process started from now on by this test's thread:
/// a copy in /usr/lib (an overlay of this namespace, readable by every
/// user the programs switch to) named in /etc/ld.so.preload.
fn preload_everywhere() {
    private_machine(&["/usr/lib"]);
    let dir = Path::new("/usr/lib/rtprof-e2e");
    std::fs::create_dir_all(dir).unwrap();
    let lib = dir.join("librtprof.so");
    std::fs::copy(agent(), &lib).unwrap();
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write("/etc/ld.so.preload", format!("{}\n", lib.display())).unwrap();
    // Every process maps it now (not a vacuous test).
    let maps = run(&["/bin/cat", "/proc/self/maps"], &[]);
    assert!(
        String::from_utf8_lossy(&maps.stdout).contains("/usr/lib/rtprof-e2e/librtprof.so"),
        "the agent is not preloaded: {}",
        String::from_utf8_lossy(&maps.stderr)
    );
}

fn run(argv: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(argv[0]);
    c.args(&argv[1..]).env_remove("LD_PRELOAD");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// A scratch directory every user can read (programs run as nobody).
fn open_scratch(name: &str) -> PathBuf {
    let d = scratch(name);
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Runs each of `cases` plainly, then with the agent in every process,
/// once per sampler: exit status, output and error output are the same.
fn same_with_agent_everywhere(cases: &[Vec<String>]) {
    let samplers: [&[(&str, &str)]; 2] = [&[], &[("RTPROF_SAMPLER", "perf")]];
    let plain: Vec<Output> = cases.iter().map(|c| run(&argv(c), &[])).collect();
    for (c, p) in cases.iter().zip(&plain) {
        assert!(p.status.success(), "{c:?} fails without the agent: {p:?}");
    }
    preload_everywhere();
    for env in samplers {
        for (c, p) in cases.iter().zip(&plain) {
            let with = run(&argv(c), env);
            assert_same_behaviour(&format!("{c:?} with {env:?}"), p, &with);
        }
    }
}

fn argv(c: &[String]) -> Vec<&str> {
    c.iter().map(String::as_str).collect()
}

fn strings(argv: &[&str]) -> Vec<String> {
    argv.iter().map(|s| s.to_string()).collect()
}

/// setpriv keeps its capabilities across setresuid on its own thread
/// (PR_SET_KEEPCAPS, capset), then changes groups: glibc repeats each call
/// in every thread it knows and aborts the process if one fails, as the
/// agent's drain thread did. su and runuser go through PAM; the test
/// program does the same as setpriv, and the usual order with threads.
/// None keeps a thread with root's user id.
#[test]
fn privilege_drops_run_as_without_the_agent() {
    let dir = open_scratch("drops");
    let bin = compile_o2("drop_privileges.c", &["-pthread"], &dir);
    let bin = bin.to_str().unwrap();
    let cases = [
        strings(&[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--init-groups",
            "id",
        ]),
        strings(&[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "/bin/sh",
            "-c",
            "id -u; id -G",
        ]),
        strings(&["runuser", "-u", "nobody", "--", "id"]),
        strings(&["su", "-s", "/bin/sh", "nobody", "-c", "id; echo done"]),
        strings(&[bin, "keepcaps"]),
        strings(&[bin, "threads"]),
    ];
    same_with_agent_everywhere(&cases);
    for mode in ["keepcaps", "threads"] {
        let o = run(&[bin, mode], &[]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("uid 65534 gid 65534"), "{out}");
        assert!(out.contains("tasks with user id 0: 0"), "{out}");
    }
}

/// A filter that kills on perf_event_open and timer_create, from the
/// program's start (as systemd's SystemCallFilter= installs it); one that
/// kills on memfd_create, which the agent's start-up needs; a strict
/// allow-list installed later, with prctl and with the seccomp system
/// call, after which the program also forks a child: every one runs to
/// its end as without the agent.
#[test]
fn seccomp_filters_leave_programs_running() {
    let dir = open_scratch("seccomp");
    let bin = compile_o2("sandboxed.c", &[], &dir);
    let bin = bin.to_str().unwrap();
    let cases = [
        strings(&[bin, "deny", bin, "spin"]),
        strings(&[bin, "deny", "/bin/ls", "/"]),
        strings(&[
            bin,
            "deny",
            "/bin/sh",
            "-c",
            "echo in a sandbox; cat /etc/hostname",
        ]),
        strings(&[bin, "later", "prctl"]),
        strings(&[bin, "later", "syscall"]),
    ];
    same_with_agent_everywhere(&cases);
}

/// A function's calls; 0 for one the report leaves out.
fn calls(p: &serde_json::Value, name: &str) -> u64 {
    p["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .map_or(0, |f| f["calls"].as_u64().unwrap())
}

/// Under a filter the agent stops sampling and says why; calls are still
/// counted exactly, and a child forked under the filter does not count
/// into its parent.
#[test]
fn sandboxed_processes_are_counted_exactly() {
    let dir = open_scratch("seccomp-counts");
    let bin = compile_o2("sandboxed.c", &[], &dir);
    for sampler in ["perf", "timer"] {
        let env = [("RTPROF_SAMPLER", sampler)];
        let later = run_profiled(&bin, &["later", "syscall"], &env, &dir);
        assert!(later.output.status.success(), "{:?}", later.output);
        let out = String::from_utf8_lossy(&later.output.stdout);
        assert!(out.contains("child status 7"), "{out}");
        let e = expectations(&later.output.stdout);
        let procs = later.report["processes"].as_array().unwrap();
        assert_eq!(procs.len(), 1, "the child is not reported: {procs:?}");
        let p = &procs[0];
        assert_eq!(calls(p, "work"), e.counts[0].1, "{sampler}");
        assert_eq!(calls(p, "child_work"), 0, "{sampler}");
        assert_eq!(p["sampler"]["name"], "off", "{sampler}");
        assert_eq!(p["sampler"]["why"], "seccomp filter", "{sampler}");

        let bin_s = bin.to_str().unwrap();
        let from_start = run_profiled(&bin, &["deny", bin_s, "spin"], &env, &dir);
        assert!(
            from_start.output.status.success(),
            "{:?}",
            from_start.output
        );
        let e = expectations(&from_start.output.stdout);
        let procs = from_start.report["processes"].as_array().unwrap();
        // The image that installed the filter, then the one it exec'd.
        let spun = procs.last().unwrap();
        assert_eq!(calls(spun, "work"), e.counts[0].1, "{sampler}");
        assert_eq!(spun["sampler"]["why"], "seccomp filter", "{sampler}");
    }
}

/// A program that dropped root's privileges is counted exactly to its
/// end (its report written as the user it became).
#[test]
fn a_process_that_dropped_privileges_is_counted_exactly() {
    let dir = open_scratch("drop-counts");
    let bin = compile_o2("drop_privileges.c", &["-pthread"], &dir);
    for mode in ["keepcaps", "threads"] {
        let r = run_profiled(&bin, &[mode], &[], &dir);
        assert!(r.output.status.success(), "{mode}: {:?}", r.output);
        let e = expectations(&r.output.stdout);
        let p = process(&r.report, &bin);
        assert_eq!(calls(p, "work"), e.counts[0].1, "{mode}");
    }
}

/// A filter present at start-up is tried out in a child, call by call:
/// one that kills on a call of sampling (perf_event_open) leaves counting
/// alone; one that kills on a call start-up makes (memfd_create) leaves
/// the process unprofiled; one that only answers errors (perf_event_open
/// refused with EPERM, as a container's) leaves the agent as it is, and
/// the timers take over sampling.
#[test]
fn a_filter_at_start_is_tried_out_before_the_agent_acts() {
    let dir = open_scratch("probe");
    let bin = compile_o2("sandboxed.c", &[], &dir);
    let noperf = compile_o2("noperf.c", &[], &dir);
    let b = bin.to_str().unwrap();
    let cases = [
        (
            vec![b, "deny", b, "spin"],
            "under a seccomp filter: counted, not sampled",
        ),
        (
            vec![b, "deny-memfd", b, "spin"],
            "under a seccomp filter that forbids what start-up needs; process left unprofiled",
        ),
        (
            vec![noperf.to_str().unwrap(), b, "spin"],
            "under a seccomp filter that allows what the agent does",
        ),
    ];
    let agent = agent();
    for (argv, said) in cases {
        let o = run(
            &argv,
            &[
                ("LD_PRELOAD", agent.to_str().unwrap()),
                ("RTPROF_VERBOSE", "1"),
            ],
        );
        assert!(o.status.success(), "{argv:?}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(said), "{argv:?}: {err}");
    }
}
