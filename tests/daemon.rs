//! rtprofd end to end: a daemon on a private socket and segment, profiled
//! C programs with known call rates registering with it, spans read through
//! the Rust client library.

use rtprof_e2e::*;
use rtprof_shared::present::{read_process, read_view, ProcView, RowView};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Daemon {
    child: Child,
    socket: PathBuf,
    present: PathBuf,
}

impl Daemon {
    fn start(dir: &Path) -> Daemon {
        let socket = dir.join("sock");
        let present = dir.join("present");
        let child = Command::new(rtprof().with_file_name("rtprofd"))
            .args([
                "--tick",
                "200",
                "--span",
                "1000",
                "--buffer-mib",
                "4",
                "--socket",
            ])
            .arg(&socket)
            .arg("--present")
            .arg(&present)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("rtprofd starts");
        let t = Instant::now();
        while !(socket.exists() && present.exists()) {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "rtprofd did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Daemon {
            child,
            socket,
            present,
        }
    }

    fn profiled(&self, bin: &Path, args: &[&str]) -> Child {
        Command::new(bin)
            .args(args)
            .env("LD_PRELOAD", agent())
            .env("RTPROF_DAEMON_SOCKET", &self.socket)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Waits until `pick` finds something in a published view.
    fn wait_for<T>(&self, what: &str, pick: impl Fn(&[u8]) -> Option<T>) -> T {
        let f = std::fs::File::open(&self.present).unwrap();
        let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        let t = Instant::now();
        loop {
            if let Some(x) = pick(&map) {
                return x;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "timed out waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The daemon's log so far (it is stopped).
    fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut log = String::new();
        use std::io::Read;
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut log);
        }
        log
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tick_row(rows: &[RowView]) -> Option<&RowView> {
    rows.iter().find(|r| r.name == "tick")
}

fn process_rows(b: &[u8], pid: u32) -> Option<(ProcView, Vec<RowView>)> {
    read_process(b, pid).ok().flatten()
}

fn exact_count(child: Child) -> u64 {
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim().strip_prefix("calls ").unwrap().parse().unwrap()
}

/// Two programs calling `tick` about 10^6 times a second: every span shows
/// a rate in range while they run, and their final span has the exact
/// lifetime total, then they leave the table.
#[test]
fn spans_follow_running_programs_and_end_exactly() {
    let dir = scratch("daemon-spans");
    let bin = compile_o2("rate.c", &[], &dir);
    let d = Daemon::start(&dir);
    let a = d.profiled(&bin, &["3"]);
    let b = d.profiled(&bin, &["3"]);
    let (pa, pb) = (a.id(), b.id());
    for pid in [pa, pb] {
        let (p, rows) = d.wait_for("a full span", |m| {
            let (p, rows) = process_rows(m, pid)?;
            (p.span_ns >= 900_000_000 && tick_row(&rows).is_some()).then_some((p, rows))
        });
        let t = tick_row(&rows).unwrap();
        let rate = t.calls_per_s(p.span_ns);
        // 1000 calls per 1 ms sleep: somewhat under 10^6/s, never above.
        assert!((2e5..=1.05e6).contains(&rate), "pid {pid}: {rate} calls/s");
        assert!(t.counted && t.total_calls >= t.calls);
        assert!(!p.ended);
    }
    // Global view: both processes of one executable in one row.
    let exe = bin.canonicalize().unwrap().to_string_lossy().into_owned();
    d.wait_for("a global row", |m| {
        let v = read_view(m).ok()?;
        let g = v.global_rows().iter().find(|r| r.name == "tick")?;
        let both = v.procs.iter().filter(|p| p.exe == exe).count() == 2;
        (both && g.proc_index.is_none()).then_some(())
    });
    // Both end at about the same time: watch for both final spans at once
    // (each is published once, then the process leaves the table).
    let finals = std::cell::RefCell::new([None, None]);
    d.wait_for("both final spans", |m| {
        let mut f = finals.borrow_mut();
        for (k, pid) in [pa, pb].into_iter().enumerate() {
            if let Some((p, rows)) = process_rows(m, pid) {
                if p.ended {
                    f[k] = Some(tick_row(&rows).map_or(0, |r| r.total_calls));
                }
            }
        }
        (f[0].is_some() && f[1].is_some()).then_some(())
    });
    let (na, nb) = (exact_count(a), exact_count(b));
    let f = finals.into_inner();
    assert_eq!(
        (f[0], f[1]),
        (Some(na), Some(nb)),
        "lifetime totals in the last spans"
    );
    for pid in [pa, pb] {
        d.wait_for("removal", |m| process_rows(m, pid).is_none().then_some(()));
    }
    d.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A program killed with SIGKILL still has its counts up to its death in
/// one last span.
#[test]
fn killed_program_has_its_final_counts() {
    let dir = scratch("daemon-kill");
    let bin = compile_o2("rate.c", &[], &dir);
    let d = Daemon::start(&dir);
    let mut c = d.profiled(&bin, &["1", "hold"]);
    let pid = c.id();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let n: u64 = line.trim().strip_prefix("calls ").unwrap().parse().unwrap();
    d.wait_for("the span", |m| process_rows(m, pid).map(|_| ()));
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let _ = c.wait();
    let last = d.wait_for("the final span", |m| {
        let (p, rows) = process_rows(m, pid)?;
        p.ended
            .then(|| tick_row(&rows).map_or(0, |r| r.total_calls))
    });
    assert_eq!(last, n);
    d.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A memfd holding `bytes`, sealed against shrinking as the agent's is.
fn sealed_memfd(bytes: &[u8]) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    unsafe {
        let fd = libc::memfd_create(c"rtprof".as_ptr(), libc::MFD_ALLOW_SEALING);
        assert!(fd >= 0);
        assert_eq!(
            libc::write(fd, bytes.as_ptr().cast(), bytes.len()),
            bytes.len() as isize
        );
        assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
        std::os::fd::OwnedFd::from_raw_fd(fd)
    }
}

/// Sends `fd` as a registration, as an agent would.
fn register(socket: &Path, fd: i32) {
    let s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    let mut payload = *b"RTPROF1\0";
    let mut iov = libc::iovec {
        iov_base: payload.as_mut_ptr() as *mut libc::c_void,
        iov_len: 8,
    };
    let mut control = [0u64; 4];
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = libc::CMSG_SPACE(4) as usize;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut i32, fd);
        assert!(libc::sendmsg(s.as_raw_fd(), &msg, 0) > 0);
    }
}

/// Hostile registrations (garbage, a truncated header, offsets out of
/// range, another process's pid) are rejected with one line each, and the
/// daemon keeps serving a real program.
#[test]
fn hostile_segments_are_rejected() {
    let dir = scratch("daemon-hostile");
    let bin = compile_o2("rate.c", &[], &dir);
    let d = Daemon::start(&dir);
    let real = d.profiled(&bin, &["3"]);
    let pid = real.id();
    d.wait_for("the real program", |m| process_rows(m, pid).map(|_| ()));
    // A valid-looking header from this test's own agent-less process.
    let mut header = vec![0u8; 4096];
    header[..8].copy_from_slice(b"RTPROFC\0");
    header[8..12].copy_from_slice(&2u32.to_le_bytes());
    header[12..16].copy_from_slice(&248u32.to_le_bytes());
    header[16..24].copy_from_slice(&4096u64.to_le_bytes());
    let mut out_of_range = header.clone();
    // modules_off far beyond the file.
    out_of_range[64..72].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let mut huge = header.clone();
    huge[16..24].copy_from_slice(&(1u64 << 50).to_le_bytes());
    // A real segment whose function count is far beyond its capacity.
    let layout = rtprof_shared::Layout::new(rtprof_shared::Capacities {
        modules: 1,
        functions: 4,
        strings: 64,
        stripes: 1,
    });
    let mut huge_count = vec![0u64; layout.total_size as usize / 8];
    let w = unsafe {
        rtprof_shared::SegmentWriter::init(huge_count.as_mut_ptr().cast(), layout, 1, 1, 1)
    };
    w.set_exe(b"/bin/x").unwrap();
    let mut huge_count: Vec<u8> = huge_count.iter().flat_map(|w| w.to_le_bytes()).collect();
    let at = std::mem::offset_of!(rtprof_shared::layout::Header, func_count);
    huge_count[at..at + 4].copy_from_slice(&(1u32 << 30).to_le_bytes());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"not a segment at all, just bytes".repeat(20)),
        ("truncated", header[..100].to_vec()),
        ("offsets out of range", out_of_range),
        ("huge size", huge),
        ("huge count", huge_count),
    ];
    let mut files = Vec::new();
    for (_, bytes) in &cases {
        let fd = sealed_memfd(bytes);
        register(&d.socket, fd.as_raw_fd());
        files.push(fd);
    }
    // A plain file could be shrunk under the daemon's mapping: refused.
    let plain = dir.join("plain");
    std::fs::write(&plain, &header).unwrap();
    let f = std::fs::File::open(&plain).unwrap();
    register(&d.socket, f.as_raw_fd());
    files.push(f.into());
    // Still serving: the real program's spans keep coming.
    let gen0 = d.wait_for("a view", |m| read_view(m).ok().map(|v| v.generation));
    d.wait_for("later spans", |m| {
        let v = read_view(m).ok()?;
        (v.generation > gen0 + 3 && v.process(pid).is_some()).then_some(())
    });
    let n = exact_count(real);
    assert!(n > 0);
    let log = d.stop();
    for word in [
        "bad magic",
        "segment truncated",
        "out of bounds",
        "exceeds capacity",
        "not a memfd sealed",
    ] {
        assert!(log.contains(word), "{word}: {log}");
    }
    assert_eq!(log.matches("rejected").count(), cases.len() + 1, "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A program profiled before the daemon started is found and followed.
#[test]
fn agents_running_before_the_daemon_are_found() {
    if unsafe { libc::geteuid() } != 0 {
        panic!("this test needs root (/proc/PID/map_files)");
    }
    let dir = scratch("daemon-discover");
    let bin = compile_o2("rate.c", &[], &dir);
    let early = Command::new(&bin)
        .arg("3")
        .env("LD_PRELOAD", agent())
        .env("RTPROF_DAEMON_SOCKET", dir.join("sock"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = early.id();
    std::thread::sleep(Duration::from_millis(300));
    let d = Daemon::start(&dir);
    let (_, rows) = d.wait_for("the early program", |m| {
        let (p, rows) = process_rows(m, pid)?;
        tick_row(&rows).is_some().then_some((p, rows))
    });
    assert!(tick_row(&rows).unwrap().calls > 0);
    let n = exact_count(early);
    assert_eq!(n, 3_000_000);
    d.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The scheduler examples, in C (through the C reader) and in Rust, read
/// the live daemon's spans and name the hot function with a decision;
/// `rtprof top` and `rtprof report --json` show it too.
#[test]
fn c_and_rust_schedulers_read_the_spans() {
    let dir = scratch("daemon-sched");
    let bin = compile_o2("rate.c", &[], &dir);
    let sched_c = dir.join("scheduler");
    let o = Command::new("gcc")
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&sched_c)
        .arg(format!("-I{}", root().join("shared/include").display()))
        .arg(root().join("examples/scheduler.c"))
        .arg(root().join("shared/c/rtprof_present.c"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let d = Daemon::start(&dir);
    let prog = d.profiled(&bin, &["3"]);
    let pid = prog.id();
    d.wait_for("a full span", |m| {
        let (p, rows) = process_rows(m, pid)?;
        (p.span_ns >= 900_000_000 && tick_row(&rows).is_some()).then_some(())
    });
    let rust = rtprof().with_file_name("scheduler");
    for s in [&sched_c, &rust] {
        let out = Command::new(s)
            .arg("--present")
            .arg(&d.present)
            .arg("--once")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}: {text}", s.display());
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("tick "))
            .unwrap_or_else(|| panic!("{}: no tick in\n{text}", s.display()));
        let rate: f64 = line
            .split_whitespace()
            .nth(2)
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        assert!((2e5..=1.05e6).contains(&rate), "{line}");
        assert!(line.ends_with("keep") || line.ends_with("MOVE"), "{line}");
    }
    // The command-line views read the same spans.
    let pid_s = pid.to_string();
    let top = Command::new(rtprof())
        .args(["top", "--iterations", "2", "--pid", &pid_s, "--present"])
        .arg(&d.present)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&top.stdout);
    assert!(
        top.status.success() && text.contains(&format!("pid {pid} ")),
        "{text}"
    );
    assert!(text.lines().any(|l| l.contains(" tick (")), "{text}");
    let report = Command::new(rtprof())
        .args(["report", "--json", "--pid", &pid_s, "--present"])
        .arg(&d.present)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&report.stdout).expect("JSON");
    let p = &v["processes"][0];
    assert_eq!(p["pid"], pid);
    let tick = function_named(p, "tick");
    assert!(tick["calls_per_s"].as_f64().unwrap() > 2e5, "{tick}");
    let _ = exact_count(prog);
    d.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// (open descriptors, private resident KiB) of a process.
fn fds_and_rss(pid: u32) -> (usize, u64) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    (fds, rss)
}

/// 1,000 short-lived profiled processes come and go: the daemon's
/// descriptors return to where they were and its memory stays flat.
#[test]
fn short_lived_processes_leave_nothing_behind() {
    let dir = scratch("daemon-churn");
    let bin = compile_o2("rate.c", &[], &dir);
    let d = Daemon::start(&dir);
    let daemon_pid = d.child.id();
    let batch = |n: usize| {
        for _ in 0..n {
            let st = Command::new(&bin)
                .arg("0")
                .env("LD_PRELOAD", agent())
                .env("RTPROF_DAEMON_SOCKET", &d.socket)
                .stdout(Stdio::null())
                .status()
                .unwrap();
            assert!(st.success());
        }
        // Two ticks: every registration read, every ended process dropped.
        std::thread::sleep(Duration::from_millis(600));
    };
    let mut seen = Vec::new();
    for _ in 0..5 {
        batch(200);
        seen.push(fds_and_rss(daemon_pid));
    }
    eprintln!("fds/rss after each 200: {seen:?}");
    // (Compared with the first batch: at start-up the daemon briefly holds
    // a descriptor of /proc while it looks for running agents.)
    assert!(
        seen.iter().all(|s| s.0 == seen[0].0),
        "descriptors held: {seen:?}"
    );
    // Private memory (the published segment's pages are not counted): what
    // 800 more processes left must be within allocator noise (a few MiB
    // here). A leaked function table alone would be over 100 KiB each.
    let early = seen[0].1.max(seen[1].1);
    let last = seen[4].1;
    assert!(
        last <= early + 8 * 1024,
        "private memory grew from {early} KiB to {last} KiB: {seen:?}"
    );
    let log = d.stop();
    assert!(!log.contains("rejected"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
