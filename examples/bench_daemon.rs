//! Benchmark: `rtprofd` following many processes.
//!
//! usage: bench-daemon [--procs 500] [--funcs 2000] [--exes 50]
//!                     [--active 0.1] [--threads 2] [--tick-ms 1000]
//!                     [--ticks 20] [--reads 20000] [--metrics 1]
//!                     [--thread-rows N] [--daemon PATH]
//! (build first: cargo build --release --workspace)
//!
//! Starts the real `rtprofd` on a private socket, then `--procs` simulated
//! processes (forked from this one), each with a real counter segment of
//! `--funcs` functions registered the way the agent registers it. Every
//! 100 ms each process adds calls (and now and then a sample) to each of
//! its hot functions, a random `--active` share of all, in `--threads`
//! stripes. Once the daemon publishes all
//! of them, it measures over `--ticks` ticks: the daemon's CPU time per
//! tick and as a share of one core (from /proc/PID/schedstat), its memory
//! (VmRSS, VmHWM), and a scheduler's reads of the presentation segment
//! (one process's table, one function by the hash index, the whole view).
//! With `--metrics 1` the daemon also serves Prometheus metrics (with
//! per-process series of 5 functions), and the scrape's time and size
//! are measured. With `--thread-rows N` the daemon publishes each
//! simulated thread's N hottest functions too.

#[path = "common.rs"]
mod common;

use common::{arg, arg_text, here, median};
use rtprof_abi::layout::{state, Capacities, Layout};
use rtprof_abi::present::{lookup, read_process_into, read_view, ProcessRows};
use rtprof_abi::sampling::{Sampler, Why};
use rtprof_abi::writer::SegmentWriter;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Sends a segment's descriptor to the daemon, as the agent does.
fn register(socket: &Path, fd: i32) -> bool {
    std::os::unix::net::UnixStream::connect(socket)
        .is_ok_and(|s| rtprof_abi::protocol::send_registration(s.as_raw_fd(), fd).is_ok())
}

fn exe_name(k: usize) -> String {
    format!("/usr/bin/simulated-{k}")
}

fn func_name(exe: usize, i: usize) -> String {
    // Name lengths vary like real symbols do.
    let tail = ["", "_impl", "_slow_path", "_with_context_and_flags"][i % 4];
    format!("sim{exe}_function_{i}{tail}")
}

/// A simulated profiled process: never returns.
fn simulate(socket: &Path, exe: usize, funcs: u32, active: f64, threads: u32, parent: i32) -> ! {
    let layout = Layout::new(Capacities {
        modules: 4,
        functions: funcs,
        strings: funcs * 48 + 256,
        stripes: threads + 2,
    });
    let pid = std::process::id();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    // SAFETY: a simulated process of one thread: its own memfd, sized and sealed before it is
    // mapped; the writer gets the whole fresh mapping, which lives until the process exits;
    // counters are bumped by this thread alone (the daemon only reads).
    unsafe {
        let fd = libc::memfd_create(
            rtprof_abi::protocol::SEGMENT_MEMFD.as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        );
        assert!(fd >= 0 && libc::ftruncate(fd, layout.total_size as i64) == 0);
        assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
        let base = libc::mmap(
            std::ptr::null_mut(),
            layout.total_size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        assert!(base != libc::MAP_FAILED);
        let mut w = SegmentWriter::init(base as *mut u8, layout, pid, parent as u32, now);
        w.set_exe(exe_name(exe).as_bytes()).unwrap();
        w.add_module(exe_name(exe).as_bytes(), 0x400000).unwrap();
        for i in 0..funcs as usize {
            let f = w
                .add_function(func_name(exe, i).as_bytes(), 0x1000 + i as u64 * 64, 64)
                .unwrap();
            w.set_status(f, None);
        }
        let c = *w.counters();
        let stripes: Vec<u32> = (0..threads.saturating_sub(1))
            .map(|t| c.append_stripe(pid + t).unwrap())
            .chain([0])
            .collect();
        c.set_sampler(Sampler::Perf, Why::Default, 0, 1_000_000);
        c.set_state(state::RUNNING);
        if !register(socket, fd) {
            libc::_exit(3);
        }
        let mut x = (pid as u64) << 17 | 1;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // The functions this process calls: a fixed random share.
        let hot: Vec<usize> = (0..funcs as usize)
            .filter(|_| (rand() % 1_000_000) as f64 / 1e6 < active)
            .collect();
        loop {
            for &f in &hot {
                let s = stripes[(rand() % stripes.len() as u64) as usize];
                *c.stripe_ptr(s).add(f) += 1 + rand() % 1000;
                if rand() % 4 == 0 {
                    c.function_samples(f as u32)
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    c.samples_total()
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            libc::usleep(100_000);
            if libc::getppid() != parent {
                libc::_exit(0);
            }
        }
    }
}

/// Bytes of one `GET /metrics`.
fn scrape(port: u16) -> usize {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = Vec::new();
    s.read_to_end(&mut body).unwrap();
    assert!(body.starts_with(b"HTTP/1.1 200"), "scrape failed");
    body.len()
}

/// Nanoseconds `pid` has run on a CPU.
fn cpu_ns(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn status_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// Median nanoseconds of `f` over `n` calls, in batches of 100.
fn time_ns(n: usize, mut f: impl FnMut()) -> f64 {
    let batches = (n / 100).max(3);
    let per = (0..batches)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..100 {
                f();
            }
            t.elapsed().as_nanos() as f64 / 100.0
        })
        .collect();
    median(per)
}

fn main() {
    common::check_args(
        "usage: bench-daemon [--procs 500] [--funcs 2000] [--exes 50]\n                    [--active 0.1] [--threads 2] [--tick-ms 1000]\n                    [--ticks 20] [--reads 20000] [--metrics 1]\n                    [--thread-rows N] [--daemon PATH]\n(build first: cargo build --release --workspace)",
        &common::Takes {
            numbers: &["--procs", "--funcs", "--exes", "--active", "--threads", "--tick-ms", "--ticks", "--reads", "--metrics", "--thread-rows"],
            texts: &["--daemon"],
            flags: &[],
        },
    );
    let procs = arg("--procs", 500.0) as usize;
    let funcs = arg("--funcs", 2000.0) as u32;
    let exes = (arg("--exes", 50.0) as usize).clamp(1, procs.max(1));
    let active = arg("--active", 0.1);
    let threads = (arg("--threads", 2.0) as u32).max(1);
    let tick_ms = arg("--tick-ms", 1000.0) as u64;
    let ticks = arg("--ticks", 20.0) as u64;
    let reads = arg("--reads", 20000.0) as usize;
    let metrics = arg("--metrics", 0.0) != 0.0;
    let thread_rows = arg("--thread-rows", 0.0) as usize;
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap();
    // `--daemon PATH` times another build (say, the one before a change).
    let daemon_bin = arg_text("--daemon").map_or_else(|| here().join("rtprofd"), Into::into);
    assert!(
        daemon_bin.exists(),
        "build first: cargo build --release --workspace"
    );

    let dir = std::env::temp_dir().join(format!("rtprof-bench-daemon-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("sock");
    let present = dir.join("present");
    let mut daemon = Command::new(&daemon_bin);
    if metrics {
        daemon
            .args(["--metrics", &format!("127.0.0.1:{metrics_port}")])
            .args(["--metrics-per-process", "5"]);
    }
    if thread_rows > 0 {
        daemon.args(["--thread-rows", &thread_rows.to_string()]);
    }
    let mut daemon = daemon
        .arg("--socket")
        .arg(&socket)
        .arg("--present")
        .arg(&present)
        .args(["--tick", &tick_ms.to_string(), "--span", "5000"])
        .stderr(Stdio::null())
        .spawn()
        .expect("rtprofd starts");
    let dpid = daemon.id();
    let t0 = Instant::now();
    while !present.exists() || !socket.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "rtprofd did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Forked before any thread of ours exists.
    let parent = std::process::id() as i32;
    let mut children = Vec::new();
    for p in 0..procs {
        // SAFETY: the benchmark has no thread of its own yet; each child only simulates a process
        // and exits.
        match unsafe { libc::fork() } {
            0 => simulate(&socket, p % exes, funcs, active, threads, parent),
            -1 => panic!("fork failed"),
            c => children.push(c),
        }
    }
    println!(
        "rtprofd following {procs} simulated processes x {funcs} functions \
         ({exes} executables, {:.0}% of functions hot, {threads} stripes each), \
         tick {tick_ms} ms, span 5 s",
        active * 100.0
    );

    let file = std::fs::File::open(&present).unwrap();
    // SAFETY: rtprofd's presentation file, which it only ever replaces by rename (this mapping
    // stays valid); the reader validates what it reads.
    let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
    let t0 = Instant::now();
    loop {
        let v = read_view(&map);
        if v.is_ok_and(|v| v.procs.len() >= procs) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "rtprofd never published every process"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // One more span so every process is past its first snapshots.
    std::thread::sleep(Duration::from_millis(tick_ms * 2));

    let (cpu0, wall0) = (cpu_ns(dpid), Instant::now());
    std::thread::sleep(Duration::from_millis(tick_ms * ticks));
    let (cpu1, wall) = (cpu_ns(dpid), wall0.elapsed());
    let cpu_per_tick_ms = (cpu1 - cpu0) as f64 / ticks as f64 / 1e6;
    let share = (cpu1 - cpu0) as f64 / wall.as_nanos() as f64 * 100.0;
    let rss = status_kb(dpid, "VmRSS:");
    let hwm = status_kb(dpid, "VmHWM:");
    let anon = status_kb(dpid, "RssAnon:");
    let shmem = status_kb(dpid, "RssShmem:");

    let view = read_view(&map).unwrap();
    // Each process's own rows (thread rows, if any, counted apart).
    let rows: usize = view.procs.iter().map(|p| p.rows.len()).sum();
    let thread_rows = view.rows.len() - view.global.len() - rows;
    let p = &view.procs[view.procs.len() / 2];
    let (pid, exe) = (p.pid, p.exe.clone());
    let p_rows = p.rows.len();
    let hot = view.rows[p.rows.clone()][0].name.clone();
    // As a polling scheduler would: into buffers reused between reads.
    let mut rows_buf = ProcessRows::default();
    let one = time_ns(reads, || {
        assert!(read_process_into(&map, pid, &mut rows_buf).unwrap());
        std::hint::black_box(rows_buf.rows().map(|r| r.time_ns).sum::<u64>());
    });
    let found = time_ns(reads, || {
        std::hint::black_box(lookup(&map, &exe, &hot).unwrap().unwrap());
    });
    let whole = time_ns(20, || {
        std::hint::black_box(read_view(&map).unwrap());
    });

    println!(
        "published: {} processes, {rows} process rows, {thread_rows} thread rows, {} global rows",
        view.procs.len(),
        view.global.len()
    );
    println!(
        "daemon CPU: {cpu_per_tick_ms:.2} ms per tick, {share:.2}% of one core \
         (over {ticks} ticks; target < 2%)"
    );
    println!(
        "daemon memory: VmRSS {:.1} MiB (peak {:.1}): private {:.1} MiB, \
         shared segments {:.1} MiB (the agents' counters and the presentation segment)",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        anon as f64 / 1024.0,
        shmem as f64 / 1024.0
    );
    println!(
        "scheduler reads (median): one process's table ({p_rows} rows) {:.2} us \
         (target < 10 us); one function by hash {:.2} us; whole view {:.2} ms",
        one / 1e3,
        found / 1e3,
        whole / 1e6
    );

    // The C reader, as a C scheduler would call it (if gcc is here).
    let checker = dir.join("present_check");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let built = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&checker)
        .arg(format!("-I{}", root.join("abi/include").display()))
        .arg(root.join("abi/c/present_check.c"))
        .arg(root.join("abi/c/rtprof_present.c"))
        .status()
        .is_ok_and(|s| s.success());
    if built {
        let out = Command::new(&checker)
            .arg("time")
            .arg(&present)
            .args([pid.to_string(), reads.to_string()])
            .output()
            .unwrap();
        println!(
            "C reader (median): {} (one process's table / the whole table)",
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }

    if metrics {
        let mut size = 0;
        let times: Vec<f64> = (0..10)
            .map(|_| {
                let t = Instant::now();
                size = scrape(metrics_port);
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        println!(
            "/metrics scrape (median of 10): {:.2} ms, {:.1} KiB",
            median(times),
            size as f64 / 1024.0
        );
    }

    for c in &children {
        // SAFETY: our own children, killed by pid.
        unsafe { libc::kill(*c, libc::SIGKILL) };
    }
    for c in &children {
        // SAFETY: reaps our own children; no status is asked for.
        unsafe { libc::waitpid(*c, std::ptr::null_mut(), 0) };
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
