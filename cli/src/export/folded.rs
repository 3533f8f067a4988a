//! Folded stacks, the input of flamegraph.pl and inferno: one line per
//! stack, `exe;frame;...;leaf count`, the root first, `count` its
//! samples. Processes of one executable share its root.

use super::model::Profile;
use rtprof_abi::escape::escape_text;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// A frame's name as a folded line can hold it: `;` separates frames, so
/// a `;` in a name becomes `:`; control characters are escaped as in the
/// text report (a newline would end the line). Spaces stay: readers take
/// the count after the line's last space.
fn frame_text(name: &str) -> Cow<'_, str> {
    match escape_text(name) {
        Cow::Borrowed(n) if !n.contains(';') => Cow::Borrowed(n),
        n => Cow::Owned(n.replace(';', ":")),
    }
}

/// `profile`'s sampled stacks, folded, sorted; stacks without samples are
/// left out (they would have no width in a flame graph).
pub fn folded(profile: &Profile) -> String {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for p in &profile.processes {
        for s in p.stacks.iter().filter(|s| s.samples > 0) {
            let mut stack = frame_text(p.exe_name()).into_owned();
            for f in p.frames_of(s) {
                stack.push(';');
                stack.push_str(&frame_text(&f.name));
            }
            // Copies of one function, and one executable's processes,
            // are one line.
            *lines.entry(stack).or_default() += s.samples;
        }
    }
    let mut out = String::new();
    for (stack, n) in lines {
        out.push_str(&stack);
        out.push(' ');
        out.push_str(&n.to_string());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::model::tests::sample;
    use super::*;

    #[test]
    fn one_line_per_stack_with_copies_and_processes_merged() {
        let p = sample();
        let text = folded(&p);
        assert_eq!(
            text,
            "prog;[libc.so.6] 6\nprog;[unknown] 2\nprog;hot 44\nprog;main 2\n"
        );
        let sum: u64 = text
            .lines()
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
            .sum();
        assert_eq!(sum, p.samples());
    }

    #[test]
    fn names_cannot_split_frames_or_lines() {
        let mut p = sample();
        p.processes.truncate(1);
        let q = &mut p.processes[0];
        q.exe = "/bin/my prog;1".into();
        q.frames[0].name = "operator()(int, std::vector<int>)".into();
        q.frames[1].name = "a;b\nc".into();
        q.stacks.truncate(2);
        assert_eq!(
            folded(&p),
            "my prog:1;a:b\\nc 30\nmy prog:1;operator()(int, std::vector<int>) 1\n"
        );
    }
}
