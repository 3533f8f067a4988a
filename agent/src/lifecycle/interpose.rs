//! Every libc function the agent wraps, and the one table of the real
//! functions behind them. A preloaded library's exported definitions come
//! first in symbol lookup, so the program's calls land here; each wrapper
//! forwards to the next definition (libc's) and tells counting and
//! sampling what happened:
//!
//! - threads: `pthread_create` (a new thread gets its stripe and timer
//!   before its start routine runs);
//! - fork: `fork`, `_Fork`, `__register_atfork` (our fork handlers go
//!   first; a child gets its own segment and sampler);
//! - the image ending without exit handlers: `_exit`, `_Exit`, the exec
//!   family (the last samples are drained first);
//! - user namespaces: `unshare`, `setns` (only a single-threaded process
//!   may enter one, so the agent's threads step aside for the call);
//! - the profiling signal: `sigaction`, `signal` (the program taking
//!   SIGPROF over stops the timers; it sees its own disposition, not ours),
//!   `sigprocmask`, `pthread_sigmask` (a timer waiting for SIGPROF to be
//!   unblocked starts);
//! - with trap entries (`options::traps`), SIGTRAP: `sigaction` and
//!   `signal` keep the program's handler for it aside, and the mask calls
//!   never block it; the other libc functions wrapped only for trap
//!   entries are in `options::traps::signals`.
//!
//! The real functions are looked up from the agent's constructor, so a
//! vfork child, which must not take the loader's locks, never calls
//! `dlsym` here.

use crate::{count::threads, lifecycle::fork, options::budget, sampling};
use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering};

/// [`Real::addr`] of a function looked up and not found (never a
/// function's address: odd, in the zero page).
const MISSING: usize = 1;

/// The next definition of a wrapped function, looked up once.
pub struct Real {
    name: &'static CStr,
    addr: AtomicUsize,
}

impl Real {
    pub(crate) const fn new(name: &'static CStr) -> Real {
        Real {
            name,
            addr: AtomicUsize::new(0),
        }
    }

    /// Its address, or 0 if the next object has none (looked up once:
    /// [`MISSING`] remembers a failed lookup, so a vfork child never calls
    /// `dlsym` for a function this C library lacks).
    fn addr(&self) -> usize {
        let mut f = self.addr.load(Ordering::Acquire);
        if f == 0 {
            // SAFETY: a NUL-terminated name; dlsym only looks it up.
            f = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) } as usize;
            self.addr
                .store(if f == 0 { MISSING } else { f }, Ordering::Release);
        }
        if f == MISSING {
            0
        } else {
            f
        }
    }

    /// Its address, if the next object defines it.
    pub fn original(&self) -> Option<u64> {
        Some(self.addr() as u64).filter(|&a| a != 0)
    }

    /// Calls go to `to` from now on: the original, reached through a
    /// detour once its entry is sent to our wrapper (attach).
    pub fn redirect(&self, to: u64) {
        self.addr.store(to as usize, Ordering::Release);
    }

    /// The function as `F`, if the next object defines it.
    ///
    /// # Safety
    /// `F` must be the C signature of the function this names.
    pub unsafe fn get<F: Copy>(&self) -> Option<F> {
        const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<usize>()) };
        let f = self.addr();
        // SAFETY: a function pointer of the size of usize (asserted), of
        // the signature the caller vouches for.
        (f != 0).then(|| unsafe { std::mem::transmute_copy::<usize, F>(&f) })
    }
}

pub static EXIT: Real = Real::new(c"_exit");
pub static EXIT2: Real = Real::new(c"_Exit");
pub static EXECVE: Real = Real::new(c"execve");
pub static EXECV: Real = Real::new(c"execv");
pub static EXECVP: Real = Real::new(c"execvp");
pub static EXECVPE: Real = Real::new(c"execvpe");
pub static FEXECVE: Real = Real::new(c"fexecve");
pub static UNSHARE: Real = Real::new(c"unshare");
pub static SETNS: Real = Real::new(c"setns");
pub static FORK: Real = Real::new(c"fork");
pub static FORK_WITHOUT_HANDLERS: Real = Real::new(c"_Fork");
pub static REGISTER_ATFORK: Real = Real::new(c"__register_atfork");
pub static PTHREAD_CREATE: Real = Real::new(c"pthread_create");
pub static SIGACTION: Real = Real::new(c"sigaction");
pub static SIGNAL: Real = Real::new(c"signal");
pub static SIGPROCMASK: Real = Real::new(c"sigprocmask");
pub static PTHREAD_SIGMASK: Real = Real::new(c"pthread_sigmask");

static ALL: [&Real; 17] = [
    &EXIT,
    &EXIT2,
    &EXECVE,
    &EXECV,
    &EXECVP,
    &EXECVPE,
    &FEXECVE,
    &UNSHARE,
    &SETNS,
    &FORK,
    &FORK_WITHOUT_HANDLERS,
    &REGISTER_ATFORK,
    &PTHREAD_CREATE,
    &SIGACTION,
    &SIGNAL,
    &SIGPROCMASK,
    &PTHREAD_SIGMASK,
];

/// Looks every wrapped function up now: from the agent's constructor,
/// whether or not it goes on to profile.
pub fn resolve() {
    for r in ALL
        .iter()
        .chain(&crate::options::traps::signals::ALL)
        .chain(&super::credentials::ALL)
        .chain(&super::sandbox::ALL)
        .chain(&crate::options::routes::ALL)
    {
        r.addr();
    }
}

pub type StartFn = extern "C" fn(*mut libc::c_void) -> *mut libc::c_void;
pub type CreateFn = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    StartFn,
    *mut libc::c_void,
) -> libc::c_int;
pub type RegisterFn = unsafe extern "C" fn(
    Option<extern "C" fn()>,
    Option<extern "C" fn()>,
    Option<extern "C" fn()>,
    *mut libc::c_void,
) -> libc::c_int;
pub type SigactionFn =
    unsafe extern "C" fn(libc::c_int, *const libc::sigaction, *mut libc::sigaction) -> libc::c_int;
pub(crate) type SignalFn =
    unsafe extern "C" fn(libc::c_int, libc::sighandler_t) -> libc::sighandler_t;
type MaskFn =
    unsafe extern "C" fn(libc::c_int, *const libc::sigset_t, *mut libc::sigset_t) -> libc::c_int;
type ForkFn = unsafe extern "C" fn() -> libc::pid_t;
type Argv = *const *const libc::c_char;

/// libc's `pthread_create`.
pub fn real_pthread_create() -> Option<CreateFn> {
    // SAFETY: CreateFn is pthread_create's C signature.
    unsafe { PTHREAD_CREATE.get() }
}

/// libc's `__register_atfork`.
pub fn real_register_atfork() -> Option<RegisterFn> {
    // SAFETY: RegisterFn is __register_atfork's C signature.
    unsafe { REGISTER_ATFORK.get() }
}

/// libc's `sigaction`.
pub fn real_sigaction() -> Option<SigactionFn> {
    // SAFETY: SigactionFn is sigaction's C signature.
    unsafe { SIGACTION.get() }
}

pub(crate) fn errno() -> libc::c_int {
    // SAFETY: this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

pub(crate) fn set_errno(e: libc::c_int) {
    // SAFETY: this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

pub(crate) fn no_such_function() -> libc::c_int {
    set_errno(libc::ENOSYS);
    -1
}

/// Runs `f` (ours, between the program's call and its return), keeping
/// the program's errno and never unwinding into it.
pub(crate) fn quietly(f: impl FnOnce() + std::panic::UnwindSafe) {
    let e = errno();
    let _ = std::panic::catch_unwind(f);
    set_errno(e);
}

// ---- Threads ----

/// What a program thread runs first: its stripe and timer, then the
/// program's start routine.
struct ThreadStart {
    start: StartFn,
    arg: *mut libc::c_void,
}

extern "C" fn thread_start(p: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: `p` is the Box the pthread_create wrapper leaked for this
    // thread, taken back exactly once, here.
    let ts = unsafe { Box::from_raw(p as *mut ThreadStart) };
    threads::mark_program_thread();
    quietly(|| {
        threads::attach_current();
        sampling::thread_started();
        if crate::options::traps::on() {
            crate::options::traps::unblock_here();
        }
    });
    (ts.start)(ts.arg)
}

/// The program's last thread has ended: the agent's threads end too, so
/// glibc can end the process as usual.
pub fn program_threads_gone() {
    sampling::program_threads_gone();
    budget::program_threads_gone();
    crate::options::attach::program_threads_gone();
}

/// Wraps thread creation so the new thread has its stripe before its start
/// routine runs. Without an active agent it only forwards.
///
/// # Safety
/// Same contract as `pthread_create(3)`.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: StartFn,
    arg: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: the caller's contract is pthread_create's.
    unsafe { create_thread(thread, attr, start, arg) }
}

/// What [`pthread_create`] does, under a name of this library alone: where
/// libc's entry is sent here (attach), the exported name would resolve to
/// libc's first, and so back to that entry.
///
/// # Safety
/// Same contract as `pthread_create(3)`.
pub unsafe extern "C" fn create_thread(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: StartFn,
    arg: *mut libc::c_void,
) -> libc::c_int {
    let Some(real) = real_pthread_create() else {
        return libc::EAGAIN;
    };
    super::process_mark::note_thread_started();
    if crate::agent().is_none() {
        return real(thread, attr, start, arg);
    }
    let boxed = Box::into_raw(Box::new(ThreadStart { start, arg }));
    // Counted before it exists: the creator may end first.
    threads::program_thread_coming();
    let rc = real(thread, attr, thread_start, boxed as *mut libc::c_void);
    if rc != 0 {
        threads::program_thread_not_started();
        drop(Box::from_raw(boxed));
    }
    rc
}

// ---- Fork ----

/// `fork()`: once it has returned in the child (every fork handler done,
/// allocating and starting threads safe again), the child starts a sampler
/// and a budget of its own.
///
/// # Safety
/// Same contract as `fork(2)`.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn fork() -> libc::pid_t {
    // SAFETY: the caller's contract is fork's.
    unsafe { fork_child() }
}

/// What [`fork`] does, under a name of this library alone (as
/// [`create_thread`] for `pthread_create`).
///
/// # Safety
/// Same contract as `fork(2)`.
pub unsafe extern "C" fn fork_child() -> libc::pid_t {
    let Some(real) = FORK.get::<ForkFn>() else {
        return no_such_function();
    };
    let pid = real();
    if pid == 0 {
        quietly(|| fork::run_steps(fork::CHILD_STARTS));
    }
    pid
}

/// `_Fork` makes a child without running fork handlers; ours must still
/// run, or the child would count into its parent's segment.
///
/// # Safety
/// Same contract as glibc's `_Fork`.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
#[allow(non_snake_case)]
pub unsafe extern "C" fn _Fork() -> libc::pid_t {
    let Some(real) = FORK_WITHOUT_HANDLERS.get::<ForkFn>() else {
        return no_such_function();
    };
    let pid = real();
    if pid == 0 {
        quietly(|| fork::become_child(threads::stripe()));
    }
    pid
}

/// Every `pthread_atfork` registration passes through here (glibc's
/// `pthread_atfork` is a static stub calling this): ours goes first.
///
/// # Safety
/// Same contract as glibc's `__register_atfork`.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn __register_atfork(
    prepare: Option<extern "C" fn()>,
    parent: Option<extern "C" fn()>,
    child: Option<extern "C" fn()>,
    dso: *mut libc::c_void,
) -> libc::c_int {
    fork::register_ours_once();
    match real_register_atfork() {
        Some(real) => real(prepare, parent, child, dso),
        None => libc::ENOMEM,
    }
}

// ---- The image ending ----

/// Drains the last samples before this image ends (errno kept).
fn image_ending() {
    quietly(sampling::image_ending);
}

macro_rules! exit_wrapper {
    ($name:ident, $real:ident) => {
        /// # Safety
        /// Same contract as `_exit(2)`.
        #[cfg_attr(not(test), no_mangle)]
        #[cfg_attr(test, allow(dead_code))]
        #[allow(non_snake_case)]
        pub unsafe extern "C" fn $name(status: libc::c_int) -> ! {
            type F = unsafe extern "C" fn(libc::c_int) -> !;
            image_ending();
            fork::ending_without_exit_handlers();
            match $real.get::<F>() {
                Some(f) => f(status),
                None => {
                    libc::syscall(libc::SYS_exit_group, status);
                    libc::abort()
                }
            }
        }
    };
}

exit_wrapper!(_exit, EXIT);
exit_wrapper!(_Exit, EXIT2);

macro_rules! exec_wrapper {
    ($name:ident, $real:ident, ($($arg:ident: $ty:ty),*)) => {
        /// # Safety
        /// Same contract as the libc function of the same name.
        #[cfg_attr(not(test), no_mangle)]
        #[cfg_attr(test, allow(dead_code))]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> libc::c_int {
            type F = unsafe extern "C" fn($($ty),*) -> libc::c_int;
            image_ending();
            match $real.get::<F>() {
                Some(f) => f($($arg),*),
                None => no_such_function(),
            }
        }
    };
}

exec_wrapper!(execve, EXECVE, (path: *const libc::c_char, argv: Argv, envp: Argv));
exec_wrapper!(execv, EXECV, (path: *const libc::c_char, argv: Argv));
exec_wrapper!(execvp, EXECVP, (file: *const libc::c_char, argv: Argv));
exec_wrapper!(execvpe, EXECVPE, (file: *const libc::c_char, argv: Argv, envp: Argv));
exec_wrapper!(fexecve, FEXECVE, (fd: libc::c_int, argv: Argv, envp: Argv));

// ---- User namespaces ----

/// Runs `f` with the agent's threads stopped if `needs_one_thread`, again
/// while the kernel still counts a thread just joined (EINVAL): a process
/// must be single-threaded to enter a user namespace.
fn single_threaded(needs_one_thread: bool, f: impl Fn() -> libc::c_int) -> libc::c_int {
    if !needs_one_thread {
        return f();
    }
    with_agent_threads_stopped(|joined| {
        let mut rc = f();
        // A joined thread leaves the kernel's thread group a moment after
        // join returns; until then the kernel still says EINVAL.
        for _ in 0..200 {
            if !(joined && rc == -1 && errno() == libc::EINVAL) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
            rc = f();
        }
        rc
    })
}

/// Runs `f` with the agent's threads (drain, budget, attach control)
/// stopped and joined (`f` is told whether any was), and starts them again
/// after it (the attach control thread at rtprof's next request); errno
/// is `f`'s. Not in a vfork child, whose threads are its parent's.
pub(crate) fn with_agent_threads_stopped(f: impl FnOnce(bool) -> libc::c_int) -> libc::c_int {
    if !sampling::in_own_process() {
        return f(false);
    }
    let paused = sampling::pause_drain();
    let budget_paused = budget::pause();
    let control_paused = crate::options::attach::pause();
    let rc = f(paused || budget_paused || control_paused);
    let e = errno();
    if paused {
        quietly(sampling::resume_drain);
    }
    if budget_paused {
        quietly(budget::resume);
    }
    set_errno(e);
    rc
}

/// # Safety
/// Same contract as `unshare(2)`.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn unshare(flags: libc::c_int) -> libc::c_int {
    type F = unsafe extern "C" fn(libc::c_int) -> libc::c_int;
    single_threaded(flags & libc::CLONE_NEWUSER != 0, || {
        match UNSHARE.get::<F>() {
            Some(f) => f(flags),
            None => no_such_function(),
        }
    })
}

/// # Safety
/// Same contract as `setns(2)`.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn setns(fd: libc::c_int, nstype: libc::c_int) -> libc::c_int {
    type F = unsafe extern "C" fn(libc::c_int, libc::c_int) -> libc::c_int;
    // 0 means "any type": it may be a user namespace.
    let user = nstype == 0 || nstype & libc::CLONE_NEWUSER != 0;
    single_threaded(user, || match SETNS.get::<F>() {
        Some(f) => f(fd, nstype),
        None => no_such_function(),
    })
}

// ---- The profiling signal ----

/// `sigaction(2)` as the program sees it: unchanged, except that taking
/// SIGPROF over stops our timers first, and that while they run the
/// program sees its own disposition, not our handler.
///
/// # Safety
/// Same contract as `sigaction(2)`.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn sigaction(
    sig: libc::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    if sig == libc::SIGTRAP && crate::options::traps::owns_disposition() {
        return crate::options::traps::program_sigaction(act, old);
    }
    let shown = sampling::timer::program_view(sig);
    if !act.is_null() {
        sampling::timer::program_takes_signal(sig, (*act).sa_sigaction);
    }
    let Some(real) = real_sigaction() else {
        return no_such_function();
    };
    // A handler of the program's runs with SIGTRAP unblocked.
    let mut unmasked: libc::sigaction;
    let act = match act.is_null() {
        false => match crate::options::traps::without_trap(&(*act).sa_mask) {
            Some(mask) => {
                unmasked = *act;
                unmasked.sa_mask = mask;
                &unmasked as *const libc::sigaction
            }
            None => act,
        },
        true => act,
    };
    let rc = real(sig, act, old);
    if let (Some(view), 0, false) = (shown, rc, old.is_null()) {
        (*old).sa_sigaction = view;
        (*old).sa_flags = 0;
        libc::sigemptyset(&mut (*old).sa_mask);
    }
    rc
}

/// `signal(3)`: glibc's calls its internal sigaction directly, so it is
/// wrapped too.
///
/// # Safety
/// Same contract as `signal(3)`.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn signal(
    sig: libc::c_int,
    handler: libc::sighandler_t,
) -> libc::sighandler_t {
    if sig == libc::SIGTRAP && crate::options::traps::owns_disposition() {
        return crate::options::traps::program_signal(handler, 0);
    }
    let shown = sampling::timer::program_view(sig);
    sampling::timer::program_takes_signal(sig, handler);
    let Some(real) = SIGNAL.get::<SignalFn>() else {
        return libc::SIG_ERR;
    };
    match (real(sig, handler), shown) {
        (old, Some(view)) if old != libc::SIG_ERR => view,
        (old, _) => old,
    }
}

/// `sigprocmask(2)`, unchanged, then a waiting timer may start.
///
/// # Safety
/// Same contract as `sigprocmask(2)`.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn sigprocmask(
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    match SIGPROCMASK.get::<MaskFn>() {
        Some(real) => masked(real, how, set, old),
        None => no_such_function(),
    }
}

/// `pthread_sigmask(3)`, unchanged, then a waiting timer may start.
///
/// # Safety
/// Same contract as `pthread_sigmask(3)`.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn pthread_sigmask(
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    match PTHREAD_SIGMASK.get::<MaskFn>() {
        Some(real) => masked(real, how, set, old),
        None => libc::ENOSYS,
    }
}

/// Calls the real mask function; if the mask changed, a timer waiting for
/// SIGPROF to be unblocked may start.
///
/// # Safety
/// The mask function's contract.
unsafe fn masked(
    real: MaskFn,
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    // SIGTRAP stays unblocked while trap entries exist.
    let unmasked = match how {
        libc::SIG_UNBLOCK => None,
        _ => crate::options::traps::without_trap(set),
    };
    let set = unmasked
        .as_ref()
        .map_or(set, |s| s as *const libc::sigset_t);
    let rc = real(how, set, old);
    if rc == 0 && !set.is_null() {
        sampling::timer::mask_changed();
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_real_function_resolves_to_libc() {
        resolve();
        for r in ALL.iter().chain(&crate::options::traps::signals::ALL) {
            assert_ne!(r.addr(), 0, "{:?} not found", r.name);
        }
        // And is libc's, not our wrapper (which the test build does not
        // export, so the lookup cannot find it either way).
        let f = real_sigaction().unwrap();
        // SAFETY: integers, a handler address and a signal set: all
        // valid as zero bytes.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: reads SIGUSR2's disposition into a live local.
        assert_eq!(unsafe { f(libc::SIGUSR2, std::ptr::null(), &mut old) }, 0);
    }
}
