//! The text of /etc/ld.so.preload, read as the dynamic loader reads it:
//! `#` starts a comment that runs to the end of the line, and entries are
//! separated by spaces, tabs, newlines or colons. Adding and removing our
//! entry touches nothing else: other entries, comments, blank lines and
//! their order stay byte for byte.

/// The loader's separators between entries.
const SEPARATORS: &[char] = &[' ', '\t', '\n', ':'];

/// The part of a line the loader reads (before any `#`).
fn code(line: &str) -> &str {
    line.split('#').next().unwrap_or("")
}

/// Every entry, in the loader's order.
pub fn entries(text: &str) -> Vec<&str> {
    text.split('\n')
        .flat_map(|l| code(l).split(SEPARATORS))
        .filter(|e| !e.is_empty())
        .collect()
}

pub fn contains(text: &str, path: &str) -> bool {
    entries(text).contains(&path)
}

/// Entries that look like an rtprof agent, wherever installed.
pub fn agents(text: &str) -> Vec<&str> {
    entries(text)
        .into_iter()
        .filter(|e| e.rsplit('/').next() == Some("librtprof.so"))
        .collect()
}

/// `text` with `path` on a line of its own at the end (the agent is
/// loaded after the libraries already listed), or `None` if the loader
/// already loads it.
pub fn with_entry(text: &str, path: &str) -> Option<String> {
    if contains(text, path) {
        return None;
    }
    let mut out = String::with_capacity(text.len() + path.len() + 2);
    out.push_str(text);
    // A last line without its newline would run into ours.
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(path);
    out.push('\n');
    Some(out)
}

/// `text` without `path`, or `None` if it has no such entry. A line that
/// held only our entry goes with it; on a line that lists others too, only
/// our entry and one separator go, and its comment stays.
pub fn without_entry(text: &str, path: &str) -> Option<String> {
    if !contains(text, path) {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, newline) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        let code = code(body);
        let comment = &body[code.len()..];
        let ours = |e: &&str| *e == path;
        if !code.split(SEPARATORS).any(|e| ours(&e)) {
            out.push_str(line);
            continue;
        }
        let others: Vec<&str> = code
            .split(SEPARATORS)
            .filter(|e| !e.is_empty() && !ours(e))
            .collect();
        if others.is_empty() && comment.is_empty() {
            continue;
        }
        out.push_str(&others.join(" "));
        if !others.is_empty() && !comment.is_empty() {
            out.push(' ');
        }
        out.push_str(comment);
        out.push_str(newline);
    }
    Some(out)
}

/// Whether a file holding `text` would make the loader preload nothing (so
/// it can go when it did not exist before).
pub fn is_empty(text: &str) -> bool {
    entries(text).is_empty() && text.trim().is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGENT: &str = "/usr/lib/rtprof/librtprof.so";

    #[test]
    fn reads_entries_as_the_loader_does() {
        let text = "# preloads\n/lib/a.so:/lib/b.so  /lib/c.so # not /lib/d.so\n\n\t/lib/e.so";
        assert_eq!(
            entries(text),
            ["/lib/a.so", "/lib/b.so", "/lib/c.so", "/lib/e.so"]
        );
        assert!(!contains("# /usr/lib/rtprof/librtprof.so\n", AGENT));
        assert!(contains("/lib/a.so:/usr/lib/rtprof/librtprof.so\n", AGENT));
        assert_eq!(
            agents("/usr/local/lib/librtprof.so /lib/x.so\n"),
            ["/usr/local/lib/librtprof.so"]
        );
    }

    #[test]
    fn adds_a_line_at_the_end_keeping_the_rest() {
        assert_eq!(with_entry("", AGENT).unwrap(), format!("{AGENT}\n"));
        let text = "# keep me\n/lib/x86_64-linux-gnu/libm.so.6\n";
        assert_eq!(with_entry(text, AGENT).unwrap(), format!("{text}{AGENT}\n"));
        // No newline after the last line: one is added before ours.
        assert_eq!(
            with_entry("/lib/a.so", AGENT).unwrap(),
            format!("/lib/a.so\n{AGENT}\n")
        );
        assert_eq!(with_entry(&format!("{AGENT}\n"), AGENT), None);
        assert_eq!(with_entry(&format!("/lib/a.so:{AGENT}"), AGENT), None);
    }

    #[test]
    fn removing_undoes_adding() {
        for text in ["", "/lib/a.so\n", "/lib/a.so", "# c\n\n/lib/a.so\n# end"] {
            let added = with_entry(text, AGENT).unwrap();
            let removed = without_entry(&added, AGENT).unwrap();
            // What adding put in for a missing newline stays: harmless.
            let expected = if text.is_empty() || text.ends_with('\n') {
                text.to_string()
            } else {
                format!("{text}\n")
            };
            assert_eq!(removed, expected, "{text:?}");
        }
    }

    #[test]
    fn removes_only_our_entry() {
        let text = format!("/lib/a.so\n{AGENT}\n# after\n/lib/b.so\n");
        assert_eq!(
            without_entry(&text, AGENT).unwrap(),
            "/lib/a.so\n# after\n/lib/b.so\n"
        );
        // Sharing a line: the others and the comment stay.
        let text = format!("/lib/a.so:{AGENT} /lib/b.so # both\n");
        assert_eq!(
            without_entry(&text, AGENT).unwrap(),
            "/lib/a.so /lib/b.so # both\n"
        );
        let text = format!("{AGENT} # ours\n");
        assert_eq!(without_entry(&text, AGENT).unwrap(), "# ours\n");
        // Every occurrence goes; a commented-out one is not an entry.
        let text = format!("{AGENT}\n# {AGENT}\n{AGENT}");
        assert_eq!(without_entry(&text, AGENT).unwrap(), format!("# {AGENT}\n"));
        assert_eq!(without_entry("/lib/a.so\n", AGENT), None);
        assert_eq!(without_entry(&format!("# {AGENT}\n"), AGENT), None);
    }

    #[test]
    fn an_empty_file_preloads_nothing() {
        assert!(is_empty(""));
        assert!(is_empty(" \n\n"));
        assert!(!is_empty("# a comment\n"));
        assert!(!is_empty("/lib/a.so"));
    }
}
