//! Calls routed to implementations the program offered, while it runs:
//! `rtprof route` through rtprofd moves a function's calls to the offered
//! implementation and back, which the program's own per-implementation
//! counts show at once; rtprof's rows per implementation equal them; eight
//! threads keep their results while the route flips 1,000 times; a route
//! survives fork, not exec; a library that is unloaded while it holds the
//! implementation is routed back first; requests that cannot be done are
//! refused with their reason.

use rtprof_e2e::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

fn compile_offers(dir: &Path) -> PathBuf {
    let inc = format!("-I{}", root().join("abi/include").display());
    compile_o2("offers.c", &["-pthread", &inc, "-ldl"], dir)
}

fn daemon(dir: &Path) -> Rtprofd {
    let mut cmd = Command::new(rtprof().with_file_name("rtprofd"));
    cmd.args(["--tick", "100", "--span", "500"])
        .stderr(Stdio::null());
    Rtprofd::start(cmd, dir)
}

/// The program under the agent, registered with `d`, its report in
/// `report`; with its stdout read line by line.
struct Program {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Program {
    fn start(
        bin: &Path,
        args: &[&str],
        d: &Rtprofd,
        report: &Path,
        env: &[(&str, &str)],
    ) -> Program {
        let mut child = Command::new(bin)
            .args(args)
            .env("LD_PRELOAD", agent())
            .env("RTPROF_DAEMON_SOCKET", &d.socket)
            .env("RTPROF_REPORT", report)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut p = Program { child, out };
        assert_eq!(p.line(), "ready");
        p
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.out.read_line(&mut l).unwrap();
        l.trim_end().to_string()
    }

    fn signal(&self, sig: i32) {
        // SAFETY: a signal to our own child.
        assert_eq!(unsafe { libc::kill(self.pid() as i32, sig) }, 0);
    }

    /// The program's own counts, asked for with SIGUSR1.
    fn counts(&mut self) -> Counts {
        self.signal(libc::SIGUSR1);
        Counts::parse(&self.line())
    }

    /// Waits for its end: its status and stderr.
    fn wait(&mut self) -> (std::process::ExitStatus, String) {
        use std::io::Read;
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            e.read_to_string(&mut err).unwrap();
        }
        (self.child.wait().unwrap(), err)
    }

    /// Ends it with SIGTERM: its last counts, its stderr and status.
    fn end(mut self) -> (Counts, String) {
        self.signal(libc::SIGTERM);
        let last = Counts::parse(&self.line());
        let (status, stderr) = self.wait();
        assert!(status.success(), "{status:?} {stderr}");
        (last, stderr)
    }
}

impl Drop for Program {
    /// A test that fails leaves no program running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `WHO work original A fast B scale original C fast D`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Counts {
    work: (u64, u64),
    scale: (u64, u64),
}

impl Counts {
    fn parse(line: &str) -> Counts {
        let n: Vec<u64> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        assert_eq!(n.len(), 4, "{line}");
        Counts {
            work: (n[0], n[1]),
            scale: (n[2], n[3]),
        }
    }
}

/// `rtprof route`, retried while rtprofd does not follow the process yet.
fn route(d: &Rtprofd, pid: u32, function: &str, to: &str) -> std::process::Output {
    route_when_followed(d, pid, function, to)
}

fn route_ok(d: &Rtprofd, pid: u32, function: &str, to: &str) {
    let o = route(d, pid, function, to);
    assert!(o.status.success(), "route {function} {to}: {o:?}");
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(
        said.contains(&format!("calls of {function} go to {to}")),
        "{said}"
    );
}

fn route_refused(d: &Rtprofd, pid: u32, function: &str, to: &str, why: &str) {
    let o = route(d, pid, function, to);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(why), "{function} {to}: {err}");
}

fn report(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn row<'a>(report: &'a Value, name: &str) -> &'a Value {
    function_named(&report["processes"][0], name)
}

#[test]
fn calls_are_routed_to_an_offer_and_back_and_counted_per_implementation() {
    let dir = scratch("routes");
    let bin = compile_offers(&dir);
    let d = daemon(&dir);
    let json = dir.join("report.json");
    let mut p = Program::start(&bin, &["serve"], &d, &json, &[]);
    let pid = p.pid();

    // Offered by the call (work) and by the section (scale).
    route_ok(&d, pid, "work", "fast");
    route_ok(&d, pid, "scale", "fast");
    // Every call after the answer runs the offered code.
    let a = p.counts();
    std::thread::sleep(Duration::from_millis(200));
    let b = p.counts();
    assert_eq!((b.work.0, b.scale.0), (a.work.0, a.scale.0), "{a:?} {b:?}");
    assert!(b.work.1 > a.work.1 && b.scale.1 > a.scale.1, "{a:?} {b:?}");
    // rtprofd's span shows the implementation that runs, active.
    let f = std::fs::File::open(&d.present).unwrap();
    // SAFETY: the daemon only ever writes the file, and every read is validated.
    let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
    let (fast, own) = poll("a span of work [fast]", Duration::from_secs(10), || {
        let (_, rows) = rtprof_abi::present::read_process(&map, pid)
            .ok()
            .flatten()?;
        let fast = rows
            .iter()
            .find(|r| r.name == "work [fast]" && r.calls > 0)?
            .clone();
        let own = rows.iter().find(|r| r.name == "work")?.clone();
        (fast.active && !own.active).then_some((fast, own))
    });
    assert!(
        fast.implementation && !own.implementation && own.offered,
        "{fast:?} {own:?}"
    );
    assert!(fast.samples > 0, "its code's samples: {fast:?}");
    // A sample in routed code counts once, for the implementation routed
    // to: not for a twin offer of the same code, nor for the code's own
    // function.
    let (twin, code, routed) = poll(
        "rows of the twin and the code",
        Duration::from_secs(10),
        || {
            let (_, rows) = rtprof_abi::present::read_process(&map, pid)
                .ok()
                .flatten()?;
            let twin = rows.iter().find(|r| r.name == "work [twin]")?.clone();
            let code = rows.iter().find(|r| r.name == "work_fast")?.clone();
            let routed = rows.iter().find(|r| r.name == "work [fast]")?.clone();
            (routed.samples > 0).then_some((twin, code, routed))
        },
    );
    assert_eq!((twin.samples, twin.calls), (0, 0), "{twin:?}");
    // Under the timer sampler a few samples (5-10%) still land on the
    // code's own row; before, all of them did, and on every offer's row.
    assert!(code.samples * 4 <= routed.samples, "{code:?} {routed:?}");

    // And back.
    route_ok(&d, pid, "work", "original");
    let c = p.counts();
    std::thread::sleep(Duration::from_millis(200));
    let e = p.counts();
    assert_eq!(e.work.1, c.work.1, "{c:?} {e:?}");
    assert!(e.work.0 > c.work.0, "{c:?} {e:?}");
    let again = route(&d, pid, "work", "original");
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("already so"),
        "{again:?}"
    );

    route_refused(
        &d,
        pid,
        "work",
        "slow",
        "offered no implementation of that name",
    );
    route_refused(
        &d,
        pid,
        "no_such_function",
        "fast",
        "no patched function of that name",
    );
    let stranger = rtprof_abi::protocol::route(&d.socket, 1, "work", "fast");
    assert!(
        stranger
            .as_ref()
            .is_err_and(|e| e.contains("not a process rtprofd follows")),
        "{stranger:?}"
    );
    if let Ok(o) = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(rtprof())
        .args(["route", "--socket"])
        .arg(&d.socket)
        .args([&pid.to_string(), "work", "fast"])
        .output()
    {
        assert_eq!(o.status.code(), Some(1), "{o:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("belongs to another user"),
            "{o:?}"
        );
    }

    // The same request from the C reader library.
    let client = dir.join("route_client");
    let st = Command::new("cc")
        .args([
            "-O2",
            &format!("-I{}", root().join("abi/include").display()),
            "-o",
        ])
        .arg(&client)
        .arg(root().join("tests/c/route_client.c"))
        .arg(root().join("abi/c/rtprof_route.c"))
        .status()
        .unwrap();
    assert!(st.success());
    let c_route = |function: &str, to: &str| {
        Command::new(&client)
            .arg(&d.socket)
            .args([&pid.to_string(), function, to])
            .output()
            .unwrap()
    };
    let done = c_route("scale", "original");
    assert_eq!(done.status.code(), Some(0), "{done:?}");
    assert!(String::from_utf8_lossy(&done.stdout).contains("calls of scale go to original"));
    let f = p.counts();
    std::thread::sleep(Duration::from_millis(100));
    let g = p.counts();
    assert!(
        g.scale.1 == f.scale.1 && g.scale.0 > f.scale.0,
        "{f:?} {g:?}"
    );
    let refused = c_route("work", "slow");
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stdout).contains("no implementation of that name"));
    route_ok(&d, pid, "scale", "fast");

    let (last, stderr) = p.end();
    // Offers the agent refused, each with its reason.
    for (what, code) in [
        ("offer", 0),
        ("twin", 0),
        ("data", -3),
        ("unknown", -2),
        ("reserved", -4),
    ] {
        assert!(
            stderr.contains(&format!("{what} {code}\n")),
            "{what}: {stderr}"
        );
    }
    let r = report(&json);
    let count = |name: &str| row(&r, name)["calls"].as_u64().unwrap();
    assert_eq!(count("work"), last.work.0, "{}", row(&r, "work"));
    assert_eq!(count("work [fast]"), last.work.1);
    assert_eq!(count("scale"), last.scale.0);
    assert_eq!(count("scale [fast]"), last.scale.1);
    let (w, wf) = (row(&r, "work"), row(&r, "work [fast]"));
    assert_eq!(
        (&w["implementation"], &w["active"]),
        (&"original".into(), &true.into()),
        "{w}"
    );
    assert_eq!(
        (
            &wf["implementation"],
            &wf["implements"],
            &wf["code"],
            &wf["active"]
        ),
        (
            &"fast".into(),
            &"work".into(),
            &"work_fast".into(),
            &false.into()
        ),
        "{wf}"
    );
    let sf = row(&r, "scale [fast]");
    assert_eq!(sf["active"], true, "{sf}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Eight threads check every result of `work` while its calls are routed
/// to the offer and back 1,000 times, through the Rust reader library:
/// the output is that of a plain run, and rtprof's counts per
/// implementation are the program's.
#[test]
fn eight_threads_keep_their_results_while_routed_a_thousand_times() {
    let dir = scratch("routes-threads");
    let bin = compile_offers(&dir);
    let mut plain = Command::new(&bin)
        .args(["threads", "8"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(plain.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(plain.id() as i32, libc::SIGTERM) };
    let plain = plain.wait_with_output().unwrap();

    let d = daemon(&dir);
    let json = dir.join("report.json");
    let mut p = Program::start(&bin, &["threads", "8"], &d, &json, &[]);
    let pid = p.pid();
    route_ok(&d, pid, "work", "fast");
    for i in 0..1000 {
        let to = if i % 2 == 0 { "original" } else { "fast" };
        let said = rtprof_abi::protocol::route(&d.socket, pid, "work", to)
            .unwrap_or_else(|e| panic!("route {i} to {to}: {e}"));
        assert!(said.contains("(routed)"), "{said}");
    }
    p.signal(libc::SIGTERM);
    let summary = p.line();
    let (status, stderr) = p.wait();
    assert_eq!(
        format!("ready\n{summary}\n"),
        format!("{first}{}", String::from_utf8_lossy(&plain.stdout))
    );
    assert_eq!(status.code(), plain.status.code());
    assert!(summary.ends_with(" 0 wrong results"), "{summary}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("work original"))
        .unwrap();
    let n: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let r = report(&json);
    assert!(n[0] > 0 && n[1] > 0, "{line}");
    assert_eq!(row(&r, "work")["calls"].as_u64(), Some(n[0]), "{line}");
    assert_eq!(
        row(&r, "work [fast]")["calls"].as_u64(),
        Some(n[1]),
        "{line}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fork child keeps the route; the image an exec starts has none.
#[test]
fn a_route_survives_fork_and_not_exec() {
    let dir = scratch("routes-fork");
    let bin = compile_offers(&dir);
    let d = daemon(&dir);
    let mut p = Program::start(&bin, &["fork"], &d, &dir.join("r.json"), &[]);
    route_ok(&d, p.pid(), "work", "fast");
    p.signal(libc::SIGUSR1);
    let lines: Vec<String> = (0..3).map(|_| p.line()).collect();
    let c: Vec<Counts> = lines.iter().map(|l| Counts::parse(l)).collect();
    assert!(
        lines[0].starts_with("parent") && c[0].work == (0, 1000),
        "{lines:?}"
    );
    assert!(
        lines[1].starts_with("child") && c[1].work == (0, 1000),
        "{lines:?}"
    );
    assert!(
        lines[2].starts_with("exec") && c[2].work == (1000, 0),
        "{lines:?}"
    );
    assert!(p.child.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A library that offered the implementation the calls are routed to is
/// unloaded: the calls go back to the function's own code first.
#[test]
fn unloading_the_implementation_routes_back_first() {
    let dir = scratch("routes-dlclose");
    let bin = compile_offers(&dir);
    let lib = dir.join("liboffers.so");
    let inc = format!("-I{}", root().join("abi/include").display());
    let st = Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", &inc, "-o"])
        .arg(&lib)
        .arg(root().join("tests/c/offers_lib.c"))
        .status()
        .unwrap();
    assert!(st.success());
    let d = daemon(&dir);
    let lib_arg = lib.to_str().unwrap();
    // The library instrumented too.
    let env = [("RTPROF_MODULES", "all")];
    let mut p = Program::start(&bin, &["dlclose", lib_arg], &d, &dir.join("r.json"), &env);
    // Offered by the library's section, read after its dlopen: an
    // implementation in the library of the program's function, and one of
    // the library's own function.
    route_ok(&d, p.pid(), "work", "lib");
    route_ok(&d, p.pid(), "lib_own", "fast");
    p.signal(libc::SIGUSR1);
    assert_eq!(
        p.line(),
        "loaded work original 0 lib 1000 lib_own original 0 fast 1000"
    );
    assert_eq!(p.line(), "unloaded work original 1000");
    let (status, stderr) = p.wait();
    assert!(status.success(), "{status:?} {stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Under an overhead budget a function's entry is not always patched: its
/// calls are not routed, and the request says why.
#[test]
fn routes_are_refused_under_a_budget_with_the_reason() {
    let dir = scratch("routes-budget");
    let bin = compile_offers(&dir);
    let d = daemon(&dir);
    let p = Program::start(
        &bin,
        &["serve"],
        &d,
        &dir.join("r.json"),
        &[("RTPROF_BUDGET", "1")],
    );
    route_refused(&d, p.pid(), "work", "fast", "overhead budget");
    let (_, _) = p.end();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `scheduler --act --slots 1` gives the one slot to whichever of two
/// programs is in its hot phase: A's kernel is routed to its offered
/// implementation, then back when B's phase begins and B's is routed,
/// then A's again. Each program's own counts per implementation equal
/// rtprof's, and no result differs.
#[test]
fn the_acting_scheduler_moves_the_slot_between_two_programs() {
    let dir = scratch("routes-scheduler");
    let inc = format!("-I{}", root().join("abi/include").display());
    let bin = dir.join("offload");
    let st = Command::new("cc")
        .args(["-O2", &inc, "-o"])
        .arg(&bin)
        .arg(root().join("examples/offload/offload.c"))
        .status()
        .unwrap();
    assert!(st.success());
    let mut cmd = Command::new(rtprof().with_file_name("rtprofd"));
    cmd.args(["--tick", "100", "--span", "300"])
        .stderr(Stdio::null());
    let d = Rtprofd::start(cmd, &dir);
    let log = dir.join("scheduler.log");
    let mut scheduler = Killed(
        Command::new(rtprof().with_file_name("scheduler"))
            // A slot is held one span at least: the phases below last
            // five spans each.
            .args(["--act", "--slots", "1", "--min-spans", "1", "--socket"])
            .arg(&d.socket)
            .arg("--present")
            .arg(&d.present)
            .stdout(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let program = |phases: &[&str], report: &Path| {
        Command::new(&bin)
            .arg("1.5")
            .args(phases)
            .env("LD_PRELOAD", agent())
            .env("RTPROF_DAEMON_SOCKET", &d.socket)
            .env("RTPROF_REPORT", report)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let reports = [dir.join("a.json"), dir.join("b.json")];
    let a = program(&["hot", "idle", "hot"], &reports[0]);
    let b = program(&["idle", "hot", "idle"], &reports[1]);
    let pids = [a.id(), b.id()];
    let outs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    let _ = scheduler.0.kill();
    let _ = scheduler.0.wait();
    let log = std::fs::read_to_string(&log).unwrap();
    // (program, routed to its offer) of each decision that was done.
    let moves: Vec<(usize, bool)> = log
        .lines()
        .filter(|l| l.ends_with("(done)"))
        .filter_map(|l| {
            let who = pids
                .iter()
                .position(|p| l.contains(&format!("pid {p} kernel ")))?;
            Some((who, !l.contains(" -> original:")))
        })
        .collect();
    let wanted = [(0, true), (0, false), (1, true), (1, false), (0, true)];
    let mut at = 0;
    for m in &moves {
        if at < wanted.len() && *m == wanted[at] {
            at += 1;
        }
    }
    assert_eq!(at, wanted.len(), "decisions {moves:?} in:\n{log}");
    for (out, path) in outs.iter().zip(&reports) {
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("wrong 0\n"), "{text}");
        let line = text
            .lines()
            .find(|l| l.starts_with("calls original"))
            .unwrap();
        let n: Vec<u64> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        assert!(n[1] > 0, "{line}");
        let r = report(path);
        let offered = r["processes"][0]["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["implements"] == "kernel")
            .unwrap();
        assert_eq!(row(&r, "kernel")["calls"].as_u64(), Some(n[0]), "{line}");
        assert_eq!(offered["calls"].as_u64(), Some(n[1]), "{line}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn compile_checks(dir: &Path) -> PathBuf {
    let inc = format!("-I{}", root().join("abi/include").display());
    compile_o2("offer_checks.c", &[&inc], dir)
}

/// `offer_checks MODE` under the agent, registered with `d`, its stderr
/// (the agent's log too) in `log`: a file, which a verbose agent cannot
/// fill up as it could a pipe nobody reads yet.
fn start_checks(bin: &Path, mode: &str, d: &Rtprofd, dir: &Path, env: &[(&str, &str)]) -> Program {
    let mut child = Command::new(bin)
        .arg(mode)
        .env("LD_PRELOAD", agent())
        .env("RTPROF_DAEMON_SOCKET", &d.socket)
        .env("RTPROF_REPORT", dir.join("report.json"))
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut p = Program { child, out };
    assert_eq!(p.line(), "ready");
    p
}

fn stderr_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("stderr.log")).unwrap()
}

/// `f own N a N b N g own N fast N h own N fast N`, asked for with SIGUSR1.
#[derive(Debug, Clone, Copy, PartialEq)]
struct CheckCounts {
    f: (u64, u64, u64),
    g: (u64, u64),
    h: (u64, u64),
}

impl CheckCounts {
    fn parse(line: &str) -> CheckCounts {
        let n: Vec<u64> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        assert_eq!(n.len(), 7, "{line}");
        CheckCounts {
            f: (n[0], n[1], n[2]),
            g: (n[3], n[4]),
            h: (n[5], n[6]),
        }
    }

    fn ask(p: &mut Program) -> CheckCounts {
        p.signal(libc::SIGUSR1);
        CheckCounts::parse(&p.line())
    }

    /// The counts before and after the program ran a while.
    fn over_a_while(p: &mut Program) -> (CheckCounts, CheckCounts) {
        let a = CheckCounts::ask(p);
        std::thread::sleep(Duration::from_millis(200));
        (a, CheckCounts::ask(p))
    }
}

/// Ends `offer_checks` with SIGTERM: its last counts (it exits 0).
fn end_checks(mut p: Program, dir: &Path) -> CheckCounts {
    p.signal(libc::SIGTERM);
    let last = CheckCounts::parse(&p.line());
    let (status, _) = p.wait();
    assert!(status.success(), "{status:?} {}", stderr_of(dir));
    last
}

/// The process's state letter in /proc/PID/stat.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].chars().next()
}

/// A second offer after libc's functions were named for samples (their
/// records written after the first offer's row): the segment stays
/// readable, rtprofd follows the process, both offers route, and the
/// report counts each implementation's calls as the program does.
#[test]
fn a_second_offer_after_libc_was_named_keeps_the_segment_readable() {
    let dir = scratch("routes-second-offer");
    let bin = compile_checks(&dir);
    let d = daemon(&dir);
    let mut p = start_checks(&bin, "second", &d, &dir, &[]);
    let log = stderr_of(&dir);
    assert!(
        log.contains("first 0\n") && log.contains("second 0\n"),
        "{log}"
    );
    let pid = p.pid();
    route_ok(&d, pid, "f", "b");
    let (x, y) = CheckCounts::over_a_while(&mut p);
    assert!(
        y.f.2 > x.f.2 && (y.f.0, y.f.1) == (x.f.0, x.f.1),
        "{x:?} {y:?}"
    );
    route_ok(&d, pid, "f", "a");
    let (x, y) = CheckCounts::over_a_while(&mut p);
    assert!(
        y.f.1 > x.f.1 && (y.f.0, y.f.2) == (x.f.0, x.f.2),
        "{x:?} {y:?}"
    );
    // rtprofd still reads the segment: its span shows both rows.
    let f = std::fs::File::open(&d.present).unwrap();
    // SAFETY: the daemon only ever writes the file, and every read is validated.
    let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
    poll(
        "a span with f [a] and f [b]",
        Duration::from_secs(10),
        || {
            let (_, rows) = rtprof_abi::present::read_process(&map, pid)
                .ok()
                .flatten()?;
            let has = |n: &str| rows.iter().any(|r| r.name == n && r.implementation);
            (has("f [a]") && has("f [b]")).then_some(())
        },
    );
    let last = end_checks(p, &dir);
    let log = stderr_of(&dir);
    assert!(!log.contains("cannot read own counters"), "{log}");
    let r = report(&dir.join("report.json"));
    let calls = |name: &str| row(&r, name)["calls"].as_u64().unwrap();
    assert_eq!(
        (calls("f"), calls("f [a]"), calls("f [b]")),
        last.f,
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Offers that would route a function into itself (its address, an alias
/// of it, an address inside it) or into the middle of another function,
/// with a null function name, or with names `rtprof route` cannot carry,
/// are refused, each with its code. The section's good entries are taken
/// though bad ones sit among them, and each bad one is logged.
#[test]
fn offers_into_the_function_itself_or_mid_function_are_refused_with_their_codes() {
    let dir = scratch("routes-bad-offers");
    let bin = compile_checks(&dir);
    let d = daemon(&dir);
    let mut p = start_checks(&bin, "bad", &d, &dir, &[("RTPROF_VERBOSE", "1")]);
    let log = stderr_of(&dir);
    for (what, code) in [
        ("first", 0),
        ("itself", -7),
        ("alias", -7),
        ("inside", -7),
        ("elsewhere", -8),
        ("null", -6),
        ("utf8", -9),
        ("newline", -9),
        ("tab", -9),
        ("good", 0),
    ] {
        assert!(log.contains(&format!("\n{what} {code}\n")), "{what}: {log}");
    }
    let pid = p.pid();
    route_ok(&d, pid, "g", "fast");
    route_ok(&d, pid, "h", "fast");
    route_ok(&d, pid, "f", "b");
    for name in ["self", "alias", "inside", "elsewhere"] {
        route_refused(&d, pid, "f", name, "offered no implementation");
    }
    let (x, y) = CheckCounts::over_a_while(&mut p);
    assert!(
        y.g.1 > x.g.1 && y.h.1 > x.h.1 && y.f.2 > x.f.2 && y.g.0 == x.g.0,
        "{x:?} {y:?}"
    );
    // Each bad section entry is logged with its reason.
    let log = stderr_of(&dir);
    for why in [
        "its function name is not a string inside the module",
        "the implementation is not in executable memory",
        "a null function name, implementation or name",
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains("rtprof_offers entry") && l.contains(why)),
            "{why}: {log}"
        );
    }
    end_checks(p, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A route to a stopped process is refused with that reason, nothing is
/// left for it to do when it runs again, and later routes work.
#[test]
fn a_stopped_process_is_refused_and_routes_work_once_it_runs() {
    let dir = scratch("routes-stopped");
    let bin = compile_checks(&dir);
    let d = daemon(&dir);
    let mut p = start_checks(&bin, "bad", &d, &dir, &[]);
    let pid = p.pid();
    route_ok(&d, pid, "f", "a");
    route_ok(&d, pid, "f", "original");
    p.signal(libc::SIGSTOP);
    poll("the process stopped", Duration::from_secs(10), || {
        (proc_state(pid) == Some('T')).then_some(())
    });
    route_refused(&d, pid, "f", "b", "is stopped");
    p.signal(libc::SIGCONT);
    poll("the process running", Duration::from_secs(10), || {
        (proc_state(pid) != Some('T')).then_some(())
    });
    // Nothing stale is carried out: f's calls stay with its own code.
    std::thread::sleep(Duration::from_millis(300));
    let (x, y) = CheckCounts::over_a_while(&mut p);
    assert!(
        y.f.0 > x.f.0 && y.f.2 == x.f.2 && y.f.1 == x.f.1,
        "{x:?} {y:?}"
    );
    route_ok(&d, pid, "f", "b");
    let (x, y) = CheckCounts::over_a_while(&mut p);
    assert!(y.f.2 > x.f.2 && y.f.0 == x.f.0, "{x:?} {y:?}");
    end_checks(p, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A request its agent never takes (no thread of it serves requests:
/// sampling off, no budget) is withdrawn, and the answer says it will not
/// be carried out, and why.
#[test]
fn a_request_its_agent_does_not_take_is_withdrawn() {
    let dir = scratch("routes-withdrawn");
    let bin = compile_checks(&dir);
    let d = daemon(&dir);
    let p = start_checks(&bin, "bad", &d, &dir, &[("RTPROF_SAMPLER", "off")]);
    let o = route(&d, p.pid(), "f", "b");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        err.contains("withdrawn and will not be carried out") && err.contains("did not take it"),
        "{err}"
    );
    let again = route(&d, p.pid(), "f", "b");
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("has not taken an earlier request"), "{err}");
    end_checks(p, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A process killed and not yet reaped (a zombie) has ended: a route to
/// it is refused as such at once.
#[test]
fn a_zombie_is_treated_as_gone() {
    let dir = scratch("routes-zombie");
    let bin = compile_checks(&dir);
    let d = daemon(&dir);
    let p = start_checks(&bin, "bad", &d, &dir, &[]);
    let pid = p.pid();
    route_ok(&d, pid, "f", "a");
    p.signal(libc::SIGKILL);
    poll("a zombie", Duration::from_secs(10), || {
        (proc_state(pid) == Some('Z')).then_some(())
    });
    // Refused at once as ended, or already no longer followed; not asked
    // of an agent that will never answer.
    let said = rtprof_abi::protocol::route(&d.socket, pid, "f", "b");
    assert!(
        said.as_ref()
            .is_err_and(|e| e.contains("has ended") || e.contains("not a process rtprofd follows")),
        "{said:?}"
    );
    drop(p);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `bin ARGS` to its end, killed if it is still running after a
/// minute (it ran its benchmark instead of answering): (exit code,
/// stdout, stderr, whether it had to be killed).
fn answer_of(bin: &Path, args: &[&str]) -> (Option<i32>, String, String, bool) {
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    let mut killed = false;
    let t = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            killed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
        killed,
    )
}

/// Every program of `examples/` answers `--help` with its usage and runs
/// nothing, and refuses an option it does not know (`scheduler --slot 2`
/// among them) with a message and exit status 2.
#[test]
fn examples_answer_help_and_refuse_unknown_options() {
    for name in [
        "bench-attach",
        "bench-daemon",
        "bench-loops",
        "bench-multiply",
        "bench-offload",
        "bench-sampling",
        "bench-startup",
        "bench-threads",
        "scheduler",
    ] {
        let bin = rtprof().with_file_name(name);
        let (code, out, err, killed) = answer_of(&bin, &["--help"]);
        assert!(!killed, "{name} --help ran instead of answering: {out}");
        assert_eq!(code, Some(0), "{name} --help: {out} {err}");
        assert!(out.starts_with(&format!("usage: {name}")), "{name}: {out}");
        for bad in [&["--no-such-option"][..], &["--runs"], &["stray"]] {
            if name == "scheduler" && bad == ["--runs"] {
                continue;
            }
            let (code, out, err, killed) = answer_of(&bin, bad);
            assert!(!killed, "{name} {bad:?} ran: {out}");
            assert_eq!(code, Some(2), "{name} {bad:?}: {out} {err}");
            assert!(
                err.contains("unknown option") || err.contains("needs a value"),
                "{name} {bad:?}: {err}"
            );
        }
    }
    let (code, _, err, killed) = answer_of(&rtprof().with_file_name("scheduler"), &["--slot", "2"]);
    assert!(
        !killed && code == Some(2) && err.contains("unknown option \"--slot\""),
        "{err}"
    );
    let (code, _, err, _) = answer_of(&rtprof().with_file_name("scheduler"), &["--slots", "2"]);
    assert!(
        code == Some(2) && err.contains("--slots is an option of --act"),
        "{err}"
    );

    // The C examples too.
    let dir = scratch("examples-help");
    let inc = format!("-I{}", root().join("abi/include").display());
    for (name, sources, bad, why) in [
        (
            "scheduler",
            &["examples/scheduler.c", "abi/c/rtprof_present.c"][..],
            &["--slot", "2"][..],
            "bad argument --slot",
        ),
        (
            "offload",
            &["examples/offload/offload.c"],
            &["1", "warm"],
            "unknown phase warm",
        ),
    ] {
        let bin = dir.join(name);
        let o = Command::new("gcc")
            .args(["-O2", "-Wall", "-Werror", &inc, "-o"])
            .arg(&bin)
            .args(sources.iter().map(|s| root().join(s)))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let (code, out, _, killed) = answer_of(&bin, &["--help"]);
        assert!(
            !killed && code == Some(0) && out.starts_with(&format!("usage: {name}")),
            "{out}"
        );
        let (code, _, err, killed) = answer_of(&bin, bad);
        assert!(!killed && code == Some(2) && err.contains(why), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Where people look, a routed function shows which implementation runs
/// its calls and what is offered: `rtprof report`, `rtprof top` and
/// rtprofd's `/metrics` (`rtprof_route_active`).
#[test]
fn routes_are_visible_in_report_top_and_metrics() {
    let dir = scratch("routes-visible");
    let bin = compile_offers(&dir);
    let port = free_port();
    let mut cmd = Command::new(rtprof().with_file_name("rtprofd"));
    cmd.args([
        "--tick",
        "100",
        "--span",
        "500",
        "--metrics-public",
        "--metrics",
    ])
    .arg(format!("127.0.0.1:{port}"))
    .stderr(Stdio::null());
    let d = Rtprofd::start(cmd, &dir);
    let p = Program::start(&bin, &["serve"], &d, &dir.join("r.json"), &[]);
    let pid = p.pid();
    route_ok(&d, pid, "work", "fast");
    let pid_s = pid.to_string();
    let view = |args: &[&str]| -> String {
        let o = Command::new(rtprof())
            .args(args)
            .args(["--pid", &pid_s, "--present"])
            .arg(&d.present)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let report = poll(
        "the route in rtprof report",
        Duration::from_secs(10),
        || {
            let t = view(&["report", "--top", "0"]);
            t.contains("(runs the calls)").then_some(t)
        },
    );
    let line = |text: &str, what: &str| -> String {
        text.lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what}: {text}"))
            .to_string()
    };
    assert!(
        line(&report, "work [fast]").ends_with("(runs the calls)"),
        "{report}"
    );
    assert!(
        line(&report, "work [twin]").ends_with("(offered)"),
        "{report}"
    );
    let own = report
        .lines()
        .find(|l| l.contains("  work  "))
        .unwrap_or_else(|| panic!("{report}"));
    assert!(
        own.ends_with("(offers fast, twin; calls go to fast)"),
        "{own}"
    );
    let top = view(&["top", "--plain", "--iterations", "1", "--rows", "50"]);
    assert!(top.contains("work [fast] (runs)"), "{top}");
    assert!(top.contains("work (routed away)"), "{top}");
    let metrics = poll("rtprof_route_active", Duration::from_secs(10), || {
        let a = http_get(port, "/metrics", &[])?;
        a.body.contains("rtprof_route_active").then_some(a.body)
    });
    let gauge = |implementation: &str| -> String {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("rtprof_route_active{")
                    && l.contains(&format!("pid=\"{pid}\""))
                    && l.contains("function=\"work\"")
                    && l.contains(&format!("implementation=\"{implementation}\""))
            })
            .unwrap_or_else(|| panic!("no gauge for {implementation}: {metrics}"))
            .to_string()
    };
    assert!(gauge("fast").ends_with(" 1"), "{metrics}");
    assert!(gauge("twin").ends_with(" 0"), "{metrics}");
    assert!(gauge("original").ends_with(" 0"), "{metrics}");
    let _ = p.end();
}

/// A program whose code came from its page image (its second start) is
/// routed and back as one that wrote its code: stubs mapped from a file
/// are switched like written ones, and the program's own counts equal
/// the report's.
#[test]
fn a_program_mapped_from_its_image_is_routed_and_back() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("routes-image");
    let cache = dir.join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
    let bin = compile_checks(&dir);
    let d = daemon(&dir);
    let env = [
        ("RTPROF_CACHE", cache.to_str().unwrap()),
        ("RTPROF_VERBOSE", "1"),
    ];
    // The first start writes the image.
    end_checks(start_checks(&bin, "second", &d, &dir, &env), &dir);
    let mut p = start_checks(&bin, "second", &d, &dir, &env);
    let log = stderr_of(&dir);
    assert!(log.contains("code mapped from its image"), "{log}");
    let pid = p.pid();
    route_ok(&d, pid, "f", "b");
    let (x, y) = CheckCounts::over_a_while(&mut p);
    assert!(
        y.f.2 > x.f.2 && (y.f.0, y.f.1) == (x.f.0, x.f.1),
        "{x:?} {y:?}"
    );
    route_ok(&d, pid, "f", "original");
    let (x, y) = CheckCounts::over_a_while(&mut p);
    assert!(
        y.f.0 > x.f.0 && (y.f.1, y.f.2) == (x.f.1, x.f.2),
        "{x:?} {y:?}"
    );
    let last = end_checks(p, &dir);
    let r = report(&dir.join("report.json"));
    let calls = |name: &str| row(&r, name)["calls"].as_u64().unwrap();
    assert_eq!((calls("f"), calls("f [a]"), calls("f [b]")), last.f);
    let _ = std::fs::remove_dir_all(&dir);
}
