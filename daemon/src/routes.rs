//! Route requests: relayed to the process's agent through its segment
//! (`Table::route`) and answered, on the requester's connection, once the
//! agent has done it or said why not: a scheduler learns the outcome from
//! the answer itself.

use crate::registry::RouteRequest;
use crate::table::Table;
use rtprof_abi::route::RouteOutcome;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// How long an agent may take: its drain thread looks at requests at
/// least once a second.
const ANSWER_WITHIN: Duration = Duration::from_millis(2500);
/// How often the answers of waiting requests are looked for.
pub const POLL: Duration = Duration::from_millis(5);

struct Waiting {
    conn: OwnedFd,
    req: RouteRequest,
    /// The process's entry in the table, and the request's number.
    key: u64,
    seq: u32,
    deadline: Instant,
}

/// Route requests waiting for their agents' answers.
#[derive(Default)]
pub struct Routes {
    waiting: Vec<Waiting>,
}

impl Routes {
    /// Relays `req`; answers at once if it is refused here.
    pub fn ask(&mut self, table: &mut Table, req: RouteRequest, conn: OwnedFd, now: Instant) {
        match table.route(&req) {
            Ok((key, seq)) => self.waiting.push(Waiting {
                conn,
                req,
                key,
                seq,
                deadline: now + ANSWER_WITHIN,
            }),
            Err(e) => say(conn, &format!("error: {e}")),
        }
    }

    /// Whether any request waits (the acceptor then wakes every [`POLL`]).
    pub fn any(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Answers the requests whose agents have answered, or took too long.
    pub fn poll(&mut self, table: &mut Table, now: Instant) {
        let mut i = 0;
        while i < self.waiting.len() {
            let w = &self.waiting[i];
            let (pid, f, to) = (w.req.pid, &w.req.function, &w.req.implementation);
            let line = match table.route_answer(w.key, w.seq, pid, now >= w.deadline) {
                Ok(Some(code)) => Some(match RouteOutcome::from_code(code) {
                    Some(o) if o.done() => format!("ok: pid {pid}: calls of {f} go to {to} ({})", o.text()),
                    Some(o) => format!("error: pid {pid}: {f} not routed to {to}: {}", o.text()),
                    None => format!("error: pid {pid}: its agent answered with unknown code {code}"),
                }),
                Ok(None) if now >= w.deadline => Some(format!(
                    "error: pid {pid}: its agent did not answer within {} ms (no drain thread runs where sampling is off); the request stays with it and may still be carried out",
                    ANSWER_WITHIN.as_millis()
                )),
                Ok(None) => None,
                Err(e) => Some(format!("error: {e}")),
            };
            match line {
                Some(line) => {
                    let w = self.waiting.swap_remove(i);
                    say(w.conn, &line);
                }
                None => i += 1,
            }
        }
    }
}

/// Writes one line on `conn` (non-blocking: a requester that does not read
/// loses it).
fn say(conn: OwnedFd, line: &str) {
    let mut f = std::fs::File::from(conn);
    let _ = std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes());
}
