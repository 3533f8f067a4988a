//! `rtprof top`: a live view of a running rtprofd's spans: processes and
//! their functions by time, calls, calls per second or time per call, with
//! a sparkline of each one's time over recent spans, and each thread's
//! (`H`, or `--threads`) where rtprofd publishes them. On a terminal it is
//! interactive (`tui`); into a pipe or a file, or with `--plain` or
//! `--iterations`, it prints plain screens (`plain`). When the daemon stops
//! publishing the view says how old it is; when it restarts (a new segment
//! file at the same path) the view follows it (`source`).

mod model;
mod plain;
mod source;
mod tui;

use clap::Args;
use model::SortKey;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct TopArgs {
    /// The daemon's presentation segment.
    #[arg(long, default_value = rtprof_abi::protocol::DEFAULT_PRESENT)]
    present: PathBuf,
    /// Only this process (interactive: start in its functions).
    #[arg(long)]
    pid: Option<u32>,
    /// Only executables or functions whose name contains this
    /// (interactive: the initial filter).
    #[arg(long)]
    name: Option<String>,
    /// Row order (interactive: the initial one).
    #[arg(long, value_enum, default_value_t = SortKey::Time)]
    sort: SortKey,
    /// Functions shown per process in plain output.
    #[arg(long, default_value_t = 10)]
    rows: usize,
    /// Plain output: each process's threads too, with their hottest
    /// functions (rows per thread: `rtprofd --thread-rows N`).
    #[arg(long)]
    threads: bool,
    /// Print plain screens and stop after this many (0: run until
    /// interrupted). A screen is drawn for every new span, and once a
    /// second while the spans are stale.
    #[arg(long, default_value_t = 0)]
    iterations: u64,
    /// Plain screens even on a terminal.
    #[arg(long)]
    plain: bool,
}

pub fn run(a: TopArgs) -> ExitCode {
    if a.plain || a.iterations != 0 || !std::io::stdout().is_terminal() {
        plain::run(a)
    } else {
        tui::run(a)
    }
}
