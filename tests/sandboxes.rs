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

/// `argv` under `timeout`, so that a hang fails the test (status 137)
/// rather than stalling it.
fn bounded(argv: &[&str]) -> Vec<String> {
    let mut v = strings(&["timeout", "-s", "KILL", "60"]);
    v.extend(strings(argv));
    v
}

/// A child made by clone() (glibc's wrapper, and a raw clone system call)
/// that changes its credentials, as firejail's sandbox child does: no
/// fork handler runs there, so its C library still lists the agent's
/// threads, which do not exist in it. Every run ends, with the output of
/// a run without the agent (five runs each: the hang was not every time).
#[test]
fn a_clone_child_changes_credentials_as_without_the_agent() {
    let dir = open_scratch("clone-credentials");
    let bin = compile_o2("clone_credentials.c", &[], &dir);
    let bin = bin.to_str().unwrap();
    let agent = agent();
    for mode in ["clone", "raw"] {
        let plain = run(
            &bounded(&[bin, mode])
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            &[],
        );
        assert!(
            plain.status.success(),
            "{mode} without the agent: {plain:?}"
        );
        let out = String::from_utf8_lossy(&plain.stdout);
        assert!(out.contains("setresuid 0 uid 65534"), "{out}");
        assert!(out.contains("child exited 7"), "{out}");
        for sampler in ["timer", "perf"] {
            for _ in 0..5 {
                let with = run(
                    &bounded(&[bin, mode])
                        .iter()
                        .map(String::as_str)
                        .collect::<Vec<_>>(),
                    &[
                        ("LD_PRELOAD", agent.to_str().unwrap()),
                        ("RTPROF_SAMPLER", sampler),
                    ],
                );
                assert_same_behaviour(&format!("{mode}, {sampler}"), &plain, &with);
            }
        }
    }
}

/// firejail makes its sandbox with clone() and changes credentials in the
/// child; under a machine-wide preload it ran as without the agent only
/// some of the time. Five runs, as root and with secure programs
/// profiled.
#[test]
fn firejail_runs_under_a_machine_wide_preload() {
    if !Path::new("/usr/bin/firejail").exists() {
        panic!("firejail is not installed (scripts/test-deps installs it)");
    }
    let argv = bounded(&["firejail", "--quiet", "--noprofile", "/bin/echo", "hi"]);
    let plain = run(&argv.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    assert!(
        plain.status.success(),
        "firejail without the agent: {plain:?}"
    );
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "hi\n");
    preload_everywhere();
    std::fs::create_dir_all("/etc/rtprof").unwrap();
    for policy in ["", "profile_secure_processes = yes\n"] {
        std::fs::write("/etc/rtprof/rtprof.conf", policy).unwrap();
        for _ in 0..5 {
            let with = run(&argv.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
            assert_same_behaviour(&format!("firejail, policy {policy:?}"), &plain, &with);
        }
    }
}

/// A root program gives capabilities up in each way programs do (capset,
/// the capset system call through syscall(), the bounding set with
/// PR_CAPBSET_DROP, libcap's cap_set_proc, libcap-ng's capng_apply) or
/// changes its file system user id: no task of the process (the agent's
/// threads among them) keeps what its main thread gave up.
#[test]
fn no_agent_thread_keeps_what_the_program_gave_up() {
    let dir = open_scratch("capabilities");
    let bin = compile_o2("capabilities.c", &["-lcap", "-lcap-ng"], &dir);
    let bin = bin.to_str().unwrap();
    let agent = agent();
    for how in ["capset", "syscall", "bounding", "libcap", "capng", "fsuid"] {
        let plain = run(&[bin, how], &[]);
        assert!(plain.status.success(), "{how}: {plain:?}");
        for sampler in ["timer", "perf"] {
            let with = run(
                &[bin, how],
                &[
                    ("LD_PRELOAD", agent.to_str().unwrap()),
                    ("RTPROF_SAMPLER", sampler),
                ],
            );
            assert!(with.status.success(), "{how}: {with:?}");
            assert_eq!(
                String::from_utf8_lossy(&plain.stdout),
                String::from_utf8_lossy(&with.stdout),
                "{how}, {sampler}"
            );
            let out = String::from_utf8_lossy(&with.stdout);
            assert!(
                out.contains("tasks keeping what the main thread gave up: 0"),
                "{how}: {out}"
            );
            // Not vacuous: the agent's thread was there to be checked.
            let err = String::from_utf8_lossy(&with.stderr);
            let tasks: usize = err
                .lines()
                .find_map(|l| l.strip_prefix("tasks: "))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0);
            assert!(tasks >= 2, "{how}, {sampler}: no agent thread ran: {err}");
        }
    }
}

/// Runs `argv` plainly, then with the agent preloaded under each sampler
/// of `samplers` (and `env`): where the plain run succeeds, the runs
/// with the agent behave the same. Returns how many cases were compared.
fn same_where_plain_succeeds(argv: &[&str], env: &[(&str, &str)], samplers: &[&str]) -> usize {
    let plain = run(argv, &[]);
    if !plain.status.success() {
        return 0;
    }
    let agent = agent();
    for sampler in samplers {
        let mut e = vec![
            ("LD_PRELOAD", agent.to_str().unwrap()),
            ("RTPROF_SAMPLER", sampler),
        ];
        e.extend_from_slice(env);
        let with = run(argv, &e);
        assert_same_behaviour(&format!("{argv:?} with {e:?}"), &plain, &with);
    }
    1
}

/// Calls the agent makes (or made, before it tried them) that a program
/// need not: each killed by a filter the program inherits at exec.
const AGENT_CALLS: &[&str] = &[
    "close_range",
    "sched_getaffinity",
    "readlink",
    "lseek",
    "rt_sigprocmask",
    "dup2",
    "wait4",
    "statx",
    "getdents64",
    "rt_sigreturn",
    "futex_waitv",
    "tgkill",
    "getpid",
    "membarrier",
    "clock_nanosleep",
    "timer_create",
    "perf_event_open",
    "memfd_create",
    "fallocate",
    "socket",
    "sigaltstack",
];

/// A filter present from the program's start (inherited at exec, as bwrap
/// --seccomp and systemd put it) that kills one call the agent would
/// make: the agent tries every call it makes in a child before making it,
/// and the program (single- and multi-threaded) runs as without it.
#[test]
fn a_filter_from_the_start_kills_no_call_of_the_agent() {
    let dir = open_scratch("filters-start");
    let bin = compile_o2("filters.c", &["-pthread", "-lseccomp"], &dir);
    let b = bin.to_str().unwrap();
    let mut compared = 0;
    for call in AGENT_CALLS {
        for prog in [&["/bin/echo", "hi"][..], &[b, "threads"][..]] {
            let mut argv = vec![b, "exec", call];
            argv.extend_from_slice(prog);
            compared += same_where_plain_succeeds(&argv, &[], &["timer", "perf"]);
        }
    }
    assert!(
        compared >= AGENT_CALLS.len(),
        "only {compared} cases ran plainly"
    );
    // bwrap's own --seccomp, as the sandboxes that found it used it.
    for call in ["statx", "wait4", "close_range", "readlink"] {
        let bpf = dir.join(format!("{call}.bpf"));
        let out = run(&[b, "bpf", call], &[]);
        assert!(out.status.success(), "{out:?}");
        std::fs::write(&bpf, &out.stdout).unwrap();
        let script = format!(
            "exec bwrap --bind / / --seccomp 9 /bin/echo hi 9<{}",
            bpf.display()
        );
        assert_eq!(
            same_where_plain_succeeds(&["/bin/sh", "-c", &script], &[], &["timer", "perf"]),
            1,
            "bwrap --seccomp did not run plainly"
        );
    }
}

/// A filter the program installs while it runs, killing one call, then
/// work and the program's end (exit or _exit): with libseccomp (the agent
/// sees it arrive) under every sampler, and with a raw `syscall`
/// instruction (seen only at the end) under the samplers that send no
/// signal to the program's threads. Nothing the agent does after the
/// filter kills the program.
#[test]
fn a_filter_arriving_later_kills_no_call_of_the_agent() {
    let dir = open_scratch("filters-later");
    let bin = compile_o2("filters.c", &["-pthread", "-lseccomp"], &dir);
    let b = bin.to_str().unwrap();
    let calls = [
        "getpid",
        "tgkill",
        "statx",
        "timer_delete",
        "futex",
        "gettid",
        "madvise",
        "munmap",
        "clock_gettime",
        "lseek",
    ];
    let mut compared = 0;
    for call in calls {
        for end in ["exit", "_exit"] {
            compared +=
                same_where_plain_succeeds(&[b, "later", call, end], &[], &["timer", "perf", "off"]);
            compared += same_where_plain_succeeds(&[b, "raw", call, end], &[], &["perf", "off"]);
        }
    }
    assert!(
        compared >= calls.len() * 4,
        "only {compared} cases ran plainly"
    );
}

/// With the agent switched off (RTPROF_DISABLE, the machine's kill switch)
/// it makes no call at all beyond the dynamic loader's: filters killing
/// the calls it used to make run as without it.
#[test]
fn a_switched_off_agent_makes_no_call() {
    let dir = open_scratch("filters-off");
    let bin = compile_o2("filters.c", &["-pthread", "-lseccomp"], &dir);
    let b = bin.to_str().unwrap();
    let calls = [
        "statx",
        "getpid",
        "lseek",
        "readlink",
        "madvise",
        "getrandom",
    ];
    let off = [("RTPROF_DISABLE", "1")];
    let mut compared = 0;
    for call in calls {
        compared +=
            same_where_plain_succeeds(&[b, "exec", call, "/bin/echo", "hi"], &off, &["timer"]);
        for end in ["exit", "_exit"] {
            compared += same_where_plain_succeeds(&[b, "later", call, end], &off, &["timer"]);
            compared += same_where_plain_succeeds(&[b, "raw", call, end], &off, &["timer"]);
        }
    }
    assert!(
        compared >= calls.len() * 4,
        "only {compared} cases ran plainly"
    );
    // The kill switch, in a private copy of /etc.
    private_machine(&[]);
    std::fs::create_dir_all("/etc/rtprof").unwrap();
    std::fs::write("/etc/rtprof/disable", "").unwrap();
    for call in calls {
        compared +=
            same_where_plain_succeeds(&[b, "exec", call, "/bin/echo", "hi"], &[], &["timer"]);
        compared += same_where_plain_succeeds(&[b, "later", call, "_exit"], &[], &["timer"]);
    }
    assert!(compared >= calls.len() * 6);
}

/// The notifications a seccomp supervisor received from `argv` (run by
/// tests/c/supervised.c, answering each after 20 ms), checked to end
/// well.
fn notifications(supervised: &str, argv: &[&str]) -> u64 {
    let mut all = vec![supervised, "20"];
    all.extend_from_slice(argv);
    let o = run(&all, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && err.contains("status 0"),
        "{all:?}: {o:?}"
    );
    err.lines()
        .find_map(|l| l.strip_prefix("notifications: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{all:?}: {err}"))
}

/// A filter whose calls a supervisor answers (SECCOMP_RET_USER_NOTIF, as
/// container runtimes intercept calls), slowly: the agent notices from
/// its first reading of /proc and makes no call beyond it (openat, read,
/// close), so the supervisor hears of at most those, where the trial
/// alone sent it dozens.
#[test]
fn a_supervisor_hears_of_almost_no_call_of_the_agent() {
    let dir = open_scratch("supervised");
    let sup = compile_o2("supervised.c", &[], &dir);
    let sup = sup.to_str().unwrap();
    let agent = format!("LD_PRELOAD={}", agent().display());
    let off = notifications(sup, &["env", &agent, "RTPROF_DISABLE=1", "/bin/true"]);
    let on = notifications(sup, &["env", &agent, "/bin/true"]);
    // Two processes (env, then true) with the agent loaded in each.
    assert!(
        on <= off + 8,
        "the supervisor heard of {on} calls with the agent on, {off} with it off"
    );
}
