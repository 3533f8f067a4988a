//! Text read from a segment made safe to show. Names in the segments
//! (functions, modules, executables, threads) come from binaries and
//! memory anyone can write, so every reader that prints them escapes them
//! the same way.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `s` made safe to print on a terminal. Function, module and executable
/// names come from binaries and segments anyone can make, and whoever
/// reads a report (root included) must not have their terminal driven by
/// them: control characters (C0, DEL, C1) become `\n`, `\t`, `\r`,
/// `\xHH` or `\u{HHHH}`, and so do the Unicode bidirectional controls
/// that reorder what is shown; a backslash becomes `\\`, so an escape
/// cannot be forged. Every text report of rtprof goes through this (JSON
/// has its own escaping).
pub fn escape_text(s: &str) -> Cow<'_, str> {
    fn special(c: char) -> bool {
        c.is_control()
            || c == '\\'
            || matches!(c, '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    }
    if !s.contains(special) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x80 && special(c) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if special(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_drive_the_terminal() {
        assert!(matches!(escape_text("plain name"), Cow::Borrowed(_)));
        assert_eq!(
            escape_text("\u{e9}t\u{e9} \u{65e5}"),
            "\u{e9}t\u{e9} \u{65e5}"
        );
        assert_eq!(
            escape_text("a\x1b[2Jb\x07\x08\x7f\0\t\n\r\\x1b"),
            "a\\x1b[2Jb\\x07\\x08\\x7f\\x00\\t\\n\\r\\\\x1b"
        );
        // C1 controls (CSI) and bidirectional overrides.
        assert_eq!(
            escape_text("x\u{9b}31m\u{85}\u{202e}cod\u{2066}"),
            "x\\u{9b}31m\\u{85}\\u{202e}cod\\u{2066}"
        );
    }
}
