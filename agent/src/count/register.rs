//! Telling `rtprofd` about this process's counter segment: the segment's
//! descriptor is passed over the daemon's Unix socket (SCM_RIGHTS) just
//! before the agent closes it. The daemon learns the sender from the
//! socket's credentials, so a process can only register itself.
//!
//! Nothing here may disturb the host: the socket is non-blocking, any
//! failure (no daemon, a backlog still full after 15 ms) is silent, and a daemon that is
//! neither root nor this user is never sent anything. Allocation-free (a
//! forked child registers from its fork handler).

use crate::error::Errno;
use std::sync::atomic::{AtomicBool, Ordering};

/// Where `rtprofd` listens unless `RTPROF_DAEMON_SOCKET` says otherwise.
pub use rtprof_abi::protocol::DEFAULT_SOCKET;

static mut PATH: [u8; 108] = [0; 108];
static SET: AtomicBool = AtomicBool::new(false);

/// Sets the socket path (start-up, single-threaded). Too long: no daemon.
pub fn set_socket(path: &str) {
    let b = path.as_bytes();
    if b.is_empty() || b.len() >= 108 || b.contains(&0) {
        return;
    }
    // SAFETY: start-up, single-threaded: nothing reads PATH until SET
    // says it is written (Release below, Acquire in `offer`).
    unsafe {
        let p = &mut *std::ptr::addr_of_mut!(PATH);
        p[..b.len()].copy_from_slice(b);
        p[b.len()] = 0;
    }
    SET.store(true, Ordering::Release);
}

/// Offers `fd` (the segment) to the daemon, if one listens and may have it.
pub fn offer(fd: libc::c_int) {
    if !SET.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: a socket of our own, closed before returning; PATH was
    // written before SET (checked above) and is never written again.
    unsafe {
        let s = libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        );
        if s < 0 {
            return;
        }
        // Nobody listens, or not someone we trust: nothing happened
        // (said only under RTPROF_VERBOSE).
        if let Err(e) = connect_and_send(s, fd) {
            crate::log::vlog!("not registered with rtprofd: {e}");
        }
        libc::close(s);
    }
}

/// Why a segment was not offered (the process goes on unregistered).
#[derive(Debug)]
enum Refused {
    /// connect() failed with this errno (no daemon, a full backlog).
    Connect(Errno),
    /// The listener is neither root nor this user.
    Untrusted,
    /// sendmsg() failed with this errno.
    Send(Errno),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Connect(e) => write!(f, "cannot connect: {e}"),
            Refused::Untrusted => f.write_str("the listener is neither root nor this user"),
            Refused::Send(e) => write!(f, "cannot send: {e}"),
        }
    }
}

/// Connects socket `s` to the daemon and sends it `fd`.
///
/// # Safety
/// `s` is an unconnected Unix stream socket of ours; PATH is written.
unsafe fn connect_and_send(s: libc::c_int, fd: libc::c_int) -> Result<(), Refused> {
    let mut addr: libc::sockaddr_un = std::mem::zeroed();
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let path = &*std::ptr::addr_of!(PATH);
    for (d, s) in addr.sun_path.iter_mut().zip(path.iter()) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // A full backlog (the daemon busy, or someone flooding it) answers
    // EAGAIN: a few short waits, 15 ms at most, then the process goes on
    // unregistered.
    let mut wait_ms = 1;
    while libc::connect(s, &addr as *const _ as *const libc::sockaddr, len) != 0 {
        let errno = Errno::last();
        if errno != Errno(libc::EAGAIN) || wait_ms > 8 {
            return Err(Refused::Connect(errno));
        }
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: wait_ms * 1_000_000,
        };
        libc::nanosleep(&ts, std::ptr::null_mut());
        wait_ms *= 2;
    }
    // The listener must be root or ourselves: anyone else could have put a
    // socket there to collect other users' counters.
    let mut cred: libc::ucred = std::mem::zeroed();
    let mut clen = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    if libc::getsockopt(
        s,
        libc::SOL_SOCKET,
        libc::SO_PEERCRED,
        &mut cred as *mut _ as *mut libc::c_void,
        &mut clen,
    ) != 0
        || (cred.uid != 0 && cred.uid != libc::geteuid())
    {
        return Err(Refused::Untrusted);
    }
    rtprof_abi::protocol::send_registration(s, fd).map_err(|e| Refused::Send(Errno::of(&e)))
}
