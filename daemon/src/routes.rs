//! Route requests: relayed to the process's agent through its segment
//! (`Table::route`) and answered, on the requester's connection, once the
//! agent has done it or said why not: a scheduler learns the outcome from
//! the answer itself. A request the agent has not taken when its time is
//! up is withdrawn (see `rtprof_abi::route`): the agent will never carry
//! it out, and the answer says so, and why the process did not take it
//! (stopped, ended, or no thread of its agent serves requests).

use crate::registry::RouteRequest;
use crate::table::Table;
use rtprof_abi::route::{monotonic_ns, RequestState, RouteOutcome};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// How long an agent may take: its drain thread looks at requests at
/// least once a second.
const ANSWER_WITHIN: Duration = Duration::from_millis(2500);
/// How much longer an agent that took a request in time may take to
/// answer (a process stopped while it carried the request out).
const FINISH_WITHIN: Duration = Duration::from_millis(5000);
/// How often the answers of waiting requests are looked for.
pub const POLL: Duration = Duration::from_millis(5);

struct Waiting {
    conn: OwnedFd,
    req: RouteRequest,
    /// The process's entry in the table, and the request's number.
    key: u64,
    seq: u32,
    /// When the request expires, on the clock of `monotonic_ns`.
    expires_ns: u64,
    deadline: Instant,
}

/// What `/proc/PID/stat` says of a process's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcState {
    Running,
    /// Stopped by a signal, or (`traced`) by a debugger.
    Stopped {
        traced: bool,
    },
    /// Ended and not yet reaped by its parent.
    Zombie,
    /// No such process (or its state cannot be read).
    Gone,
}

impl ProcState {
    pub fn of(pid: u32) -> ProcState {
        match std::fs::read(format!("/proc/{pid}/stat")) {
            Ok(stat) => ProcState::parse(&stat),
            Err(_) => ProcState::Gone,
        }
    }

    /// The state letter follows the last `)` (the command name, in
    /// parentheses, may hold any byte).
    fn parse(stat: &[u8]) -> ProcState {
        let Some(close) = stat.iter().rposition(|&c| c == b')') else {
            return ProcState::Gone;
        };
        match stat.get(close + 2) {
            Some(b'T') => ProcState::Stopped { traced: false },
            Some(b't') => ProcState::Stopped { traced: true },
            Some(b'Z' | b'X' | b'x') => ProcState::Zombie,
            Some(_) => ProcState::Running,
            None => ProcState::Gone,
        }
    }

    /// Whether the process has ended (a zombie has: it runs no more).
    pub fn ended(self) -> bool {
        matches!(self, ProcState::Zombie | ProcState::Gone)
    }
}

/// Why an agent did not take a request in time, from its process's state.
fn why_not_taken(pid: u32) -> String {
    match ProcState::of(pid) {
        ProcState::Stopped { traced: false } => {
            "the process is stopped (SIGSTOP or another stop signal)".to_string()
        }
        ProcState::Stopped { traced: true } => "the process is stopped by a debugger".to_string(),
        ProcState::Zombie | ProcState::Gone => "the process has ended".to_string(),
        ProcState::Running => format!(
            "its agent did not take it within {} ms (no thread of it serves requests where sampling is off and no budget runs)",
            ANSWER_WITHIN.as_millis()
        ),
    }
}

/// Route requests waiting for their agents' answers.
#[derive(Default)]
pub struct Routes {
    waiting: Vec<Waiting>,
}

impl Routes {
    /// Relays `req`; answers at once if it is refused here.
    pub fn ask(&mut self, table: &mut Table, req: RouteRequest, conn: OwnedFd, now: Instant) {
        let expires_ns = monotonic_ns().saturating_add(ANSWER_WITHIN.as_nanos() as u64);
        match table.route(&req, expires_ns) {
            Ok((key, seq)) => self.waiting.push(Waiting {
                conn,
                req,
                key,
                seq,
                expires_ns,
                deadline: now + ANSWER_WITHIN + FINISH_WITHIN,
            }),
            Err(e) => say(conn, &format!("error: {e}")),
        }
    }

    /// Whether any request waits (the acceptor then wakes every [`POLL`]).
    pub fn any(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Answers the requests whose agents have answered, whose time is up
    /// (withdrawn), or that were taken and not finished in time.
    pub fn poll(&mut self, table: &mut Table, now: Instant) {
        let mut i = 0;
        while i < self.waiting.len() {
            let w = &self.waiting[i];
            let (pid, f, to) = (w.req.pid, &w.req.function, &w.req.implementation);
            let giving_up = now >= w.deadline;
            let line = match table.route_state(w.key, w.seq, pid, w.expires_ns, giving_up) {
                Ok(RequestState::Answered(code)) => Some(match RouteOutcome::from_code(code) {
                    Some(o) if o.done() => format!("ok: pid {pid}: calls of {f} go to {to} ({})", o.text()),
                    Some(o) => format!("error: pid {pid}: {f} not routed to {to}: {}", o.text()),
                    None => format!("error: pid {pid}: its agent answered with unknown code {code}"),
                }),
                Ok(RequestState::Withdrawn) => Some(format!(
                    "error: pid {pid}: {f} not routed to {to}: {}; the request is withdrawn and will not be carried out",
                    why_not_taken(pid)
                )),
                Ok(RequestState::Replaced) => Some(format!(
                    "error: pid {pid}: its segment holds another request; {f} not routed to {to}"
                )),
                Ok(RequestState::Taken) if giving_up => Some(format!(
                    "error: pid {pid}: its agent took the request in time but has not finished it within {} ms ({}); it may still be carried out",
                    (ANSWER_WITHIN + FINISH_WITHIN).as_millis(),
                    why_not_taken(pid)
                )),
                Ok(RequestState::Waiting | RequestState::Taken) => None,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_states_are_read_after_the_command_name() {
        let p = |s: &str| ProcState::parse(s.as_bytes());
        assert_eq!(p("42 (sleep) S 1 42"), ProcState::Running);
        assert_eq!(
            p("42 (a) T (b) R 1"),
            ProcState::Running,
            "a name with ') T '"
        );
        assert_eq!(p("42 (x) T 1"), ProcState::Stopped { traced: false });
        assert_eq!(p("42 (x) t 1"), ProcState::Stopped { traced: true });
        assert_eq!(p("42 (x) Z 1"), ProcState::Zombie);
        assert_eq!(p("42 (x"), ProcState::Gone);
        assert_eq!(ProcState::of(std::process::id()), ProcState::Running);
        assert!(ProcState::Zombie.ended() && !ProcState::Stopped { traced: false }.ended());
    }
}
