//! Taking registrations without ever holding up the publishing tick. The
//! listener and every connection are non-blocking and waited on with
//! poll() up to the caller's deadline. An agent sends its registration as
//! soon as it connects, so it is usually read at once; a connection that
//! has sent nothing yet waits in a small table, with a deadline. Each user
//! may have a few connections waiting: one more closes that user's oldest,
//! so whoever holds idle connections delays only their own registrations.

use crate::registry::{self, Message, Peer, RecvError, Registered, RouteRequest, SwitchRequest};
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

/// Connections accepted per wake-up, so a stream of them cannot keep the
/// caller from its deadline; their descriptors are in flight until the
/// caller takes the registrations.
const BATCH: usize = 16;
/// How long the listener is left alone when we are out of descriptors
/// (it would stay readable, and poll would spin).
const BACKOFF: Duration = Duration::from_millis(50);

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections of one user waiting for their registration.
    pub per_user: usize,
    /// Connections waiting, in all.
    pub total: usize,
    /// How long a connection may wait before it sends its registration.
    pub deadline: Duration,
}

/// Why a connection was closed without a registration.
#[derive(Debug)]
pub enum Closed {
    /// Nothing sent before the deadline.
    Idle(Duration),
    /// Closed unread to make room for a newer connection of the same user
    /// (`per_user`) or, with the table full, anyone's.
    Evicted { waiting: usize, per_user: bool },
    /// It sent something that is not a registration, or hung up.
    Refused(RecvError),
}

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Closed::Idle(d) => write!(
                f,
                "connection idle for {} ms without a registration; closed",
                d.as_millis()
            ),
            Closed::Evicted { waiting, per_user } => write!(
                f,
                "connection closed unread: {waiting} connections {} were waiting (the limit)",
                if *per_user { "of this user" } else { "in all" }
            ),
            Closed::Refused(e) => write!(f, "connection closed: {e}"),
        }
    }
}

pub enum Outcome {
    Registered(Registered),
    /// A switch request, with its connection to answer on.
    Switch(SwitchRequest, OwnedFd),
    /// A route request, with its connection to answer on.
    Route(RouteRequest, OwnedFd),
    Closed {
        peer: Peer,
        why: Closed,
    },
    /// accept() failed for want of descriptors or memory.
    Starved(io::Error),
}

struct Waiting {
    conn: OwnedFd,
    peer: Peer,
    deadline: Instant,
}

pub struct Acceptor {
    listener: UnixListener,
    limits: Limits,
    /// Oldest first.
    waiting: Vec<Waiting>,
    /// The listener is not polled before then.
    backoff_until: Option<Instant>,
}

impl Acceptor {
    pub fn new(listener: UnixListener, limits: Limits) -> Acceptor {
        Acceptor {
            listener,
            limits: Limits {
                per_user: limits.per_user.max(1),
                total: limits.total.max(1),
                ..limits
            },
            waiting: Vec::new(),
            backoff_until: None,
        }
    }

    /// Connections waiting for their registration.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Serves connections until `until` or until something happened (added
    /// to `out`), whichever is first; looks at least once even if `until`
    /// has passed, and never waits past it.
    pub fn wait(&mut self, until: Instant, out: &mut Vec<Outcome>) {
        loop {
            let now = Instant::now();
            self.expire(now, out);
            let mut wake = until;
            for w in &self.waiting {
                wake = wake.min(w.deadline);
            }
            let listening = match self.backoff_until {
                Some(t) if now < t => {
                    wake = wake.min(t);
                    false
                }
                _ => {
                    self.backoff_until = None;
                    true
                }
            };
            let mut fds: Vec<libc::pollfd> = Vec::with_capacity(self.waiting.len() + 1);
            fds.extend(self.waiting.iter().map(|w| libc::pollfd {
                fd: w.conn.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }));
            if listening {
                fds.push(libc::pollfd {
                    fd: self.listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            // Rounded up: waking early would only spin.
            let ms = wake
                .saturating_duration_since(now)
                .as_micros()
                .div_ceil(1000);
            // SAFETY: `fds` is a valid array of `fds.len()` pollfds.
            let r = unsafe {
                libc::poll(
                    fds.as_mut_ptr(),
                    fds.len() as libc::nfds_t,
                    ms.min(i32::MAX as u128) as i32,
                )
            };
            if r > 0 {
                // Descending, so removing one leaves the others' indices.
                for i in (0..self.waiting.len()).rev() {
                    if fds[i].revents != 0 {
                        self.read_waiting(i, out);
                    }
                }
                if listening && fds.last().is_some_and(|p| p.revents != 0) {
                    self.accept_some(out);
                }
            }
            if !out.is_empty() || Instant::now() >= until {
                return;
            }
        }
    }

    /// Closes connections past their deadline.
    fn expire(&mut self, now: Instant, out: &mut Vec<Outcome>) {
        let deadline = self.limits.deadline;
        self.waiting.retain(|w| {
            let keep = w.deadline > now;
            if !keep {
                out.push(Outcome::Closed {
                    peer: w.peer,
                    why: Closed::Idle(deadline),
                });
            }
            keep
        });
    }

    fn read_waiting(&mut self, i: usize, out: &mut Vec<Outcome>) {
        let w = &self.waiting[i];
        match registry::receive(w.conn.as_fd(), w.peer) {
            Err(RecvError::WouldBlock) => {}
            r => {
                let w = self.waiting.remove(i);
                out.push(match r {
                    Ok(Message::Register(reg)) => Outcome::Registered(reg),
                    Ok(Message::Switch(req)) => Outcome::Switch(req, w.conn),
                    Ok(Message::Route(req)) => Outcome::Route(req, w.conn),
                    Err(e) => Outcome::Closed {
                        peer: w.peer,
                        why: Closed::Refused(e),
                    },
                });
            }
        }
    }

    fn accept_some(&mut self, out: &mut Vec<Outcome>) {
        for _ in 0..BATCH {
            // SAFETY: accepting on our listener; null address buffers are
            // allowed (the peer is asked for below).
            let fd = unsafe {
                libc::accept4(
                    self.listener.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            if fd < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR | libc::ECONNABORTED) => continue,
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
                        self.backoff_until = Some(Instant::now() + BACKOFF);
                        out.push(Outcome::Starved(e));
                    }
                    _ => {}
                }
                return;
            }
            // SAFETY: accept4 just returned this descriptor to us alone.
            let conn = unsafe { OwnedFd::from_raw_fd(fd) };
            let Ok(peer) = registry::peer(conn.as_fd()) else {
                continue;
            };
            match registry::receive(conn.as_fd(), peer) {
                Ok(Message::Register(reg)) => out.push(Outcome::Registered(reg)),
                Ok(Message::Switch(req)) => out.push(Outcome::Switch(req, conn)),
                Ok(Message::Route(req)) => out.push(Outcome::Route(req, conn)),
                Err(RecvError::WouldBlock) => self.park(conn, peer, out),
                Err(e) => out.push(Outcome::Closed {
                    peer,
                    why: Closed::Refused(e),
                }),
            }
        }
    }

    /// Lets `conn` wait for its registration, closing the oldest waiting
    /// connection of its user (or anyone's) if there is no room.
    fn park(&mut self, conn: OwnedFd, peer: Peer, out: &mut Vec<Outcome>) {
        let mine: Vec<usize> = (0..self.waiting.len())
            .filter(|&i| self.waiting[i].peer.uid == peer.uid)
            .collect();
        let victim = if mine.len() >= self.limits.per_user {
            Some((mine[0], self.limits.per_user, true))
        } else if self.waiting.len() >= self.limits.total {
            Some((0, self.limits.total, false))
        } else {
            None
        };
        if let Some((i, waiting, per_user)) = victim {
            let w = self.waiting.remove(i);
            out.push(Outcome::Closed {
                peer: w.peer,
                why: Closed::Evicted { waiting, per_user },
            });
        }
        self.waiting.push(Waiting {
            conn,
            peer,
            deadline: Instant::now() + self.limits.deadline,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    fn acceptor(tag: &str, limits: Limits) -> (Acceptor, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("rtprofd-accept-{}-{tag}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("sock");
        let l = registry::listen(&path).unwrap();
        (Acceptor::new(l, limits), path)
    }

    fn serve_for(a: &mut Acceptor, d: Duration) -> Vec<Outcome> {
        let until = Instant::now() + d;
        let mut out = Vec::new();
        while Instant::now() < until {
            a.wait(until, &mut out);
        }
        out
    }

    #[test]
    fn idle_connections_beyond_a_users_limit_close_the_oldest() {
        let limits = Limits {
            per_user: 3,
            total: 10,
            deadline: Duration::from_secs(60),
        };
        let (mut a, path) = acceptor("evict", limits);
        let idle: Vec<_> = (0..5)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        let out = serve_for(&mut a, Duration::from_millis(200));
        assert_eq!(a.waiting(), 3);
        let evicted = out
            .iter()
            .filter(|o| {
                matches!(
                    o,
                    Outcome::Closed {
                        why: Closed::Evicted {
                            waiting: 3,
                            per_user: true
                        },
                        ..
                    }
                )
            })
            .count();
        assert_eq!(evicted, 2);
        // The two oldest were closed: they read end of file.
        for (i, mut s) in idle.iter().enumerate() {
            s.set_nonblocking(true).unwrap();
            let mut b = [0u8; 1];
            let closed = matches!(std::io::Read::read(&mut s, &mut b), Ok(0));
            assert_eq!(closed, i < 2, "connection {i}");
        }
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn a_connection_past_its_deadline_is_closed_and_garbage_refused() {
        let limits = Limits {
            per_user: 8,
            total: 8,
            deadline: Duration::from_millis(50),
        };
        let (mut a, path) = acceptor("deadline", limits);
        let _idle = UnixStream::connect(&path).unwrap();
        let mut junk = UnixStream::connect(&path).unwrap();
        junk.write_all(b"hello, daemon").unwrap();
        let out = serve_for(&mut a, Duration::from_millis(300));
        assert_eq!(a.waiting(), 0);
        let me = std::process::id();
        let mut whys: Vec<String> = out
            .iter()
            .map(|o| match o {
                Outcome::Closed { peer, why } => {
                    assert_eq!(peer.pid, me);
                    why.to_string()
                }
                _ => panic!("only closed connections expected"),
            })
            .collect();
        whys.sort();
        assert_eq!(
            whys,
            [
                "connection closed: not a registration or switch request",
                "connection idle for 50 ms without a registration; closed"
            ]
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    /// A switch request comes out with its sender and its connection, to
    /// answer on; a malformed one is refused like any garbage.
    #[test]
    fn switch_requests_are_read_with_their_connection() {
        let limits = Limits {
            per_user: 8,
            total: 8,
            deadline: Duration::from_millis(500),
        };
        let (mut a, path) = acceptor("switch", limits);
        let mut good = UnixStream::connect(&path).unwrap();
        good.write_all(&rtprof_abi::protocol::switch_request(77, false, "lua_*").unwrap())
            .unwrap();
        let mut bad = UnixStream::connect(&path).unwrap();
        bad.write_all(b"RTPROFS1\x01\0\0\0\x05x").unwrap();
        let mut out = serve_for(&mut a, Duration::from_millis(200));
        out.sort_by_key(|o| matches!(o, Outcome::Closed { .. }));
        match &out[..] {
            [Outcome::Switch(req, conn), Outcome::Closed { why, .. }] => {
                assert_eq!(
                    (req.pid, req.on, req.pattern.as_str()),
                    (77, false, "lua_*")
                );
                assert_eq!(req.from.pid, std::process::id());
                assert!(why.to_string().contains("not a registration"), "{why}");
                // The answer reaches the client.
                let mut f = std::fs::File::from(conn.try_clone().unwrap());
                f.write_all(b"ok\n").unwrap();
                let mut line = [0u8; 3];
                std::io::Read::read_exact(&mut good, &mut line).unwrap();
                assert_eq!(&line, b"ok\n");
            }
            _ => panic!("expected one switch request and one refusal"),
        }
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}
