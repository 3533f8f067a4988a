//! `rtprof attach PID`: the agent loaded into a running multi-threaded
//! program for a while, its counts checked against the program's own, the
//! program left running its original code; and every refusal's message.

use rtprof_e2e::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The target, started (and killed when the test ends, also if it fails:
/// a program left stopped or deadlocked would outlive it); its stdout
/// lines arrive on the channel.
fn start_target(bin: &Path, args: &[&str]) -> (Killed, mpsc::Receiver<String>) {
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines() {
            if tx.send(l.unwrap()).is_err() {
                break;
            }
        }
    });
    (Killed(child), rx)
}

/// The program's own total in a `tick N calls C` or `done calls C` line.
fn calls_in(line: &str) -> u64 {
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

fn well_formed(line: &str) -> bool {
    let w: Vec<&str> = line.split(' ').collect();
    match w.as_slice() {
        ["tick", n, "calls", c] => n.parse::<u64>().is_ok() && c.parse::<u64>().is_ok(),
        ["done", "calls", c] => c.parse::<u64>().is_ok(),
        _ => false,
    }
}

/// Reads `rtprof attach --verbose`'s stderr until it says the agent is
/// in: what it said, and the rest of its stderr to read.
fn until_attached(attach: &mut Child) -> (String, BufReader<std::process::ChildStderr>) {
    let mut err = BufReader::new(attach.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("attached to") {
        assert!(
            err.read_line(&mut said).unwrap() > 0,
            "rtprof ended: {said}"
        );
        assert!(!said.contains("cannot"), "{said}");
    }
    (said, err)
}

/// One short attach (20 ms) and detach of `pid` by rtprof, which must
/// succeed: its report (stderr).
fn attach_briefly(pid: &str, cycle: usize) -> String {
    let out = Command::new(rtprof())
        .args(["attach", pid, "--duration", "0.02", "--agent"])
        .arg(agent())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "cycle {cycle}: {stderr}");
    stderr
}

fn calls_of(report: &Value, name: &str) -> u64 {
    let p = &report["processes"][0];
    function_named(p, name)["calls"].as_u64().unwrap()
}

#[test]
fn attach_counts_the_interval_and_detach_leaves_the_program_running() {
    let dir = scratch("attach");
    let bin = compile_o2("attach_target.c", &["-pthread"], &dir);
    let threads = 8;
    let (mut child, lines) = start_target(&bin, &["6", &threads.to_string()]);
    let mut seen = Vec::new();
    // Running for a while before attach.
    while seen.len() < 8 {
        seen.push(lines.recv_timeout(Duration::from_secs(10)).unwrap());
    }
    let before = calls_in(seen.last().unwrap());
    let json = dir.join("attach.json");
    let out = Command::new(rtprof())
        .arg("attach")
        .arg(child.id().to_string())
        .args(["--duration", "3", "--verbose", "--output"])
        .arg(&json)
        .arg("--agent")
        .arg(agent())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "rtprof attach: {stderr}");
    // The first tick printed after rtprof returned bounds the interval:
    // the lines printed meanwhile are waiting in the channel.
    seen.extend(lines.try_iter());
    let next = lines.recv_timeout(Duration::from_secs(10)).unwrap();
    let after = calls_in(&next);
    seen.push(next);
    seen.extend(lines.iter());
    let status = child.wait().unwrap();
    assert!(status.success(), "target: {status:?}");
    assert!(
        seen.iter().all(|l| well_formed(l)),
        "output changed: {seen:?}"
    );
    assert!(seen.last().unwrap().starts_with("done calls "), "{seen:?}");
    // Every tick of the 6 s run, none lost or doubled.
    assert_eq!(seen.len(), 61, "{seen:?}");
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["processes"][0]["ended"], "detached", "{report}");
    let work = calls_of(&report, "work");
    let rarely = calls_of(&report, "rarely");
    assert!(work > 0, "no calls counted: {report}");
    // Threads that existed before attach are sampled (CPU-time timers).
    let p = &report["processes"][0];
    let work_samples = function_named(p, "work")["samples"].as_u64().unwrap();
    assert!(work_samples > 0, "work() never sampled: {p}");
    assert!(
        work <= after - before,
        "counted {work} calls, the program made {} in a longer interval",
        after - before
    );
    // Exact: each thread calls rarely() once per 1,000 work(); only the
    // loops cut by attach and detach differ, by under 1,000 per thread
    // at each end.
    let gap = work.abs_diff(rarely * 1000);
    assert!(
        gap <= 2 * 1000 * threads,
        "work {work} vs rarely {rarely}: {gap} off"
    );
    let held: f64 = stderr
        .lines()
        .find_map(|l| l.split("held for ").nth(1)?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no held time in: {stderr}"));
    eprintln!("target held {held} ms, counted work {work}, rarely {rarely}");
}

fn attach_err(pid: u32) -> String {
    attach_err_as(&mut Command::new(rtprof()), pid)
}

/// rtprof attach through `cmd` (rtprof itself, or a wrapper running it).
fn attach_err_as(cmd: &mut Command, pid: u32) -> String {
    let out = cmd
        .args(["attach", &pid.to_string(), "--duration", "0.1", "--agent"])
        .arg(agent())
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn sleeper(bin: &Path, cmd: &mut Command) -> Child {
    cmd.arg(bin)
        .arg("20")
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn refusals_each_say_why_and_leave_the_target_alone() {
    let dir = scratch("attach-refuse");
    let bin = compile_o2("attach_target.c", &["-pthread"], &dir);
    let stat = dir.join("static_target");
    let o = Command::new("gcc")
        .args(["-O2", "-static", "-pthread", "-o"])
        .arg(&stat)
        .arg(root().join("tests/c/attach_target.c"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let mut kids = Vec::new();
    // Statically linked.
    let mut c = Command::new(&stat);
    kids.push(c.arg("20").stdout(Stdio::null()).spawn().unwrap());
    let e = attach_err(kids[0].id());
    assert!(e.contains("statically linked"), "{e}");

    // Already profiled (the agent preloaded).
    let mut c = Command::new(&bin);
    c.env("LD_PRELOAD", agent()).env("RTPROF_DAEMON_SOCKET", "");
    kids.push(c.arg("20").stdout(Stdio::null()).spawn().unwrap());
    std::thread::sleep(Duration::from_millis(300));
    let e = attach_err(kids[1].id());
    assert!(e.contains("already profiled"), "{e}");

    // Another user's process: root may attach to it
    // (`root_attaches_to_another_users_process_and_not_the_other_way`).
    // SAFETY: a plain system call.
    if unsafe { libc_geteuid() } == 0 {
        // Set-user-ID (a root-owned copy, run by root: same ids, the
        // file's mode tells).
        let suid = dir.join("suid_target");
        std::fs::copy(&bin, &suid).unwrap();
        sh_ok(&format!("chmod 4755 {}", suid.display()));
        let k = sleeper(&suid, &mut Command::new("env"));
        std::thread::sleep(Duration::from_millis(200));
        let e = attach_err(k.id());
        kids.push(k);
        assert!(e.contains("set-user-ID"), "{e}");

        // ptrace refused: rtprof as an ordinary user, the target of the
        // same user but not dumpable.
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&bin)
            .args(["20", "2", "nodump"])
            .stdout(Stdio::null());
        let k = c.spawn().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(rtprof())
            .env("TMPDIR", "/tmp");
        let e = attach_err_as(&mut c, k.id());
        kids.push(k);
        assert!(
            e.contains("ptrace refused") && e.contains("CAP_SYS_PTRACE"),
            "{e}"
        );
    }

    // Already traced (by strace, where installed).
    if Command::new("strace").arg("-V").output().is_ok() {
        let mut c = Command::new("strace");
        c.args(["-f", "-o", "/dev/null"]).stderr(Stdio::null());
        let k = sleeper(&bin, &mut c);
        std::thread::sleep(Duration::from_millis(500));
        // strace's child is the target.
        let target =
            std::fs::read_to_string(format!("/proc/{}/task/{}/children", k.id(), k.id())).unwrap();
        let target: u32 = target.split_whitespace().next().unwrap().parse().unwrap();
        kids.push(k);
        let e = attach_err(target);
        assert!(e.contains("already traced"), "{e}");
    }

    // Stopped.
    let mut c = Command::new(&bin);
    kids.push(c.arg("20").stdout(Stdio::null()).spawn().unwrap());
    let stopped = kids.last().unwrap().id();
    sh_ok(&format!("kill -STOP {stopped}"));
    std::thread::sleep(Duration::from_millis(100));
    let e = attach_err(stopped);
    assert!(e.contains("is stopped"), "{e}");
    sh_ok(&format!("kill -CONT {stopped}"));

    // In a mount namespace of its own.
    let mut c = Command::new("unshare");
    c.arg("-m");
    kids.push(sleeper(&bin, &mut c));
    std::thread::sleep(Duration::from_millis(300));
    let e = attach_err(kids.last().unwrap().id());
    assert!(e.contains("another mount namespace"), "{e}");

    // No such process.
    let e = attach_err(999_999_999);
    assert!(e.contains("no such process"), "{e}");

    // Every target is still running, untouched.
    for k in &mut kids {
        assert!(k.try_wait().unwrap().is_none(), "a refused target ended");
        let _ = k.kill();
        let _ = k.wait();
    }
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

#[test]
fn attach_to_python_with_libpython_instrumented() {
    let python = match shared_python() {
        Ok(p) => p,
        Err(tried) => panic!("no python3 with a shared libpython: tried {tried:?}"),
    };
    let dir = scratch("attach-python");
    let json = dir.join("py.json");
    let script = "import time\n\
                  def f(x): return x * 2\n\
                  t = time.time(); n = 0\n\
                  while time.time() - t < 5:\n    \
                      n += sum(f(i) for i in range(1000))\n\
                  print('done', n > 0)\n";
    let (mut child, lines) = start_target(&python, &["-c", script]);
    std::thread::sleep(Duration::from_millis(800));
    let out = Command::new(rtprof())
        .arg("attach")
        .arg(child.id().to_string())
        .args(["--modules", "libpython*", "--duration", "1", "--verbose"])
        .arg("--output")
        .arg(&json)
        .arg("--agent")
        .arg(agent())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "rtprof attach: {stderr}");
    let status = child.wait().unwrap();
    assert!(status.success(), "python: {status:?}");
    let printed: Vec<String> = lines.iter().collect();
    assert_eq!(printed, ["done True"]);
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let p = &report["processes"][0];
    let in_libpython: u64 = p["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["module"].as_str().unwrap_or("").contains("libpython"))
        .map(|f| f["calls"].as_u64().unwrap_or(0))
        .sum();
    assert!(in_libpython > 1000, "libpython calls {in_libpython}: {p}");
    // How long the process was held: for the calls that load the agent,
    // and for the stop that writes libpython's ~5,000 entries (the goal
    // is under 50 ms with the plan cached; the bound here only catches
    // gross regressions on a busy machine).
    let ms_after = |key: &str| -> f64 {
        stderr
            .lines()
            .find_map(|l| l.split(key).nth(1)?.split(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no '{key}' in: {stderr}"))
    };
    let (calls, longest) = (ms_after("held for "), ms_after("longest "));
    eprintln!("python: held {calls} ms for the calls, longest entry stop {longest} ms");
    assert!(calls < 500.0 && longest < 500.0, "{stderr}");
}

#[test]
fn attach_and_detach_a_hundred_times_under_eight_busy_threads() {
    let dir = scratch("attach-loop");
    let bin = compile_o2("attach_target.c", &["-pthread"], &dir);
    let (mut child, lines) = start_target(&bin, &["3600", "8"]);
    lines.recv_timeout(Duration::from_secs(10)).unwrap();
    let pid = child.id().to_string();
    let mut counted = 0;
    for i in 0..100 {
        let stderr = attach_briefly(&pid, i);
        counted += stderr.contains(" work ") as usize;
        assert!(
            child.try_wait().unwrap().is_none(),
            "the target died in cycle {i}"
        );
    }
    // Most cycles catch some calls (20 ms, 8 threads calling).
    assert!(counted > 50, "only {counted} of 100 reports counted work()");

    // rtprof killed while attached: `rtprof detach` puts the entries back.
    let mut attach = Command::new(rtprof())
        .args(["attach", &pid, "--agent"])
        .arg(agent())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    attach.kill().unwrap();
    attach.wait().unwrap();
    let out = Command::new(rtprof())
        .args(["detach", &pid])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rtprof detach: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Not attached any more: a second detach says so.
    let out = Command::new(rtprof())
        .args(["detach", &pid])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not attached"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Still running and printing as before.
    let mut more = Vec::new();
    while more.len() < 3 {
        more.push(lines.recv_timeout(Duration::from_secs(10)).unwrap());
    }
    assert!(more.iter().all(|l| well_formed(l)), "{more:?}");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Threads hit by a stream of queued real-time signals while rtprof
/// holds them, again and again: each attach and detach succeeds (a thread
/// may stop in a signal's delivery instead of the interrupt's stop) and
/// every signal a stop intercepted reaches the program once, with its
/// value.
#[test]
fn every_signal_intercepted_while_held_is_handed_back_once() {
    let dir = scratch("attach-signals");
    let bin = compile_o2("signal_storm.c", &["-pthread"], &dir);
    let mut child = Killed(
        Command::new(&bin)
            .arg("4")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let pid = child.id().to_string();
    for i in 0..30 {
        let stderr = attach_briefly(&pid, i);
        assert!(stderr.contains(" step "), "cycle {i}: {stderr}");
    }
    drop(child.stdin.take());
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(child.wait().unwrap().success());
    let w: Vec<&str> = line.split_whitespace().collect();
    assert!(
        matches!(w.as_slice(), ["sent", _, _, "got", _, _]),
        "{line}"
    );
    let sent: u64 = w[1].parse().unwrap();
    assert!(sent > 1000, "{line}");
    assert_eq!((w[1], w[2]), (w[4], w[5]), "signals sent and received");
}

#[test]
fn a_library_loaded_after_attach_is_instrumented_and_restored() {
    let python = shared_python().expect("a python3 with a shared libpython");
    let dir = scratch("attach-late-lib");
    let json = dir.join("late.json");
    // _json's accelerator module is loaded by the import, after attach;
    // the program runs on past the attach's 2.5 s (and a busy machine's
    // slower attach), so it is still there to be detached from.
    let script = "import time\n\
                  time.sleep(1.5)\n\
                  import json\n\
                  t = time.time()\n\
                  while time.time() - t < 4:\n    \
                      json.dumps({'a': [1, 2, {'b': 'c'}]})\n\
                  print('done')\n";
    let (mut child, lines) = start_target(&python, &["-c", script]);
    std::thread::sleep(Duration::from_millis(500));
    let out = Command::new(rtprof())
        .arg("attach")
        .arg(child.id().to_string())
        .args(["--modules", "_json*", "--duration", "2.5", "--output"])
        .arg(&json)
        .arg("--agent")
        .arg(agent())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rtprof attach: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(child.wait().unwrap().success());
    assert_eq!(lines.iter().collect::<Vec<_>>(), ["done"]);
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let p = &report["processes"][0];
    let in_json: u64 = p["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["module"].as_str().unwrap_or("").contains("_json"))
        .map(|f| f["calls"].as_u64().unwrap_or(0))
        .sum();
    assert!(in_json > 100, "_json calls {in_json}: {p}");
    // Loops of the sampled functions, from the places samples landed.
    let loops = p["loops"].as_array().expect("loops while attached");
    assert!(!loops.is_empty(), "{p}");
    for l in loops {
        let f = function_named(p, l["name"].as_str().unwrap());
        assert!(f["samples"].as_u64().unwrap() > 0, "{l} {f}");
        assert!(l["samples"].as_u64().unwrap() > 0, "{l}");
    }
    assert_eq!(p["offsets_dropped"].as_u64(), Some(0), "{p}");
}

/// Threads the program creates while attached pass through the agent's
/// own thread creation (libc's entry is sent to it): each is sampled and
/// counts in a stripe of its own, folded at its end; after detach libc's
/// entry is its own again and threads are created as before.
#[test]
fn threads_created_while_attached_are_sampled_and_counted_exactly() {
    let dir = scratch("attach-new-threads");
    let bin = compile_o2("attach_new_threads.c", &["-pthread"], &dir);
    let (mut child, lines) = start_target(&bin, &[]);
    assert_eq!(
        lines.recv_timeout(Duration::from_secs(10)).unwrap(),
        "ready"
    );
    let pid = child.id();
    let json = dir.join("threads.json");
    let mut attach = Command::new(rtprof())
        .arg("attach")
        .arg(pid.to_string())
        .args(["--duration", "4", "--verbose", "--output"])
        .arg(&json)
        .arg("--agent")
        .arg(agent())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (said, err) = until_attached(&mut attach);
    // SAFETY: a signal to our own child, which waits for it.
    unsafe { libc::kill(pid as i32, libc::SIGUSR1) };
    let done = lines.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(done, "fresh done 8000000");
    let rest = std::io::read_to_string(err).unwrap();
    assert!(attach.wait().unwrap().success(), "{said} {rest}");
    assert!(rest.contains("detached from"), "{rest}");
    // After detach: threads created the program's own way.
    // SAFETY: as above.
    unsafe { libc::kill(pid as i32, libc::SIGUSR1) };
    assert_eq!(
        lines.recv_timeout(Duration::from_secs(30)).unwrap(),
        "fresh done 8000000"
    );
    assert!(child.wait().unwrap().success());
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let p = &report["processes"][0];
    let fresh = function_named(p, "fresh");
    assert_eq!(fresh["calls"].as_u64(), Some(8_000_000), "{p}");
    assert_eq!(calls_of(&report, "run"), 4, "{p}");
    assert!(
        fresh["samples"].as_u64().unwrap_or(0) > 0,
        "threads created while attached were not sampled: {p}"
    );
    // Per thread: the four created and ended while attached, each with
    // its exact 2,000,000 calls, and the main thread live.
    let threads = p["threads"].as_array().expect("threads in the report");
    let ended: Vec<&Value> = threads.iter().filter(|t| t["ended"] == true).collect();
    assert_eq!(ended.len(), 4, "{threads:?}");
    for t in &ended {
        let calls: u64 = t["functions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["name"] == "fresh")
            .map(|f| f["calls"].as_u64().unwrap())
            .sum();
        assert_eq!(calls, 2_000_000, "{t}");
    }
    assert!(
        threads
            .iter()
            .any(|t| t["tid"].as_u64() == Some(pid as u64) && t["ended"] == false),
        "{threads:?}"
    );
    assert_eq!(p["threads_dropped"].as_u64(), Some(0), "{p}");
}

#[test]
fn an_attached_process_registers_with_rtprofd() {
    let dir = scratch("attach-daemon");
    let bin = compile_o2("attach_target.c", &["-pthread"], &dir);
    let mut cmd = Command::new(rtprof().with_file_name("rtprofd"));
    cmd.args(["--tick", "100", "--span", "500", "--buffer-mib", "4"])
        .stderr(Stdio::null());
    let d = Rtprofd::start(cmd, &dir);
    let (mut child, _lines) = start_target(&bin, &["6", "2"]);
    std::thread::sleep(Duration::from_millis(300));
    let pid = child.id();
    let mut attach = Command::new(rtprof())
        .args(["attach", &pid.to_string(), "--duration", "3", "--agent"])
        .arg(agent())
        .env("RTPROF_DAEMON_SOCKET", &d.socket)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The daemon's spans show the process and its calls while attached.
    let shown = poll(
        "the attached process in rtprofd",
        Duration::from_secs(10),
        || {
            let out = Command::new(rtprof())
                .args(["report", "--present"])
                .arg(&d.present)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            let section = text.split(&format!("pid {pid} ")).nth(1)?.to_string();
            section
                .lines()
                .take(6)
                .any(|l| l.contains(" work "))
                .then_some(section)
        },
    );
    assert!(shown.contains("calls/s"), "{shown}");
    // An attached agent routes no calls, and says so.
    let route = Command::new(rtprof())
        .args(["route", "--socket"])
        .arg(&d.socket)
        .args([&pid.to_string(), "work", "fast"])
        .output()
        .unwrap();
    assert_eq!(route.status.code(), Some(1), "{route:?}");
    assert!(
        String::from_utf8_lossy(&route.stderr).contains("loaded by rtprof attach routes no calls"),
        "{route:?}"
    );
    assert!(attach.wait().unwrap().success());
    assert!(child.wait().unwrap().success());
}

/// A child forked while attached is profiled as under a preloaded agent:
/// libc's `fork` reaches the agent's, so the child gets a segment and a
/// sampler of its own, and rtprofd shows its calls and samples.
#[test]
fn a_child_forked_while_attached_is_counted_and_sampled() {
    let dir = scratch("attach-fork");
    let bin = compile_o2("attach_fork.c", &[], &dir);
    let mut cmd = Command::new(rtprof().with_file_name("rtprofd"));
    cmd.args(["--tick", "100", "--span", "500", "--buffer-mib", "4"])
        .stderr(Stdio::null());
    let d = Rtprofd::start(cmd, &dir);
    let (mut child, lines) = start_target(&bin, &[]);
    assert_eq!(
        lines.recv_timeout(Duration::from_secs(10)).unwrap(),
        "ready"
    );
    let pid = child.id();
    let mut attach = Command::new(rtprof())
        .args([
            "attach",
            &pid.to_string(),
            "--duration",
            "5",
            "--verbose",
            "--agent",
        ])
        .arg(agent())
        .env("RTPROF_DAEMON_SOCKET", &d.socket)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (_, err) = until_attached(&mut attach);
    // SAFETY: a signal to our own child, which waits for it.
    unsafe { libc::kill(pid as i32, libc::SIGUSR1) };
    let forked = poll(
        "the forked child in rtprofd",
        Duration::from_secs(10),
        || {
            let out = Command::new(rtprof())
                .args(["report", "--json", "--present"])
                .arg(&d.present)
                .output()
                .unwrap();
            let r: Value = serde_json::from_slice(&out.stdout).ok()?;
            r["processes"].as_array()?.iter().find_map(|p| {
                let f = p["functions"]
                    .as_array()?
                    .iter()
                    .find(|f| f["name"] == "fresh")?;
                (p["pid"].as_u64()? != pid as u64
                    && f["calls"].as_u64()? > 0
                    && f["samples"].as_u64()? > 0)
                    .then(|| p.clone())
            })
        },
    );
    let child_line = lines.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(
        child_line.starts_with(&format!("child {} called fresh ", forked["pid"])),
        "{child_line} / {forked}"
    );
    assert_eq!(
        lines.recv_timeout(Duration::from_secs(20)).unwrap(),
        "parent done 0"
    );
    assert!(child.wait().unwrap().success());
    let _ = std::io::read_to_string(err);
    assert!(attach.wait().unwrap().success());
}

#[test]
fn attach_to_a_program_busy_in_malloc_never_deadlocks() {
    let dir = scratch("attach-malloc");
    let bin = compile_o2("attach_malloc.c", &[], &dir);
    let (mut child, lines) = start_target(&bin, &["3600"]);
    std::thread::sleep(Duration::from_millis(200));
    let pid = child.id().to_string();
    for i in 0..30 {
        let stderr = attach_briefly(&pid, i);
        assert!(stderr.contains(" fill "), "cycle {i}: {stderr}");
        assert!(child.try_wait().unwrap().is_none(), "died in cycle {i}");
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(lines.try_iter().next().is_none());
}

/// CPU time the process has used so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = stat.rsplit_once(')').unwrap().1;
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// A program whose own signal handler often runs on top of malloc (with
/// its arena's lock held) while its code is outside libc: rtprof never
/// calls into the process from inside such a handler, and detaching
/// takes no lock at all, so the program never deadlocks.
#[test]
fn a_signal_handler_on_top_of_malloc_is_never_called_in() {
    let dir = scratch("attach-handler");
    let bin = compile_o2("attach_malloc.c", &[], &dir);
    let (mut child, _lines) = start_target(&bin, &["3600", "handler"]);
    std::thread::sleep(Duration::from_millis(200));
    let pid = child.id();
    for i in 0..20 {
        attach_briefly(&pid.to_string(), i);
        assert!(child.try_wait().unwrap().is_none(), "died in cycle {i}");
    }
    // Still running: not stuck on a lock it holds itself.
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_millis(300));
    let after = cpu_ticks(pid);
    assert!(after > before, "the program stopped running after detach");
}

/// A program whose main thread calls pthread_exit ends when its worker
/// does, also while attached: the agent's control thread does not keep
/// it alive.
#[test]
fn a_program_whose_threads_all_end_while_attached_ends() {
    let dir = scratch("attach-main-exits");
    let bin = compile_o2("attach_main_exits.c", &["-pthread"], &dir);
    let (mut child, lines) = start_target(&bin, &["3"]);
    assert_eq!(
        lines.recv_timeout(Duration::from_secs(10)).unwrap(),
        "ready"
    );
    let pid = child.id();
    let mut attach = Killed(
        Command::new(rtprof())
            .args([
                "attach",
                &pid.to_string(),
                "--duration",
                "60",
                "--verbose",
                "--agent",
            ])
            .arg(agent())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (_, err) = until_attached(&mut attach);
    // SAFETY: a signal to our own child, which waits for it.
    unsafe { libc::kill(pid as i32, libc::SIGUSR1) };
    // The worker runs 3 s more; a process kept alive would still be there
    // a minute later.
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the process did not end after its last thread"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    let rest = std::io::read_to_string(err).unwrap();
    assert!(attach.wait().unwrap().success(), "{rest}");
    assert!(rest.contains(" work "), "{rest}");
}

/// A user of our own for processes that are not root's, made once.
fn test_user() -> &'static str {
    const NAME: &str = "rtprof-test";
    let exists = Command::new("id")
        .arg(NAME)
        .output()
        .unwrap()
        .status
        .success();
    if !exists {
        // Another test may make it meanwhile: only its existence counts.
        let _ = Command::new("useradd")
            .args(["--system", "--no-create-home", "--shell", "/bin/sh", NAME])
            .output();
    }
    assert!(
        Command::new("id")
            .arg(NAME)
            .output()
            .unwrap()
            .status
            .success(),
        "useradd {NAME} failed (these tests run as root)"
    );
    NAME
}

/// `cmd` to be run as `user` (real and effective ids, its own group).
fn as_user(user: &str) -> Command {
    let mut c = Command::new("runuser");
    c.args(["-u", user, "--"]);
    c
}

/// A program that spends its life blocked in `read`, `epoll_wait` or
/// `accept` (or busy inside libc's `strlen`) is attached to while it is
/// there, profiled, and behaves exactly as it does alone: the same output
/// for the same input, the same exit status, and no EINTR out of the call
/// it was blocked in (it has no signal handler: alone, it never gets one).
#[test]
fn programs_blocked_in_a_system_call_or_busy_in_libc_are_attached_and_behave_the_same() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    let dir = scratch("attach-blocked");
    let bin = compile_o2("attach_blocked.c", &[], &dir);
    for mode in ["read", "epoll", "accept", "busy"] {
        let sock = dir.join(format!("{mode}.sock"));
        let sock_arg = sock.to_string_lossy().into_owned();
        let args: Vec<&str> = match mode {
            "accept" => vec![mode, &sock_arg],
            "busy" => vec![mode, "40000000"],
            _ => vec![mode],
        };
        // Asks the program for work(n): a line on stdin or a connection.
        let ask = |stdin: &mut Option<std::process::ChildStdin>, n: u32| {
            if mode == "accept" {
                let mut c = UnixStream::connect(&sock).unwrap();
                writeln!(c, "{n}").unwrap();
                let mut reply = String::new();
                c.read_to_string(&mut reply).unwrap();
                assert!(reply.starts_with(&format!("{n} -> ")), "{reply}");
            } else if let Some(i) = stdin.as_mut() {
                writeln!(i, "{n}").unwrap();
            }
        };
        let finish = |stdin: &mut Option<std::process::ChildStdin>| {
            if mode == "accept" {
                let mut c = UnixStream::connect(&sock).unwrap();
                writeln!(c, "quit").unwrap();
            }
            drop(stdin.take());
        };
        let run = |attached: bool| -> (Vec<String>, std::process::ExitStatus, Option<Value>) {
            let mut child = Killed(
                Command::new(&bin)
                    .args(&args)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
            let mut stdin = child.stdin.take();
            let mut out = BufReader::new(child.stdout.take().unwrap());
            let mut lines = Vec::new();
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            lines.push(line.trim_end().to_string());
            let mut report = None;
            if attached {
                // Blocked (or busy) by now.
                std::thread::sleep(Duration::from_millis(300));
                let json = dir.join(format!("{mode}.json"));
                let mut attach = Killed(
                    Command::new(rtprof())
                        .arg("attach")
                        .arg(child.id().to_string())
                        .args(["--duration", "1.5", "--verbose", "--output"])
                        .arg(&json)
                        .arg("--agent")
                        .arg(agent())
                        .stderr(Stdio::piped())
                        .spawn()
                        .unwrap(),
                );
                let (_, err) = until_attached(&mut attach);
                // The call it was blocked in still returns what comes.
                if mode != "busy" {
                    ask(&mut stdin, 300);
                    line.clear();
                    out.read_line(&mut line).unwrap();
                    lines.push(line.trim_end().to_string());
                }
                let rest = std::io::read_to_string(err).unwrap();
                assert!(attach.wait().unwrap().success(), "{mode}: {rest}");
                report = Some(serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap());
            } else if mode != "busy" {
                ask(&mut stdin, 300);
            }
            // After detach, blocked in the same call again.
            if mode != "busy" {
                std::thread::sleep(Duration::from_millis(200));
                ask(&mut stdin, 2);
            }
            finish(&mut stdin);
            for l in out.lines() {
                lines.push(l.unwrap());
            }
            (lines, child.wait().unwrap(), report)
        };
        let (plain, plain_status, _) = run(false);
        let (seen, status, report) = run(true);
        assert_eq!(seen, plain, "{mode}: output changed by attach");
        assert_eq!(status.code(), plain_status.code(), "{mode}: {seen:?}");
        assert!(plain_status.success(), "{mode}: {plain:?}");
        let report = report.unwrap();
        let p = &report["processes"][0];
        assert_eq!(p["ended"], "detached", "{mode}: {report}");
        if mode == "busy" {
            // Called every 100,000 rounds, counted while attached.
            assert!(
                function_named(p, "work")["calls"].as_u64().unwrap() > 0,
                "{p}"
            );
            assert!(p["sampler"]["samples"].as_u64().unwrap() > 0, "{p}");
        } else {
            // The one request made while attached, counted and sampled.
            let work = function_named(p, "work");
            assert_eq!(work["calls"], 1, "{mode}: {p}");
            assert!(work["samples"].as_u64().unwrap() > 0, "{mode}: {p}");
        }
    }
}

/// A program spending most of its CPU time in system calls (reads of
/// /dev/zero) and the rest in spin(): attached, it is sampled as the
/// preloaded agent samples it, on the same clock, so spin() gets the same
/// share; and the report says which time it counts (the timers' CPU
/// time, system calls included).
#[test]
fn attached_samples_count_user_time_as_preloaded_ones_do() {
    let dir = scratch("attach-user-time");
    let bin = compile_o2("syscall_heavy.c", &[], &dir);
    let share = |p: &Value| {
        let spin = function_named(p, "spin")["samples"].as_u64().unwrap() as f64;
        let all = p["sampler"]["samples"].as_u64().unwrap() as f64;
        assert!(all > 20.0, "too few samples: {p}");
        assert_eq!(p["sampler"]["name"], "timer", "{p}");
        assert_eq!(p["sampler"]["time"], "CPU", "{p}");
        spin / all
    };
    let pre = dir.join("pre.json");
    let o = Command::new(rtprof())
        .args(["run", "--output"])
        .arg(&pre)
        .arg("--")
        .arg(&bin)
        .arg("2")
        .env("RTPROF_DAEMON_SOCKET", "")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let pre: Value = serde_json::from_slice(&std::fs::read(&pre).unwrap()).unwrap();
    let preloaded = share(&process(&pre, &bin).clone());

    let (mut child, lines) = start_target(&bin, &["4"]);
    assert_eq!(
        lines.recv_timeout(Duration::from_secs(10)).unwrap(),
        "ready"
    );
    let json = dir.join("attach.json");
    let out = Command::new(rtprof())
        .arg("attach")
        .arg(child.id().to_string())
        .args(["--duration", "2", "--output"])
        .arg(&json)
        .arg("--agent")
        .arg(agent())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(child.wait().unwrap().success());
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let attached = share(&report["processes"][0]);
    // On another clock (user time only, or CPU time), spin() would get
    // several times its share, or a fifth of it.
    assert!(
        attached > preloaded * 0.5 && attached < preloaded * 2.0,
        "spin() has {:.0}% of the samples attached, {:.0}% preloaded: {report}",
        attached * 100.0,
        preloaded * 100.0
    );
}

/// Root attaches to another user's process, as gdb and perf may; that
/// user cannot attach to root's.
#[test]
fn root_attaches_to_another_users_process_and_not_the_other_way() {
    let user = test_user();
    let dir = scratch("attach-other-user");
    let bin = compile_o2("syscall_heavy.c", &[], &dir);
    sh_ok(&format!("chmod -R a+rX {}", dir.display()));
    let mut child = Killed(
        as_user(user)
            .arg(&bin)
            .arg("3")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    // runuser's child is the program.
    let pid = poll("the program under runuser", Duration::from_secs(10), || {
        std::fs::read_to_string(format!("/proc/{}/task/{}/children", child.id(), child.id()))
            .ok()?
            .split_whitespace()
            .next()?
            .parse::<u32>()
            .ok()
    });
    let o = Command::new(rtprof())
        .arg("attach")
        .arg(pid.to_string())
        .args(["--duration", "1", "--agent"])
        .arg(agent())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{text}");
    // The report, with the time it counts.
    assert!(
        text.contains(" spin ") && text.contains("s of CPU"),
        "{text}"
    );
    assert!(child.wait().unwrap().success());
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "done\n");

    // The other way round: refused.
    let mut root_owned = Killed(sleeper(&bin, &mut Command::new("env")));
    std::thread::sleep(Duration::from_millis(200));
    let mut c = as_user(user);
    c.arg(rtprof()).env("TMPDIR", "/tmp");
    let e = attach_err_as(&mut c, root_owned.id());
    assert!(e.contains("another user (uid 0)"), "{e}");
    assert!(root_owned.try_wait().unwrap().is_none());
}

/// A private PostgreSQL cluster of the test user's, stopped when dropped.
struct Postgres {
    bin: PathBuf,
    dir: PathBuf,
    user: &'static str,
}

impl Postgres {
    fn start(dir: &Path) -> Postgres {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()
            .and_then(|d| d.flatten().map(|e| e.path().join("bin")).max())
            .filter(|b| b.join("initdb").exists())
            .expect("PostgreSQL is not installed (apt-get install postgresql)");
        let user = test_user();
        sh_ok(&format!("chown {user} {}", dir.display()));
        let pg = Postgres {
            bin,
            dir: dir.to_path_buf(),
            user,
        };
        let data = dir.join("data");
        let o = as_user(user)
            .arg(pg.bin.join("initdb"))
            .args(["-A", "trust", "-U", "postgres", "-D"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let o = as_user(user)
            .arg(pg.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&data)
            .arg("-o")
            .arg(format!("-k {} -c listen_addresses=''", dir.display()))
            .arg("-l")
            .arg(dir.join("log"))
            .args(["-w", "start"])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "pg_ctl start: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        pg
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = as_user(self.user)
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

/// A client backend of a real PostgreSQL server, idle in `epoll_wait`
/// between queries as it spends its life, is attached to (by root: the
/// server is another user's), profiled while it runs queries, and answers
/// the same afterwards.
#[test]
fn attach_to_a_postgresql_client_backend() {
    use std::io::Write;
    let dir = scratch("attach-postgres");
    sh_ok(&format!("chmod 755 {}", dir.display()));
    let pg = Postgres::start(&dir);
    let mut psql = Killed(
        as_user(pg.user)
            .arg("psql")
            .args(["-X", "-q", "-A", "-t", "-U", "postgres", "-h"])
            .arg(&dir)
            .arg("postgres")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut sql = psql.stdin.take().unwrap();
    let mut out = BufReader::new(psql.stdout.take().unwrap());
    let mut query = |q: &str| -> String {
        writeln!(sql, "{q}").unwrap();
        sql.flush().unwrap();
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        line.trim_end().to_string()
    };
    let backend: u32 = query("SELECT pg_backend_pid();").parse().unwrap();
    let sum = "SELECT sum(i % 7) FROM generate_series(1, 3000000) AS i;";
    let expected = query(sum);
    // Idle in epoll_wait, waiting for the next query.
    std::thread::sleep(Duration::from_millis(300));
    // Root's report goes in root's own directory, not the cluster's
    // (another user's, where root's files are refused).
    let json = scratch("attach-postgres-report").join("attach.json");
    let mut attach = Killed(
        Command::new(rtprof())
            .arg("attach")
            .arg(backend.to_string())
            .args(["--verbose", "--output"])
            .arg(&json)
            .arg("--agent")
            .arg(agent())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (_, err) = until_attached(&mut attach);
    for _ in 0..3 {
        assert_eq!(query(sum), expected);
    }
    // Ended as a user's Ctrl-C ends it, once the queries are answered (a
    // fixed duration may end before the third on a busy machine).
    // SAFETY: a signal to the child we spawned, which is still ours to
    // wait for.
    unsafe { libc::kill(attach.id() as i32, libc::SIGINT) };
    let rest = std::io::read_to_string(err).unwrap();
    assert!(attach.wait().unwrap().success(), "{rest}");
    // Detached: the same backend answers the same.
    assert_eq!(query("SELECT pg_backend_pid();"), backend.to_string());
    assert_eq!(query(sum), expected);
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let p = &report["processes"][0];
    assert_eq!(p["ended"], "detached", "{report}");
    // The executor's functions, counted and sampled.
    let funcs = p["functions"].as_array().unwrap();
    let sampled_calls = funcs
        .iter()
        .filter(|f| f["module"] == "postgres" && f["calls"].as_u64().unwrap_or(0) > 0)
        .filter(|f| f["samples"].as_u64().unwrap_or(0) > 0)
        .count();
    assert!(sampled_calls > 3, "{p}");
    // Exactly the three queries made while attached: a portal each, and
    // a call of the set-returning function per row and one to end.
    assert_eq!(function_named(p, "PortalRun")["calls"], 3, "{p}");
    assert_eq!(
        function_named(p, "generate_series_int4")["calls"],
        3 * 3_000_001,
        "{p}"
    );
    drop(sql);
    assert!(psql.wait().unwrap().success());
}
