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
//! `SystemCallFilter=` or a container runtime installs it) is seen in
//! `/proc/self/status`, and tried out in a child process that makes each
//! kind of system call the agent may make, in order ([`probe`]): a filter
//! that only answers with an error (a container's) leaves the agent as it
//! is (it copes with errors); one that kills on a call sampling or the
//! agent's threads need leaves counting alone; one that kills on a call
//! start-up needs leaves the process unprofiled. One the program installs
//! later is seen on its way in (`prctl`, or the `seccomp` system call
//! through `syscall`, as libseccomp makes it) and the agent steps aside
//! before it takes effect.

use super::interpose::{quietly, Real};
use crate::{options::budget, sampling};
use libc::{c_int, c_long, c_ulong};
use std::sync::atomic::{AtomicBool, Ordering};

static SANDBOXED: AtomicBool = AtomicBool::new(false);

pub static PRCTL: Real = Real::new(c"prctl");
pub static SYSCALL: Real = Real::new(c"syscall");

pub static ALL: [&Real; 2] = [&PRCTL, &SYSCALL];

/// System calls that change the calling thread's credentials.
const CREDENTIAL_CALLS: [c_long; 10] = [
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
    libc::SYS_setgroups,
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
    libc::SYS_capset,
];

/// `prctl` options that change the calling thread's capabilities (its
/// bounding and ambient sets, its securebits, whether it keeps them across
/// `setuid`): the agent's threads step aside and start again from the
/// calling thread, as for a credential change.
const CAPABILITY_OPTIONS: [c_int; 4] = [
    libc::PR_CAPBSET_DROP,
    libc::PR_CAP_AMBIENT,
    libc::PR_SET_SECUREBITS,
    libc::PR_SET_KEEPCAPS,
];

/// A thread's seccomp state as `/proc/.../status` gives it: the mode
/// (`Seccomp:`) and the number of filters (`Seccomp_filters:`, since Linux
/// 5.9). Either grows when a filter arrives, however it was installed.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Filters {
    pub mode: u64,
    pub count: u64,
}

impl Filters {
    pub fn parse(status: &str) -> Filters {
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        Filters {
            mode: field("Seccomp:"),
            count: field("Seccomp_filters:"),
        }
    }
}

/// A call that takes longer than this many processor cycles (a few
/// milliseconds) under a filter is being answered by a supervisor
/// (`SECCOMP_RET_USER_NOTIF`): every further call of the agent's would be
/// too, each as slowly.
const SLOW_CYCLES: u64 = 20_000_000;

/// The processor's cycle counter: a clock read without a system call (the
/// vDSO's may fall back to one, which a filter could kill).
pub fn cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtsc reads the time-stamp counter; it has no side effects.
    return unsafe { core::arch::x86_64::_rdtsc() };
    #[cfg(not(target_arch = "x86_64"))]
    return 0;
}

/// Whether calls that took `elapsed` cycles were answered by a supervisor.
pub fn answered_slowly(elapsed: u64) -> bool {
    elapsed > SLOW_CYCLES
}

/// The main thread's filters at start-up (mode, count).
static AT_START: [std::sync::atomic::AtomicU64; 2] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];

/// Start-up's reading of the filters the process came with.
pub fn note_filters_at_start(f: Filters) {
    AT_START[0].store(f.mode, Ordering::Relaxed);
    AT_START[1].store(f.count, Ordering::Relaxed);
}

/// Whether a filter arrived on this thread that no wrapper saw (installed
/// by a raw `syscall` instruction, as Go's runtime and others do): asked of
/// `/proc/thread-self/status` (openat, read, close) before the image ends
/// and the agent would make calls of its own. If so, from now on the agent
/// makes none, as if it had seen the filter arrive (its threads and
/// timers, which would need calls to stop, are left to end with the
/// process).
pub fn filter_arrived_unseen() -> bool {
    if on() {
        return true;
    }
    let now = Filters::parse(&crate::discover::maps::read_proc(
        "/proc/thread-self/status",
    ));
    let start = Filters {
        mode: AT_START[0].load(Ordering::Relaxed),
        count: AT_START[1].load(Ordering::Relaxed),
    };
    if now.mode > start.mode || now.count > start.count {
        SANDBOXED.store(true, Ordering::Release);
        return true;
    }
    false
}

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

/// What a filter present at start-up lets the agent do.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Verdict {
    /// Every call the agent makes is allowed, or answered with an error.
    Everything,
    /// Counting only: a call of sampling or of the agent's threads kills.
    CountOnly,
    /// Nothing: a call start-up needs kills, or the trial could not be made.
    Nothing,
    /// Nothing: a supervisor answers the filter's calls, slowly; every call
    /// of the agent's would wait for it.
    Supervised,
}

/// One system call of the trial, with harmless arguments (most fail with
/// EBADF or EINVAL once the filter has let them through).
struct Trial {
    nr: c_long,
    args: [c_long; 4],
}

const fn trial(nr: c_long, a: c_long, b: c_long, c: c_long, d: c_long) -> Trial {
    Trial {
        nr,
        args: [a, b, c, d],
    }
}

/// The trial child's core file size: none.
static NO_CORE: libc::rlimit = libc::rlimit {
    rlim_cur: 0,
    rlim_max: 0,
};

/// Calls start-up (and the agent in the program's threads) makes that the
/// dynamic loader has not made already (it made openat, read, pread64,
/// close, newfstatat, access, mmap, mprotect, munmap, arch_prctl,
/// set_tid_address, set_robust_list, rseq and prlimit64 under the same
/// filter): the probe's own reaping first (the parent reaps the child only
/// once the child has made that call), the counter segment (memfd, its
/// size, seals, memory backed in advance), registering with rtprofd, the C
/// library's and Rust's own (memory, random seeds, file status, futexes),
/// files beside the segment, the process's identity.
const START_UP: &[Trial] = &[
    trial(libc::SYS_wait4, -1, 0, libc::WNOHANG as c_long, 0),
    // Then, so that a child killed later leaves no core dump: not dumpable
    // (its core file size is set to none before the trials).
    trial(libc::SYS_prctl, libc::PR_SET_DUMPABLE as c_long, 0, 0, 0),
    trial(libc::SYS_memfd_create, 0, 0, 0, 0),
    trial(libc::SYS_ftruncate, -1, 0, 0, 0),
    trial(libc::SYS_fallocate, -1, 0, 0, 0),
    trial(libc::SYS_fcntl, -1, libc::F_ADD_SEALS as c_long, 0, 0),
    trial(libc::SYS_madvise, 0, 0, 23, 0),
    trial(libc::SYS_brk, 0, 0, 0, 0),
    trial(libc::SYS_mremap, 0, 0, 0, 0),
    trial(libc::SYS_socket, -1, 0, 0, 0),
    trial(libc::SYS_connect, -1, 0, 0, 0),
    trial(libc::SYS_sendmsg, -1, 0, 0, 0),
    trial(libc::SYS_recvmsg, -1, 0, 0, 0),
    trial(libc::SYS_getrandom, 0, 0, libc::GRND_NONBLOCK as c_long, 0),
    trial(libc::SYS_statx, -1, 0, 0, 0),
    // Page images: their trailer read, the file copied when one is made.
    trial(libc::SYS_pread64, -1, 0, 0, 0),
    trial(libc::SYS_copy_file_range, -1, 0, -1, 0),
    trial(libc::SYS_lseek, -1, 0, 0, 0),
    trial(libc::SYS_readlink, 0, 0, 0, 0),
    trial(libc::SYS_readlinkat, -1, 0, 0, 0),
    trial(libc::SYS_getdents64, -1, 0, 0, 0),
    trial(libc::SYS_futex, 0, libc::FUTEX_WAKE as c_long, 0, 0),
    trial(libc::SYS_write, -1, 0, 0, 0),
    trial(libc::SYS_pwrite64, -1, 0, 0, 0),
    trial(libc::SYS_renameat, -1, 0, -1, 0),
    trial(libc::SYS_unlinkat, -1, 0, 0, 0),
    trial(libc::SYS_fchmod, -1, 0, 0, 0),
    trial(libc::SYS_ioctl, -1, 0, 0, 0),
    trial(libc::SYS_membarrier, -1, 0, 0, 0),
    trial(libc::SYS_kcmp, 0, 0, -1, 0),
    trial(libc::SYS_rt_sigprocmask, -1, 0, 0, 8),
    trial(libc::SYS_sched_getaffinity, 0, 0, 0, 0),
    trial(libc::SYS_getpid, 0, 0, 0, 0),
    trial(libc::SYS_gettid, 0, 0, 0, 0),
    trial(libc::SYS_getppid, 0, 0, 0, 0),
    trial(libc::SYS_geteuid, 0, 0, 0, 0),
    trial(libc::SYS_getegid, 0, 0, 0, 0),
    trial(libc::SYS_getuid, 0, 0, 0, 0),
    trial(libc::SYS_getgid, 0, 0, 0, 0),
];

/// Calls of sampling and of the agent's threads (and of starting them).
const THREADS_AND_SAMPLING: &[Trial] = &[
    trial(libc::SYS_perf_event_open, 0, 0, -1, -1),
    trial(libc::SYS_timer_create, -1, 0, 0, 0),
    trial(libc::SYS_timer_settime, -1, 0, 0, 0),
    trial(libc::SYS_timer_getoverrun, -1, 0, 0, 0),
    trial(libc::SYS_timer_delete, -1, 0, 0, 0),
    trial(libc::SYS_rt_sigaction, -1, 0, 0, 8),
    trial(libc::SYS_rt_sigtimedwait, 0, 0, 0, 8),
    trial(libc::SYS_clone3, 0, 0, 0, 0),
    trial(libc::SYS_clone, libc::CLONE_THREAD as c_long, 0, 0, 0),
    trial(libc::SYS_set_robust_list, 0, 0, 0, 0),
    trial(libc::SYS_rseq, 0, 0, -1, 0),
    trial(libc::SYS_sched_yield, 0, 0, 0, 0),
    trial(libc::SYS_mprotect, 0, 0, 0, 0),
    trial(libc::SYS_poll, 0, 0, 0, 0),
    trial(libc::SYS_futex_waitv, 0, 0, -1, 0),
    trial(libc::SYS_clock_nanosleep, -1, 0, 0, 0),
    trial(libc::SYS_nanosleep, 0, 0, 0, 0),
    // Each agent thread's descriptor table of its own.
    trial(libc::SYS_close_range, 1, 0, 0, 0),
    trial(libc::SYS_dup2, -1, -1, 0, 0),
    trial(libc::SYS_dup3, -1, -1, 0, 0),
    // A thread's end is waited for with signal 0.
    trial(libc::SYS_tgkill, 0, 0, 0, 0),
    trial(libc::SYS_sigaltstack, 0, 0, 0, 0),
    // The timers' handlers and the agent's threads read CPU clocks, which
    // the vDSO does not serve (a null result: EFAULT, if allowed).
    trial(
        libc::SYS_clock_gettime,
        libc::CLOCK_THREAD_CPUTIME_ID as c_long,
        0,
        0,
        0,
    ),
];

/// Tries every call of [`START_UP`] then [`THREADS_AND_SAMPLING`] in a
/// child (a copy of this process, under the same filter), then a signal
/// taken and returned from (`rt_sigreturn`, as after every timer sample):
/// the child notes each step in memory shared with us before it makes the
/// call, and ends with `exit` once all were allowed. The parent sleeps
/// until the child has ended (`CLONE_VFORK`: no call of ours to wait), and
/// reaps it only if the child showed `wait4` allowed. From the agent's
/// constructor, single-threaded: the child runs system calls and the C
/// library's `sigaction` and nothing else. The one call the parent makes
/// untried is the `clone` itself.
pub fn probe() -> Verdict {
    // SAFETY: a fresh shared anonymous page, unmapped below; no address
    // given, nothing existing is replaced.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        return Verdict::Nothing;
    }
    let step = page as *mut u32;
    STEP.store(step, Ordering::Release);
    let calls = START_UP.len() + THREADS_AND_SAMPLING.len();
    let trials = calls + 1;
    // A copy of this process without fork handlers and with no signal to
    // the program at its end (so never reaped for us by an ignored
    // SIGCHLD, nor seen by a handler): it shares the page. The parent
    // sleeps until the child has ended (CLONE_VFORK, with memory of its
    // own).
    // SAFETY: clone with no exit signal is fork without handlers; the child
    // below makes system calls only, then exits.
    let pid = unsafe { raw(libc::SYS_clone, [libc::CLONE_VFORK as c_long, 0, 0, 0, 0]) };
    if pid == 0 {
        // SAFETY: in the child only; see `trial_child`.
        unsafe { trial_child(step, calls) };
    }
    // SAFETY: the shared page, read once the child has ended (CLONE_VFORK
    // returned).
    let last = unsafe { std::ptr::read_volatile(step) } as usize;
    let verdict = if pid < 0 {
        Verdict::Nothing
    } else if last == SUPERVISED as usize {
        // Each call waits for a supervisor: not one more is made (the
        // child is left unreaped, as after a wait4 that kills).
        Verdict::Supervised
    } else if last == 0 {
        // wait4 kills: the child stays a zombie no one sees (no exit
        // signal: only a wait for every kind of child finds it).
        Verdict::Nothing
    } else {
        let mut status = 0;
        let r = loop {
            // SAFETY: waits for the child just made (a clone child:
            // __WALL), with a status on our stack.
            let r = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::__WALL) };
            if r >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break r;
            }
        };
        if r != pid as libc::pid_t {
            Verdict::Nothing
        } else if last == trials && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
            Verdict::Everything
        } else if last >= START_UP.len() {
            Verdict::CountOnly
        } else {
            Verdict::Nothing
        }
    };
    STEP.store(std::ptr::null_mut(), Ordering::Release);
    // SAFETY: the page mapped above, no longer used.
    unsafe { libc::munmap(page, 4096) };
    verdict
}

/// The step word's value when a trial call was answered slowly.
const SUPERVISED: u32 = u32::MAX;

/// The probe's shared step word, for the trial child's signal handler.
static STEP: std::sync::atomic::AtomicPtr<u32> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// The trial child's signal handler: it ran; its return is the trial.
extern "C" fn trial_signal(_: c_int) {
    let step = STEP.load(Ordering::Acquire);
    if !step.is_null() {
        // SAFETY: the shared page, live while the probe runs.
        unsafe { std::ptr::write_volatile(step, std::ptr::read_volatile(step) + 1) };
    }
}

/// The trial child: each call with harmless arguments, the step noted
/// before it; a signal taken and returned from; then `exit`.
///
/// # Safety
/// Only in the probe's child, a copy of a single-threaded process.
unsafe fn trial_child(step: *mut u32, calls: usize) -> ! {
    // No core file for a child killed below (the C library asked for
    // limits at the program's start: prlimit64 is allowed).
    let no_core = &NO_CORE as *const libc::rlimit as c_long;
    // SAFETY: sets this child's own core file size; reads NO_CORE.
    unsafe {
        raw(
            libc::SYS_prlimit64,
            [0, libc::RLIMIT_CORE as c_long, no_core, 0, 0],
        )
    };
    for (i, t) in START_UP.iter().chain(THREADS_AND_SAMPLING).enumerate() {
        // SAFETY: our shared page; the parent reads it after we end.
        unsafe { std::ptr::write_volatile(step, i as u32) };
        let [a, b, c, d] = t.args;
        let t0 = cycles();
        // SAFETY: each call with arguments that change nothing of the
        // parent's (bad descriptors, null pointers, invalid flags; the
        // child's own dumpable flag).
        unsafe { raw(t.nr, [a, b, c, d, 0]) };
        if answered_slowly(cycles().wrapping_sub(t0)) {
            // SAFETY: as above; then this child ends at once.
            unsafe {
                std::ptr::write_volatile(step, SUPERVISED);
                raw(libc::SYS_exit, [0, 0, 0, 0, 0]);
            }
        }
    }
    // A signal and its return: the handler adds one to the step.
    // SAFETY: as above.
    unsafe { std::ptr::write_volatile(step, calls as u32) };
    if let Some(real) = super::interpose::real_sigaction() {
        // SAFETY: a sigaction of this child's own, zeroed then filled; the
        // C library adds its restorer (rt_sigreturn).
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = trial_signal as *const () as usize;
            real(libc::SIGUSR2, &act, std::ptr::null_mut());
            let me = raw(libc::SYS_getpid, [0; 5]);
            let tid = raw(libc::SYS_gettid, [0; 5]);
            raw(libc::SYS_tgkill, [me, tid, libc::SIGUSR2 as c_long, 0, 0]);
        }
    }
    // SAFETY: ends this child (its only thread); exit_group if exit
    // returned.
    unsafe {
        raw(libc::SYS_exit, [0, 0, 0, 0, 0]);
        raw(libc::SYS_exit_group, [0, 0, 0, 0, 0]);
    }
    unreachable!("exit returned")
}

/// A system call through the C library's `syscall`, as the program's own
/// would go (the wrapper below passes it on).
unsafe fn raw(nr: c_long, a: [c_long; 5]) -> c_long {
    // SAFETY: the caller vouches for the call and its arguments.
    unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4]) }
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
        crate::options::attach::pause();
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
    let real = unsafe { PRCTL.get::<F>() };
    let call = || match real {
        // SAFETY: the caller's arguments, passed on as it gave them.
        Some(f) => unsafe { f(option, a2, a3, a4, a5) },
        None => super::interpose::no_such_function(),
    };
    if CAPABILITY_OPTIONS.contains(&option) {
        return super::interpose::with_agent_threads_stopped(|_| call());
    }
    call()
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
    // SECCOMP_SET_MODE_STRICT (0) and SECCOMP_SET_MODE_FILTER (1); other
    // operations only ask (libseccomp asks which actions there are).
    let installs = match n {
        libc::SYS_seccomp => (a1 as libc::c_uint) < 2,
        libc::SYS_prctl => a1 as c_int == libc::PR_SET_SECCOMP,
        _ => false,
    };
    if installs {
        entering();
    }
    // SAFETY: F is syscall's C signature.
    let real = unsafe { SYSCALL.get::<F>() };
    let call = || match real {
        // SAFETY: the caller's arguments, passed on as it gave them.
        Some(f) => unsafe { f(n, a1, a2, a3, a4, a5, a6) },
        None => super::interpose::no_such_function() as c_long,
    };
    // A credential change made directly changes the calling thread only;
    // the agent's threads still step aside and start again with it, so
    // that none keeps what the program gave up.
    let capabilities = n == libc::SYS_prctl && CAPABILITY_OPTIONS.contains(&(a1 as c_int));
    if CREDENTIAL_CALLS.contains(&n) || capabilities {
        let mut r = -1;
        super::interpose::with_agent_threads_stopped(|_| {
            r = call();
            0
        });
        return r;
    }
    call()
}
