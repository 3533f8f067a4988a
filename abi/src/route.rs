//! Routing a function's calls to an implementation the program offered:
//! the outcomes an agent answers a route request with (stored in the
//! segment's `control_kind`), the request itself (`function\0implementation`
//! on rtprofd's socket; in the segment's pattern area followed by the
//! moment it expires), and how a request that was not taken in time is
//! withdrawn.
//!
//! Withdrawing: rtprofd cannot take a request back out of a process that
//! does not run (stopped, or without a thread that serves requests), so
//! the request carries the moment it expires, on the system's monotonic
//! clock, and both sides decide by that moment and one word. The agent
//! first marks the request taken (`control_kind` from [`control::ROUTE`]
//! to [`control::CLAIMED`], a compare-exchange), then reads the clock, and
//! carries it out only if the moment has not come. rtprofd, once the
//! moment has come (clock read first), reads that word: still
//! `ROUTE`, the request is withdrawn, since any later mark would be
//! followed by a clock read past the moment, and the agent answers
//! [`RouteOutcome::Withdrawn`] whenever it gets to it. `CLAIMED`, the
//! agent is carrying it out. (Both read the same clock: a process in
//! another time namespace, whose monotonic clock is offset, is not
//! supported.)

use crate::layout::control::{self, PATTERN_MAX};
use std::sync::atomic::{fence, Ordering};

/// The implementation name that sends calls back to the function's own
/// code.
pub const ORIGINAL: &str = "original";

crate::codes::abi_codes! {
/// How an agent answered a route request.
pub enum RouteOutcome {
    /// The calls go to the implementation asked for from now on.
    Routed = 0,
    /// No patched function of that name.
    NotPatched = 1,
    /// The function has no implementation of that name.
    NotOffered = 2,
    /// The process runs under an overhead budget, which switches entries
    /// between the jump and their own bytes: its calls cannot all be
    /// routed.
    Budget = 3,
    /// The agent was loaded by `rtprof attach`, which routes nothing.
    Attached = 4,
    /// The function's stub could not be rewritten.
    Failed = 5,
    /// The request was not `function\0implementation`.
    Malformed = 6,
    /// Already so: nothing changed.
    Unchanged = 7,
    /// A library is being unloaded (`dlclose`) and the implementation
    /// lies in one that might be.
    Unloading = 8,
    /// The request came after the moment it expired, when rtprofd had
    /// withdrawn it: nothing was done.
    Withdrawn = 9,
}
}

impl RouteOutcome {
    /// Why, as a sentence an answer ends with.
    pub fn text(self) -> &'static str {
        match self {
            RouteOutcome::Routed => "routed",
            RouteOutcome::NotPatched => "no patched function of that name",
            RouteOutcome::NotOffered => "the program offered no implementation of that name for it",
            RouteOutcome::Budget => {
                "the process runs under an overhead budget, which switches entries between the jump and their own bytes, so its calls cannot all be routed"
            }
            RouteOutcome::Attached => "an agent loaded by rtprof attach routes no calls",
            RouteOutcome::Failed => "its stub could not be rewritten",
            RouteOutcome::Malformed => "malformed request",
            RouteOutcome::Unchanged => "already so",
            RouteOutcome::Unloading => "a library is being unloaded and the implementation may lie in it; ask again",
            RouteOutcome::Withdrawn => "the request was withdrawn before its agent took it; nothing changed",
        }
    }

    /// Whether the calls now go where they were asked to.
    pub fn done(self) -> bool {
        matches!(self, RouteOutcome::Routed | RouteOutcome::Unchanged)
    }
}

/// The request's bytes in the pattern area, or `None` if the names are
/// empty, hold a NUL or do not fit.
pub fn request_bytes(function: &str, implementation: &str) -> Option<Vec<u8>> {
    if function.is_empty()
        || implementation.is_empty()
        || function.contains('\0')
        || implementation.contains('\0')
        || function.len() + 1 + implementation.len() > PATTERN_MAX
    {
        return None;
    }
    let mut b = function.as_bytes().to_vec();
    b.push(0);
    b.extend_from_slice(implementation.as_bytes());
    Some(b)
}

/// The bytes of a route request in a segment's pattern area: the names
/// as [`request_bytes`] has them, a NUL, and the moment the request
/// expires ([`monotonic_ns`], 8 bytes little-endian).
pub fn segment_request(function: &str, implementation: &str, expires_ns: u64) -> Option<Vec<u8>> {
    let mut b = request_bytes(function, implementation)?;
    if b.len() + 9 > PATTERN_MAX {
        return None;
    }
    b.push(0);
    b.extend_from_slice(&expires_ns.to_le_bytes());
    Some(b)
}

/// (function, implementation, expiry) of a segment request's bytes.
pub fn parse_segment_request(b: &[u8]) -> Option<(&[u8], &[u8], u64)> {
    let cut = b.len().checked_sub(9)?;
    let (names, tail) = b.split_at(cut);
    if tail[0] != 0 {
        return None;
    }
    let expires = u64::from_le_bytes(tail[1..].try_into().ok()?);
    let (f, i) = parse_request(names)?;
    Some((f, i, expires))
}

/// The system's monotonic clock, in ns: what a request's expiry is on.
/// Memory accesses after the call are not done before the clock is read.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live local that clock_gettime fills.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    // The clock is read from the time-stamp counter, which the processor
    // may read after later loads: an lfence keeps them after it.
    #[cfg(target_arch = "x86_64")]
    // SAFETY: lfence has no operands and only orders instructions.
    unsafe {
        std::arch::x86_64::_mm_lfence()
    };
    fence(Ordering::SeqCst);
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Where a route request rtprofd left stands, as rtprofd reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestState {
    /// The agent answered with this code.
    Answered(u32),
    /// Not taken, and the moment it expires has not come.
    Waiting,
    /// The agent took it in time and is carrying it out.
    Taken,
    /// Not taken by the moment it expired: it never will be carried out.
    Withdrawn,
    /// The segment holds another request now.
    Replaced,
}

/// Reads request `seq`'s state from the segment's header `bytes` (read
/// only, changed by the agent meanwhile), given its expiry: the clock is
/// read first (see the module's documentation).
pub fn request_state(bytes: &[u8], seq: u32, expires_ns: u64) -> RequestState {
    let now = monotonic_ns();
    let word = |off: usize| {
        bytes.get(off..off + 4).map_or(0, |w| {
            // SAFETY: four bytes of `bytes` (checked by `get`); the
            // segment's header words are 4-aligned in an 8-aligned
            // mapping and written atomically, so one aligned read sees
            // one value. Volatile: the agent changes them.
            unsafe { std::ptr::read_volatile(w.as_ptr() as *const u32) }
        })
    };
    let (s, ack) = (word(control::SEQ), word(control::ACK));
    fence(Ordering::Acquire);
    let kind = word(control::KIND);
    if s != seq {
        RequestState::Replaced
    } else if ack == seq {
        RequestState::Answered(kind)
    } else if now < expires_ns {
        RequestState::Waiting
    } else if kind == control::CLAIMED {
        RequestState::Taken
    } else {
        RequestState::Withdrawn
    }
}

/// (function, implementation) of a request's bytes.
pub fn parse_request(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let nul = b.iter().position(|&c| c == 0)?;
    let (f, i) = (&b[..nul], &b[nul + 1..]);
    (!f.is_empty() && !i.is_empty() && !i.contains(&0)).then_some((f, i))
}

/// The name of the row of implementation `implementation` of `function`.
pub fn row_name(function: &[u8], implementation: &[u8]) -> Vec<u8> {
    let mut n = function.to_vec();
    n.extend_from_slice(b" [");
    n.extend_from_slice(implementation);
    n.push(b']');
    n
}

/// The implementation's name in the name of its row, given the name of
/// the function it implements.
pub fn implementation_in<'a>(row: &'a str, function: &str) -> Option<&'a str> {
    row.strip_prefix(function)?
        .strip_prefix(" [")?
        .strip_suffix(']')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_row_names_round_trip() {
        let b = request_bytes("work", "fast").unwrap();
        assert_eq!(parse_request(&b), Some((&b"work"[..], &b"fast"[..])));
        assert!(request_bytes("", "fast").is_none());
        assert!(request_bytes("a\0b", "fast").is_none());
        assert!(request_bytes(&"x".repeat(PATTERN_MAX), "y").is_none());
        assert_eq!(parse_request(b"work"), None, "no separator");
        assert_eq!(parse_request(b"work\0"), None, "no implementation");
        let row = row_name(b"work", b"fast");
        assert_eq!(row, b"work [fast]");
        assert_eq!(implementation_in("work [fast]", "work"), Some("fast"));
        assert_eq!(implementation_in("work [fast]", "wor"), None);
    }

    #[test]
    fn segment_requests_carry_their_expiry() {
        let b = segment_request("work", "fast", 0x0102_0000_0000_0003).unwrap();
        assert_eq!(
            parse_segment_request(&b),
            Some((&b"work"[..], &b"fast"[..], 0x0102_0000_0000_0003))
        );
        // A zero byte inside the expiry is no separator.
        let z = segment_request("work", "fast", 0).unwrap();
        assert_eq!(
            parse_segment_request(&z),
            Some((&b"work"[..], &b"fast"[..], 0))
        );
        assert_eq!(parse_segment_request(b"work\0fast"), None);
        assert!(segment_request(&"x".repeat(PATTERN_MAX - 8), "y", 1).is_none());
    }

    /// The agent and rtprofd decide a request's fate by the mark and the
    /// clock: taken in time, it is carried out (and rtprofd, past the
    /// moment, sees it taken); not taken by then, rtprofd sees it
    /// withdrawn and the agent's later claim fails.
    #[test]
    fn a_request_not_taken_in_time_is_withdrawn_on_both_sides() {
        use crate::layout::{Capacities, Layout};
        use std::sync::atomic::AtomicU32;
        let layout = Layout::new(Capacities {
            modules: 2,
            functions: 4,
            strings: 64,
            stripes: 2,
        });
        let mut buf = vec![0u64; (layout.total_size / 8) as usize];
        let base = buf.as_mut_ptr() as *mut u8;
        // SAFETY: zeroed, 8-aligned, `total_size` bytes, alive for the test.
        let w = unsafe { crate::SegmentWriter::init(base, layout, 7, 1, 5) };
        let c = *w.counters();
        // What rtprofd writes to leave request `seq`.
        let leave = |seq: u32| {
            for (off, v) in [(control::KIND, control::ROUTE), (control::SEQ, seq)] {
                // SAFETY: a u32 word of the header inside `buf`.
                unsafe { AtomicU32::from_ptr(base.add(off) as *mut u32) }
                    .store(v, Ordering::SeqCst);
            }
        };
        // SAFETY: the whole buffer, read while nothing writes it.
        let bytes = || unsafe { std::slice::from_raw_parts(base, layout.total_size as usize) };
        let later = monotonic_ns() + 60_000_000_000;
        let past = monotonic_ns().saturating_sub(1);

        leave(1);
        assert_eq!(request_state(bytes(), 1, later), RequestState::Waiting);
        assert!(c.control_claim(later), "taken in time");
        assert_eq!(request_state(bytes(), 1, past), RequestState::Taken);
        c.control_answer(1, RouteOutcome::Routed);
        assert_eq!(request_state(bytes(), 1, past), RequestState::Answered(0));

        leave(2);
        assert_eq!(request_state(bytes(), 2, past), RequestState::Withdrawn);
        assert!(!c.control_claim(past), "withdrawn: never carried out");
        c.control_answer(2, RouteOutcome::Withdrawn);
        assert_eq!(
            request_state(bytes(), 2, past),
            RequestState::Answered(RouteOutcome::Withdrawn.code())
        );
        assert_eq!(request_state(bytes(), 1, past), RequestState::Replaced);
    }

    #[test]
    fn only_routed_and_unchanged_are_done() {
        for o in RouteOutcome::ALL {
            assert_eq!(
                o.done(),
                matches!(o, RouteOutcome::Routed | RouteOutcome::Unchanged)
            );
            assert!(!o.text().is_empty());
        }
    }
}
