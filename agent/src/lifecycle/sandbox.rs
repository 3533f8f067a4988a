//! Seccomp sandboxes. A process under a seccomp filter may be killed for
//! any system call the filter does not allow, and which ones it allows
//! cannot be asked. So once a filter is there, the agent makes no system
//! call of its own beyond those start-up needs: sampling stops (perf
//! events, timers, the drain thread), so do the budget and attach threads,
//! new threads count in the shared stripe, ended ones are not folded,
//! libraries loaded later are not instrumented, a fork child is not
//! counted and no report is written at exit. Counting goes on, and rtprofd
//! reads it from outside.
//!
//! A filter present at start-up (inherited across exec, as systemd's
//! `SystemCallFilter=` installs it) is read from `/proc/self/status`; one
//! the program installs later is seen on its way in (`prctl`, or the
//! `seccomp` system call through `syscall`, as libseccomp makes it) and
//! the agent steps aside before it takes effect.

use super::interpose::{quietly, Real};
use crate::{budget, sampling};
use libc::{c_int, c_long, c_ulong};
use std::sync::atomic::{AtomicBool, Ordering};

static SANDBOXED: AtomicBool = AtomicBool::new(false);

pub static PRCTL: Real = Real::new(c"prctl");
pub static SYSCALL: Real = Real::new(c"syscall");

pub static ALL: [&Real; 2] = [&PRCTL, &SYSCALL];

/// Whether the process runs under a seccomp filter (or strict mode).
pub fn on() -> bool {
    SANDBOXED.load(Ordering::Acquire)
}

/// At start-up: a filter came with the process (start-up's own reading
/// of `/proc/self/status`, not `prctl(PR_GET_SECCOMP)`, which a filter
/// may forbid).
pub fn started_sandboxed() {
    SANDBOXED.store(true, Ordering::Release);
}

/// The program is about to install a filter: the agent's own activity
/// stops first, while every system call is still allowed. Not in a vfork
/// child, which shares its parent's memory (the flag would be the
/// parent's) and has no threads of the agent.
fn entering() {
    if !sampling::in_own_process() || SANDBOXED.swap(true, Ordering::AcqRel) {
        return;
    }
    quietly(|| {
        sampling::stop_for_sandbox();
        budget::pause();
        crate::lifecycle::attach::pause();
    });
}

/// `prctl(2)`: `PR_SET_SECCOMP` first stops the agent's own calls.
///
/// # Safety
/// Same contract as `prctl(2)` (its variadic arguments are all integers
/// or pointers passed in registers, read here as `c_ulong`).
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn prctl(
    option: c_int,
    a2: c_ulong,
    a3: c_ulong,
    a4: c_ulong,
    a5: c_ulong,
) -> c_int {
    type F = unsafe extern "C" fn(c_int, ...) -> c_int;
    if option == libc::PR_SET_SECCOMP {
        entering();
    }
    // SAFETY: F is prctl's C signature.
    match unsafe { PRCTL.get::<F>() } {
        // SAFETY: the caller's arguments, passed on as it gave them.
        Some(f) => unsafe { f(option, a2, a3, a4, a5) },
        None => super::interpose::no_such_function(),
    }
}

/// `syscall(2)`: `SYS_seccomp` first stops the agent's own calls. Six
/// arguments are read and passed on whatever the caller gave (unused ones
/// are whatever its registers and stack slot held, as the kernel would
/// see them).
///
/// # Safety
/// Same contract as `syscall(2)`.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn syscall(
    n: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    type F = unsafe extern "C" fn(c_long, ...) -> c_long;
    if n == libc::SYS_seccomp || n == libc::SYS_prctl && a1 == libc::PR_SET_SECCOMP as c_long {
        entering();
    }
    // SAFETY: F is syscall's C signature.
    match unsafe { SYSCALL.get::<F>() } {
        // SAFETY: the caller's arguments, passed on as it gave them.
        Some(f) => unsafe { f(n, a1, a2, a3, a4, a5, a6) },
        None => super::interpose::no_such_function() as c_long,
    }
}
