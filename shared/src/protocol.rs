//! What is said on rtprofd's socket: an agent's registration (the greeting
//! with its segment's descriptor attached) and a client's request to switch
//! counting in a followed process (answered with one line, `ok: ...` or
//! `error: ...`).

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
}
