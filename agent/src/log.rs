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
