//! The daemon's side of registration, and reading a registered segment.
//!
//! Agents send their segment's descriptor over a Unix socket; the kernel
//! tells us who sent it (SO_PEERCRED), and a segment is accepted only if it
//! names that process. A segment is mapped read-only only if it is a
//! shmem memfd (not hugetlbfs, whose pages a hole punched under our
//! mapping cannot always give back: SIGBUS) sealed against shrinking (a
//! process shrinking its file under our mapping would otherwise kill the
//! daemon with SIGBUS); its bytes are treated as hostile and validated on
//! every read. A read of a shmem page the process never backed would give
//! it memory, charged to the daemon: the pages a segment's reads touch are
//! checked to be in memory first (see [`Mapped::charge`]).
//!
//! What a segment says about its process is the process's claim; which
//! executable it runs is the kernel's to say (`/proc/PID/exe`), read when
//! the process registers and checked to be the one that maps the segment.

use crate::error::Error;
use rtprof_abi::layout::{Header, PAGE};
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
/// `statfs` f_type of tmpfs and shmem (memfds but hugetlb ones).
const TMPFS_MAGIC: i64 = 0x0102_1994;
/// Ticks a segment may have pages absent from what its reads touch
/// (swapped out, asked back in) before it is refused.
pub const ABSENT_TICKS: u32 = 3;

/// Byte ranges (offset, length) of a segment, sorted, no two sharing a
/// page.
type Ranges = Vec<(u64, u64)>;

/// `cachestat(2)` (Linux 6.5) on x86-64, which the libc crate does not name.
const SYS_CACHESTAT: libc::c_long = 451;

/// How many pages of `[off, off + len)` (page-aligned) of the file behind
/// `fd` have memory: in the page cache, written or only allocated
/// (fallocate), or swapped out. `None` if the kernel cannot say.
fn backed_pages(fd: BorrowedFd<'_>, off: u64, len: u64) -> Option<u64> {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        cache: u64,
        dirty: u64,
        writeback: u64,
        evicted: u64,
        recently_evicted: u64,
    }
    let range = Range { off, len };
    let mut st = Stat::default();
    // SAFETY: both structures are laid out as the kernel's and live across
    // the call; it only reads `range` and writes `st`.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd.as_raw_fd(),
            &range as *const Range,
            &mut st as *mut Stat,
            0u32,
        )
    };
    // Swapped-out shmem pages are counted as evicted.
    (r == 0).then_some(st.cache + st.evicted)
}

/// A registered segment, mapped read-only, and its header page writable
/// for the switch requests relayed to its agent.
pub struct Mapped {
    map: memmap2::Mmap,
    control: Option<memmap2::MmapMut>,
    /// The header page was found in memory once: reading it gives the
    /// file no page.
    header_seen: bool,
    /// The ranges last found all in memory (see [`Mapped::charge`]), by
    /// what decides them: fixed by the header, then by its tables.
    checked: (Ranges, Ranges),
    /// Both, merged: pages known to have memory, not looked at again.
    verified: Ranges,
    /// Ticks in a row with pages absent.
    absent_ticks: u32,
    /// Reused for the ranges and `mincore`'s answer.
    ranges: Ranges,
    tables: Ranges,
    resident: Vec<u8>,
}

/// Whether a segment's reads may go ahead, by the pages they touch.
#[derive(Debug, PartialEq, Eq)]
pub enum Charge {
    /// As last checked: nothing new to charge.
    Unchanged,
    /// Every page the reads touch is in memory: this many bytes of them.
    Resident(u64),
    /// Some are absent, asked back in (if swapped out): not read this tick.
    NotYet,
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
        // Sealed hugetlbfs files may still have holes punched; once the
        // huge pages are gone, a read of such a hole is SIGBUS. In a shmem
        // file it gets a page (which [`Mapped::charge`] keeps bounded).
        // SAFETY: statfs is plain data; all-zero is valid.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: `fs` is valid for writes; fstatfs reads only the descriptor.
        if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut fs) } != 0 {
            return Err(Error::SegmentStat(io::Error::last_os_error()));
        }
        if fs.f_type as i64 != TMPFS_MAGIC {
            return Err(Error::NotShmem {
                f_type: fs.f_type as u64,
            });
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
        // above) and is shmem, where a hole punched in it is given a new
        // page when read, so no page of the mapping can fault; its bytes
        // change under us, which every reader of them allows for.
        let map = unsafe { memmap2::MmapOptions::new().len(len as usize).map(fd) }
            .map_err(Error::SegmentMap)?;
        // SAFETY: as above; only the request words are written, with
        // atomic stores (the agent reads them concurrently). A descriptor
        // opened read-only gives no relay, nothing else changes.
        let control = unsafe { memmap2::MmapOptions::new().len(HEADER_PAGE).map_mut(fd) }.ok();
        Ok(Mapped {
            map,
            control,
            header_seen: false,
            checked: Default::default(),
            verified: Vec::new(),
            absent_ticks: 0,
            ranges: Vec::new(),
            tables: Vec::new(),
            resident: Vec::new(),
        })
    }

    /// Pages of `ranges` (offset, length; sorted and merged) of the
    /// mapping that are in memory, and how many are not.
    fn residency(&mut self, ranges: &[(u64, u64)]) -> (u64, u64) {
        let (mut present, mut absent) = (0, 0);
        for &(off, len) in ranges {
            let end = (off + len).min(self.map.len() as u64).div_ceil(PAGE) * PAGE;
            let lo = off / PAGE * PAGE;
            if end <= lo {
                continue;
            }
            let pages = ((end - lo) / PAGE) as usize;
            self.resident.clear();
            self.resident.resize(pages, 0);
            // SAFETY: a page-aligned range inside our mapping (clamped to
            // its length, which the kernel rounds up to pages), and one
            // byte of `resident` per page of it.
            let r = unsafe {
                libc::mincore(
                    self.map.as_ptr().add(lo as usize) as *mut libc::c_void,
                    (end - lo) as usize,
                    self.resident.as_mut_ptr(),
                )
            };
            if r != 0 {
                // Cannot tell: counted as absent.
                absent += pages as u64;
                continue;
            }
            let here = self.resident.iter().filter(|&&b| b & 1 != 0).count() as u64;
            present += here;
            absent += pages as u64 - here;
        }
        (present, absent)
    }

    /// Asks the kernel to bring back the pages of `ranges` that were
    /// swapped out (for shmem this reads swap only: a hole stays one).
    fn ask_back(&self, ranges: &[(u64, u64)]) {
        for &(off, len) in ranges {
            let end = (off + len).min(self.map.len() as u64).div_ceil(PAGE) * PAGE;
            let lo = off / PAGE * PAGE;
            if end > lo {
                // SAFETY: advice only, on a page-aligned range of our
                // mapping; it changes no contents.
                unsafe {
                    libc::madvise(
                        self.map.as_ptr().add(lo as usize) as *mut libc::c_void,
                        (end - lo) as usize,
                        libc::MADV_WILLNEED,
                    )
                };
            }
        }
    }

    /// Whether every page this tick's reads of the segment touch (header
    /// `h`, read from [`Mapped::bytes`], and the tables it names) is in
    /// memory: a real agent gives memory to all it publishes before it
    /// publishes it, and reading a page it did not would give the file
    /// one, charged to us. Only pages not verified before are looked at,
    /// when the ranges change (`mincore`: pages allocated by fallocate
    /// but never written look absent to it, so what the agent reserved
    /// that way is verified at registration, [`Mapped::verify`]). A page
    /// taken away after it was verified is given back by our read once,
    /// and counts as present from then on. Pages absent [`ABSENT_TICKS`]
    /// in a row refuse the segment.
    pub fn charge(&mut self, h: &Header) -> Result<Charge, Error> {
        let mut fixed = std::mem::take(&mut self.ranges);
        fixed_ranges(h, &mut fixed);
        let same_fixed = fixed == self.checked.0;
        if !same_fixed {
            let new = subtract(&fixed, &self.verified);
            let (_, absent) = self.residency(&new);
            if absent > 0 {
                return self.absent(fixed, &new, absent);
            }
        }
        // The tables the fixed ranges hold are in memory: reading them
        // gives the file no page.
        let mut tables = std::mem::take(&mut self.tables);
        table_ranges(&self.map, h, &mut tables);
        if same_fixed && tables == self.checked.1 {
            self.ranges = fixed;
            self.tables = tables;
            self.absent_ticks = 0;
            return Ok(Charge::Unchanged);
        }
        let new = subtract(&tables, &self.verified);
        let (_, absent) = self.residency(&new);
        if absent > 0 {
            self.tables = tables;
            return self.absent(fixed, &new, absent);
        }
        Ok(Charge::Resident(self.verified(fixed, tables)))
    }

    /// Takes `fixed` and `tables` as checked and their pages as verified:
    /// the bytes of those pages.
    fn verified(&mut self, fixed: Ranges, tables: Ranges) -> u64 {
        self.verified.clear();
        self.verified.extend_from_slice(&fixed);
        self.verified.extend_from_slice(&tables);
        merge(&mut self.verified);
        let bytes = page_bytes(&self.verified, self.map.len() as u64);
        self.absent_ticks = 0;
        self.ranges = std::mem::replace(&mut self.checked.0, fixed);
        self.tables = std::mem::replace(&mut self.checked.1, tables);
        bytes
    }

    /// At registration, with the segment's descriptor: whether every page
    /// its reads touch has memory, written or only allocated (as the agent
    /// of a forked child reserves the counters it copies no value into),
    /// and the bytes of them. `Ok(None)` if that cannot be told now (no
    /// header yet, or a kernel without `cachestat`): [`Mapped::charge`]
    /// looks at every page then.
    pub fn verify(&mut self, fd: &OwnedFd) -> Result<Option<u64>, Error> {
        let Some(bytes) = self.look() else {
            return Ok(None);
        };
        let Ok(h) = rtprof_abi::read_header(bytes) else {
            return Ok(None);
        };
        self.check_size(&h)?;
        let (mut fixed, mut tables) = (Vec::new(), Vec::new());
        fixed_ranges(&h, &mut fixed);
        // The tables are read only once the pages holding them are known
        // to have memory.
        self.backed(fd, &fixed, &[])?;
        table_ranges(&self.map, &h, &mut tables);
        self.backed(fd, &tables, &fixed)?;
        Ok(Some(self.verified(fixed, tables)))
    }

    /// Refuses the segment behind `fd` unless every page of `ranges` has
    /// memory. Without `cachestat` (Linux before 6.5), the file must have
    /// at least as much memory as `ranges` and `before` (checked already)
    /// together, wherever it is: a read can then give it no more pages
    /// than its process paid for.
    fn backed(
        &self,
        fd: &OwnedFd,
        ranges: &[(u64, u64)],
        before: &[(u64, u64)],
    ) -> Result<(), Error> {
        let mut absent = 0;
        for &(off, len) in ranges {
            let (lo, hi) = (off / PAGE * PAGE, (off + len).div_ceil(PAGE) * PAGE);
            let Some(n) = backed_pages(fd.as_fd(), lo, hi - lo) else {
                let mut all = [ranges, before].concat();
                merge(&mut all);
                let need = page_bytes(&all, self.map.len() as u64);
                // SAFETY: stat is plain data; all-zero is valid.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: `st` is valid for writes; fstat reads only the descriptor.
                if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
                    return Err(Error::SegmentStat(io::Error::last_os_error()));
                }
                let have = st.st_blocks as u64 * 512;
                return match need.checked_sub(have) {
                    Some(absent @ 1..) => Err(Error::Unbacked { absent }),
                    _ => Ok(()),
                };
            };
            absent += ((hi - lo) / PAGE).saturating_sub(n);
        }
        match absent {
            0 => Ok(()),
            _ => Err(Error::Unbacked {
                absent: absent * PAGE,
            }),
        }
    }

    /// `absent` pages of `new` (of `ranges`, what the reads touch, those
    /// not verified before) are not in memory: not read this tick, and
    /// refused after [`ABSENT_TICKS`].
    fn absent(&mut self, ranges: Ranges, new: &[(u64, u64)], absent: u64) -> Result<Charge, Error> {
        self.checked = Default::default();
        self.absent_ticks += 1;
        self.ask_back(new);
        self.ranges = ranges;
        if self.absent_ticks >= ABSENT_TICKS {
            return Err(Error::Unbacked {
                absent: absent * PAGE,
            });
        }
        Ok(Charge::NotYet)
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

    /// The segment's bytes, once its header page was found in memory
    /// ([`Mapped::look`]); `None` before, and while the agent has not
    /// written its header.
    pub fn bytes(&self) -> Option<&[u8]> {
        (self.header_seen && self.map[..8] != [0; 8]).then_some(&self.map[..])
    }

    /// [`Mapped::bytes`], looking first whether the header page has
    /// memory yet (reading it before would give it some).
    pub fn look(&mut self) -> Option<&[u8]> {
        if !self.header_seen {
            self.header_seen = self.residency(&[(0, HEADER_PAGE as u64)]) == (1, 0);
        }
        self.bytes()
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

/// Adds `(off, len)` to `out` if it is not empty.
fn push(out: &mut Vec<(u64, u64)>, off: u64, len: u64) {
    if len > 0 {
        out.push((off, len));
    }
}

/// Bytes of the pages of `ranges` (sorted and merged) within `len`.
fn page_bytes(ranges: &[(u64, u64)], len: u64) -> u64 {
    ranges
        .iter()
        .map(|&(off, n)| (off + n).min(len).div_ceil(PAGE).saturating_sub(off / PAGE) * PAGE)
        .sum()
}

/// Sorts `ranges` and merges those that share a page.
fn merge(ranges: &mut Vec<(u64, u64)>) {
    ranges.sort_unstable();
    // In place: this runs for every segment every tick.
    let mut kept: usize = 0;
    for i in 0..ranges.len() {
        let (off, len) = ranges[i];
        let end = off.saturating_add(len);
        if let Some((o, l)) = kept.checked_sub(1).map(|k| &mut ranges[k]) {
            if (*o + *l).div_ceil(PAGE) * PAGE > off / PAGE * PAGE {
                *l = (*o + *l).max(end) - *o;
                continue;
            }
        }
        ranges[kept] = (off, end - off);
        kept += 1;
    }
    ranges.truncate(kept);
}

/// The pages of `a` that are in none of `b` (both sorted and merged), as
/// byte ranges of whole pages.
fn subtract(a: &[(u64, u64)], b: &[(u64, u64)]) -> Ranges {
    let pages = |&(off, len): &(u64, u64)| (off / PAGE, (off + len).div_ceil(PAGE));
    let mut out = Vec::new();
    let mut b = b.iter().map(pages).peekable();
    for (mut lo, hi) in a.iter().map(pages) {
        while lo < hi {
            // Ranges of `b` wholly before `lo` are of no more use.
            while b.peek().is_some_and(|&(_, bh)| bh <= lo) {
                b.next();
            }
            match b.peek() {
                Some(&(bl, bh)) if bl <= lo => lo = bh.min(hi),
                Some(&(bl, _)) if bl < hi => {
                    out.push((lo * PAGE, (bl - lo) * PAGE));
                    lo = bl;
                }
                _ => {
                    out.push((lo * PAGE, (hi - lo) * PAGE));
                    lo = hi;
                }
            }
        }
    }
    out
}

/// The ranges (offset, length) of a segment that its reads touch and that
/// header `h` alone decides (checked against the file by
/// `read_header`): the header with its cost words, the module and
/// function records and names in use, the functions' samples, the stripe
/// table and the per-thread samples' head. A real agent has written all
/// of them (pages it reserved with fallocate but never wrote would look
/// absent).
fn fixed_ranges(h: &Header, out: &mut Vec<(u64, u64)>) {
    use rtprof_abi::layout::{cost, FunctionRecord, ModuleRecord, TableHead};
    use std::mem::size_of;
    out.clear();
    let (funcs, stripes) = (h.func_count as u64, h.stripe_count.min(h.stripe_cap) as u64);
    // The header, the request area and the cost words.
    const _: () = assert!(cost::END <= HEADER_PAGE);
    push(out, 0, HEADER_PAGE as u64);
    let module = size_of::<ModuleRecord>() as u64;
    push(out, h.modules_off, h.module_count as u64 * module);
    let function = size_of::<FunctionRecord>() as u64;
    push(out, h.funcs_off, funcs * function);
    push(out, h.strings_off, h.strings_len as u64);
    push(out, h.samples_off, funcs * 8);
    push(out, h.stripe_table_off, stripes * 8);
    // The head only: the agent reserves the stripes' sample words with it
    // (fallocate), but writes a word only when its thread is sampled, and
    // a page reserved but never written looks absent. They are read for
    // the threads followed (at most 64) only.
    if h.thread_samples_off != 0 {
        push(out, h.thread_samples_off, size_of::<TableHead>() as u64);
    }
    merge(out);
}

/// The ranges that the tables in the fixed ranges decide: the stripes
/// counted (the stripe table says which) and the written parts of the
/// per-thread sample table (its head says which), as the reader takes
/// them (`rtprof_abi::sum_calls`, `thread_function_samples`).
fn table_ranges(bytes: &[u8], h: &Header, out: &mut Vec<(u64, u64)>) {
    use rtprof_abi::layout::{stripe_state, thread_entries_off, TableHead, VERSION};
    use std::mem::offset_of;
    use std::sync::atomic::{AtomicU64, Ordering};
    out.clear();
    let word = |off: u64| -> u64 {
        let o = off as usize;
        match bytes.get(o..o + 8) {
            // SAFETY: 8 bytes inside the mapping, 8-aligned (checked),
            // written by the agent with whole aligned stores.
            Some(b) if (b.as_ptr() as usize).is_multiple_of(8) => unsafe {
                AtomicU64::from_ptr(b.as_ptr() as *mut u64).load(Ordering::Acquire)
            },
            _ => 0,
        }
    };
    let generation = word(offset_of!(Header, fold_seq) as u64) / 2;
    let live = h.func_count as u64 * 8;
    for s in 0..h.stripe_count.min(h.stripe_cap) as u64 {
        let slot = word(h.stripe_table_off + s * 8);
        let (state, tid) = (slot as u32, (slot >> 32) as u32);
        // What the reader sums of this generation or the next, and the
        // stripes of live threads.
        let read = if h.version >= VERSION {
            stripe_state::counted(state, tid, generation)
                || stripe_state::counted(state, tid, generation + 1)
                || state == stripe_state::LIVE
        } else {
            state != stripe_state::FREE
        };
        if read {
            push(out, h.stripes_off + s * h.stripe_bytes, live);
        }
    }
    if h.thread_samples_off != 0 {
        let head = h.thread_samples_off;
        let cap = word(head + offset_of!(TableHead, cap) as u64) as u32 as u64;
        let dirty = word(head + offset_of!(TableHead, dirty) as u64);
        let first = thread_entries_off(head, h.stripe_cap);
        if cap.is_power_of_two()
            && (64..=1 << 20).contains(&cap)
            && first + cap * 16 <= h.total_size
        {
            let group = cap / 64 * 16;
            for bit in (0..64).filter(|b| dirty & 1 << b != 0) {
                push(out, first + bit * group, group);
            }
        }
    }
    merge(out);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_by_page_and_subtract_whole_pages() {
        let mut r = vec![(8192, 10), (0, 100), (4000, 200), (20480, 4096)];
        merge(&mut r);
        assert_eq!(r, [(0, 4200), (8192, 10), (20480, 4096)]);
        let verified = [(0, 4096), (8192, 4096)];
        // Pages 1, 5 (and none of 0 or 2).
        assert_eq!(subtract(&r, &verified), [(4096, 4096), (20480, 4096)]);
        assert_eq!(subtract(&r, &[]), [(0, 8192), (8192, 4096), (20480, 4096)]);
        assert!(subtract(&verified, &[(0, 1 << 20)]).is_empty());
    }
}
