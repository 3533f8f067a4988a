//! A flame graph (SVG) of the folded stacks, drawn by inferno.

use super::folded::folded;
use super::model::Profile;

pub fn svg(profile: &Profile) -> Vec<u8> {
    let mut opt = inferno::flamegraph::Options::default();
    opt.title = format!("rtprof: {}", profile.name);
    opt.count_name = "samples".into();
    // Colours from the names, not random: the same profile draws the same.
    opt.hash = true;
    opt.deterministic = true;
    let mut out = Vec::new();
    // With no samples inferno still writes an SVG, saying there is nothing
    // to draw, and returns an error; writing into memory cannot fail.
    let _ = inferno::flamegraph::from_lines(&mut opt, folded(profile).lines(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::super::model::tests::sample;
    use super::*;

    #[test]
    fn functions_are_drawn_and_names_escaped() {
        let mut p = sample();
        p.name = "prog <&> x".into();
        p.processes[0].frames[1].name = "std::vector<int>::push_back".into();
        let svg = String::from_utf8(svg(&p)).unwrap();
        assert!(svg.starts_with("<?xml"), "{svg}");
        assert!(svg.contains("rtprof: prog &lt;&amp;&gt; x"), "{svg}");
        assert!(svg.contains("std::vector&lt;int&gt;::push_back"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
    }

    #[test]
    fn no_samples_is_an_svg_that_says_so() {
        let mut p = sample();
        for q in &mut p.processes {
            q.stacks.iter_mut().for_each(|s| s.samples = 0);
        }
        let svg = String::from_utf8(svg(&p)).unwrap();
        assert!(svg.contains("No valid input"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
    }
}
