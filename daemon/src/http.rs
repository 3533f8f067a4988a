//! The HTTP the metrics need, and no more: one thread serves one
//! connection at a time, `GET /metrics` gets the newest text, and every
//! connection has a deadline to send its request and one to take the
//! answer. A client that connects and says nothing, or reads its answer a
//! byte at a time, holds the thread for those few seconds at most, and no
//! number of connections makes the daemon start threads or buffer more
//! than one request. (tiny_http, used before, has no socket timeouts and
//! starts a thread per connection.)

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Time a client has to send its request, and to take the answer.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(5);
/// A request longer than this is refused (Prometheus sends a few hundred
/// bytes).
const MAX_REQUEST: usize = 8192;
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves connections from `listener` for ever; `metrics` makes the
/// text of each `GET /metrics`.
pub fn serve(listener: TcpListener, metrics: impl Fn() -> String) {
    loop {
        match listener.accept() {
            Ok((stream, _)) => answer(stream, &metrics),
            // Out of descriptors and the like: wait rather than spin.
            Err(e) if e.kind() != ErrorKind::Interrupted => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(_) => {}
        }
    }
}

/// What a request asks for.
#[derive(Debug, PartialEq)]
enum Asked {
    Metrics,
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

/// Reads the request head within [`REQUEST_DEADLINE`]; `None` if the
/// client did not send one in time (or sent too much).
fn read_head(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let start = Instant::now();
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let left = REQUEST_DEADLINE.checked_sub(start.elapsed())?;
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .ok()?;
        match stream.read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
        if head.len() > MAX_REQUEST {
            return None;
        }
    }
    Some(head)
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

/// Answers one connection, then closes it.
fn answer(mut stream: TcpStream, metrics: &impl Fn() -> String) {
    let Some(head) = read_head(&mut stream) else {
        return;
    };
    let head_only = head.starts_with(b"HEAD ");
    let (status, body) = match parse(&head) {
        Asked::Metrics => ("200 OK", metrics()),
        Asked::NotFound => ("404 Not Found", String::from("not found\n")),
        Asked::BadMethod => ("405 Method Not Allowed", String::from("GET only\n")),
        Asked::Bad => ("400 Bad Request", String::from("bad request\n")),
    };
    let content_type = if status.starts_with("200") {
        CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    let header = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let start = Instant::now();
    if write_within(&mut stream, header.as_bytes(), start).is_some() && !head_only {
        let _ = write_within(&mut stream, body.as_bytes(), start);
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

    /// A client that connects and says nothing holds the server for the
    /// request deadline at most: a scrape behind it is answered.
    #[test]
    fn a_silent_client_does_not_hold_the_server() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || serve(listener, || String::from("# EOF\n")));
        let silent: Vec<TcpStream> = (0..1).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let mut s = TcpStream::connect(addr).unwrap();
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
