//! Credential changes: `setuid` and its kin. In a threaded process glibc
//! makes every thread it knows take the new credentials (a signal to each,
//! the same system call in each) and aborts the process if one of them
//! fails. The agent's threads would fail where the program's succeed: a
//! program that keeps its capabilities across `setresuid` (`prctl
//! PR_SET_KEEPCAPS`, `capset`) does so for its own thread only. So the
//! agent's threads step aside for the call and start again afterwards,
//! with the program's new credentials; a thread that kept root's while
//! the program runs as another user would be a way back to root. The
//! same for the calls that change one thread's capabilities or file
//! system ids (`capset`, `setfsuid`, `setfsgid`; `prctl`'s capability
//! options are in `sandbox`, which wraps `prctl`).
//!
//! In a child made by `clone()` (or a raw `fork`/`clone` system call) no
//! fork handler ran: glibc there still lists the agent's threads, which
//! do not exist in the child, and its broadcast would wait for them for
//! ever. Such a child has one task, so the call is made directly, as
//! glibc makes it in a process it knows to be single-threaded. (Once
//! such a child starts threads of its own, glibc's way is taken again.)

use super::interpose::{no_such_function, set_errno, with_agent_threads_stopped, Real};
use super::process_mark::copy_with_one_task;
use libc::{c_char, c_int, c_long, c_void, gid_t, size_t, uid_t};

pub static SETUID: Real = Real::new(c"setuid");
pub static SETGID: Real = Real::new(c"setgid");
pub static SETEUID: Real = Real::new(c"seteuid");
pub static SETEGID: Real = Real::new(c"setegid");
pub static SETREUID: Real = Real::new(c"setreuid");
pub static SETREGID: Real = Real::new(c"setregid");
pub static SETRESUID: Real = Real::new(c"setresuid");
pub static SETRESGID: Real = Real::new(c"setresgid");
pub static SETGROUPS: Real = Real::new(c"setgroups");
pub static INITGROUPS: Real = Real::new(c"initgroups");
pub static CAPSET: Real = Real::new(c"capset");
pub static SETFSUID: Real = Real::new(c"setfsuid");
pub static SETFSGID: Real = Real::new(c"setfsgid");

pub static ALL: [&Real; 13] = [
    &SETUID,
    &SETGID,
    &SETEUID,
    &SETEGID,
    &SETREUID,
    &SETREGID,
    &SETRESUID,
    &SETRESGID,
    &SETGROUPS,
    &INITGROUPS,
    &CAPSET,
    &SETFSUID,
    &SETFSGID,
];

macro_rules! credential_wrapper {
    ($name:ident, $real:ident, ($($arg:ident: $ty:ty),*), $direct:expr) => {
        /// # Safety
        /// Same contract as the libc function of the same name.
        #[cfg_attr(not(test), no_mangle)]
        #[cfg_attr(test, allow(dead_code))]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            type F = unsafe extern "C" fn($($ty),*) -> c_int;
            if copy_with_one_task() {
                return $direct;
            }
            // SAFETY: F is the C signature of the function $real names.
            let real = unsafe { $real.get::<F>() };
            with_agent_threads_stopped(|_| match real {
                // SAFETY: the caller's arguments, as it passed them.
                Some(f) => unsafe { f($($arg),*) },
                None => no_such_function(),
            })
        }
    };
}

/// A credential system call made directly (one task: nobody to tell),
/// through the C library's `syscall`, so errno is set as glibc sets it.
fn direct(nr: c_long, a: c_long, b: c_long, c: c_long) -> c_int {
    type F = unsafe extern "C" fn(c_long, ...) -> c_long;
    // SAFETY: F is syscall's C signature.
    match unsafe { super::sandbox::SYSCALL.get::<F>() } {
        // SAFETY: a credential call of the caller's, with its arguments.
        Some(f) => unsafe { f(nr, a, b, c) as c_int },
        None => no_such_function(),
    }
}

/// glibc refuses -1 ("unchanged") for the one id `seteuid` and `setegid`
/// set, then sets it alone.
fn direct_effective(nr: c_long, id: u32) -> c_int {
    if id == u32::MAX {
        set_errno(libc::EINVAL);
        return -1;
    }
    direct(nr, -1, id as c_long, -1)
}

/// `initgroups` in a child with one task: the user's groups (the C
/// library's own look-up), then `setgroups` made directly.
///
/// # Safety
/// `user` is a NUL-terminated string.
unsafe fn direct_initgroups(user: *const c_char, group: gid_t) -> c_int {
    let mut n: c_int = 64;
    loop {
        let mut groups = vec![0 as gid_t; n as usize];
        let asked = n;
        // SAFETY: a buffer of `n` ids and its length, the caller's name.
        let r = unsafe { libc::getgrouplist(user, group, groups.as_mut_ptr(), &mut n) };
        if r >= 0 {
            let p = groups.as_ptr() as c_long;
            return direct(libc::SYS_setgroups, n as c_long, p, 0);
        }
        if n <= asked {
            n = asked.saturating_mul(2);
        }
        if n > 1 << 20 {
            set_errno(libc::EINVAL);
            return -1;
        }
    }
}

credential_wrapper!(setuid, SETUID, (uid: uid_t), direct(libc::SYS_setuid, uid as c_long, 0, 0));
credential_wrapper!(setgid, SETGID, (gid: gid_t), direct(libc::SYS_setgid, gid as c_long, 0, 0));
credential_wrapper!(seteuid, SETEUID, (uid: uid_t), direct_effective(libc::SYS_setresuid, uid));
credential_wrapper!(setegid, SETEGID, (gid: gid_t), direct_effective(libc::SYS_setresgid, gid));
credential_wrapper!(
    setreuid,
    SETREUID,
    (r: uid_t, e: uid_t),
    direct(libc::SYS_setreuid, r as c_long, e as c_long, 0)
);
credential_wrapper!(
    setregid,
    SETREGID,
    (r: gid_t, e: gid_t),
    direct(libc::SYS_setregid, r as c_long, e as c_long, 0)
);
credential_wrapper!(
    setresuid,
    SETRESUID,
    (r: uid_t, e: uid_t, s: uid_t),
    direct(libc::SYS_setresuid, r as c_long, e as c_long, s as c_long)
);
credential_wrapper!(
    setresgid,
    SETRESGID,
    (r: gid_t, e: gid_t, s: gid_t),
    direct(libc::SYS_setresgid, r as c_long, e as c_long, s as c_long)
);
credential_wrapper!(
    setgroups,
    SETGROUPS,
    (n: size_t, list: *const gid_t),
    direct(libc::SYS_setgroups, n as c_long, list as c_long, 0)
);
// Calls libc's own setgroups, which the wrapper above does not see.
credential_wrapper!(
    initgroups,
    INITGROUPS,
    (user: *const c_char, group: gid_t),
    // SAFETY: the caller's name, as initgroups takes it.
    unsafe { direct_initgroups(user, group) }
);
// These change the calling thread alone, in glibc too: the agent's
// threads start again from it, with what it kept.
credential_wrapper!(
    capset,
    CAPSET,
    (header: *mut c_void, data: *const c_void),
    direct(libc::SYS_capset, header as c_long, data as c_long, 0)
);
credential_wrapper!(setfsuid, SETFSUID, (uid: uid_t), direct(libc::SYS_setfsuid, uid as c_long, 0, 0));
credential_wrapper!(setfsgid, SETFSGID, (gid: gid_t), direct(libc::SYS_setfsgid, gid as c_long, 0, 0));
