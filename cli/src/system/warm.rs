//! `rtprof system warm`: the machine-wide plan cache filled ahead of time,
//! so that a program's first start under the agent maps its patched code
//! from a page image like every later one. Its default set is the programs
//! the machine runs now (their next starts, and the tools in use); `enable`
//! starts it in the background at the lowest priority. Each program is
//! started with the installed agent (cache entries belong to one agent
//! build) and ends before its `main`.

use super::{need_root, AGENT_PATH};
use crate::error::Error;
use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The programs of the processes running now: each process's executable,
/// once, if it is a regular file still on disk that the environment
/// configures (not set-ID), and not rtprof's own.
pub fn running_programs() -> Vec<PathBuf> {
    let me = std::env::current_exe().ok();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = BTreeSet::new();
    for e in rd.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // Kernel threads have none; a deleted file's link says so.
        let Ok(exe) = std::fs::read_link(e.path().join("exe")) else {
            continue;
        };
        if exe.to_string_lossy().ends_with(" (deleted)") || Some(&exe) == me.as_ref() {
            continue;
        }
        found.insert(exe);
    }
    found
        .into_iter()
        .filter(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o6000 == 0)
        })
        .collect()
}

/// Warms `paths` (or, if none, the running programs) with the installed
/// agent into the machine-wide cache, going on past a program that fails.
pub fn run(paths: Vec<PathBuf>) -> Result<(), Error> {
    need_root("it fills the machine-wide cache, /var/cache/rtprof")?;
    let agent = Path::new(AGENT_PATH);
    if !agent.exists() {
        return Err(Error::NotInstalled(AGENT_PATH));
    }
    let paths = match paths.is_empty() {
        true => running_programs(),
        false => paths,
    };
    let started = Instant::now();
    let mut warmed = 0;
    for p in &paths {
        match crate::cache::warm_one(p, agent, "system") {
            Ok(()) => {
                warmed += 1;
                println!("warmed {}", p.display());
            }
            Err(e) => eprintln!("not warmed: {e}"),
        }
    }
    println!(
        "{warmed} of {} programs warmed in {:.1} s",
        paths.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Starts `rtprof system warm` for the running programs as a process of
/// its own, at the lowest CPU and I/O priority, its output discarded.
/// Returns its pid.
pub fn start_in_background() -> std::io::Result<u32> {
    let me = std::env::current_exe()?;
    let mut c = std::process::Command::new(me);
    c.args(["system", "warm"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: the closure runs in the child between fork and exec and
    // makes only async-signal-safe system calls.
    unsafe {
        c.pre_exec(|| {
            lowest_priority();
            Ok(())
        });
    }
    Ok(c.spawn()?.id())
}

/// The calling process (and what it starts) in its own session, running
/// only when nothing else wants the CPU or the disk. Each step is best
/// effort: warming at a higher priority is only slower for others.
fn lowest_priority() {
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    const IOPRIO_CLASS_IDLE: libc::c_long = 3;
    const IOPRIO_CLASS_SHIFT: libc::c_long = 13;
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain system calls on the calling process; `param` is a
    // live sched_param.
    unsafe {
        libc::setsid();
        libc::setpriority(libc::PRIO_PROCESS, 0, 19);
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0 as libc::c_long,
            IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT,
        );
    }
}
