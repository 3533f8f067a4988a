//! Running the program as time(1) does, and leaving with its status.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitCode, ExitStatus};

/// Runs `cmd` the way time(1) does: a terminal's Ctrl-C and Ctrl-\\ are
/// for the program, which starts with the dispositions rtprof was given
/// (a job started in the background with them ignored keeps them ignored,
/// as it would without rtprof).
pub fn run(cmd: &mut Command) -> std::io::Result<ExitStatus> {
    // SAFETY: signal() with SIG_IGN, restored below.
    let old_int = unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    // SAFETY: as above.
    let old_quit = unsafe { libc::signal(libc::SIGQUIT, libc::SIG_IGN) };
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure only calls signal(),
    // which is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(libc::SIGINT, old_int);
            libc::signal(libc::SIGQUIT, old_quit);
            Ok(())
        })
    };
    let status = cmd.status();
    // SAFETY: restores the dispositions saved above.
    unsafe {
        libc::signal(libc::SIGINT, old_int);
        libc::signal(libc::SIGQUIT, old_quit);
    }
    status
}

/// rtprof's exit: the program's status, or death by the same signal.
pub fn exit_like(status: ExitStatus) -> ExitCode {
    if let Some(sig) = status.signal() {
        // Die the way the program died, so callers see the same status.
        // SAFETY: plain signal calls on this process.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
        }
        return ExitCode::from(128 + sig as u8);
    }
    ExitCode::from(status.code().unwrap_or(1) as u8)
}
