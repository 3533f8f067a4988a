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
