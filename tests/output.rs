//! What rtprof's readers print: names that carry terminal escapes, spans
//! of a daemon that stopped or restarted, `--present` paths that are not
//! segments, and malformed segments given to `rtprof report` and to both
//! example schedulers. Real programs compiled here, a real `rtprofd` on a
//! private socket and segment.

use rtprof_abi::present::{
    read_process, segment_bytes, BufferHeader, PresentHeader, PresentWriter, ProcTable, Row, RowIn,
};
use rtprof_e2e::*;
use std::io::Read;
use std::mem::offset_of;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The name `tick` is given in the test binary: CSI and OSC sequences, a
/// bell, a backspace, DEL, a tab, an 8-bit CSI and a right-to-left
/// override.
const EVIL: &str = "tick\x1b[2J\x1b]0;pwned\x07\x08\x7f\tx\u{9b}31m\u{202e}z";
/// How it must be shown.
const EVIL_SHOWN: &str = r"tick\x1b[2J\x1b]0;pwned\x07\x08\x7f\tx\u{9b}31m\u{202e}z";

/// tests/c/rate.c with `tick` renamed to [`EVIL`].
fn evil_binary(dir: &Path) -> PathBuf {
    let obj = dir.join("rate.o");
    let renamed = dir.join("evil.o");
    let bin = dir.join("evil");
    let run = |c: &mut Command| {
        let o = c.output().unwrap();
        assert!(
            o.status.success(),
            "{c:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    run(Command::new("gcc")
        .args(["-O2", "-c", "-o"])
        .arg(&obj)
        .arg(root().join("tests/c/rate.c")));
    run(Command::new("objcopy")
        .arg(format!("--redefine-sym=tick={EVIL}"))
        .arg(&obj)
        .arg(&renamed));
    run(Command::new("gcc").arg("-o").arg(&bin).arg(&renamed));
    bin
}

/// Bytes of `out` that would drive a terminal: ESC, BEL, BS, DEL, the
/// UTF-8 form of an 8-bit CSI, and of a right-to-left override.
fn raw_controls(out: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    for (what, pat) in [
        ("ESC", &b"\x1b"[..]),
        ("BEL", b"\x07"),
        ("BS", b"\x08"),
        ("DEL", b"\x7f"),
        ("C1 CSI", "\u{9b}".as_bytes()),
        ("RLO", "\u{202e}".as_bytes()),
    ] {
        if out.windows(pat.len()).any(|w| w == pat) {
            found.push(what.to_string());
        }
    }
    found
}

/// rtprofd on `dir`'s socket and segment, 200 ms ticks.
struct Daemon(Rtprofd);

impl std::ops::Deref for Daemon {
    type Target = Rtprofd;
    fn deref(&self) -> &Rtprofd {
        &self.0
    }
}

impl Daemon {
    fn start(dir: &Path) -> Daemon {
        let mut cmd = Command::new(rtprof().with_file_name("rtprofd"));
        cmd.args(["--tick", "200", "--span", "1000", "--buffer-mib", "4"])
            .stderr(Stdio::null());
        Daemon(Rtprofd::start(cmd, dir))
    }

    fn profiled(&self, bin: &Path, args: &[&str]) -> Child {
        Command::new(bin)
            .args(args)
            .env("LD_PRELOAD", agent())
            .env("RTPROF_DAEMON_SOCKET", &self.socket)
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// Waits until process `pid` has a row named `name` in a published span.
    fn wait_for_row(&self, pid: u32, name: &str) {
        wait_a_minute(&format!("pid {pid}'s {name:?}"), || {
            let f = std::fs::File::open(&self.present).ok()?;
            // SAFETY: a read-only mapping the reader validates.
            let map = unsafe { memmap2::Mmap::map(&f) }.ok()?;
            let (_, rows) = read_process(&map, pid).ok()??;
            rows.iter().any(|r| r.name == name).then_some(())
        });
    }

    fn kill(&mut self) {
        self.0.stop();
    }
}

/// Polls `f` until it gives a value, for a minute at most.
fn wait_a_minute<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    poll(what, Duration::from_secs(60), f)
}

/// Runs a command to its end, but never waits for ever on one that would
/// hang (a FIFO opened for reading, say). Its output is read while it runs,
/// so a long report cannot fill the pipe and stall it.
fn finish(c: &mut Command) -> Output {
    use std::io::Read;
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("{c:?} hangs");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A child whose stdout is collected as it comes.
struct Watched {
    child: Child,
    out: Arc<Mutex<Vec<u8>>>,
}

impl Watched {
    fn start(c: &mut Command) -> Watched {
        let mut child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut pipe = child.stdout.take().unwrap();
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = out.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Watched { child, out }
    }
    fn text(&self) -> String {
        text(&self.out.lock().unwrap())
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `rtprof run`'s text report, `rtprof report` and `rtprof top` against a
/// live daemon show a function name full of terminal escapes escaped, and
/// the JSON reports keep it exactly (JSON-escaped).
#[test]
fn names_with_terminal_escapes_are_shown_escaped() {
    let dir = scratch("evil-names");
    let bin = evil_binary(&dir);

    let out = finish(
        Command::new(rtprof())
            .arg("run")
            .arg("--")
            .arg(&bin)
            .arg("1"),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        raw_controls(&out.stderr),
        Vec::<String>::new(),
        "{:?}",
        text(&out.stderr)
    );
    let line = text(&out.stderr)
        .lines()
        .find(|l| l.contains("tick"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("{}", text(&out.stderr)));
    assert!(line.contains(EVIL_SHOWN), "{line}");

    let json = dir.join("r.json");
    let out = finish(
        Command::new(rtprof())
            .arg("run")
            .arg("--json")
            .arg(&json)
            .arg("--")
            .arg(&bin)
            .arg("1"),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let raw = std::fs::read(&json).unwrap();
    assert!(!raw.contains(&0x1b), "JSON escapes ESC itself");
    let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    assert!(
        function_named(&v["processes"][0], EVIL)["calls"]
            .as_u64()
            .unwrap()
            > 0
    );

    let d = Daemon::start(&dir);
    let mut prog = d.profiled(&bin, &["600"]);
    let pid = prog.id();
    d.wait_for_row(pid, EVIL);
    let pid_s = pid.to_string();
    let report = finish(
        Command::new(rtprof())
            .args(["report", "--pid", &pid_s, "--present"])
            .arg(&d.present),
    );
    assert!(report.status.success(), "{}", text(&report.stderr));
    assert_eq!(
        raw_controls(&report.stdout),
        Vec::<String>::new(),
        "{:?}",
        text(&report.stdout)
    );
    assert!(
        text(&report.stdout).contains(EVIL_SHOWN),
        "{}",
        text(&report.stdout)
    );

    let top = finish(
        Command::new(rtprof())
            .args(["top", "--iterations", "1", "--pid", &pid_s, "--present"])
            .arg(&d.present),
    );
    assert!(top.status.success(), "{}", text(&top.stderr));
    // Its own clear-screen sequence, then nothing a name put there.
    let screen = top
        .stdout
        .strip_prefix(b"\x1b[H\x1b[2J")
        .unwrap_or_else(|| panic!("{:?}", text(&top.stdout)));
    assert_eq!(
        raw_controls(screen),
        Vec::<String>::new(),
        "{:?}",
        text(screen)
    );
    assert!(text(screen).contains(EVIL_SHOWN), "{}", text(screen));

    let json = finish(
        Command::new(rtprof())
            .args(["report", "--json", "--pid", &pid_s, "--present"])
            .arg(&d.present),
    );
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    function_named(&v["processes"][0], EVIL);
    let _ = prog.kill();
    let _ = prog.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `rtprof report` on the segment of a daemon that was killed says how old
/// its span is and that it is stale; `rtprof top`, left running, says so
/// too, and when a new daemon starts on the same path it re-opens the new
/// segment and shows that daemon's processes.
#[test]
fn a_stopped_daemon_is_flagged_and_top_follows_a_new_one() {
    let dir = scratch("stale");
    let bin = compile_o2("rate.c", &[], &dir);
    let mut d1 = Daemon::start(&dir);
    let mut a = d1.profiled(&bin, &["600"]);
    d1.wait_for_row(a.id(), "tick");
    let present = d1.present.clone();
    let report = || {
        let out = finish(
            Command::new(rtprof())
                .arg("report")
                .arg("--present")
                .arg(&present),
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let live = report();
    assert!(live.lines().next().unwrap().contains(" ago"), "{live}");
    assert!(!live.contains("STALE"), "a live daemon's span: {live}");
    let top = Watched::start(
        Command::new(rtprof())
            .arg("top")
            .arg("--present")
            .arg(&present),
    );
    wait_a_minute("top's first screen", || {
        top.text()
            .contains(&format!("pid {} ", a.id()))
            .then_some(())
    });

    d1.kill();
    // Three 200 ms ticks and a second of slack.
    let stale = wait_a_minute("a stale report", || {
        Some(report()).filter(|r| r.contains("STALE"))
    });
    assert!(
        stale.contains("STALE: nothing new for") && stale.contains("rtprofd publishes every 0.2 s"),
        "{stale}"
    );
    assert!(
        stale.contains(&format!("pid {} ", a.id())),
        "still its last numbers: {stale}"
    );
    let json = finish(
        Command::new(rtprof())
            .args(["report", "--json", "--present"])
            .arg(&present),
    );
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(v["stale"], true, "{v}");
    assert!(
        v["age_ns"].as_u64().unwrap() > 3 * v["tick_ns"].as_u64().unwrap(),
        "{v}"
    );
    assert!(
        text(&json.stderr).contains("STALE"),
        "{}",
        text(&json.stderr)
    );
    wait_a_minute("top to say it is stale", || {
        top.text().contains("STALE").then_some(())
    });

    // A new daemon: a new segment file at the same path.
    let d2 = Daemon::start(&dir);
    let mut b = d2.profiled(&bin, &["600"]);
    d2.wait_for_row(b.id(), "tick");
    let shown = wait_a_minute("top to show the new daemon's process", || {
        let t = top.text();
        let restarted = t.rfind("rtprofd restarted: re-opened")?;
        t[restarted..]
            .contains(&format!("pid {} ", b.id()))
            .then_some(t)
    });
    assert!(shown.contains(&format!("pid {} ", b.id())));
    // Its latest screen is current again.
    wait_a_minute("a current screen", || {
        let t = top.text();
        let last = t.rsplit("\x1b[H\x1b[2J").next()?.to_string();
        (last.contains(&format!("pid {} ", b.id())) && !last.contains("STALE")).then_some(())
    });
    for c in [&mut a, &mut b] {
        let _ = c.kill();
        let _ = c.wait();
    }
    drop(top);
    drop(d2);
    let _ = std::fs::remove_dir_all(&dir);
}

fn c_scheduler(dir: &Path) -> PathBuf {
    let out = dir.join("scheduler-c");
    let o = Command::new("gcc")
        .args([
            "-O1",
            "-g",
            "-Wall",
            "-Werror",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-o",
        ])
        .arg(&out)
        .arg(format!("-I{}", root().join("abi/include").display()))
        .arg(root().join("examples/scheduler.c"))
        .arg(root().join("abi/c/rtprof_present.c"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// A segment with one publish, as bytes.
fn segment(edit: impl FnOnce(&mut [u8], usize)) -> Vec<u8> {
    let len = segment_bytes(64 * 1024);
    let mut mem = vec![0u64; len as usize / 8];
    // SAFETY: `mem` holds `len` zeroed, 8-aligned bytes and outlives `w`.
    let mut w = unsafe { PresentWriter::init(mem.as_mut_ptr().cast(), len, 200_000_000) };
    let rows = vec![RowIn {
        name: "hot",
        module: "app",
        counted: true,
        calls: 1000,
        samples: 5,
        time_ns: 5_000_000,
        total_calls: 1000,
        ..Default::default()
    }];
    let procs = [ProcTable {
        pid: 4242,
        exe: "/bin/app",
        span_ns: 1_000_000_000,
        rows,
        ..Default::default()
    }];
    w.publish(1, 1_000_000_000, &procs).unwrap();
    let mut b: Vec<u8> = mem.iter().flat_map(|w| w.to_le_bytes()).collect();
    // Generation 1: buffer 1 is current.
    let at = offset_of!(PresentHeader, buffer_off) + 8;
    let current = u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize;
    edit(&mut b, current);
    b
}

fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize
}

/// `--present` paths that are no segment, and segments that are broken,
/// stale or never published: `rtprof report`, `rtprof top` and both
/// schedulers finish with one clear message each (exit 1), never hang,
/// and never retry for ever.
#[test]
fn readers_stop_with_one_message_on_what_is_not_a_good_segment() {
    let dir = scratch("bad-present");
    let sched_c = c_scheduler(&dir);
    let sched_rust = rtprof().with_file_name("scheduler");
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let file = |name: &str, bytes: Vec<u8>| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let generation = offset_of!(PresentHeader, generation);
    let version = offset_of!(PresentHeader, version);
    let cases: Vec<(&str, PathBuf, [&str; 2])> = vec![
        ("a FIFO", fifo.clone(), ["is a FIFO", "not a regular file"]),
        (
            "a directory",
            dir.clone(),
            ["is a directory", "not a regular file"],
        ),
        (
            "missing",
            dir.join("missing"),
            ["No such file", "No such file"],
        ),
        (
            "8 bytes",
            file("short", vec![1; 8]),
            ["too small", "truncated"],
        ),
        (
            "not a segment",
            file("junk", vec![b'x'; 4096]),
            ["not an rtprof presentation segment"; 2],
        ),
        (
            "version 1",
            file(
                "v1",
                segment(|b, _| b[version..version + 4].copy_from_slice(&1u32.to_le_bytes())),
            ),
            ["version 1", "another version"],
        ),
        (
            "a row's name past the strings",
            file(
                "name",
                segment(|b, cur| {
                    let rows = cur + u32_at(b, cur + offset_of!(BufferHeader, rows_off));
                    let at = rows + offset_of!(Row, name_off);
                    b[at..at + 4].copy_from_slice(&(1u32 << 30).to_le_bytes())
                }),
            ),
            ["string out of bounds", "out of bounds"],
        ),
        (
            "never published",
            file(
                "unpublished",
                segment(|b, _| b[generation..generation + 8].fill(0)),
            ),
            ["nothing published yet"; 2],
        ),
        (
            "always being written",
            file(
                "busy",
                segment(|b, cur| b[cur..cur + 8].copy_from_slice(&1u64.to_le_bytes())),
            ),
            ["rewritten during every read attempt"; 2],
        ),
    ];
    for (what, path, [rust_msg, c_msg]) in &cases {
        let tools: [(&str, Command, &str); 3] = [
            (
                "report",
                {
                    let mut c = Command::new(rtprof());
                    c.arg("report").arg("--present").arg(path);
                    c
                },
                rust_msg,
            ),
            (
                "rust scheduler",
                {
                    let mut c = Command::new(&sched_rust);
                    c.arg("--once").arg("--present").arg(path);
                    c
                },
                rust_msg,
            ),
            (
                "c scheduler",
                {
                    let mut c = Command::new(&sched_c);
                    c.arg("--once").arg("--present").arg(path);
                    c
                },
                c_msg,
            ),
        ];
        for (tool, mut cmd, msg) in tools {
            let out = finish(&mut cmd);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{tool}, {what}: {err}");
            assert!(err.contains(msg), "{tool}, {what}: {err}");
            assert_eq!(err.lines().count(), 1, "{tool}, {what}: one line: {err}");
            assert!(
                out.stdout.is_empty(),
                "{tool}, {what}: {}",
                text(&out.stdout)
            );
        }
    }
    // top: the same verdicts for what cannot be opened or read.
    for (what, path, [msg, _]) in &cases[..7] {
        let out = finish(
            Command::new(rtprof())
                .args(["top", "--iterations", "1", "--present"])
                .arg(path),
        );
        assert_eq!(
            out.status.code(),
            Some(1),
            "top, {what}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(msg),
            "top, {what}: {}",
            text(&out.stderr)
        );
    }

    // A well-formed segment published long ago: shown, and said to be old.
    let old = file(
        "old",
        segment(|b, cur| {
            let at = cur + offset_of!(BufferHeader, publish_ns);
            b[at..at + 8].copy_from_slice(&1_000_000_000u64.to_le_bytes())
        }),
    );
    let out = finish(
        Command::new(rtprof())
            .arg("report")
            .arg("--present")
            .arg(&old),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    assert!(
        t.contains("pid 4242 /bin/app") && t.contains("STALE: nothing new for"),
        "{t}"
    );
    for s in [&sched_rust, &sched_c] {
        let out = finish(Command::new(s).arg("--once").arg("--present").arg(&old));
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(text(&out.stdout).contains("hot "), "{}", text(&out.stdout));
        assert!(
            text(&out.stderr).contains("rtprofd has stopped or is stuck"),
            "{}",
            text(&out.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
