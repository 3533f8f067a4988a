//! `rtprof`: the command-line front end.

mod cache;
mod last_span;
mod run;
mod switch;
mod top;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "rtprof",
    version,
    about = "Exact call counts for every function of a running program"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a program with the agent preloaded and report when it ends.
    Run(run::RunArgs),
    /// Print the last span published by a running rtprofd.
    Report(last_span::ReportArgs),
    /// A live view of a running rtprofd's spans.
    Top(top::TopArgs),
    /// The agent's cache of analysed programs and libraries.
    Cache(cache::CacheArgs),
    /// Switch counting of a running process's functions on or off,
    /// through rtprofd.
    Switch(switch::SwitchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Report(args) => last_span::run(args),
        Command::Top(args) => top::run(args),
        Command::Cache(args) => cache::run(args),
        Command::Switch(args) => switch::run(args),
    }
}

/// Where librtprof.so is: `--agent`, `$RTPROF_AGENT`, or installed next to
/// this binary (`./`, `../lib/`, `../lib/rtprof/`).
pub fn find_agent(explicit: Option<PathBuf>) -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> =
        if let Some(p) = explicit.or_else(|| std::env::var_os("RTPROF_AGENT").map(PathBuf::from)) {
            vec![p]
        } else {
            let exe =
                std::env::current_exe().map_err(|e| format!("cannot locate rtprof itself: {e}"))?;
            let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
            vec![
                dir.join("librtprof.so"),
                dir.join("../lib/librtprof.so"),
                dir.join("../lib/rtprof/librtprof.so"),
            ]
        };
    for c in &candidates {
        if c.is_file() {
            let abs = c
                .canonicalize()
                .map_err(|e| format!("{}: {e}", c.display()))?;
            let s = abs.to_string_lossy();
            // LD_PRELOAD splits on spaces and colons.
            if s.contains([' ', ':']) {
                return Err(format!(
                    "{s}: agent path contains a space or colon, which LD_PRELOAD cannot carry"
                ));
            }
            return Ok(abs);
        }
    }
    Err(format!(
        "cannot find librtprof.so (looked at {}); set RTPROF_AGENT or pass --agent",
        candidates
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}
