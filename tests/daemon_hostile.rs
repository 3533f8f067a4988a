//! rtprofd against a hostile local user: a segment in a hugetlbfs memfd
//! whose pages are punched out and used up, sealed sparse segments whose
//! headers claim far more counters than they have memory for, and the
//! file system under `--present` filled by someone else. The daemon must
//! stay alive, publishing, with its memory bounded, and say why it
//! refused what it refused.

use rtprof_abi::present::read_view;
use rtprof_e2e::*;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A daemon whose stderr is read as it comes.
struct Daemon {
    child: Child,
    socket: PathBuf,
    /// The presentation segment, as this process reaches it.
    present: PathBuf,
    log: Arc<Mutex<String>>,
}

impl Daemon {
    /// rtprofd on `dir`'s socket and segment, ticking every `tick_ms`.
    fn start(dir: &Path, tick_ms: u64) -> Daemon {
        let mut cmd = Command::new(rtprof().with_file_name("rtprofd"));
        cmd.args(["--tick", &tick_ms.to_string()])
            .args(["--span", &(5 * tick_ms).to_string()])
            .args(["--buffer-mib", "4", "--log-interval", "2"])
            .arg("--socket")
            .arg(dir.join("sock"))
            .arg("--present")
            .arg(dir.join("present"));
        let _ = std::fs::remove_file(dir.join("present"));
        Daemon::spawn(cmd, dir.join("sock"), |_| dir.join("present"))
    }

    /// Starts `cmd` (rtprofd, or what execs it), which listens at
    /// `socket` and publishes where `present(pid)` reaches.
    fn spawn(mut cmd: Command, socket: PathBuf, present: impl Fn(u32) -> PathBuf) -> Daemon {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("rtprofd starts");
        let log = Arc::new(Mutex::new(String::new()));
        let mut stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = stderr.read(&mut buf) {
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let present = present(child.id());
        let mut d = Daemon {
            child,
            socket,
            present,
            log,
        };
        wait_until("rtprofd starts", Duration::from_secs(20), || {
            assert!(d.alive(), "rtprofd ended at start: {}", d.log());
            d.socket.exists() && d.generation().is_some()
        });
        d
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// The generation of the last publication, if there was one.
    fn generation(&self) -> Option<u64> {
        let f = std::fs::File::open(&self.present).ok()?;
        // SAFETY: the daemon only writes the file, and every read of it is
        // validated.
        let map = unsafe { memmap2::Mmap::map(&f) }.ok()?;
        read_view(&map).ok().map(|v| v.generation)
    }

    /// Whether the last publication lists process `pid`.
    fn lists(&self, pid: u32) -> bool {
        let Ok(f) = std::fs::File::open(&self.present) else {
            return false;
        };
        // SAFETY: as in `generation`.
        let Ok(map) = (unsafe { memmap2::Mmap::map(&f) }) else {
            return false;
        };
        read_view(&map).is_ok_and(|v| v.process(pid).is_some())
    }

    /// Waits for `n` more publications (or the daemon's end), calling
    /// `each` meanwhile.
    fn ticks(&mut self, n: u64, mut each: impl FnMut(u32)) {
        let from = self.generation().unwrap_or(0);
        let t = Instant::now();
        while self.alive() && self.generation().unwrap_or(0) < from + n {
            each(self.child.id());
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "no publication: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Asserts the daemon still runs, with its log.
    fn assert_alive(&mut self) {
        let status = self.child.try_wait().unwrap();
        assert!(
            status.is_none(),
            "rtprofd ended: {status:?}\n{}",
            self.log()
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `fd` as a registration, as an agent would.
fn register(socket: &Path, fd: i32) {
    let s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    rtprof_abi::protocol::send_registration(s.as_raw_fd(), fd).unwrap();
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

/// A kernel-given number from /proc/PID/status (`key:` in kB).
fn status_kib(pid: u32, key: &str) -> u64 {
    number_in(&format!("/proc/{pid}/status"), key)
}

/// A number from /proc/meminfo.
fn meminfo(key: &str) -> u64 {
    number_in("/proc/meminfo", key)
}

/// The number after `key:` in the kernel's text file at `path` (0 if none).
fn number_in(path: &str, key: &str) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

const HUGE: usize = 2 << 20;
const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// Huge pages reserved for the test; the old count is put back on drop.
struct HugePages {
    old: u64,
}

impl HugePages {
    /// `n` more huge pages than the machine had, or why not.
    fn reserve(n: u64) -> Result<HugePages, String> {
        let old: u64 = std::fs::read_to_string(NR_HUGEPAGES)
            .map_err(|e| format!("{NR_HUGEPAGES}: {e}"))?
            .trim()
            .parse()
            .map_err(|e| format!("{NR_HUGEPAGES}: {e}"))?;
        std::fs::write(NR_HUGEPAGES, (old + n).to_string())
            .map_err(|e| format!("cannot write {NR_HUGEPAGES} (root needed): {e}"))?;
        let h = HugePages { old };
        let free = meminfo("HugePages_Free");
        if free < n {
            return Err(format!(
                "the kernel gave {free} free huge pages of the {n} asked for"
            ));
        }
        Ok(h)
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        let _ = std::fs::write(NR_HUGEPAGES, self.old.to_string());
    }
}

/// A hugetlbfs memfd sealed against shrinking, its one huge page holding
/// a valid segment of this process, is refused at registration: a hole
/// punched in it (which that seal allows) once the huge pages are used up
/// would make a read of the mapping SIGBUS. Where huge pages can be had,
/// the hole is punched and the free huge pages taken, and rtprofd must
/// still run; where not, the refusal alone is checked, and the test says
/// why it could do no more.
#[test]
fn a_hugetlb_segment_is_refused_and_its_holes_kill_nothing() {
    let dir = scratch("hostile-hugetlb");
    let mut d = Daemon::start(&dir, 100);
    let huge = HugePages::reserve(2);
    let me = std::process::id();
    // SAFETY: a plain system call; the descriptor is owned from here on.
    let fd = unsafe {
        libc::memfd_create(
            rtprof_abi::protocol::SEGMENT_MEMFD.as_ptr(),
            libc::MFD_HUGETLB | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        eprintln!(
            "a_hugetlb_segment_is_refused_and_its_holes_kill_nothing: not run: this kernel makes \
             no hugetlbfs memfd ({})",
            std::io::Error::last_os_error()
        );
        return;
    }
    // SAFETY: a new descriptor of ours, owned once.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sizes our own memfd.
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), HUGE as i64) }, 0);
    let mut mapped = std::ptr::null_mut();
    if huge.is_ok() {
        let seg = segment_of(me, 7, b"/hostile/hugetlb");
        // SAFETY: maps our own memfd, one huge page, and writes the segment
        // (smaller than it) at its start.
        unsafe {
            mapped = libc::mmap(
                std::ptr::null_mut(),
                HUGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            );
            assert_ne!(
                mapped,
                libc::MAP_FAILED,
                "{}",
                std::io::Error::last_os_error()
            );
            std::ptr::copy_nonoverlapping(seg.as_ptr(), mapped.cast(), seg.len());
        }
    }
    // SAFETY: seals our own memfd.
    let sealed = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
    assert_eq!(sealed, 0, "{}", std::io::Error::last_os_error());
    register(&d.socket, fd.as_raw_fd());
    let mut taken = Vec::new();
    match &huge {
        Err(why) => eprintln!(
            "a_hugetlb_segment_is_refused_and_its_holes_kill_nothing: no huge pages ({why}): \
             no hole can be punched here, only the refusal is checked"
        ),
        Ok(_) => {
            // Refused, or (a daemon that takes it) read at least once.
            wait_until(
                "the segment refused or followed",
                Duration::from_secs(20),
                || d.log().contains("segment rejected") || d.lists(me),
            );
            // SAFETY: punches our own file's only page out; then takes
            // every free huge page (a shared anonymous mapping, populated).
            unsafe {
                let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                assert_eq!(libc::fallocate(fd.as_raw_fd(), punch, 0, HUGE as i64), 0);
                let free = meminfo("HugePages_Free") as usize;
                if free > 0 {
                    let p = libc::mmap(
                        std::ptr::null_mut(),
                        free * HUGE,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED
                            | libc::MAP_ANONYMOUS
                            | libc::MAP_HUGETLB
                            | libc::MAP_POPULATE,
                        -1,
                        0,
                    );
                    assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
                    taken.push((p, free * HUGE));
                }
            }
            assert_eq!(meminfo("HugePages_Free"), 0);
            // A daemon that maps the segment reads it every tick.
            d.ticks(5, |_| {});
        }
    }
    d.assert_alive();
    let log = d.log();
    assert!(
        log.contains("segment rejected: segment is not a shmem memfd") && log.contains("hugetlbfs"),
        "{log}"
    );
    drop(d);
    // SAFETY: unmaps what was mapped above, once.
    unsafe {
        for (p, len) in taken {
            libc::munmap(p, len);
        }
        if !mapped.is_null() {
            libc::munmap(mapped, HUGE);
        }
    }
    drop(fd);
    drop(huge);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A sealed memfd as long as `bytes`, holding only its non-zero pages
/// (the rest holes, as a process that never wrote them leaves
/// them).
fn sparse_memfd(bytes: &[u8]) -> OwnedFd {
    // SAFETY: plain system calls on a descriptor made here and then owned;
    // every write is from inside `bytes`.
    unsafe {
        let fd = libc::memfd_create(
            rtprof_abi::protocol::SEGMENT_MEMFD.as_ptr(),
            libc::MFD_ALLOW_SEALING,
        );
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, bytes.len() as i64), 0);
        for (i, page) in bytes.chunks(4096).enumerate() {
            if page.iter().any(|&b| b != 0) {
                let n = libc::pwrite(fd, page.as_ptr().cast(), page.len(), (i * 4096) as i64);
                assert_eq!(n, page.len() as isize);
            }
        }
        assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
        OwnedFd::from_raw_fd(fd)
    }
}

/// Bytes of memory a file has (st_blocks).
fn allocated(fd: &OwnedFd) -> u64 {
    // SAFETY: stat is plain data; fstat writes only it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
    st.st_blocks as u64 * 512
}

/// A segment of this process whose header claims 32,768 functions counted
/// in 1,000 live stripes (256 MiB of counters, just under what one segment
/// may ask to have read) of which no page was ever written.
fn giant_claim(start_ns: u64) -> Vec<u8> {
    use rtprof_abi::layout::{stripe_state, Header};
    const FUNCS: u32 = 32_768;
    const STRIPES: u32 = 1_000;
    let layout = rtprof_abi::Layout::new(rtprof_abi::Capacities {
        modules: 1,
        functions: FUNCS,
        strings: FUNCS * 8,
        stripes: STRIPES,
    });
    let mut mem = vec![0u64; layout.total_size as usize / 8];
    // SAFETY: `mem` is the layout's size, 8-aligned, and outlives `w`.
    let mut w = unsafe {
        rtprof_abi::SegmentWriter::init(
            mem.as_mut_ptr().cast(),
            layout,
            std::process::id(),
            1,
            start_ns,
        )
    };
    w.set_exe(b"/hostile/sparse").unwrap();
    w.add_module(b"/hostile/sparse", 0).unwrap();
    for i in 0..FUNCS {
        w.add_function(format!("f{i}").as_bytes(), 16 * i as u64, 16)
            .unwrap();
    }
    w.counters().set_state(rtprof_abi::layout::state::RUNNING);
    let mut bytes: Vec<u8> = mem.iter().flat_map(|w| w.to_le_bytes()).collect();
    let at = std::mem::offset_of!(Header, stripe_count);
    bytes[at..at + 4].copy_from_slice(&STRIPES.to_le_bytes());
    for s in 0..STRIPES as usize {
        let slot = stripe_state::LIVE as u64 | (100_000 + s as u64) << 32;
        let at = layout.stripe_table_off as usize + s * 8;
        bytes[at..at + 8].copy_from_slice(&slot.to_le_bytes());
    }
    bytes
}

/// Four sealed, sparse segments claiming 256 MiB of counters each, with
/// about a MiB written: rtprofd refuses them (they publish counters they
/// never gave memory to), says so, and neither its memory nor theirs
/// grows by what they claim (reading a shmem hole through a mapping
/// would allocate it).
#[test]
fn sparse_giant_segments_cost_the_daemon_nothing() {
    const SEGMENTS: usize = 4;
    let dir = scratch("hostile-sparse");
    let mut d = Daemon::start(&dir, 200);
    let pid = d.child.id();
    d.ticks(2, |_| {});
    let (rss0, shmem0) = (status_kib(pid, "VmRSS"), status_kib(pid, "RssShmem"));
    let fds: Vec<OwnedFd> = (0..SEGMENTS)
        .map(|i| sparse_memfd(&giant_claim(1 + i as u64)))
        .collect();
    let written: u64 = fds.iter().map(allocated).sum();
    let (mut rss, mut shmem) = (rss0, shmem0);
    let grown = |fds: &[OwnedFd]| fds.iter().map(allocated).sum::<u64>() > written + (64 << 20);
    // One at a time (they are all this process's: a later registration of
    // a pid would replace an earlier one not read yet), each until it is
    // refused or (a daemon that reads it) the segments' memory grew.
    for (i, fd) in fds.iter().enumerate() {
        register(&d.socket, fd.as_raw_fd());
        let t = Instant::now();
        while d.log().matches("never gave memory").count() <= i && !grown(&fds) {
            assert!(
                d.alive() && t.elapsed() < Duration::from_secs(30),
                "{}",
                d.log()
            );
            rss = rss.max(status_kib(pid, "VmRSS"));
            shmem = shmem.max(status_kib(pid, "RssShmem"));
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    d.ticks(5, |pid| {
        rss = rss.max(status_kib(pid, "VmRSS"));
        shmem = shmem.max(status_kib(pid, "RssShmem"));
    });
    d.assert_alive();
    let now: u64 = fds.iter().map(allocated).sum();
    let log = d.log();
    eprintln!(
        "segments: {} KiB written, {} KiB after; rtprofd VmRSS {rss0} -> at most {rss} KiB, \
         RssShmem {shmem0} -> at most {shmem} KiB",
        written >> 10,
        now >> 10
    );
    assert!(
        now <= written + (1 << 20),
        "the segments grew from {written} to {now} bytes\n{log}"
    );
    assert!(
        shmem <= shmem0 + 64 * 1024,
        "RssShmem {shmem0} -> {shmem} KiB\n{log}"
    );
    assert!(rss <= rss0 + 128 * 1024, "VmRSS {rss0} -> {rss} KiB\n{log}");
    assert_eq!(log.matches("never gave memory").count(), SEGMENTS, "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The file system under `--present` (a 3 MiB tmpfs in a mount namespace
/// of the daemon's own) is filled by someone else once rtprofd has
/// started; then 40 profiled processes register. rtprofd allocated its
/// whole file at start, so it keeps publishing them all; and a daemon
/// that cannot allocate its file at start says so and leaves, with the
/// previous segment still in place.
#[test]
fn a_full_presentation_file_system_kills_nothing() {
    const PROCESSES: usize = 40;
    let dir = scratch("hostile-present");
    let bin = compile_o2("rate.c", &[], &dir);
    let small = dir.join("small");
    std::fs::create_dir_all(&small).unwrap();
    let rtprofd = rtprof().with_file_name("rtprofd");
    let socket = dir.join("sock");
    let _ = std::fs::remove_file(&socket);
    let script = format!(
        "mount -t tmpfs -o size=3m tmpfs '{small}' && exec '{bin}' --tick 100 --span 500 \
         --buffer-mib 1 --log-interval 2 --socket '{socket}' --present '{small}/present'",
        small = small.display(),
        bin = rtprofd.display(),
        socket = socket.display()
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c", &script]);
    let seen = small.clone();
    let mut d = Daemon::spawn(cmd, socket.clone(), move |pid| {
        // The daemon's mounts, as this process sees them.
        PathBuf::from(format!("/proc/{pid}/root"))
            .join(seen.strip_prefix("/").unwrap().join("present"))
    });
    let inside = d.present.parent().unwrap().to_path_buf();
    // Someone else fills what is left.
    {
        use std::io::Write;
        let mut f = std::fs::File::create(inside.join("filler")).unwrap();
        let chunk = vec![0x55u8; 64 << 10];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                    break;
                }
            }
        }
        let _ = f.flush();
    }
    let fs = free_bytes(&inside);
    assert!(fs < 64 << 10, "{fs} bytes still free");
    let kids: Vec<Killed> = (0..PROCESSES)
        .map(|_| {
            Killed(
                Command::new(&bin)
                    .args(["60"])
                    .env("LD_PRELOAD", agent())
                    .env("RTPROF_DAEMON_SOCKET", &socket)
                    .stdout(Stdio::null())
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    let pids: Vec<u32> = kids.iter().map(|k| k.0.id()).collect();
    let t = Instant::now();
    while !pids.iter().all(|&p| d.lists(p)) {
        d.assert_alive();
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "not every process published\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    d.ticks(5, |_| {});
    d.assert_alive();
    assert!(pids.iter().all(|&p| d.lists(p)), "{}", d.log());
    drop(kids);
    // A daemon that cannot allocate its file leaves at once, saying so;
    // the segment in place stays.
    let before = std::fs::read(&d.present).unwrap();
    let present = small.join("present");
    let o = Command::new("nsenter")
        .arg(format!("--mount=/proc/{}/ns/mnt", d.child.id()))
        .arg(&rtprofd)
        .args(["--buffer-mib", "1", "--socket"])
        .arg(dir.join("sock2"))
        .arg("--present")
        .arg(&present)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot allocate"), "{err}");
    let after = std::fs::read(&d.present).unwrap();
    assert_eq!(before.len(), after.len());
    assert!(read_view(&after).is_ok());
    d.assert_alive();
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Bytes free in the file system at `dir`.
fn free_bytes(dir: &Path) -> u64 {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs is plain data; the call writes only it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated, `st` valid for writes.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bavail * st.f_frsize
}

/// A metrics token path in a directory of another user's, or one others
/// may write, is refused at start, naming the directory, and no token is
/// made there.
#[test]
fn a_token_in_a_directory_of_another_user_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("hostile-token");
    let theirs = dir.join("theirs");
    let open = dir.join("open");
    for d in [&theirs, &open] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    for (d, why) in [
        (&theirs, "owned by uid 65534"),
        (&open, "group or others may write it"),
    ] {
        let token = d.join("metrics.token");
        let mut child = Command::new(rtprof().with_file_name("rtprofd"))
            .args(["--metrics", &format!("127.0.0.1:{}", free_port())])
            .arg("--metrics-token-file")
            .arg(&token)
            .arg("--socket")
            .arg(dir.join("sock"))
            .arg("--present")
            .arg(dir.join("present"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A daemon that takes the path runs on: stopped after a while, it
        // fails the checks below.
        let t = Instant::now();
        while child.try_wait().unwrap().is_none() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.contains(why) && err.contains(&*d.to_string_lossy()),
            "{err}"
        );
        assert!(!token.exists());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
