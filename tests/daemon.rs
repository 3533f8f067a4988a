//! rtprofd end to end: a daemon on a private socket and segment, profiled
//! C programs with known call rates registering with it, spans read through
//! the Rust client library.

use rtprof_abi::present::{read_process, read_view, ProcView, RowView};
use rtprof_e2e::*;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Daemon {
    d: Rtprofd,
    /// Everything the daemon wrote to stderr so far, read as it comes (a
    /// pipe nobody reads would block a chatty daemon).
    log: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl std::ops::Deref for Daemon {
    type Target = Rtprofd;
    fn deref(&self) -> &Rtprofd {
        &self.d
    }
}

impl Daemon {
    fn start(dir: &Path) -> Daemon {
        Daemon::start_ticking(dir, 200)
    }

    /// A daemon publishing every `tick_ms` over spans of five ticks.
    fn start_ticking(dir: &Path, tick_ms: u64) -> Daemon {
        Daemon::start_with(dir, tick_ms, 5 * tick_ms, &[])
    }

    /// A daemon publishing every `tick_ms` over spans of `span_ms`, with
    /// `extra` options.
    fn start_with(dir: &Path, tick_ms: u64, span_ms: u64, extra: &[&str]) -> Daemon {
        let mut cmd = Command::new(rtprof().with_file_name("rtprofd"));
        cmd.args(["--tick", &tick_ms.to_string()])
            .args(["--span", &span_ms.to_string()])
            .args(["--buffer-mib", "4", "--log-interval", "2"])
            .args(extra)
            .stderr(Stdio::piped());
        let mut d = Rtprofd::start(cmd, dir);
        let log = Arc::new(Mutex::new(String::new()));
        let mut stderr = d.child.stderr.take().unwrap();
        let sink = log.clone();
        let reader = std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = stderr.read(&mut buf) {
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Daemon {
            d,
            log,
            reader: Some(reader),
        }
    }

    fn log_so_far(&self) -> String {
        self.log.lock().unwrap().clone()
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
        self.wait_for_or(what, String::new, pick)
    }

    /// `wait_for`, saying what `last` last saw if it times out.
    fn wait_for_or<T>(
        &self,
        what: &str,
        last: impl Fn() -> String,
        pick: impl Fn(&[u8]) -> Option<T>,
    ) -> T {
        let f = std::fs::File::open(&self.present).unwrap();
        // SAFETY: the daemon only ever writes the file (never truncates it), and every read of it
        // is validated.
        let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        let t = Instant::now();
        loop {
            if let Some(x) = pick(&map) {
                return x;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "timed out waiting for {what}; last seen: {}",
                last()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The daemon's log so far (it is stopped).
    fn stop(mut self) -> String {
        self.d.stop();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        self.log_so_far()
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
    // SAFETY: signalling our own child, not yet reaped.
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

fn switch(d: &Daemon, pid: u32, pattern: &str, state: &str) -> std::process::Output {
    Command::new(rtprof())
        .args(["switch", "--socket"])
        .arg(&d.socket)
        .args([&pid.to_string(), pattern, state])
        .output()
        .unwrap()
}

/// `rtprof switch` through rtprofd: counting of `tick` switched off in a
/// running program stops its calls showing (the process's spans lose the
/// row while the program keeps calling), switched on again they come back,
/// and its lifetime total ends below what it called. A request for a pid
/// rtprofd does not follow, for another user's process, or matching no
/// function is refused with a reason.
#[test]
fn counting_switched_through_rtprofd() {
    let dir = scratch("daemon-switch");
    let bin = compile_o2("rate.c", &[], &dir);
    let d = Daemon::start(&dir);
    let c = d.profiled(&bin, &["6"]);
    let pid = c.id();
    let calls_in_span = |m: &[u8]| {
        let (p, rows) = process_rows(m, pid)?;
        (p.span_ns >= 900_000_000).then(|| tick_row(&rows).map_or(0, |r| r.calls))
    };
    d.wait_for("tick counted", |m| calls_in_span(m).filter(|&n| n > 0));

    let refused = switch(&d, pid, "no_such_function*", "off");
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("no instrumented function matches"));
    let stranger = switch(&d, 1, "tick", "off");
    assert!(String::from_utf8_lossy(&stranger.stderr).contains("not a process rtprofd follows"));
    if let Ok(o) = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(rtprof())
        .args(["switch", "--socket"])
        .arg(&d.socket)
        .args([&pid.to_string(), "tick", "off"])
        .output()
    {
        assert_eq!(o.status.code(), Some(1), "{o:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("belongs to another user"),
            "{o:?}"
        );
    }

    let off = switch(&d, pid, "tick", "off");
    assert!(off.status.success(), "{off:?}");
    assert!(
        String::from_utf8_lossy(&off.stdout).contains("1 function(s)"),
        "{off:?}"
    );
    // A whole span (1 s) without a counted call, while the program calls on.
    d.wait_for("a span without tick's calls", |m| {
        calls_in_span(m).filter(|&n| n == 0)
    });
    let on = switch(&d, pid, "tick", "on");
    assert!(on.status.success(), "{on:?}");
    d.wait_for("tick counted again", |m| {
        calls_in_span(m).filter(|&n| n > 0)
    });
    let n = exact_count(c);
    let last = d.wait_for("the final span", |m| {
        let (p, rows) = process_rows(m, pid)?;
        p.ended
            .then(|| tick_row(&rows).map_or(0, |r| r.total_calls))
    });
    assert!(last > 0 && last < n, "{last} counted of {n} calls");
    d.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A memfd holding `bytes`, sealed against shrinking as the agent's is.
fn sealed_memfd(bytes: &[u8]) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: plain system calls on a descriptor created here and then owned.
    unsafe {
        let fd = libc::memfd_create(
            rtprof_abi::protocol::SEGMENT_MEMFD.as_ptr(),
            libc::MFD_ALLOW_SEALING,
        );
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
    rtprof_abi::protocol::send_registration(s.as_raw_fd(), fd).unwrap();
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
    header[8..12].copy_from_slice(&rtprof_abi::layout::VERSION.to_le_bytes());
    let size = std::mem::size_of::<rtprof_abi::layout::Header>() as u32;
    header[12..16].copy_from_slice(&size.to_le_bytes());
    header[16..24].copy_from_slice(&4096u64.to_le_bytes());
    let mut out_of_range = header.clone();
    // modules_off far beyond the file.
    out_of_range[64..72].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let mut huge = header.clone();
    huge[16..24].copy_from_slice(&(1u64 << 50).to_le_bytes());
    // A real segment whose function count is far beyond its capacity.
    let layout = rtprof_abi::Layout::new(rtprof_abi::Capacities {
        modules: 1,
        functions: 4,
        strings: 64,
        stripes: 1,
    });
    let mut huge_count = vec![0u64; layout.total_size as usize / 8];
    // SAFETY: `huge_count` is the layout's size, 8-aligned, and outlives `w`.
    let mut w =
        unsafe { rtprof_abi::SegmentWriter::init(huge_count.as_mut_ptr().cast(), layout, 1, 1, 1) };
    w.set_exe(b"/bin/x").unwrap();
    let mut huge_count: Vec<u8> = huge_count.iter().flat_map(|w| w.to_le_bytes()).collect();
    let at = std::mem::offset_of!(rtprof_abi::layout::Header, func_count);
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
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this test needs root (/proc/PID/map_files)");
    }
    let dir = scratch("daemon-discover");
    let bin = compile_o2("rate.c", &[], &dir);
    // The program, profiled and registering at `socket`.
    let start = |socket: &str| {
        Command::new(&bin)
            .arg("3")
            .env("LD_PRELOAD", agent())
            .env("RTPROF_DAEMON_SOCKET", dir.join(socket))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let early = start("sock");
    let pid = early.id();
    // Another daemon's agent (its socket is elsewhere): not this one's.
    let theirs = start("another.sock");
    std::thread::sleep(Duration::from_millis(300));
    let d = Daemon::start(&dir);
    let (_, rows) = d.wait_for("the early program", |m| {
        let (p, rows) = process_rows(m, pid)?;
        tick_row(&rows).is_some().then_some((p, rows))
    });
    assert!(tick_row(&rows).unwrap().calls > 0);
    let taken = d.wait_for("a view", |m| {
        read_view(m)
            .ok()
            .map(|v| v.procs.iter().any(|p| p.pid == theirs.id()))
    });
    assert!(!taken, "another daemon's agent was taken");
    let n = exact_count(early);
    assert_eq!(n, 3_000_000);
    assert_eq!(exact_count(theirs), 3_000_000);
    d.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--thread-rows`: each live thread's calls per function, exact (every
/// thread counts in a stripe of its own), under the thread's name; its
/// samples per function are its own (worker-k alone runs burn_k: all of
/// the process's burn_k samples are worker-k's, none another thread's),
/// and its head row has all its samples; the process's own rows are all
/// its calls, as without the option.
#[test]
fn rows_per_thread_on_request() {
    use std::io::BufRead;
    let dir = scratch("daemon-threads");
    let bin = compile_o2("thread_rows.c", &["-pthread"], &dir);
    // A span far longer than the test: the counts stay in it.
    let d = Daemon::start_with(&dir, 200, 600_000, &["--thread-rows", "4"]);
    // Both samplers: the drain thread's (perf), and each thread's own
    // timer signal (which counts where the thread is).
    for sampler in ["timer", "perf"] {
        let mut child = Command::new(&bin)
            .env("LD_PRELOAD", agent())
            .env("RTPROF_SAMPLER", sampler)
            .env("RTPROF_DAEMON_SOCKET", &d.socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "ready\n");
        let pid = child.id();
        let burns = ["burn_0", "burn_1", "burn_2"];
        // (thread name, work calls, tick calls, [samples in burn_k]) per
        // thread, by name; and the process's own.
        type Seen = Vec<(String, u64, u64, Vec<u64>)>;
        type Own = (u64, u64, Vec<u64>);
        let per_thread = |v: &rtprof_abi::present::View| -> Option<(Seen, Own)> {
            let p = v.procs.iter().find(|p| p.pid == pid)?;
            let find = |rows: &[RowView], name: &str| {
                rows.iter()
                    .find(|r| r.name == name)
                    .map(|r| (r.calls, r.samples))
            };
            let calls = |rows: &[RowView], name: &str| find(rows, name).map_or(0, |r| r.0);
            let samples = |rows: &[RowView]| -> Vec<u64> {
                burns
                    .iter()
                    .map(|b| find(rows, b).map_or(0, |r| r.1))
                    .collect()
            };
            let mut seen: Seen = p
                .threads
                .iter()
                .map(|t| {
                    let rows = &v.rows[t.rows.clone()];
                    assert!(rows.iter().all(|r| r.thread == Some(t.tid)));
                    assert_eq!(t.time_ns, t.samples * p.period_ns);
                    // A tick may find a sample in the table that came
                    // after it read the thread's total: waited for.
                    let in_rows: u64 = rows.iter().map(|r| r.samples).sum();
                    let s = samples(rows);
                    (t.samples >= in_rows)
                        .then(|| (t.name.clone(), calls(rows, "work"), calls(rows, "tick"), s))
                })
                .collect::<Option<_>>()?;
            seen.sort();
            let own = &v.rows[p.rows.clone()];
            assert!(own.iter().all(|r| r.thread.is_none()));
            Some((seen, (calls(own, "work"), calls(own, "tick"), samples(own))))
        };
        // The main thread goes by the program's name (as the kernel cuts it).
        let main = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
        let main = main.trim_end().to_string();
        let last = std::cell::RefCell::new(String::new());
        // Samples can reach the segment late (the perf drain reads its
        // rings up to a second apart; a timer sample held for its module's
        // names waits for the drain): a view is final once it has not moved
        // for longer than that (the program is idle after "ready").
        let steady = std::cell::RefCell::new(None::<(Instant, (Seen, Own))>);
        let got = d.wait_for_or(
            "every thread's rows and samples, steady for 2 s",
            || last.borrow().clone(),
            |m| {
                let (seen, own) = per_thread(&read_view(m).ok()?)?;
                *last.borrow_mut() = format!("{sampler}: threads {seen:?}, process {own:?}");
                let names: Vec<&str> = seen.iter().map(|t| t.0.as_str()).collect();
                // Every burn sample the process has is in a thread's rows.
                let in_threads: Vec<u64> =
                    (0..3).map(|k| seen.iter().map(|t| t.3[k]).sum()).collect();
                let whole = names == [main.as_str(), "worker-0", "worker-1", "worker-2"]
                    && own.2.iter().all(|&n| n > 0)
                    && in_threads == own.2;
                let mut steady = steady.borrow_mut();
                let now = (seen, own);
                match &*steady {
                    Some((since, was)) if whole && *was == now => {
                        (since.elapsed() > Duration::from_secs(2)).then_some(now)
                    }
                    _ => {
                        *steady = whole.then(|| (Instant::now(), now));
                        None
                    }
                }
            },
        );
        let (seen, own) = got;
        let calls: Vec<(&str, u64, u64)> = seen.iter().map(|t| (t.0.as_str(), t.1, t.2)).collect();
        assert_eq!(
            calls,
            vec![
                (main.as_str(), 0, 5),
                ("worker-0", 1000, 1),
                ("worker-1", 2000, 2),
                ("worker-2", 3000, 3)
            ]
        );
        assert_eq!((own.0, own.1), (6000, 11), "the process's own rows");
        // Each burn_k's samples are worker-k's, all of them.
        assert_eq!(seen[0].3, vec![0, 0, 0], "the main thread never burned");
        for k in 0..3 {
            let mut want = vec![0; 3];
            want[k] = own.2[k];
            assert_eq!(seen[k + 1].3, want, "{sampler}: worker-{k}");
        }
        // `rtprof report` has the same threads, in JSON and in text.
        let report = |json: bool| {
            let o = Command::new(rtprof())
                .args(["report", "--pid", &pid.to_string(), "--present"])
                .arg(&d.present)
                .args(json.then_some("--json"))
                .output()
                .unwrap();
            assert!(o.status.success(), "{o:?}");
            String::from_utf8(o.stdout).unwrap()
        };
        let v: serde_json::Value = serde_json::from_str(&report(true)).unwrap();
        let threads = v["processes"][0]["threads"].as_array().unwrap();
        assert_eq!(threads.len(), 4, "{v}");
        let w1 = threads.iter().find(|t| t["name"] == "worker-1").unwrap();
        assert_eq!(function_named(w1, "work")["calls"], 2000, "{w1}");
        assert_eq!(function_named(w1, "burn_1")["samples"], own.2[1], "{w1}");
        let text = report(false);
        for k in 0..3 {
            let l = text
                .lines()
                .find(|l| l.contains(&format!(" worker-{k}: ")))
                .unwrap_or_else(|| panic!("no worker-{k} in\n{text}"));
            assert!(l.ends_with(&format!("hottest burn_{k}")), "{text}");
        }
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
    }
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
        .arg(format!("-I{}", root().join("abi/include").display()))
        .arg(root().join("examples/scheduler.c"))
        .arg(root().join("abi/c/rtprof_present.c"))
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

/// The generation of the view published last.
fn generation(b: &[u8]) -> Option<u64> {
    read_view(b).ok().map(|v| v.generation)
}

/// Waits until `ready`, for at most a minute.
/// Polls until `ready()` holds, for a minute at most.
fn wait_a_minute(what: &str, ready: impl Fn() -> bool) {
    wait_until(what, Duration::from_secs(60), ready)
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Connections counted by a [`Holder`], in memory it shares with it.
#[repr(C)]
struct HolderStats {
    connects: std::sync::atomic::AtomicU64,
    failures: std::sync::atomic::AtomicU64,
}

/// A forked process holding up to 128 connections to the daemon's socket
/// open without ever sending on them, as `uid` if given. Each connection
/// the daemon closes is made again at once, as an attacker would. Killed
/// when dropped.
struct Holder {
    pid: libc::pid_t,
    stats: *const HolderStats,
}

impl Holder {
    fn start(socket: &Path, count: usize, uid: Option<u32>) -> Holder {
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: all-zero is a valid sockaddr_un.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let path = socket.as_os_str().as_bytes();
        assert!(path.len() < addr.sun_path.len());
        for (d, s) in addr.sun_path.iter_mut().zip(path) {
            *d = *s as libc::c_char;
        }
        // SAFETY: a fresh anonymous shared mapping, checked below; zeroed
        // memory is two atomics at zero.
        let stats = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(stats, libc::MAP_FAILED);
        let stats = stats as *const HolderStats;
        // SAFETY: the child only makes system calls and touches the shared
        // counters and its own stack (no allocation, no locks: other test
        // threads may hold them at the fork), and never returns.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: this is the new child; `stats` is the shared mapping made above.
            unsafe { hold(&addr, count.min(128), uid, &*stats) }
        }
        Holder { pid, stats }
    }

    fn stats(&self) -> &HolderStats {
        // SAFETY: mapped in `start` and never unmapped while `self` lives.
        unsafe { &*self.stats }
    }

    fn connects(&self) -> u64 {
        self.stats()
            .connects
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn failures(&self) -> u64 {
        self.stats()
            .failures
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn running(&self) -> bool {
        // SAFETY: a non-blocking wait on our own child.
        unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), libc::WNOHANG) == 0 }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // SAFETY: our own child, reaped once; the mapping is ours.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            libc::munmap(self.stats as *mut libc::c_void, 4096);
        }
    }
}

/// The body of a [`Holder`]'s process.
///
/// # Safety
/// Only in a freshly forked child: it switches user and never returns.
unsafe fn hold(addr: &libc::sockaddr_un, n: usize, uid: Option<u32>, stats: &HolderStats) -> ! {
    use std::sync::atomic::Ordering::Relaxed;
    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    if let Some(u) = uid {
        if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(u) != 0 || libc::setuid(u) != 0
        {
            libc::_exit(2);
        }
    }
    let mut fds = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }; 128];
    loop {
        for p in &mut fds[..n] {
            if p.fd >= 0 {
                continue;
            }
            let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            if s >= 0 && libc::connect(s, (addr as *const libc::sockaddr_un).cast(), len) == 0 {
                p.fd = s;
                stats.connects.fetch_add(1, Relaxed);
            } else {
                if s >= 0 {
                    libc::close(s);
                }
                stats.failures.fetch_add(1, Relaxed);
            }
        }
        // Closed by the daemon (end of file or hang-up): made again after
        // a pause (the attack needs no more, and the machine is shared).
        libc::poll(fds.as_mut_ptr(), n as libc::nfds_t, 100);
        let pause = libc::timespec {
            tv_sec: 0,
            tv_nsec: 20_000_000,
        };
        libc::nanosleep(&pause, std::ptr::null_mut());
        for p in &mut fds[..n] {
            if p.fd >= 0 && p.revents != 0 {
                libc::close(p.fd);
                p.fd = -1;
            }
            p.revents = 0;
        }
    }
}

/// Sums the K of every "suppressed K" summary line about `uid`.
fn suppressed(log: &str, uid: u32) -> u64 {
    let tag = format!("uid {uid}: suppressed ");
    log.lines()
        .filter_map(|l| l.split_once(&tag))
        .filter_map(|(_, rest)| rest.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// A hundred connections that never send anything, held by another user,
/// and a hundred held by the daemon's own user, each made again whenever
/// the daemon closes it: the daemon keeps publishing every tick, follows a
/// program started meanwhile, and logs the idle connections in a few
/// rate-limited lines.
#[test]
fn idle_connections_do_not_stall_publishing() {
    assert_eq!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
        0,
        "this test needs root (it connects as nobody too)"
    );
    let dir = scratch("daemon-idle");
    {
        use std::os::unix::fs::PermissionsExt;
        // nobody must reach the socket.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let bin = compile_o2("rate.c", &[], &dir);
    let d = Daemon::start(&dir);
    d.wait_for("a first span", generation);
    let other = Holder::start(&d.socket, 100, Some(65534));
    let own = Holder::start(&d.socket, 100, None);
    wait_a_minute("every connection made once", || {
        other.connects() >= 100 && own.connects() >= 100
    });
    let made = || other.connects() + own.connects();
    let (c0, g0) = (made(), d.wait_for("a span", generation));
    let t0 = Instant::now();
    let g1 = d.wait_for("15 more spans", |m| generation(m).filter(|&g| g >= g0 + 15));
    let c1 = made();
    // (The time is reported, not asserted: the machine may be busy.)
    eprintln!(
        "{} spans published in {:.1} s (one per 0.2 s) while the holders made {} connections ({} failed)",
        g1 - g0,
        t0.elapsed().as_secs_f64(),
        c1 - c0,
        other.failures() + own.failures()
    );
    // The spans came while the attack went on: the holders were still
    // there, connecting again as the daemon closed their connections.
    assert!(other.running() && own.running());
    assert!(c1 - c0 >= 100, "{} connections made meanwhile", c1 - c0);
    // A program started under attack registers and is followed.
    let prog = d.profiled(&bin, &["1"]);
    let pid = prog.id();
    d.wait_for("the program", |m| process_rows(m, pid).map(|_| ()));
    assert_eq!(exact_count(prog), 1_000_000);
    wait_a_minute("summaries for both users", || {
        let log = d.log_so_far();
        suppressed(&log, 0) > 0 && suppressed(&log, 65534) > 0
    });
    let total = made();
    drop((other, own));
    let log = d.stop();
    // Every closed connection is accounted for, but few are printed.
    let printed = log
        .lines()
        .filter(|l| l.contains("connection") && !l.contains("suppressed"))
        .count() as u64;
    let quiet = suppressed(&log, 0) + suppressed(&log, 65534);
    eprintln!("{printed} lines printed, {quiet} suppressed, {total} connections");
    assert!(printed * 20 <= quiet, "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A complete segment of `pid` started at `start_ns`, with no functions.
fn segment_of(pid: u32, start_ns: u64, exe: &[u8]) -> Vec<u8> {
    let layout = rtprof_abi::Layout::new(rtprof_abi::Capacities {
        modules: 1,
        functions: 4,
        strings: 64,
        stripes: 1,
    });
    let mut mem = vec![0u64; layout.total_size as usize / 8];
    // SAFETY: `mem` is the layout's size, 8-aligned, and outlives `w`.
    let mut w = unsafe {
        rtprof_abi::SegmentWriter::init(mem.as_mut_ptr().cast(), layout, pid, 1, start_ns)
    };
    w.set_exe(exe).unwrap();
    w.counters().set_state(rtprof_abi::layout::state::RUNNING);
    mem.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// One process registers thousands of sealed memfds under its own pid, as
/// an agent sends them (half not yet filled in, half complete segments
/// each claiming a newer image): the daemon's descriptors stay bounded
/// throughout, the next profiled program is listed within two
/// publications of its start, and the flood takes a bounded number of log
/// lines, with the rest counted as suppressed.
#[test]
fn registration_flood_is_bounded() {
    const FLOOD: u64 = 5000;
    let dir = scratch("daemon-flood");
    let bin = compile_o2("rate.c", &[], &dir);
    let d = Daemon::start_ticking(&dir, 500);
    let daemon = d.child.id();
    d.wait_for("a first span", generation);
    let before = open_fds(daemon);
    let me = std::process::id();
    let mut most = before;
    for i in 0..FLOOD {
        let bytes = if i % 2 == 0 {
            vec![0; 4096]
        } else {
            segment_of(me, 1 + i, b"/flood/image")
        };
        let fd = sealed_memfd(&bytes);
        register(&d.socket, fd.as_raw_fd());
        if i % 25 == 0 {
            most = most.max(open_fds(daemon));
        }
    }
    // Read in order: once the last one is followed, so was the flood.
    // (This process maps none of them: each segment's executable is only
    // its claim.)
    let probe = sealed_memfd(&segment_of(me, 1 + FLOOD, b"/flood/probe"));
    register(&d.socket, probe.as_raw_fd());
    d.wait_for("the end of the flood", |m| {
        let v = read_view(m).ok()?;
        v.process(me)
            .filter(|(p, _)| p.claimed.as_deref() == Some("/flood/probe"))
            .map(|_| ())
    });
    most = most.max(open_fds(daemon));
    eprintln!("daemon descriptors: {before} before, at most {most} during the flood");
    // Beside what it held before, at most one user's connections waiting
    // to be read (8) and a batch of registrations being taken (16); a
    // descriptor kept per registration would be thousands.
    assert!(most <= before + 40, "{most} descriptors (from {before})");
    // The next program registered before its main() printed: it is listed
    // in one of the next two publications.
    let mut prog = d.profiled(&bin, &["0", "hold"]);
    let pid = prog.id();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(prog.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "calls 0");
    let f = std::fs::File::open(&d.present).unwrap();
    // SAFETY: the daemon only ever writes the file (never truncates it), and every read of it is
    // validated.
    let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
    let g0 = generation(&map).unwrap();
    let t = Instant::now();
    let listed = loop {
        if let Some(v) = read_view(&map).ok().filter(|v| v.process(pid).is_some()) {
            break v.generation;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "never listed");
        std::thread::sleep(Duration::from_millis(5));
    };
    eprintln!(
        "listed in publication {listed}, {} after its start",
        listed - g0
    );
    assert!(
        listed <= g0 + 2,
        "listed {} publications later",
        listed - g0
    );
    // SAFETY: signalling our own child, not yet reaped.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let _ = prog.wait();
    wait_a_minute("a summary of the flood", || {
        suppressed(&d.log_so_far(), 0) > 0
    });
    drop(probe);
    let log = d.stop();
    let lines = log.lines().count();
    let quiet = suppressed(&log, 0);
    eprintln!("{lines} log lines, {quiet} messages suppressed");
    assert!(lines <= 60, "{lines} lines:\n{log}");
    assert!(quiet >= FLOOD / 2, "{quiet} suppressed:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// What the claiming program says it is.
const CLAIM: &str = "/usr/sbin/cron";

/// A process that rewrites the executable its own segment names, then
/// loads a library so that rtprofd reads the names again, is published,
/// reported and counted in the metrics as the executable the kernel says
/// it runs; its claim is only shown as one.
#[test]
fn a_process_is_known_by_its_real_executable_whatever_its_segment_claims() {
    use rtprof_abi::layout::Header;
    use std::io::BufRead;
    use std::mem::offset_of;
    let dir = scratch("claim");
    let bin = compile_o2("claim_exe.c", &["-ldl"], &dir);
    let exe = bin.canonicalize().unwrap().to_string_lossy().into_owned();
    let lib = dir.join("libplugin.so");
    let o = Command::new("gcc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(root().join("tests/c/plugin.c"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let port = free_port();
    let d = Daemon::start_with(
        &dir,
        100,
        500,
        &[
            "--metrics",
            &format!("127.0.0.1:{port}"),
            "--metrics-public",
        ],
    );
    let mut child = Killed(
        Command::new(&bin)
            .arg(CLAIM)
            .arg(&lib)
            .args(
                [
                    offset_of!(Header, exe_off),
                    offset_of!(Header, exe_len),
                    offset_of!(Header, strings_off),
                ]
                .map(|o| o.to_string()),
            )
            .env("LD_PRELOAD", agent())
            .env("RTPROF_DAEMON_SOCKET", &d.socket)
            // The library instrumented when it comes: its functions are
            // added at once (only sampled, they would wait for a sample to
            // land in its little code).
            .env("RTPROF_MODULES", "main,libplugin.so")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(
        line, "claimed\n",
        "the program could not rewrite its segment"
    );
    let pid = child.id();
    // Once rtprofd has read the names the library added.
    let last = std::cell::RefCell::new(String::new());
    let (p, _) = d.wait_for_or(
        "the library's functions among the process's rows",
        || format!("{}; rtprofd: {}", last.borrow(), d.log_so_far()),
        |b| {
            let found = process_rows(b, pid);
            *last.borrow_mut() = format!("{found:?}");
            found.filter(|(_, rows)| rows.iter().any(|r| r.name == "plugin_work"))
        },
    );
    assert_eq!(p.exe, exe, "published under its claim");
    assert_eq!(p.claimed.as_deref(), Some(CLAIM));
    let report = Command::new(rtprof())
        .args(["report", "--json", "--pid", &pid.to_string(), "--present"])
        .arg(&d.present)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&report.stdout).expect("JSON");
    let rp = &v["processes"][0];
    assert_eq!(rp["pid"], pid);
    assert_eq!(rp["exe"], exe.as_str(), "{rp}");
    assert_eq!(rp["claimed"], CLAIM, "{rp}");
    let text = Command::new(rtprof())
        .args(["report", "--pid", &pid.to_string(), "--present"])
        .arg(&d.present)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("pid {pid} {exe} (claims to be {CLAIM})")),
        "{text}"
    );
    // The metrics merge by executable: the program's series are its own,
    // and nothing is counted as the program it claims to be.
    let body = poll(
        "the library's function in /metrics",
        Duration::from_secs(20),
        || {
            let a = http_get(port, "/metrics", &[])?;
            assert_eq!(a.status, 200, "{}", a.body);
            a.body
                .contains("rtprof_function_calls_total{")
                .then_some(a.body)
                .filter(|b| b.contains("function=\"plugin_work\""))
        },
    );
    for f in ["plugin_work", "claim_work"] {
        let l = body
            .lines()
            .find(|l| {
                l.starts_with("rtprof_function_calls_total{")
                    && l.contains(&format!("function=\"{f}\""))
            })
            .unwrap_or_else(|| panic!("no series of {f}: {body}"));
        assert!(l.contains(&format!("executable=\"{exe}\"")), "{l}");
    }
    assert!(
        !body.contains(&format!("executable=\"{CLAIM}\"")),
        "the claim made series: {body}"
    );
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    let log = d.stop();
    assert!(
        log.contains(&format!("claims executable \"{CLAIM}\"")),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each process's rows carry what rtprof cost it over the span: a
/// `[rtprof]` row (module `rtprof`, flagged, time only) from the agent's
/// own measure; `rtprof top` orders processes by it and says its share.
#[test]
fn each_process_has_a_row_of_what_rtprof_costs_it() {
    let dir = scratch("daemon-cost");
    let bin = compile_o2("budget.c", &["-pthread"], &dir);
    let d = Daemon::start_with(&dir, 200, 2_000, &[]);
    // Hot enough for its stubs to be sampled, long enough to be seen.
    let mut c = d.profiled(&bin, &["600000000", "1"]);
    let pid = c.id();
    let row = d.wait_for("a [rtprof] row with time", |m| {
        let (_, rows) = process_rows(m, pid)?;
        rows.into_iter().find(|r| r.agent && r.time_ns > 0)
    });
    assert_eq!(
        (row.name.as_str(), row.module.as_str()),
        ("[rtprof]", "rtprof")
    );
    assert_eq!((row.calls, row.samples, row.counted), (0, 0, false));
    let o = Command::new(rtprof())
        .args([
            "top",
            "--plain",
            "--iterations",
            "1",
            "--sort",
            "rtprof",
            "--present",
        ])
        .arg(&d.present)
        .arg("--pid")
        .arg(pid.to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(
        text.contains(&format!("pid {pid} ")) && text.contains("rtprof's cost "),
        "{text}"
    );
    let _ = c.kill();
    let _ = c.wait();
    d.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
