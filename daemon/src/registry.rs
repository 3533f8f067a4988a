//! The daemon's side of registration, and reading a registered segment.
//!
//! Agents send their segment's descriptor over a Unix socket; the kernel
//! tells us who sent it (SO_PEERCRED), and a segment is accepted only if it
//! names that process. Segments are never mapped: a process could shrink
//! its file under a mapping and kill the daemon with SIGBUS. Each tick the
//! parts that matter (metadata, stripes in use) are copied with `pread`
//! into a buffer laid out like the segment, and validated from there.

use rtprof_shared::layout::{stripe_state, Header};
use rtprof_shared::{read_header, read_snapshot, Snapshot};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::Path;

/// Larger segments are refused (a hostile size would make us reserve it).
const MAX_SEGMENT: u64 = 64 << 30;

pub struct Registered {
    pub fd: OwnedFd,
    /// The sender, from the socket's credentials.
    pub pid: u32,
    pub uid: u32,
}

/// Listens at `path` (replacing a stale socket); anyone may connect.
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

/// Receives one registration from a connected agent.
pub fn receive(conn: &std::os::unix::net::UnixStream) -> io::Result<Registered> {
    let s = conn.as_raw_fd();
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut clen = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    if unsafe {
        libc::getsockopt(
            s,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut clen,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    let mut payload = [0u8; 16];
    let mut iov = libc::iovec {
        iov_base: payload.as_mut_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    let mut control = [0u64; 8];
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&control);
    let n = unsafe { libc::recvmsg(s, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // Take every descriptor passed (so none leaks), keep the first.
    let mut fds = Vec::new();
    let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !c.is_null() {
        let h = unsafe { &*c };
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
            let data = unsafe { libc::CMSG_DATA(c) } as *const libc::c_int;
            let count = (h.cmsg_len - unsafe { libc::CMSG_LEN(0) } as usize) / 4;
            for i in 0..count {
                let fd = unsafe { std::ptr::read_unaligned(data.add(i)) };
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
        c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
    }
    if n < 8 || &payload[..8] != b"RTPROF1\0" || fds.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a registration",
        ));
    }
    Ok(Registered {
        fd: fds.swap_remove(0),
        pid: cred.pid as u32,
        uid: cred.uid,
    })
}

fn pread_into(fd: &OwnedFd, buf: &mut [u8], off: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let n = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                buf[done..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - done,
                (off + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "segment shrank",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

/// What reading a segment found.
pub enum Read {
    Ok(Snapshot),
    /// Nothing written yet (an agent still starting): try again later.
    NotYet,
}

/// Copies and validates the segment behind `fd`.
pub fn read(fd: &OwnedFd) -> Result<Read, String> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error().to_string());
    }
    let file_len = st.st_size as u64;
    let mut head = vec![0u8; std::mem::size_of::<Header>()];
    if file_len < head.len() as u64 {
        // An agent sizes its file before it sends it.
        return Err(format!("segment truncated: {file_len} bytes"));
    }
    pread_into(fd, &mut head, 0).map_err(|e| e.to_string())?;
    if head[..8] == [0; 8] {
        return Ok(Read::NotYet);
    }
    let total = {
        let h: Header = unsafe { std::ptr::read_unaligned(head.as_ptr() as *const Header) };
        h.total_size
    };
    if total > file_len || total > MAX_SEGMENT {
        return Err(format!("segment claims {total} bytes, file has {file_len}"));
    }
    // Laid out like the segment; pages never written stay unallocated.
    let mut buf = vec![0u8; total as usize];
    buf[..head.len()].copy_from_slice(&head);
    let h = read_header(&buf).map_err(|e| e.to_string())?;
    pread_into(fd, &mut buf[..h.stripes_off as usize], 0).map_err(|e| e.to_string())?;
    let h = read_header(&buf).map_err(|e| e.to_string())?;
    let used = h.func_count as u64 * 8;
    for s in 0..h.stripe_count as u64 {
        let slot = (h.stripe_table_off + s * 8) as usize;
        let state = u32::from_le_bytes(buf[slot..slot + 4].try_into().unwrap());
        if state == stripe_state::FREE {
            continue;
        }
        let off = h.stripes_off + s * h.stripe_bytes;
        pread_into(fd, &mut buf[off as usize..(off + used) as usize], off)
            .map_err(|e| e.to_string())?;
    }
    read_snapshot(&buf).map(Read::Ok).map_err(|e| e.to_string())
}

/// Agents that were running before the daemon: their segments are memfds
/// named `rtprof`, still mapped in their processes. Opened through
/// `/proc/PID/map_files` (which needs root), with the pid of the process
/// they were found in as the only acceptable owner.
pub fn discover(known: &dyn Fn(u32) -> bool) -> Vec<Registered> {
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in procs.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if known(pid) || pid == std::process::id() {
            continue;
        }
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
            continue;
        };
        // The first mapping of the segment starts at its offset 0.
        let Some(range) = maps
            .lines()
            .find(|l| {
                l.ends_with("/memfd:rtprof (deleted)")
                    && l.split_whitespace().nth(2) == Some("00000000")
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
        out.push(Registered {
            fd: f.into(),
            pid,
            uid,
        });
    }
    out
}
