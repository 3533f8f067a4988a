//! `*` and `?` globbing, as a user types names of libraries and functions
//! (`RTPROF_MODULES`, `RTPROF_COUNT`, `rtprof switch`).

/// Whether `s` matches `pat`, where `*` is any run of bytes and `?` any one.
pub fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while i < s.len() {
        if p < pat.len() && (pat[p] == b'?' || pat[p] == s[i]) {
            p += 1;
            i += 1;
        } else if p < pat.len() && pat[p] == b'*' {
            star = Some(p);
            mark = i;
            p += 1;
        } else if let Some(sp) = star {
            p = sp + 1;
            mark += 1;
            i = mark;
        } else {
            return false;
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn stars_and_questions() {
        assert!(glob_match(b"lua_*", b"lua_settop"));
        assert!(glob_match(b"*", b""));
        assert!(glob_match(b"l?a*p", b"lua_settop"));
        assert!(!glob_match(b"lua_*", b"luaV_execute"));
        assert!(!glob_match(b"hot", b"hot1"));
    }
}
