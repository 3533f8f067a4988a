//! `rtprof`: the command-line front end.

mod agent;
mod attach;
mod cache;
mod error;
mod export;
mod last_span;
mod loops;
mod presentation;
mod route;
mod run;
mod source_lines;
mod switch;
mod system;
mod top;

use clap::{Parser, Subcommand};
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
    /// Send the calls of a running process's function to an
    /// implementation the program offered, or back (`original`), through
    /// rtprofd.
    Route(route::RouteArgs),
    /// Profile every new process on this machine, or stop (enable and
    /// disable need root).
    System(system::SystemArgs),
    /// Profile a running process: load the agent into it for a while,
    /// then report and leave it running its original code.
    Attach(attach::AttachArgs),
    /// Stop profiling a process `rtprof attach` left attached.
    Detach(attach::DetachArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Report(args) => last_span::run(args),
        Command::Top(args) => top::run(args),
        Command::Cache(args) => cache::run(args),
        Command::Switch(args) => switch::run(args),
        Command::Route(args) => route::run(args),
        Command::System(args) => system::run(args),
        Command::Attach(args) => attach::run_attach(args),
        Command::Detach(args) => attach::run_detach(args),
    }
}
