//! Diagnostics: one line on stderr, only when `RTPROF_VERBOSE` is set
//! (`alert` always: for what the user asked for and will not get).
//! Written with a single `write(2)` so lines from threads do not interleave.

use std::sync::atomic::{AtomicBool, Ordering};

static VERBOSE: AtomicBool = AtomicBool::new(false);

pub fn set_verbose(v: bool) {
    VERBOSE.store(v, Ordering::Relaxed);
}

pub fn verbose() -> bool {
    VERBOSE.load(Ordering::Relaxed)
}

pub fn emit(msg: std::fmt::Arguments<'_>) {
    if verbose() {
        emit_always(msg);
    }
}

pub fn emit_always(msg: std::fmt::Arguments<'_>) {
    let line = format!("rtprof[{}]: {}\n", std::process::id(), msg);
    if crate::lifecycle::private_files::is_private() {
        // An agent thread's 2 is not the program's: reach the program's
        // standard error through the process's table for this one line
        // (not possible for a socket; the line is then lost).
        // SAFETY: a static path; the descriptor is this thread's own,
        // closed right after the write.
        unsafe {
            let fd = libc::open(
                c"/proc/self/fd/2".as_ptr(),
                libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC | libc::O_NOCTTY,
            );
            if fd >= 0 {
                libc::write(fd, line.as_ptr().cast(), line.len());
                libc::close(fd);
            }
        }
        return;
    }
    // SAFETY: writes the line's own bytes; a closed stderr only fails.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

macro_rules! vlog {
    ($($arg:tt)*) => { $crate::log::emit(format_args!($($arg)*)) };
}
pub(crate) use vlog;

macro_rules! alert {
    ($($arg:tt)*) => { $crate::log::emit_always(format_args!($($arg)*)) };
}
pub(crate) use alert;

/// Where start-up's time goes, said in one line under `RTPROF_VERBOSE`.
pub struct Phases {
    t0: std::time::Instant,
    last: std::time::Instant,
    parts: Vec<(&'static str, std::time::Duration)>,
}

impl Phases {
    pub fn start() -> Phases {
        let now = std::time::Instant::now();
        Phases {
            t0: now,
            last: now,
            parts: Vec::new(),
        }
    }

    /// Ends the phase `name` now (a no-op unless verbose).
    pub fn mark(&mut self, name: &'static str) {
        if verbose() {
            let now = std::time::Instant::now();
            self.parts.push((name, now - self.last));
            self.last = now;
        }
    }

    pub fn elapsed(&self) -> std::time::Duration {
        self.t0.elapsed()
    }

    pub fn log(&self) {
        if !verbose() {
            return;
        }
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|(n, d)| format!("{n} {:.3}", d.as_secs_f64() * 1e3))
            .collect();
        emit(format_args!(
            "start-up {:.3} ms: {}",
            self.elapsed().as_secs_f64() * 1e3,
            parts.join(", ")
        ));
    }
}
