//! A thread held with ptrace (seize + interrupt) leaves the system call it
//! waited in. Most calls are restarted by the kernel when the thread
//! resumes (`-ERESTARTSYS` and kin: `read`, `accept`, `poll`), but some
//! fail with EINTR after any stop, a ptrace stop included (`epoll_wait`,
//! `sigtimedwait`, `semop`, a socket call with a timeout: signal(7)), and
//! a program that installed no handler has no reason to expect one. Such
//! a call is set up to be made again when the thread resumes, as the
//! kernel restarts the others, unless a signal is pending that the thread
//! does not block: then it was that signal's EINTR, and it stays (not a
//! CPU-time timer's signal, which cannot end a wait: [`could_end_a_wait`]).
//!
//! Only waits that nothing else ends, made again exactly as they were
//! ([`made_again`]): `epoll_wait` and its kin without a timeout,
//! `rt_sigtimedwait` and `semtimedop` without a timeout, `semop`. A call
//! with a timeout keeps its EINTR (made again, it would wait its whole
//! timeout anew, and a wait that a thread held still again and again would
//! never time out), as under a debugger or `kill -STOP`/`-CONT`; so does
//! any other call (a `close` must never be made twice).
//!
//! Only system calls, no allocation, no lock: the agent calls this from a
//! helper task while the threads it holds may hold any lock.

/// EINTR as a system call returns it.
const EINTR: i64 = -(libc::EINTR as i64);
/// `syscall` on x86-64.
const SYSCALL_INSN: [u8; 2] = [0x0f, 0x05];

/// Whether `tid` (held by us in a ptrace event stop, not a signal's
/// delivery) left a system call with EINTR only because of the stop; if
/// so, its registers are set so that it makes the same call again when it
/// resumes (the instruction pointer back on the `syscall` instruction,
/// the call's number in rax, its arguments untouched). A timeout starts
/// again from the whole. True if the call will be made again.
#[cfg(target_arch = "x86_64")]
pub fn retry_interrupted_call(tid: i32) -> bool {
    // SAFETY: all-zero is a valid user_regs_struct, which the kernel fills.
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    // SAFETY: the caller holds `tid` stopped; the kernel writes `regs`.
    let got = unsafe {
        libc::ptrace(
            libc::PTRACE_GETREGS,
            tid,
            0,
            &mut regs as *mut libc::user_regs_struct,
        )
    };
    if got != 0 || (regs.orig_rax as i64) < 0 || regs.rax as i64 != EINTR {
        return false;
    }
    let args = [regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8, regs.r9];
    if !made_again(regs.orig_rax as i64, args) {
        return false;
    }
    if !at_syscall_insn(tid, regs.rip.wrapping_sub(2)) || signal_deliverable(tid) {
        return false;
    }
    regs.rax = regs.orig_rax;
    regs.rip -= 2;
    // SAFETY: as above; the kernel only reads `regs`.
    unsafe {
        libc::ptrace(
            libc::PTRACE_SETREGS,
            tid,
            0,
            &regs as *const libc::user_regs_struct,
        ) == 0
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub fn retry_interrupted_call(_tid: i32) -> bool {
    false
}

/// Whether system call `nr` with `args`, ended by EINTR, is a wait with no
/// timeout that the kernel would not restart: one made again exactly as it
/// was, with no effect of its own undone or repeated.
pub fn made_again(nr: i64, args: [u64; 6]) -> bool {
    match nr {
        // (epfd, events, maxevents, timeout ms: -1 waits for ever, ...)
        libc::SYS_epoll_wait | libc::SYS_epoll_pwait => args[3] as i32 == -1,
        // (epfd, events, maxevents, timeout: NULL waits for ever, ...)
        libc::SYS_epoll_pwait2 => args[3] == 0,
        // (set, info, timeout: NULL waits for ever, size)
        libc::SYS_rt_sigtimedwait => args[2] == 0,
        // (semid, sops, nsops): no timeout.
        libc::SYS_semop => true,
        // (semid, sops, nsops, timeout: NULL waits for ever)
        libc::SYS_semtimedop => args[3] == 0,
        _ => false,
    }
}

/// Whether the two bytes at `at` in `tid`'s memory are a `syscall`.
fn at_syscall_insn(tid: i32, at: u64) -> bool {
    // Words are read at 8-byte boundaries; the two bytes may straddle one.
    let word = |a: u64| -> Option<[u8; 8]> {
        // SAFETY: PEEKTEXT returns the word (errno tells a failure).
        unsafe {
            *libc::__errno_location() = 0;
            let v = libc::ptrace(libc::PTRACE_PEEKTEXT, tid, a, 0);
            (v != -1 || *libc::__errno_location() == 0).then_some(v.to_ne_bytes())
        }
    };
    let base = at & !7;
    let off = (at - base) as usize;
    let Some(lo) = word(base) else { return false };
    let second = if off == 7 {
        match word(base + 8) {
            Some(hi) => hi[0],
            None => return false,
        }
    } else {
        lo[off + 1]
    };
    [lo[off], second] == SYSCALL_INSN
}

/// Whether a signal is pending for `tid` (its own or its process's) that
/// it does not block: its delivery comes next, and the EINTR is its.
/// Unknown counts as yes (the EINTR is left to the program).
fn signal_deliverable(tid: i32) -> bool {
    let mut blocked: u64 = 0;
    // SAFETY: the kernel writes a sigset of the size given (8 bytes).
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_GETSIGMASK,
            tid,
            std::mem::size_of::<u64>(),
            &mut blocked as *mut u64,
        )
    };
    if r != 0 {
        return true;
    }
    const BATCH: usize = 32;
    for flags in [0, libc::PTRACE_PEEKSIGINFO_SHARED] {
        let mut off = 0u64;
        loop {
            #[repr(C)]
            struct Args {
                off: u64,
                flags: u32,
                nr: i32,
            }
            let args = Args {
                off,
                flags,
                nr: BATCH as i32,
            };
            // SAFETY: zero bytes are valid siginfos (plain C structs).
            let mut infos: [libc::siginfo_t; BATCH] = unsafe { std::mem::zeroed() };
            // SAFETY: `args` says how many siginfos `infos` holds.
            let n = unsafe {
                libc::ptrace(
                    libc::PTRACE_PEEKSIGINFO,
                    tid,
                    &args as *const Args,
                    infos.as_mut_ptr(),
                )
            };
            if n < 0 {
                return true;
            }
            let n = n as usize;
            if infos[..n].iter().any(|i| {
                i.si_signo > 0 && blocked & (1u64 << (i.si_signo - 1)) == 0 && could_end_a_wait(i)
            }) {
                return true;
            }
            if n < BATCH {
                break;
            }
            off += n as u64;
        }
    }
    false
}

/// `si_code` of a POSIX timer's signal, and of one the kernel sends (an
/// `setitimer` timer's): not exported by the libc crate.
const SI_TIMER: i32 = -2;
const SI_KERNEL: i32 = 0x80;

/// Whether a pending signal could have ended the wait the thread was in.
/// A CPU-time timer's (`SIGPROF`, `SIGVTALRM` from a timer: the agent's
/// sampling signal, a program's own profiling timer) could not: the
/// thread's clock does not advance while it sleeps. The kernel generates
/// such a signal for an expiry it noticed as the thread entered the wait
/// only on its way back out, after the stop that ended the wait: it is
/// delivered before the call is made again, and the EINTR stays ours.
fn could_end_a_wait(info: &libc::siginfo_t) -> bool {
    let cpu_timer = matches!(info.si_signo, libc::SIGPROF | libc::SIGVTALRM)
        && matches!(info.si_code, SI_TIMER | SI_KERNEL);
    !cpu_timer
}

#[cfg(test)]
mod tests {
    use super::{could_end_a_wait, made_again, SI_KERNEL, SI_TIMER};

    #[test]
    fn cpu_time_timer_signals_never_end_a_wait() {
        let info = |signo: i32, code: i32| {
            // SAFETY: zero bytes are a valid siginfo (a plain C struct).
            let mut i: libc::siginfo_t = unsafe { std::mem::zeroed() };
            i.si_signo = signo;
            i.si_code = code;
            i
        };
        assert!(!could_end_a_wait(&info(libc::SIGPROF, SI_TIMER)));
        assert!(!could_end_a_wait(&info(libc::SIGPROF, SI_KERNEL)));
        assert!(!could_end_a_wait(&info(libc::SIGVTALRM, SI_KERNEL)));
        // Sent by a process (kill, tgkill), or another signal of a timer.
        assert!(could_end_a_wait(&info(libc::SIGPROF, 0)));
        assert!(could_end_a_wait(&info(libc::SIGPROF, -6)));
        assert!(could_end_a_wait(&info(libc::SIGALRM, SI_TIMER)));
        assert!(could_end_a_wait(&info(libc::SIGUSR1, SI_TIMER)));
    }

    #[test]
    fn only_waits_without_a_timeout_are_made_again() {
        let none = [0u64; 6];
        let with = |i: usize, v: u64| {
            let mut a = none;
            a[i] = v;
            a
        };
        assert!(made_again(libc::SYS_epoll_wait, with(3, u64::MAX)));
        assert!(made_again(libc::SYS_epoll_pwait, with(3, 0xffff_ffff)));
        assert!(!made_again(libc::SYS_epoll_wait, with(3, 100)));
        assert!(!made_again(libc::SYS_epoll_wait, with(3, 0)));
        assert!(made_again(libc::SYS_epoll_pwait2, none));
        assert!(!made_again(libc::SYS_epoll_pwait2, with(3, 0x7fff_0000)));
        assert!(made_again(libc::SYS_rt_sigtimedwait, none));
        assert!(!made_again(libc::SYS_rt_sigtimedwait, with(2, 0x7fff_0000)));
        assert!(made_again(libc::SYS_semop, none));
        assert!(!made_again(libc::SYS_semtimedop, with(3, 0x7fff_0000)));
        for nr in [
            libc::SYS_close,
            libc::SYS_read,
            libc::SYS_nanosleep,
            libc::SYS_futex,
        ] {
            assert!(!made_again(nr, none), "{nr}");
        }
    }
}
