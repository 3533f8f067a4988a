//! The HTTP the metrics need, and no more: `GET /metrics` gets the newest
//! text. One thread waits on every open connection at once (poll) for
//! its request, which must come within a deadline; a connection whose
//! request is in gets its answer, which it must take within a deadline.
//! A client that connects and says nothing holds a place among a bounded
//! few (the oldest gives way), never the thread; one that reads its
//! answer a byte at a time holds the thread for that deadline at most; no
//! number of connections makes the daemon start threads. (tiny_http, used
//! before, has no socket timeouts and starts a thread per connection.)

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Time a client has to send its request, and to take the answer.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(5);
/// Connections waiting for their request, at most.
const WAITING: usize = 32;
/// A request longer than this is refused (Prometheus sends a few hundred
/// bytes).
const MAX_REQUEST: usize = 8192;
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A connection whose request is not all in yet.
struct Waiting {
    stream: TcpStream,
    head: Vec<u8>,
    since: Instant,
}

/// Serves connections from `listener` for ever; `metrics` makes the
/// text of each `GET /metrics`, given to requests that carry `token`
/// (`Authorization: Bearer TOKEN`) or to all if there is none.
pub fn serve(listener: TcpListener, token: Option<Vec<u8>>, metrics: impl Fn() -> String) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    let mut waiting: Vec<Waiting> = Vec::new();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    loop {
        let now = Instant::now();
        waiting.retain(|w| now.duration_since(w.since) < REQUEST_DEADLINE);
        let wait = waiting
            .iter()
            .map(|w| REQUEST_DEADLINE.saturating_sub(now.duration_since(w.since)))
            .min()
            .map_or(-1, |d| d.as_millis() as i32 + 1);
        fds.clear();
        fds.extend(
            std::iter::once(listener.as_raw_fd())
                .chain(waiting.iter().map(|w| w.stream.as_raw_fd()))
                .map(|fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                }),
        );
        // SAFETY: `fds` is a live array of `fds.len()` pollfd records, each
        // naming a descriptor this thread owns (the listener, the waiting
        // streams), which stay open across the call.
        if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait) } < 0 {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        // Requests that came in, answered in order; finished ones leave.
        let ready: Vec<bool> = fds[1..].iter().map(|p| p.revents != 0).collect();
        let mut k = 0;
        waiting.retain_mut(|w| {
            let ready = ready[k];
            k += 1;
            if !ready {
                return true;
            }
            match read_more(w) {
                Some(true) => {
                    answer(&mut w.stream, &w.head, token.as_deref(), &metrics);
                    false
                }
                Some(false) => true,
                None => false,
            }
        });
        if fds[0].revents != 0 {
            while let Ok((stream, _)) = listener.accept() {
                if stream.set_nonblocking(true).is_err() {
                    continue;
                }
                if waiting.len() >= WAITING {
                    waiting.remove(0);
                }
                waiting.push(Waiting {
                    stream,
                    head: Vec::with_capacity(512),
                    since: Instant::now(),
                });
            }
        }
    }
}

/// Reads what a waiting connection sent: `Some(true)` once its request
/// head is in, `Some(false)` if more is to come, `None` if it closed,
/// failed or sent too much.
fn read_more(w: &mut Waiting) -> Option<bool> {
    let mut buf = [0u8; 2048];
    loop {
        match w.stream.read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => w.head.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
        if w.head.len() > MAX_REQUEST {
            return None;
        }
    }
    let done =
        w.head.windows(4).any(|x| x == b"\r\n\r\n") || w.head.windows(2).any(|x| x == b"\n\n");
    Some(done)
}

/// What a request asks for.
#[derive(Debug, PartialEq)]
enum Asked {
    Metrics,
    /// The metrics, without the token they need.
    Unauthorized,
    NotFound,
    BadMethod,
    Bad,
}

/// The request line's verdict, once the head (up to the blank line) is in.
fn parse(head: &[u8]) -> Asked {
    let line = head.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let line = std::str::from_utf8(line).unwrap_or("").trim_end();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Asked::Bad;
    };
    if !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return Asked::Bad;
    }
    if method != "GET" && method != "HEAD" {
        return Asked::BadMethod;
    }
    match target.split('?').next() {
        Some("/metrics") => Asked::Metrics,
        _ => Asked::NotFound,
    }
}

/// The credentials of an `Authorization: Bearer ...` header in `head`.
fn bearer(head: &[u8]) -> Option<&[u8]> {
    head.split(|&b| b == b'\n').skip(1).find_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let colon = line.iter().position(|&b| b == b':')?;
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if !name.eq_ignore_ascii_case(b"authorization") || value.len() < 7 {
            return None;
        }
        let (scheme, rest) = value.split_at(7);
        scheme
            .eq_ignore_ascii_case(b"bearer ")
            .then(|| rest.trim_ascii())
    })
}

/// What a request gets: the metrics only with `token`, if one is wanted.
fn verdict(head: &[u8], token: Option<&[u8]>) -> Asked {
    match (parse(head), token) {
        (Asked::Metrics, Some(t)) => {
            if bearer(head).is_some_and(|given| crate::token::matches(given, t)) {
                Asked::Metrics
            } else {
                Asked::Unauthorized
            }
        }
        (asked, _) => asked,
    }
}

/// Writes `bytes` within what is left of `deadline` from `start`.
fn write_within(stream: &mut TcpStream, bytes: &[u8], start: Instant) -> Option<()> {
    let mut at = 0;
    while at < bytes.len() {
        let left = ANSWER_DEADLINE.checked_sub(start.elapsed())?;
        stream
            .set_write_timeout(Some(left.max(Duration::from_millis(1))))
            .ok()?;
        match stream.write(&bytes[at..(at + 65536).min(bytes.len())]) {
            Ok(0) => return None,
            Ok(n) => at += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(())
}

/// Answers one connection whose request head is in; it is closed when
/// the caller drops it.
fn answer(
    stream: &mut TcpStream,
    head: &[u8],
    token: Option<&[u8]>,
    metrics: &impl Fn() -> String,
) {
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let head_only = head.starts_with(b"HEAD ");
    let asked = verdict(head, token);
    let (status, body) = match asked {
        Asked::Metrics => ("200 OK", metrics()),
        Asked::Unauthorized => (
            "401 Unauthorized",
            String::from("a bearer token is needed (rtprofd --metrics-token-file)\n"),
        ),
        Asked::NotFound => ("404 Not Found", String::from("not found\n")),
        Asked::BadMethod => ("405 Method Not Allowed", String::from("GET only\n")),
        Asked::Bad => ("400 Bad Request", String::from("bad request\n")),
    };
    let content_type = if status.starts_with("200") {
        CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    let challenge = if asked == Asked::Unauthorized {
        "WWW-Authenticate: Bearer realm=\"rtprofd\"\r\n"
    } else {
        ""
    };
    let header = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{challenge}Connection: close\r\n\r\n",
        body.len()
    );
    let start = Instant::now();
    if write_within(stream, header.as_bytes(), start).is_some() && !head_only {
        let _ = write_within(stream, body.as_bytes(), start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_told_apart() {
        for (head, asked) in [
            (
                &b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"[..],
                Asked::Metrics,
            ),
            (b"GET /metrics?x=1 HTTP/1.0\r\n\r\n", Asked::Metrics),
            (b"HEAD /metrics HTTP/1.1\r\n\r\n", Asked::Metrics),
            (b"GET / HTTP/1.1\r\n\r\n", Asked::NotFound),
            (b"POST /metrics HTTP/1.1\r\n\r\n", Asked::BadMethod),
            (b"GET /metrics\r\n\r\n", Asked::Bad),
            (b"GET /metrics SPDY/3\r\n\r\n", Asked::Bad),
            (b"\xff\xfe\r\n\r\n", Asked::Bad),
        ] {
            assert_eq!(parse(head), asked, "{:?}", String::from_utf8_lossy(head));
        }
    }

    #[test]
    fn the_metrics_need_the_token_when_there_is_one() {
        let t = Some(&b"0123456789abcdef"[..]);
        let get = |auth: &str| format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}\r\n");
        for (auth, asked) in [
            ("Authorization: Bearer 0123456789abcdef\r\n", Asked::Metrics),
            (
                "authorization:bearer   0123456789abcdef \r\n",
                Asked::Metrics,
            ),
            (
                "Authorization: Bearer 0123456789abcdeg\r\n",
                Asked::Unauthorized,
            ),
            (
                "Authorization: Basic 0123456789abcdef\r\n",
                Asked::Unauthorized,
            ),
            (
                "X-Authorization: Bearer 0123456789abcdef\r\n",
                Asked::Unauthorized,
            ),
            ("", Asked::Unauthorized),
        ] {
            assert_eq!(verdict(get(auth).as_bytes(), t), asked, "{auth:?}");
        }
        assert_eq!(verdict(get("").as_bytes(), None), Asked::Metrics);
        // Anything else is answered as before.
        assert_eq!(verdict(b"GET / HTTP/1.1\r\n\r\n", t), Asked::NotFound);
    }

    /// A client that connects and says nothing holds the server for the
    /// request deadline at most: a scrape behind it is answered.
    #[test]
    fn a_silent_client_does_not_hold_the_server() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || serve(listener, None, || String::from("# EOF\n")));
        // More silent clients than places: none holds up a scrape.
        let silent: Vec<TcpStream> = (0..WAITING + 8)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let mut s = TcpStream::connect(addr).unwrap();
        // Served one by one, the silent ones would take 80 s first.
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("\r\n\r\n# EOF\n"), "{answer}");
        assert!(answer.contains("Content-Length: 6\r\n"), "{answer}");
        drop(silent);
        // Too long a request is dropped, the server goes on.
        let mut big = TcpStream::connect(addr).unwrap();
        let _ = big.write_all(&vec![b'x'; MAX_REQUEST + 2048]);
        let mut rest = Vec::new();
        let _ = big.read_to_end(&mut rest);
        assert!(rest.is_empty());
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /other HTTP/1.1\r\n\r\n").unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 404 "), "{answer}");
    }
}
