//! `--output FILE [--format F]`: a report in the format of the tools people
//! already use, the format named or taken from FILE's name. The file is
//! checked before a program runs (a profile lost at the end of a long run
//! is worse than an error at its start) and written after.

mod build_id;
mod destination;
mod folded;
pub mod model;
mod pprof;
mod speedscope;
mod svg;

use crate::error::Error;
pub use destination::Destination;
use model::Profile;
use rtprof_abi::escape::escape_text;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// rtprof's own JSON report (what --json gives).
    Json,
    /// pprof's profile.proto, gzipped (go tool pprof, pprof's web UI).
    Pprof,
    /// Folded stacks, one line per stack (flamegraph.pl, inferno).
    Folded,
    /// A flame graph (SVG, opens in a browser).
    Svg,
    /// speedscope's JSON file format (www.speedscope.app).
    Speedscope,
}

/// File name endings and their formats, longest first (a
/// `.speedscope.json` is not rtprof's JSON). Matched without regard to
/// case.
const ENDINGS: &[(&str, Format)] = &[
    (".speedscope.json", Format::Speedscope),
    (".json", Format::Json),
    (".pb.gz", Format::Pprof),
    (".pprof", Format::Pprof),
    (".folded", Format::Folded),
    (".collapsed", Format::Folded),
    (".svg", Format::Svg),
];

impl Format {
    /// The format a file's name ends in.
    pub fn of_path(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_string_lossy().to_lowercase();
        ENDINGS
            .iter()
            .find(|(end, _)| name.len() > end.len() && name.ends_with(end))
            .map(|&(_, f)| f)
    }
}

/// The file name endings `--output` recognises, for messages and help.
pub fn endings() -> String {
    let v: Vec<&str> = ENDINGS.iter().map(|e| e.0).collect();
    v.join(", ")
}

#[derive(clap::Args)]
pub struct OutputArgs {
    /// Write the report to FILE in the format --format names, or else the
    /// one FILE's name ends in: .json, .pb.gz or .pprof (pprof), .folded or
    /// .collapsed, .svg, .speedscope.json.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The format of --output FILE.
    #[arg(long, value_enum, requires = "output")]
    pub format: Option<Format>,
}

/// A report's destination and format, checked.
pub struct Output {
    pub format: Format,
    path: PathBuf,
    dest: Destination,
}

impl Output {
    /// `--output` as given, checked: its format known, its file writable.
    /// `None` without `--output`.
    pub fn from_args(a: &OutputArgs) -> Result<Option<Output>, String> {
        let Some(path) = &a.output else {
            return Ok(None);
        };
        Output::prepare(path, a.format)
            .map(Some)
            .map_err(|e| format!("--output {}: {e}", shown(path)))
    }

    /// Checks that a report in `format` (else the one `path`'s name ends
    /// in) can be written to `path`.
    pub fn prepare(path: &Path, format: Option<Format>) -> Result<Output, Error> {
        let format = format
            .or_else(|| Format::of_path(path))
            .ok_or_else(|| Error::UnknownFormat { endings: endings() })?;
        Ok(Output {
            format,
            path: path.to_path_buf(),
            dest: Destination::prepare(path)?,
        })
    }

    /// Writes the report: `json` makes rtprof's JSON report, `profile` the
    /// profile the other formats are made from; only the one the format
    /// needs is made. Failures are said on stderr; `false` then.
    pub fn write(self, json: impl FnOnce() -> String, profile: impl FnOnce() -> Profile) -> bool {
        let bytes = match self.format {
            Format::Json => json().into_bytes(),
            f => {
                let profile = profile();
                // Calls alone draw nothing: these formats weigh samples.
                let sampled = matches!(f, Format::Folded | Format::Svg | Format::Speedscope);
                if sampled && profile.samples() == 0 && !profile.processes.is_empty() {
                    eprintln!(
                        "rtprof: no samples were recorded: {} has no stacks",
                        shown(&self.path)
                    );
                }
                render(f, &profile)
            }
        };
        match self.dest.write(&bytes) {
            Ok(()) => true,
            Err(e) => {
                eprintln!(
                    "rtprof: cannot write the report to {}: {e}",
                    shown(&self.path)
                );
                false
            }
        }
    }
}

/// A path as messages show it.
pub fn shown(p: &Path) -> String {
    escape_text(&p.to_string_lossy()).into_owned()
}

/// `profile` in `format` (not JSON, which each command writes its own way).
fn render(format: Format, profile: &Profile) -> Vec<u8> {
    match format {
        // The modules' files are read for their build IDs: the run's, on
        // this machine. rtprofd's rows name no paths.
        Format::Pprof => pprof::pprof(profile, true),
        Format::Folded => folded::folded(profile).into_bytes(),
        Format::Svg => svg::svg(profile),
        Format::Speedscope => speedscope::speedscope(profile).into_bytes(),
        Format::Json => unreachable!("JSON is written by its command"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_come_from_file_names() {
        for (name, want) in [
            ("prof.json", Some(Format::Json)),
            ("out/prof.speedscope.json", Some(Format::Speedscope)),
            ("PROF.SVG", Some(Format::Svg)),
            ("cpu.pb.gz", Some(Format::Pprof)),
            ("cpu.pprof", Some(Format::Pprof)),
            ("stacks.folded", Some(Format::Folded)),
            ("stacks.collapsed", Some(Format::Folded)),
            ("prof.txt", None),
            ("prof.gz", None),
            ("prof", None),
            // Only an ending, no name before it.
            (".svg", None),
            ("/dev/stdout", None),
        ] {
            assert_eq!(Format::of_path(Path::new(name)), want, "{name}");
        }
    }

    #[test]
    fn an_unknown_ending_is_refused_with_the_known_ones() {
        let dir = std::env::temp_dir();
        let e = Output::prepare(&dir.join("prof.dat"), None).err().unwrap();
        let text = e.to_string();
        assert!(
            text.contains(".pb.gz") && text.contains("--format"),
            "{text}"
        );
        // --format decides whatever the name.
        let o = Output::prepare(&dir.join("prof.dat"), Some(Format::Svg)).unwrap();
        assert_eq!(o.format, Format::Svg);
    }
}
