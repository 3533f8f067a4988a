//! Helpers the benchmarks share: medians, arguments, where the build is.

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// The directory of the running benchmark (target/release), where
/// `librtprof.so` and `rtprof` are built too.
pub fn here() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

/// What a benchmark takes on its command line: options followed by a
/// number, options followed by text, and flags.
pub struct Takes<'a> {
    pub numbers: &'a [&'a str],
    pub texts: &'a [&'a str],
    pub flags: &'a [&'a str],
}

/// Checks the command line against what the benchmark `takes`, before it
/// runs anything: `--help` (or `-h`) prints `usage` and exits 0; an
/// unknown option or argument, an option without its value, or a number
/// that is not one exits 2 with a message and the usage.
pub fn check_args(usage: &str, takes: &Takes) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = parse_args(&args, takes) {
        if e.is_empty() {
            println!("{usage}");
            std::process::exit(0);
        }
        let me = std::env::args().next().unwrap_or_default();
        let me = Path::new(&me)
            .file_name()
            .map_or(me.clone(), |n| n.to_string_lossy().into());
        eprintln!("{me}: {e}\n{usage}");
        std::process::exit(2);
    }
}

/// `Err("")` for `--help`; else why `args` are not what `takes` allows.
fn parse_args(args: &[String], takes: &Takes) -> Result<(), String> {
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "--help" || a == "-h" {
            return Err(String::new());
        }
        if takes.flags.contains(&a) {
            i += 1;
            continue;
        }
        let number = takes.numbers.contains(&a);
        if !number && !takes.texts.contains(&a) {
            return Err(format!("unknown option {a:?}"));
        }
        let v = args.get(i + 1).ok_or(format!("{a} needs a value"))?;
        if number && v.parse::<f64>().map_or(true, |x| !x.is_finite()) {
            return Err(format!("{a} {v:?}: not a number"));
        }
        i += 2;
    }
    Ok(())
}

/// The number after `name` on the command line, or `default`.
pub fn arg(name: &str, default: f64) -> f64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("number"))
        .unwrap_or(default)
}

/// The text after `name` on the command line, if any.
#[allow(dead_code)] // not every benchmark takes text arguments
pub fn arg_text(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// Whether `name` is on the command line.
#[allow(dead_code)] // not every benchmark takes flags
pub fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

/// `workloads/NAME.c` built with `gcc -O2 -pthread` into `dir/NAME`.
#[allow(dead_code)] // not every benchmark builds a workload
pub fn compile_workload(name: &str, dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("workloads/{name}.c"));
    let bin = dir.join(name);
    let st = Command::new("gcc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("gcc runs");
    assert!(st.success(), "compiling {name}.c failed");
    bin
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_are_checked_against_what_is_taken() {
        let takes = Takes {
            numbers: &["--runs"],
            texts: &["--only"],
            flags: &["--skip"],
        };
        let check =
            |a: &[&str]| parse_args(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>(), &takes);
        assert_eq!(check(&["--runs", "3", "--only", "x", "--skip"]), Ok(()));
        assert_eq!(check(&["--help"]), Err(String::new()));
        assert_eq!(check(&["--runs", "3", "-h"]), Err(String::new()));
        assert!(check(&["--slot", "2"])
            .unwrap_err()
            .contains("unknown option"));
        assert!(check(&["--runs"]).unwrap_err().contains("needs a value"));
        assert!(check(&["--runs", "many"])
            .unwrap_err()
            .contains("not a number"));
        assert!(check(&["stray"]).unwrap_err().contains("unknown option"));
    }
}
