//! What is said on rtprofd's socket: an agent's registration (the greeting
//! with its segment's descriptor attached) and a client's request to switch
//! counting in a followed process, or to route a function's calls to an
//! implementation it offered (each answered with one line, `ok: ...` or
//! `error: ...`). [`ask`] and [`route`] are the client side, for schedulers.

use std::os::fd::RawFd;

/// Where rtprofd listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/rtprof/rtprofd.sock";
/// Where rtprofd publishes its spans unless told otherwise.
pub const DEFAULT_PRESENT: &str = "/run/rtprof/present";
/// The name of an agent's counter-segment memfd.
pub const SEGMENT_MEMFD: &std::ffi::CStr = c"rtprof";
/// How `/proc/PID/maps` names the mapping of such a memfd.
pub const SEGMENT_MEMFD_MAPPED: &str = "/memfd:rtprof (deleted)";

/// First bytes of a registration; the segment's descriptor comes with them.
pub const HELLO: &[u8; 8] = b"RTPROF1\0";
/// First bytes of a switch request.
pub const SWITCH: &[u8; 8] = b"RTPROFS1";
/// The longest name glob a switch request carries.
pub const MAX_PATTERN: usize = 240;
/// First bytes of a route request.
pub const ROUTE: &[u8; 8] = b"RTPROFR1";

/// A route request: the greeting, the pid (little-endian u32), then
/// `function\0implementation`. `None` if a name is empty, holds a NUL, or
/// both are longer than [`MAX_PATTERN`].
pub fn route_request(pid: u32, function: &str, implementation: &str) -> Option<Vec<u8>> {
    let names = crate::route::request_bytes(function, implementation)?;
    if names.len() > MAX_PATTERN {
        return None;
    }
    let mut m = ROUTE.to_vec();
    m.extend_from_slice(&pid.to_le_bytes());
    m.extend_from_slice(&names);
    Some(m)
}

/// The fields of a route request after its greeting: (pid, function,
/// implementation).
pub fn parse_route(b: &[u8]) -> Option<(u32, &str, &str)> {
    if b.len() < 7 || b.len() > 4 + MAX_PATTERN {
        return None;
    }
    let pid = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let (f, i) = crate::route::parse_request(&b[4..])?;
    Some((
        pid,
        std::str::from_utf8(f).ok()?,
        std::str::from_utf8(i).ok()?,
    ))
}

/// rtprofd's socket: `$RTPROF_DAEMON_SOCKET` if set, else
/// [`DEFAULT_SOCKET`].
pub fn default_socket() -> std::path::PathBuf {
    std::env::var_os("RTPROF_DAEMON_SOCKET")
        .filter(|v| !v.is_empty())
        .map_or_else(|| DEFAULT_SOCKET.into(), std::path::PathBuf::from)
}

/// Why a request got no answer.
#[derive(Debug)]
pub enum AskError {
    /// rtprofd's socket could not be reached.
    Unreachable(std::path::PathBuf, std::io::Error),
    /// Sending, or reading the answer, failed (or timed out).
    Io(std::io::Error),
    /// rtprofd closed the connection without a word.
    NoAnswer,
}

impl std::fmt::Display for AskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AskError::Unreachable(p, e) => {
                write!(
                    f,
                    "cannot reach rtprofd at {}: {e} (is it running?)",
                    p.display()
                )
            }
            AskError::Io(e) => write!(f, "no answer from rtprofd: {e}"),
            AskError::NoAnswer => f.write_str("rtprofd closed the connection without an answer"),
        }
    }
}

impl std::error::Error for AskError {}

/// Sends `request` to rtprofd at `socket` and returns its one-line answer
/// (`ok: ...` or `error: ...`), waiting at most `timeout`.
pub fn ask(
    socket: &std::path::Path,
    request: &[u8],
    timeout: std::time::Duration,
) -> Result<String, AskError> {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .map_err(|e| AskError::Unreachable(socket.to_path_buf(), e))?;
    s.set_read_timeout(Some(timeout)).map_err(AskError::Io)?;
    s.set_write_timeout(Some(timeout)).map_err(AskError::Io)?;
    s.write_all(request).map_err(AskError::Io)?;
    let mut answer = String::new();
    s.take(4096)
        .read_to_string(&mut answer)
        .map_err(AskError::Io)?;
    match answer.lines().next() {
        Some(l) if !l.is_empty() => Ok(l.to_string()),
        _ => Err(AskError::NoAnswer),
    }
}

/// Asks rtprofd at `socket` to route the calls of `function` in process
/// `pid` to its implementation `implementation` (`"original"`: its own
/// code). `Ok` with rtprofd's answer once the agent has done it; `Err`
/// with the reason it was refused.
pub fn route(
    socket: &std::path::Path,
    pid: u32,
    function: &str,
    implementation: &str,
) -> Result<String, String> {
    let msg = route_request(pid, function, implementation)
        .ok_or_else(|| "names empty, with a NUL, or too long".to_string())?;
    let line = ask(socket, &msg, std::time::Duration::from_secs(5)).map_err(|e| e.to_string())?;
    match line.strip_prefix("ok: ") {
        Some(ok) => Ok(ok.to_string()),
        None => Err(line.strip_prefix("error: ").unwrap_or(&line).to_string()),
    }
}

/// A switch request: the greeting, the pid (little-endian u32), 1 (count)
/// or 0 (do not), the glob. `None` if the glob is empty, too long or holds
/// a NUL.
pub fn switch_request(pid: u32, on: bool, pattern: &str) -> Option<Vec<u8>> {
    if pattern.is_empty() || pattern.len() > MAX_PATTERN || pattern.contains('\0') {
        return None;
    }
    let mut m = SWITCH.to_vec();
    m.extend_from_slice(&pid.to_le_bytes());
    m.push(on as u8);
    m.extend_from_slice(pattern.as_bytes());
    Some(m)
}

/// The fields of a switch request after its greeting: (pid, on, glob).
pub fn parse_switch(b: &[u8]) -> Option<(u32, bool, &str)> {
    if b.len() < 6 || b.len() > 5 + MAX_PATTERN {
        return None;
    }
    let pid = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let on = match b[4] {
        0 => false,
        1 => true,
        _ => return None,
    };
    let pattern = std::str::from_utf8(&b[5..]).ok()?;
    (!pattern.contains('\0')).then_some((pid, on, pattern))
}

/// Sends a registration on the connected Unix socket `sock`: the
/// greeting with the segment's descriptor `segment` attached (SCM_RIGHTS).
/// Allocates nothing (an agent registers from its start-up and its fork
/// handler); never raises SIGPIPE.
pub fn send_registration(sock: RawFd, segment: RawFd) -> std::io::Result<()> {
    let mut payload = *HELLO;
    let mut iov = libc::iovec {
        iov_base: payload.as_mut_ptr().cast(),
        iov_len: payload.len(),
    };
    // Room for one descriptor, aligned as cmsghdr wants.
    let mut control = [0u64; 4];
    let fd_len = std::mem::size_of::<libc::c_int>() as u32;
    // SAFETY: all-zero is a valid msghdr (null pointers, zero lengths).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a size.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(fd_len) } as usize;
    // SAFETY: `msg` points at `control`, which holds CMSG_SPACE(fd_len)
    // bytes (32 >= 24), so the first header and its data fit; every
    // pointer given to sendmsg (iov, payload, control) outlives the call.
    let sent = unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(fd_len) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>(), segment);
        libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switch_requests_round_trip_and_bad_ones_are_refused() {
        let m = switch_request(4242, true, "lua_*").unwrap();
        assert_eq!(&m[..8], SWITCH);
        assert_eq!(parse_switch(&m[8..]), Some((4242, true, "lua_*")));
        assert!(switch_request(1, false, "").is_none());
        assert!(switch_request(1, false, &"x".repeat(MAX_PATTERN + 1)).is_none());
        assert!(switch_request(1, false, "a\0b").is_none());
        let mut bad = m.clone();
        bad[12] = 7;
        assert_eq!(parse_switch(&bad[8..]), None, "on is 0 or 1");
        assert_eq!(
            parse_switch(&[0xff, 0xfe, 0, 0, 1, 0xc0]),
            None,
            "not UTF-8"
        );
        assert_eq!(parse_switch(&m[8..12]), None, "too short");
    }

    #[test]
    fn route_requests_round_trip_and_bad_ones_are_refused() {
        let m = route_request(7, "work", "fast").unwrap();
        assert_eq!(&m[..8], ROUTE);
        assert_eq!(parse_route(&m[8..]), Some((7, "work", "fast")));
        assert!(route_request(7, "", "fast").is_none());
        assert!(route_request(7, "work", &"x".repeat(MAX_PATTERN)).is_none());
        assert_eq!(parse_route(&m[8..12]), None, "no names");
        assert_eq!(parse_route(b"\x07\0\0\0work"), None, "no implementation");
    }

    /// A registration arrives as the greeting with a working descriptor.
    #[test]
    fn a_registration_carries_the_greeting_and_a_descriptor() {
        use std::io::{Read, Seek, Write};
        use std::os::fd::{AsRawFd, FromRawFd};
        use std::os::unix::net::UnixDatagram;
        let (a, b) = UnixDatagram::pair().unwrap();
        let mut file = std::fs::File::from(std::os::fd::OwnedFd::from(
            std::fs::File::open("/proc/self/exe").unwrap(),
        ));
        let _ = file.flush();
        send_registration(a.as_raw_fd(), file.as_raw_fd()).unwrap();
        let mut payload = [0u8; 16];
        let mut iov = libc::iovec {
            iov_base: payload.as_mut_ptr().cast(),
            iov_len: payload.len(),
        };
        let mut control = [0u64; 4];
        // SAFETY: all-zero is a valid msghdr.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control);
        // SAFETY: `msg` points at buffers that outlive the call.
        let n = unsafe { libc::recvmsg(b.as_raw_fd(), &mut msg, 0) };
        assert_eq!(n, HELLO.len() as isize);
        assert_eq!(&payload[..8], HELLO);
        // SAFETY: the control buffer was filled by recvmsg; one SCM_RIGHTS
        // message with one descriptor, now ours.
        let got = unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            assert!(!c.is_null());
            assert_eq!(
                ((*c).cmsg_level, (*c).cmsg_type),
                (libc::SOL_SOCKET, libc::SCM_RIGHTS)
            );
            std::fs::File::from_raw_fd(std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<i32>()))
        };
        let mut head = [0u8; 4];
        let mut got = got;
        got.rewind().unwrap();
        got.read_exact(&mut head).unwrap();
        assert_eq!(
            &head, b"\x7fELF",
            "the same file, through the passed descriptor"
        );
        // A socket whose peer is gone: an error, not SIGPIPE.
        drop(b);
        assert!(send_registration(a.as_raw_fd(), file.as_raw_fd()).is_err());
    }
}
