//! The libc functions wrapped only for trap entries: while trap entries
//! exist, SIGTRAP must reach their handler, so the program's handler for
//! it is kept aside (`sigset`, `sysv_signal`, `bsd_signal`, `sigignore`)
//! and no mask it hands the C library blocks it (`sigsuspend`, `ppoll` and
//! its fortified form, `pselect`, `epoll_pwait`, `epoll_pwait2`,
//! `pthread_attr_setsigmask_np`, `sigsetmask`, `sigblock`, `sighold`,
//! `setcontext`, `swapcontext`). With no trap entry each passes its
//! arguments on unchanged. (`sigaction`, `signal` and the mask calls are
//! the core's, in `lifecycle::interpose`, and ask `traps` the same.)

use crate::lifecycle::interpose::{no_such_function, Real, SignalFn};

pub static SIGSUSPEND: Real = Real::new(c"sigsuspend");
pub static PPOLL: Real = Real::new(c"ppoll");
pub static PSELECT: Real = Real::new(c"pselect");
pub static EPOLL_PWAIT: Real = Real::new(c"epoll_pwait");
pub static EPOLL_PWAIT2: Real = Real::new(c"epoll_pwait2");
pub static ATTR_SETSIGMASK: Real = Real::new(c"pthread_attr_setsigmask_np");
pub static SIGSETMASK: Real = Real::new(c"sigsetmask");
pub static SIGBLOCK: Real = Real::new(c"sigblock");
pub static SIGHOLD: Real = Real::new(c"sighold");
pub static SIGSET: Real = Real::new(c"sigset");
pub static SYSV_SIGNAL: Real = Real::new(c"sysv_signal");
pub static BSD_SIGNAL: Real = Real::new(c"bsd_signal");
pub static SETCONTEXT: Real = Real::new(c"setcontext");
pub static SWAPCONTEXT: Real = Real::new(c"swapcontext");
pub static SIGIGNORE: Real = Real::new(c"sigignore");
pub static PPOLL_CHK: Real = Real::new(c"__ppoll_chk");
pub static SIGSUSPEND2: Real = Real::new(c"__sigsuspend");

/// Looked up from the agent's constructor with the core's (see
/// `interpose::resolve`).
pub static ALL: [&Real; 17] = [
    &SIGSUSPEND,
    &PPOLL,
    &PSELECT,
    &EPOLL_PWAIT,
    &EPOLL_PWAIT2,
    &ATTR_SETSIGMASK,
    &SIGSETMASK,
    &SIGBLOCK,
    &SIGHOLD,
    &SIGSET,
    &SYSV_SIGNAL,
    &BSD_SIGNAL,
    &SETCONTEXT,
    &SWAPCONTEXT,
    &SIGIGNORE,
    &PPOLL_CHK,
    &SIGSUSPEND2,
];

/// `mask` without SIGTRAP while trap entries exist: a pointer to `keep`
/// (filled in) or `mask` itself.
///
/// # Safety
/// `mask` is null or a valid signal set.
unsafe fn unmasked(
    mask: *const libc::sigset_t,
    keep: &mut libc::sigset_t,
) -> *const libc::sigset_t {
    match super::without_trap(mask) {
        Some(m) => {
            *keep = m;
            keep
        }
        None => mask,
    }
}

/// Declares wrappers that pass on every argument, the one mask among them
/// without SIGTRAP while trap entries exist.
macro_rules! unmasking {
    ($($(#[$doc:meta])* $name:ident / $real:ident ($($arg:ident: $ty:ty),*; $mask:ident) -> $ret:ty, $none:expr;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// The C library function's contract.
        #[cfg_attr(not(test), no_mangle)]
        #[cfg_attr(test, allow(dead_code))]
        pub unsafe extern "C" fn $name($($arg: $ty,)* $mask: *const libc::sigset_t) -> $ret {
            // SAFETY: an all-zero sigset_t is valid; `unmasked` fills it.
            let mut keep: libc::sigset_t = std::mem::zeroed();
            let $mask = unmasked($mask, &mut keep);
            type F = unsafe extern "C" fn($($ty,)* *const libc::sigset_t) -> $ret;
            match $real.get::<F>() {
                Some(real) => real($($arg,)* $mask),
                None => $none,
            }
        }
    )*};
}

unmasking! {
    /// `sigsuspend(2)`.
    sigsuspend / SIGSUSPEND (; mask) -> libc::c_int, no_such_function();
    /// `__sigsuspend`, its other name.
    __sigsuspend / SIGSUSPEND2 (; mask) -> libc::c_int, no_such_function();
    /// `ppoll(2)`.
    ppoll / PPOLL (fds: *mut libc::pollfd, n: libc::nfds_t, timeout: *const libc::timespec; mask)
        -> libc::c_int, no_such_function();
    /// `pselect(2)`.
    pselect / PSELECT (n: libc::c_int, r: *mut libc::fd_set, w: *mut libc::fd_set,
        e: *mut libc::fd_set, timeout: *const libc::timespec; mask) -> libc::c_int,
        no_such_function();
    /// `epoll_pwait(2)`.
    epoll_pwait / EPOLL_PWAIT (fd: libc::c_int, events: *mut libc::epoll_event, max: libc::c_int,
        timeout: libc::c_int; mask) -> libc::c_int, no_such_function();
    /// `epoll_pwait2(2)`.
    epoll_pwait2 / EPOLL_PWAIT2 (fd: libc::c_int, events: *mut libc::epoll_event,
        max: libc::c_int, timeout: *const libc::timespec; mask) -> libc::c_int,
        no_such_function();
    /// `pthread_attr_setsigmask_np(3)`: the mask a new thread starts with.
    pthread_attr_setsigmask_np / ATTR_SETSIGMASK (attr: *mut libc::pthread_attr_t; mask)
        -> libc::c_int, libc::ENOSYS;
}

/// Declares wrappers of the BSD mask calls (an `int` of signal bits).
macro_rules! bsd_mask {
    ($($(#[$doc:meta])* $name:ident / $real:ident;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// The C library function's contract.
        #[cfg_attr(not(test), no_mangle)]
        #[cfg_attr(test, allow(dead_code))]
        pub unsafe extern "C" fn $name(mask: libc::c_int) -> libc::c_int {
            type F = unsafe extern "C" fn(libc::c_int) -> libc::c_int;
            match $real.get::<F>() {
                Some(real) => real(super::without_trap_bits(mask)),
                None => no_such_function(),
            }
        }
    )*};
}

bsd_mask! {
    /// `sigsetmask(3)`.
    sigsetmask / SIGSETMASK;
    /// `sigblock(3)`.
    sigblock / SIGBLOCK;
}

/// `sighold(3)`: holding SIGTRAP does nothing while trap entries exist.
///
/// # Safety
/// The C library function's contract.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn sighold(sig: libc::c_int) -> libc::c_int {
    if sig == libc::SIGTRAP && super::on() {
        return 0;
    }
    type F = unsafe extern "C" fn(libc::c_int) -> libc::c_int;
    match SIGHOLD.get::<F>() {
        Some(real) => real(sig),
        None => no_such_function(),
    }
}

/// Declares wrappers of `signal`'s relatives: SIGTRAP's handler is kept
/// aside while trap entries exist.
macro_rules! signal_like {
    ($($(#[$doc:meta])* $name:ident / $real:ident, $flags:expr;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// The C library function's contract.
        #[cfg_attr(not(test), no_mangle)]
        #[cfg_attr(test, allow(dead_code))]
        pub unsafe extern "C" fn $name(
            sig: libc::c_int,
            handler: libc::sighandler_t,
        ) -> libc::sighandler_t {
            // SIG_HOLD (2) asks for SIGTRAP blocked: it stays as it is.
            if sig == libc::SIGTRAP && super::owns_disposition() {
                return match handler {
                    2 => super::program_handler(),
                    h => super::program_signal(h, $flags),
                };
            }
            match $real.get::<SignalFn>() {
                Some(real) => real(sig, handler),
                None => libc::SIG_ERR,
            }
        }
    )*};
}

signal_like! {
    /// `sigset(3)`.
    sigset / SIGSET, 0;
    /// `sysv_signal(3)`: a one-shot handler.
    sysv_signal / SYSV_SIGNAL, libc::SA_RESETHAND | libc::SA_NODEFER;
    /// `bsd_signal(3)`.
    bsd_signal / BSD_SIGNAL, 0;
}

/// `sigignore(3)`: ignoring SIGTRAP is kept aside like a handler.
///
/// # Safety
/// The C library function's contract.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn sigignore(sig: libc::c_int) -> libc::c_int {
    if sig == libc::SIGTRAP && super::owns_disposition() {
        super::program_signal(libc::SIG_IGN, 0);
        return 0;
    }
    type F = unsafe extern "C" fn(libc::c_int) -> libc::c_int;
    match SIGIGNORE.get::<F>() {
        Some(real) => real(sig),
        None => no_such_function(),
    }
}

/// `ppoll` as `_FORTIFY_SOURCE` calls it (`fdslen`: the array's size).
///
/// # Safety
/// The C library function's contract.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: *const libc::timespec,
    mask: *const libc::sigset_t,
    fdslen: libc::size_t,
) -> libc::c_int {
    // SAFETY: an all-zero sigset_t is valid; `unmasked` fills it.
    let mut keep: libc::sigset_t = std::mem::zeroed();
    let mask = unmasked(mask, &mut keep);
    type F = unsafe extern "C" fn(
        *mut libc::pollfd,
        libc::nfds_t,
        *const libc::timespec,
        *const libc::sigset_t,
        libc::size_t,
    ) -> libc::c_int;
    match PPOLL_CHK.get::<F>() {
        Some(real) => real(fds, n, timeout, mask, fdslen),
        None => no_such_function(),
    }
}

/// A context's mask without SIGTRAP while trap entries exist (in place:
/// the program's own struct, which it made with `getcontext`).
///
/// # Safety
/// `uc` is null or a valid context.
unsafe fn unmask_context(uc: *const libc::ucontext_t) {
    if !uc.is_null() && super::on() {
        libc::sigdelset(
            &mut (*(uc as *mut libc::ucontext_t)).uc_sigmask,
            libc::SIGTRAP,
        );
    }
}

/// `setcontext(3)`.
///
/// # Safety
/// The C library function's contract.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn setcontext(uc: *const libc::ucontext_t) -> libc::c_int {
    unmask_context(uc);
    type F = unsafe extern "C" fn(*const libc::ucontext_t) -> libc::c_int;
    match SETCONTEXT.get::<F>() {
        Some(real) => real(uc),
        None => no_such_function(),
    }
}

/// `swapcontext(3)`.
///
/// # Safety
/// The C library function's contract.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn swapcontext(
    old: *mut libc::ucontext_t,
    uc: *const libc::ucontext_t,
) -> libc::c_int {
    unmask_context(uc);
    type F = unsafe extern "C" fn(*mut libc::ucontext_t, *const libc::ucontext_t) -> libc::c_int;
    match SWAPCONTEXT.get::<F>() {
        Some(real) => real(old, uc),
        None => no_such_function(),
    }
}
