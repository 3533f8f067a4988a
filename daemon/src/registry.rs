//! The daemon's side of registration, and reading a registered segment.
//!
//! Agents send their segment's descriptor over a Unix socket; the kernel
//! tells us who sent it (SO_PEERCRED), and a segment is accepted only if it
//! names that process. A segment is mapped read-only only if its memfd is
//! sealed against shrinking (a process shrinking its file under our
//! mapping would otherwise kill the daemon with SIGBUS); its bytes are
//! treated as hostile and validated on every read.
//!
//! What a segment says about its process is the process's claim; which
//! executable it runs is the kernel's to say (`/proc/PID/exe`), read when
//! the process registers and checked to be the one that maps the segment.

use crate::error::Error;
use rtprof_abi::layout::Header;
use rtprof_abi::protocol;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::Path;

/// Larger segments are refused.
const MAX_SEGMENT: u64 = 64 << 30;
/// Metadata plus counters in use, read every tick: 256 MiB is 64 threads'
/// counters of half a million functions.
const MAX_READ: u64 = 256 << 20;

pub struct Registered {
    pub fd: OwnedFd,
    /// The sender, from the socket's credentials.
    pub pid: u32,
    pub uid: u32,
    /// Its executable, from the kernel, or why it could not be had.
    pub exe: Result<String, ExeError>,
}

/// What a process is published as when the kernel could not say which
/// executable it runs (a real path starts with `/`, so this is none).
pub const UNVERIFIED_EXE: &str = "[unverified]";

/// Why the kernel's view of a registering process's executable is not
/// known.
#[derive(Debug)]
pub enum ExeError {
    /// `/proc/PID/exe` cannot be read (the process is gone, or hidden from us).
    Readlink(io::Error),
    /// `/proc/PID/maps` cannot be read.
    Maps(io::Error),
    /// The process at that pid does not map the segment: the sender
    /// exited (its pid maybe reused) or exec'd another program since it
    /// connected.
    NotMapped,
    /// The segment's descriptor cannot be examined.
    Stat(io::Error),
}

impl std::fmt::Display for ExeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExeError::Readlink(e) => write!(f, "cannot read its /proc/PID/exe: {e}"),
            ExeError::Maps(e) => write!(f, "cannot read its /proc/PID/maps: {e}"),
            ExeError::NotMapped => {
                f.write_str("the process at its pid no longer maps its segment (exited or exec'd)")
            }
            ExeError::Stat(e) => write!(f, "cannot stat its segment: {e}"),
        }
    }
}

/// The executable process `pid` runs, as the kernel says, if that process
/// maps the segment behind `fd`. The link is read first and the mapping
/// checked after: a process that exited (and whose pid another took) or
/// exec'd before the link was read no longer maps the segment, so a link
/// of anything but the sender's image is never taken.
pub fn kernel_exe(pid: u32, fd: BorrowedFd<'_>) -> Result<String, ExeError> {
    // SAFETY: stat is plain data; all-zero is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is valid for writes; fstat reads only the descriptor.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(ExeError::Stat(io::Error::last_os_error()));
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map_err(ExeError::Readlink)?;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(ExeError::Maps)?;
    let dev = format!(
        "{:02x}:{:02x}",
        libc::major(st.st_dev),
        libc::minor(st.st_dev)
    );
    let ino = st.st_ino.to_string();
    let mapped = maps.lines().any(|l| {
        let mut f = l.split_whitespace().skip(3);
        f.next() == Some(dev.as_str()) && f.next() == Some(ino.as_str())
    });
    if !mapped {
        return Err(ExeError::NotMapped);
    }
    Ok(exe.to_string_lossy().into_owned())
}

/// Who is at the other end of a connection (the kernel says, at connect).
#[derive(Clone, Copy, Debug)]
pub struct Peer {
    pub pid: u32,
    pub uid: u32,
}

/// Why no registration was read from a connection.
#[derive(Debug)]
pub enum RecvError {
    /// Nothing sent yet: try again when it is readable.
    WouldBlock,
    /// The peer hung up without sending anything.
    Closed,
    /// Neither a greeting with a descriptor nor a well-formed switch request.
    NotRegistration,
    Io(io::Error),
}

impl std::fmt::Display for RecvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecvError::WouldBlock => f.write_str("nothing sent yet"),
            RecvError::Closed => f.write_str("closed without sending a registration"),
            RecvError::NotRegistration => f.write_str("not a registration or switch request"),
            RecvError::Io(e) => write!(f, "cannot read: {e}"),
        }
    }
}

/// Listens at `path` (replacing a stale socket), non-blocking; anyone may
/// connect.
pub fn listen(path: &Path) -> io::Result<UnixListener> {
    if path.exists() {
        std::fs::remove_file(path)?;
    }
    let l = UnixListener::bind(path)?;
    l.set_nonblocking(true)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(l)
}

/// The credentials of the process that connected `conn`.
pub fn peer(conn: BorrowedFd<'_>) -> io::Result<Peer> {
    // SAFETY: ucred is plain integers; all-zero is valid.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut clen = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `clen` are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut clen,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Peer {
        pid: cred.pid as u32,
        uid: cred.uid,
    })
}

/// A request to switch counting of the functions of process `pid` whose
/// names match `pattern`, relayed to its agent (see `Table::switch`).
#[derive(Debug)]
pub struct SwitchRequest {
    /// The sender, from the socket's credentials.
    pub from: Peer,
    pub pid: u32,
    pub on: bool,
    pub pattern: String,
}

/// A request to route the calls of function `function` of process `pid`
/// to its implementation `implementation`, relayed to its agent (see
/// `Table::route`) and answered once the agent has.
#[derive(Debug)]
pub struct RouteRequest {
    /// The sender, from the socket's credentials.
    pub from: Peer,
    pub pid: u32,
    pub function: String,
    pub implementation: String,
}

/// What a connection sent.
pub enum Message {
    Register(Registered),
    Switch(SwitchRequest),
    Route(RouteRequest),
}

/// Reads one message from `conn` without waiting: a registration (an
/// 8-byte greeting with the segment's descriptor attached) or a switch
/// request (no descriptor).
pub fn receive(conn: BorrowedFd<'_>, from: Peer) -> Result<Message, RecvError> {
    let mut payload = [0u8; 8 + 5 + protocol::MAX_PATTERN + 1];
    let mut iov = libc::iovec {
        iov_base: payload.as_mut_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // Room for one descriptor (padding makes it two): the kernel closes
    // any more a sender attaches instead of adding them to our table.
    let mut control = [0u64; 4];
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    // SAFETY: CMSG_SPACE only computes a size.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(4) } as usize;
    // SAFETY: `msg` points at `iov` and `control`, which outlive the call
    // and are as large as it says.
    let n = unsafe {
        libc::recvmsg(
            conn.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return Err(match e.kind() {
            io::ErrorKind::WouldBlock => RecvError::WouldBlock,
            _ => RecvError::Io(e),
        });
    }
    // Take every descriptor passed (so none leaks), keep the first.
    let mut fds = Vec::new();
    // SAFETY: `msg` was filled in by recvmsg; the CMSG macros walk only
    // within its control buffer, and every descriptor in an SCM_RIGHTS
    // message is ours now, so owning (and closing) it is right.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let h = &*c;
            if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const libc::c_int;
                let count = (h.cmsg_len - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n == 0 && fds.is_empty() {
        return Err(RecvError::Closed);
    }
    let n = n as usize;
    if n >= 8 && &payload[..8] == protocol::SWITCH && fds.is_empty() {
        let (pid, on, pattern) =
            protocol::parse_switch(&payload[8..n]).ok_or(RecvError::NotRegistration)?;
        return Ok(Message::Switch(SwitchRequest {
            from,
            pid,
            on,
            pattern: pattern.to_string(),
        }));
    }
    if n >= 8 && &payload[..8] == protocol::ROUTE && fds.is_empty() {
        let (pid, function, implementation) =
            protocol::parse_route(&payload[8..n]).ok_or(RecvError::NotRegistration)?;
        return Ok(Message::Route(RouteRequest {
            from,
            pid,
            function: function.to_string(),
            implementation: implementation.to_string(),
        }));
    }
    if n < 8 || &payload[..8] != protocol::HELLO || fds.is_empty() {
        return Err(RecvError::NotRegistration);
    }
    let fd = fds.swap_remove(0);
    // Now, while the sender is most likely still there.
    let exe = kernel_exe(from.pid, fd.as_fd());
    Ok(Message::Register(Registered {
        fd,
        pid: from.pid,
        uid: from.uid,
        exe,
    }))
}

/// The header's page, all a switch request writes.
const HEADER_PAGE: usize = 4096;

/// A registered segment, mapped read-only, and its header page writable
/// for the switch requests relayed to its agent.
pub struct Mapped {
    map: memmap2::Mmap,
    control: Option<memmap2::MmapMut>,
}

impl Mapped {
    /// Maps the segment behind `fd` if it can never shrink: the agent seals
    /// its memfd (F_SEAL_SHRINK), so reading the mapping cannot fault
    /// (SIGBUS) whatever the process does later. Anything else is refused.
    /// The mapping keeps the file alive: the caller may close `fd`.
    pub fn open(fd: &OwnedFd) -> Result<Mapped, Error> {
        // SAFETY: F_GET_SEALS on a descriptor we own reads nothing of ours.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(Error::NotSealed);
        }
        // SAFETY: stat is plain data; all-zero is valid.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is valid for writes.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(Error::SegmentStat(io::Error::last_os_error()));
        }
        let len = st.st_size as u64;
        if len < std::mem::size_of::<Header>() as u64 {
            // An agent sizes its file before it sends it.
            return Err(Error::Truncated { len });
        }
        if len > MAX_SEGMENT {
            return Err(Error::TooLarge {
                len,
                max: MAX_SEGMENT,
            });
        }
        // SAFETY: the file can never shrink below `len` (the seal checked
        // above), so no page of the mapping can fault; its bytes change
        // under us, which every reader of them allows for.
        let map = unsafe { memmap2::MmapOptions::new().len(len as usize).map(fd) }
            .map_err(Error::SegmentMap)?;
        // SAFETY: as above; only the request words are written, with
        // atomic stores (the agent reads them concurrently). A descriptor
        // opened read-only gives no relay, nothing else changes.
        let control = unsafe { memmap2::MmapOptions::new().len(HEADER_PAGE).map_mut(fd) }.ok();
        Ok(Mapped { map, control })
    }

    /// Whether this segment takes switch requests: mapped writable, and
    /// laid out with room for one (`layout::control`).
    pub fn takes_requests(&self, h: &Header) -> bool {
        use rtprof_abi::layout::control;
        self.control.is_some() && h.modules_off >= (control::PATTERN + control::PATTERN_MAX) as u64
    }

    /// Leaves a request of `kind` (`layout::control`) with `pattern` for
    /// the agent, if it has answered the last one (and the segment takes
    /// requests: the caller checked [`Mapped::takes_requests`]). Its
    /// sequence number; `None` while the last is unanswered.
    pub fn request(&mut self, kind: u32, pattern: &[u8]) -> Option<u32> {
        use rtprof_abi::layout::control;
        use std::sync::atomic::Ordering;
        let base = self.control.as_mut()?.as_mut_ptr();
        let word = |off| self.control_word(off);
        let seq = word(control::SEQ).load(Ordering::Acquire);
        if seq != word(control::ACK).load(Ordering::Acquire) {
            return None;
        }
        let len = pattern.len().min(control::PATTERN_MAX);
        // SAFETY: the pattern area, inside the header page we mapped; the
        // agent reads it only after seeing the new sequence number.
        unsafe { std::ptr::copy_nonoverlapping(pattern.as_ptr(), base.add(control::PATTERN), len) };
        word(control::LEN).store(len as u32, Ordering::Relaxed);
        word(control::KIND).store(kind, Ordering::Relaxed);
        word(control::SEQ).store(seq.wrapping_add(1), Ordering::Release);
        // The agent's drain thread sleeps on this word (a shared futex of
        // the memfd's page): it serves the request now, not at its next
        // tick.
        // SAFETY: a futex wake on an aligned u32 of our mapping; it only
        // wakes waiters, whoever they are.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                base.add(control::SEQ),
                libc::FUTEX_WAKE,
                i32::MAX,
            )
        };
        Some(seq.wrapping_add(1))
    }

    /// The agent's answer to request `seq` (what it left in the kind
    /// word), once it has answered; `None` until then, or if another
    /// request has been made since.
    pub fn answer(&self, seq: u32) -> Option<u32> {
        use rtprof_abi::layout::control;
        use std::sync::atomic::Ordering;
        self.control.as_ref()?;
        let word = |off| self.control_word(off);
        let ack = word(control::ACK).load(Ordering::Acquire);
        (ack == seq && word(control::SEQ).load(Ordering::Acquire) == seq)
            .then(|| word(control::KIND).load(Ordering::Relaxed))
    }

    /// The request word at `off` (a `layout::control` offset) of the
    /// header page mapped writable; only called once that page is known
    /// mapped.
    fn control_word(&self, off: usize) -> &std::sync::atomic::AtomicU32 {
        let base = self
            .control
            .as_ref()
            .map_or(std::ptr::null(), |p| p.as_ptr());
        assert!(!base.is_null() && off + 4 <= HEADER_PAGE && off.is_multiple_of(4));
        // SAFETY: an aligned u32 of the header inside our mapping (checked
        // above), which the agent also accesses only atomically; it lives
        // as long as `self`.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(base.add(off) as *mut u32) }
    }

    /// The segment's bytes; `None` while the agent has not written its
    /// header yet.
    pub fn bytes(&self) -> Option<&[u8]> {
        (self.map[..8] != [0; 8]).then_some(&self.map[..])
    }

    /// Refuses a segment that asks for more reading each tick than any
    /// real process needs (pages never written would be allocated to us).
    pub fn check_size(&self, h: &Header) -> Result<(), Error> {
        let live = (h.func_count as u64 * 8).saturating_mul(h.stripe_count as u64 + 1);
        let read = h.stripes_off.saturating_add(live);
        if read > MAX_READ {
            return Err(Error::ReadsTooMuch { bytes: read });
        }
        Ok(())
    }
}

/// The socket the agent in process `pid` registers at: its
/// `RTPROF_DAEMON_SOCKET`, unless it runs in secure-execution mode (a
/// set-id program, whose agent reads no environment) or has none: the
/// default. `None` if the process's environment cannot be read.
fn agent_socket(pid: u32) -> Option<String> {
    let secure = std::fs::read(format!("/proc/{pid}/auxv")).ok()?;
    // (type, value) pairs of native words; AT_SECURE is type 23.
    let secure = secure.chunks_exact(16).any(|p| {
        let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]));
        word(&p[..8]) == libc::AT_SECURE && word(&p[8..]) != 0
    });
    let default = || protocol::DEFAULT_SOCKET.to_string();
    if secure {
        return Some(default());
    }
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let set = env
        .split(|&b| b == 0)
        .filter_map(|v| v.strip_prefix(b"RTPROF_DAEMON_SOCKET="))
        .next_back();
    Some(set.map_or_else(default, |v| String::from_utf8_lossy(v).into_owned()))
}

/// Whether `theirs` (as the agent named it) is the socket at `ours`.
fn same_socket(theirs: &str, ours: &Path) -> bool {
    let theirs = Path::new(theirs);
    theirs == ours
        || matches!(
            (theirs.canonicalize(), ours.canonicalize()),
            (Ok(a), Ok(b)) if a == b
        )
}

/// Agents that were running before the daemon and register at its
/// `socket` (another daemon's agents stay that daemon's): their segments
/// are memfds named `rtprof`, still mapped in their processes. Opened
/// through `/proc/PID/map_files` (which needs root), with the pid of the
/// process they were found in as the only acceptable owner.
pub fn discover(socket: &Path) -> Vec<Registered> {
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in procs.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
            continue;
        };
        if !maps.contains(protocol::SEGMENT_MEMFD_MAPPED)
            || !agent_socket(pid).is_some_and(|s| same_socket(&s, socket))
        {
            continue;
        }
        // The agent's own mapping: writable, shared, from offset 0, the
        // whole segment (a daemon maps other processes' segments
        // read-only, and only their header page writable).
        let Some(range) = maps
            .lines()
            .find(|l| {
                let mut f = l.split_whitespace();
                let whole = f
                    .next()
                    .and_then(|r| r.split_once('-'))
                    .is_some_and(|(a, b)| {
                        let (a, b) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16));
                        matches!((a, b), (Ok(a), Ok(b)) if b > a + HEADER_PAGE as u64)
                    });
                l.ends_with(protocol::SEGMENT_MEMFD_MAPPED)
                    && whole
                    && f.next() == Some("rw-s")
                    && f.next() == Some("00000000")
            })
            .and_then(|l| l.split_whitespace().next())
        else {
            continue;
        };
        let path = format!("/proc/{pid}/map_files/{range}");
        let Ok(f) = std::fs::File::open(&path) else {
            continue;
        };
        let uid = std::fs::metadata(format!("/proc/{pid}"))
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
            .unwrap_or(u32::MAX);
        let fd = OwnedFd::from(f);
        let exe = kernel_exe(pid, fd.as_fd());
        out.push(Registered { fd, pid, uid, exe });
    }
    out
}
