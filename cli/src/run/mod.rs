//! `rtprof run`: runs a command under the agent, then reports every process
//! of its tree from the counter segments the agents left in a private
//! directory. Arguments, stdin, stdout and the exit status pass through.

mod child;
pub(crate) mod modules_arg;
pub(crate) mod room;
pub(crate) mod segments;

use crate::error::Error;
use crate::export::{model, shown, Format, Output, OutputArgs};
use clap::Args;
use room::{out_of_space, room_for_segments, RunDir};
use rtprof_abi::escape::escape_text;
use rtprof_shared::report;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

#[derive(Args)]
pub struct RunArgs {
    /// Write the report as JSON to FILE instead of text on stderr (as
    /// --output FILE --format json).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    #[command(flatten)]
    output: OutputArgs,
    /// Show per-module patch statistics with refusal reasons.
    #[arg(long)]
    stats: bool,
    /// List every function of the instrumented modules in the JSON report,
    /// called or not (by default only those called or sampled; sets
    /// RTPROF_ALL_FUNCTIONS for the agent's own RTPROF_REPORT too).
    #[arg(long)]
    all_functions: bool,
    /// Rows listed per process (0: all that were called or sampled).
    #[arg(long, default_value_t = 25)]
    top: usize,
    /// Order of the rows.
    #[arg(long, value_enum, default_value_t = SortBy::Time)]
    sort: SortBy,
    /// Show a function's compiler copies and parts (.constprop.N, .cold,
    /// ...) as rows of their own instead of in the function's row.
    #[arg(long)]
    no_merge_clones: bool,
    /// After each process's rows, each thread's exact calls (id, name,
    /// whether it ended, its functions with the most calls).
    #[arg(long)]
    threads: bool,
    /// Events sampled besides CPU time, counted per function and thread
    /// (RTPROF_EVENTS: page-faults, context-switches, cpu-migrations,
    /// task-clock, cycles, instructions, cache-misses, branch-misses, ...;
    /// NAME:PERIOD samples every PERIOD events).
    #[arg(long, value_name = "LIST")]
    events: Option<String>,
    /// Samples per second of CPU time (RTPROF_SAMPLE_HZ; 0 switches sampling off).
    #[arg(long, value_name = "HZ")]
    sample_hz: Option<u32>,
    /// Sampler to use (RTPROF_SAMPLER): per-thread CPU-time timers (the default), perf events, or none.
    #[arg(long, value_enum)]
    sampler: Option<SamplerArg>,
    /// Sample only: patch no function entries, count no calls (RTPROF_INSTRUMENT=0).
    #[arg(long)]
    no_calls: bool,
    /// Modules to instrument besides the executable (RTPROF_MODULES), e.g. 'libpython*' or 'all'.
    #[arg(long, value_name = "GLOBS")]
    modules: Option<String>,
    /// Only these patched functions count from the start (RTPROF_COUNT), e.g. 'lua_*,luaV_*'.
    #[arg(long, value_name = "GLOBS")]
    count: Option<String>,
    /// These patched functions do not count from the start (RTPROF_NOCOUNT).
    #[arg(long, value_name = "GLOBS")]
    nocount: Option<String>,
    /// Overhead budget in percent of CPU time (RTPROF_BUDGET): over it,
    /// the hottest functions are counted in bursts and their calls
    /// estimated, with an error bound.
    #[arg(long, value_name = "PERCENT")]
    budget: Option<f64>,
    /// Count the functions no jump can enter through traps (RTPROF_TRAPS):
    /// exact, a signal per call, flagged [trap].
    #[arg(long)]
    traps: bool,
    /// Count the loops of these functions exactly (RTPROF_LOOPS), e.g.
    /// 'nested,lua_V*': executions and iterations of each loop, from
    /// probes at its header and its branches back.
    #[arg(long, value_name = "GLOBS")]
    loops: Option<String>,
    /// Agent diagnostics on stderr (RTPROF_VERBOSE).
    #[arg(long)]
    verbose: bool,
    /// Path of librtprof.so.
    #[arg(long, value_name = "PATH")]
    agent: Option<PathBuf>,
    /// The command to run, after `--`.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum SortBy {
    /// Estimated CPU time.
    Time,
    Calls,
    Samples,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum SamplerArg {
    Perf,
    Timer,
    Off,
}

/// The environment that preloads `agent` into the program and its
/// children, its counter segments kept in `dir`, and hands it the options
/// given (the agent reads only its environment).
fn agent_env(cmd: &mut Command, args: &RunArgs, agent: &Path, dir: &Path) {
    let mut preload = agent.to_string_lossy().into_owned();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(' ');
        preload.push_str(&old.to_string_lossy());
    }
    cmd.env("LD_PRELOAD", preload)
        .env("RTPROF_RUN_DIR", dir)
        .env_remove("RTPROF_REPORT");
    if let Some(m) = &args.modules {
        cmd.env("RTPROF_MODULES", m);
    }
    if let Some(c) = &args.count {
        cmd.env("RTPROF_COUNT", c);
    }
    if let Some(c) = &args.nocount {
        cmd.env("RTPROF_NOCOUNT", c);
    }
    if let Some(b) = args.budget {
        cmd.env("RTPROF_BUDGET", b.to_string());
    }
    if args.verbose {
        cmd.env("RTPROF_VERBOSE", "1");
    }
    if args.all_functions {
        cmd.env("RTPROF_ALL_FUNCTIONS", "1");
    }
    if args.traps {
        cmd.env("RTPROF_TRAPS", "1");
    }
    if let Some(l) = &args.loops {
        cmd.env("RTPROF_LOOPS", l);
    }
    if args.no_calls {
        cmd.env("RTPROF_INSTRUMENT", "0");
    }
    if let Some(ev) = &args.events {
        cmd.env("RTPROF_EVENTS", ev);
    }
    if let Some(hz) = args.sample_hz {
        cmd.env("RTPROF_SAMPLE_HZ", hz.to_string());
    }
    if let Some(s) = args.sampler {
        let name = match s {
            SamplerArg::Perf => "perf",
            SamplerArg::Timer => "timer",
            SamplerArg::Off => "off",
        };
        cmd.env("RTPROF_SAMPLER", name);
    }
}

pub fn run(args: RunArgs) -> ExitCode {
    // Mistakes in the arguments are reported before the program runs:
    // finding them after a long run would lose the profile.
    if let Some(m) = &args.modules {
        if let Err(e) = modules_arg::check(m) {
            eprintln!("rtprof: --modules: {e}; the program was not run");
            return ExitCode::from(2);
        }
    }
    let mut outputs = Vec::new();
    if let Some(p) = &args.json {
        match Output::prepare(p, Some(Format::Json)) {
            Ok(o) => outputs.push(o),
            Err(e) => {
                eprintln!("rtprof: --json {}: {e}; the program was not run", shown(p));
                return ExitCode::from(2);
            }
        }
    }
    match Output::from_args(&args.output) {
        Ok(o) => outputs.extend(o),
        Err(e) => {
            eprintln!("rtprof: {e}; the program was not run");
            return ExitCode::from(2);
        }
    }
    let agent = match crate::agent::find(args.agent.clone()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rtprof: {e}");
            return ExitCode::from(127);
        }
    };
    let (tmp, named_tmp) = room::base();
    let shown_tmp = escape_text(&tmp.to_string_lossy()).into_owned();
    // A full filesystem loses the profile, not the program's run.
    let unprofiled = |e: Error| -> Option<RunDir> {
        let trouble = room::trouble(&e);
        eprintln!("rtprof: {named_tmp} {trouble}; the program runs unprofiled");
        None
    };
    let dir = match RunDir::new(&tmp) {
        Ok(d) => match room_for_segments(&d.0) {
            Ok(()) => Some(d),
            Err(e) => unprofiled(e),
        },
        Err(e) if out_of_space(&e) => unprofiled(Error::OutOfSpace(e)),
        Err(e) => {
            eprintln!("rtprof: cannot create a private directory in {shown_tmp}: {e}");
            return ExitCode::from(127);
        }
    };
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    if let Some(dir) = &dir {
        agent_env(&mut cmd, &args, &agent, &dir.0);
    }
    let status = match child::run(&mut cmd) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rtprof: cannot run {}: {e}", escape_text(&args.command[0]));
            return ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };

    let mut procs = dir
        .as_ref()
        .map(|d| segments::collect(&d.0))
        .unwrap_or_default();
    crate::source_lines::annotate(&mut procs);
    crate::loops::annotate(&mut procs);
    if let (Some(d), true) = (&dir, procs.is_empty()) {
        // The agent falls back to anonymous memory when it cannot reserve
        // its segment in the run directory: say so if that is why.
        match room_for_segments(&d.0) {
            Err(e) => eprintln!(
                "rtprof: no profile was recorded: {named_tmp} {}",
                room::trouble(&e)
            ),
            Ok(()) => eprintln!("rtprof: no profile was recorded (the program may be static, setuid, or not an ELF program)"),
        }
    }
    if !outputs.is_empty() {
        let name = args.command.join(" ");
        let listing = match args.all_functions {
            true => report::Listing::All,
            false => report::Listing::Used,
        };
        for o in outputs {
            o.write(
                || report::json(&procs, listing),
                || model::from_snapshots(&name, &procs),
            );
        }
    } else if dir.is_some() {
        eprint!(
            "{}",
            report::text(
                &procs,
                report::TextOptions {
                    top: args.top,
                    stats: args.stats,
                    sort: match args.sort {
                        SortBy::Time => report::Sort::Time,
                        SortBy::Calls => report::Sort::Calls,
                        SortBy::Samples => report::Sort::Samples,
                    },
                    merge_copies: !args.no_merge_clones,
                    threads: args.threads,
                }
            )
        );
    }
    drop(dir);
    child::exit_like(status)
}
