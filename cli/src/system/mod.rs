//! `rtprof system`: switching a whole machine's profiling on and off.
//! `enable` installs the agent in a root-owned place, tests it, adds it to
//! /etc/ld.so.preload (keeping a backup) and starts rtprofd under systemd;
//! `disable` puts /etc/ld.so.preload back; `status` says what is on.
//! The paths are the real ones, fixed: the tests run in a private mount
//! namespace instead.

mod disable;
mod enable;
mod files;
mod install;
mod preload;
mod probe;
mod status;
mod unit;
mod warm;

use crate::error::Error;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// The file the dynamic loader reads before every program starts.
pub const PRELOAD: &str = "/etc/ld.so.preload";
/// Where the agent is installed (by `enable` or by the package).
pub const AGENT_DIR: &str = "/usr/lib/rtprof";
pub const AGENT_PATH: &str = "/usr/lib/rtprof/librtprof.so";
/// Root's rtprof settings, and `enable`'s record of the machine before.
pub const ETC_DIR: &str = "/etc/rtprof";
/// /etc/ld.so.preload as it was before `enable` changed it, byte for byte.
pub const BACKUP: &str = "/etc/rtprof/ld.so.preload.orig";
/// Exists instead of [`BACKUP`] when there was no /etc/ld.so.preload.
pub const WAS_ABSENT: &str = "/etc/rtprof/ld.so.preload.absent";
/// Held while a command changes anything.
pub const LOCK: &str = "/etc/rtprof/system.lock";
/// The agent's kill switch (agent/src/lifecycle/system.rs).
pub const KILL_SWITCH: &str = "/etc/rtprof/disable";

#[derive(Args)]
pub struct SystemArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand)]
enum Action {
    /// Profile every program started from now on: install the agent in
    /// /usr/lib/rtprof, test it, add it to /etc/ld.so.preload and start
    /// rtprofd (under systemd, if it runs).
    Enable {
        /// The agent to install (default: $RTPROF_AGENT, else next to
        /// rtprof).
        #[arg(long, value_name = "PATH")]
        agent: Option<PathBuf>,
        /// Do not warm the machine-wide cache for the running programs in
        /// the background.
        #[arg(long)]
        no_warm: bool,
    },
    /// Stop profiling new programs: put /etc/ld.so.preload back as it was
    /// before `enable`, and stop rtprofd's service.
    Disable,
    /// What is switched on: the preload entry, the kill switch, rtprofd,
    /// its presentation segment, the plan cache.
    Status,
    /// Fill the machine-wide cache now, with the installed agent, for
    /// programs (by default those running now), so that their first start
    /// maps its code from page images. Each is started and ends before its
    /// `main` (its libraries' initialisers do run).
    Warm {
        #[arg(value_name = "PATH")]
        paths: Vec<PathBuf>,
    },
}

pub fn run(a: SystemArgs) -> ExitCode {
    let (name, result) = match a.action {
        Action::Enable { agent, no_warm } => ("enable", enable::run(agent, !no_warm)),
        Action::Warm { paths } => ("warm", warm::run(paths)),
        Action::Disable => ("disable", disable::run()),
        Action::Status => {
            status::run();
            return ExitCode::SUCCESS;
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rtprof system {name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Refuses, with one message, unless running as root.
fn need_root(action: &'static str) -> Result<(), Error> {
    // SAFETY: geteuid takes nothing and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        Ok(())
    } else {
        Err(Error::NotRoot { action })
    }
}
