//! Routing a function's calls to an implementation the program offered:
//! the outcomes an agent answers a route request with (stored in the
//! segment's `control_kind`), and the request itself in the segment's
//! pattern area (`function\0implementation`).

use crate::layout::control::PATTERN_MAX;

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
