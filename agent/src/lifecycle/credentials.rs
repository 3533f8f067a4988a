//! Credential changes: `setuid` and its kin. In a threaded process glibc
//! makes every thread it knows take the new credentials (a signal to each,
//! the same system call in each) and aborts the process if one of them
//! fails. The agent's threads would fail where the program's succeed: a
//! program that keeps its capabilities across `setresuid` (`prctl
//! PR_SET_KEEPCAPS`, `capset`) does so for its own thread only. So the
//! agent's threads step aside for the call and start again afterwards,
//! with the program's new credentials; a thread that kept root's while
//! the program runs as another user would be a way back to root.

use super::interpose::{no_such_function, with_agent_threads_stopped, Real};
use libc::{c_char, c_int, gid_t, size_t, uid_t};

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

pub static ALL: [&Real; 10] = [
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
];

macro_rules! credential_wrapper {
    ($name:ident, $real:ident, ($($arg:ident: $ty:ty),*)) => {
        /// # Safety
        /// Same contract as the libc function of the same name.
        #[cfg_attr(not(test), no_mangle)]
        #[cfg_attr(test, allow(dead_code))]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            type F = unsafe extern "C" fn($($ty),*) -> c_int;
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

credential_wrapper!(setuid, SETUID, (uid: uid_t));
credential_wrapper!(setgid, SETGID, (gid: gid_t));
credential_wrapper!(seteuid, SETEUID, (uid: uid_t));
credential_wrapper!(setegid, SETEGID, (gid: gid_t));
credential_wrapper!(setreuid, SETREUID, (r: uid_t, e: uid_t));
credential_wrapper!(setregid, SETREGID, (r: gid_t, e: gid_t));
credential_wrapper!(setresuid, SETRESUID, (r: uid_t, e: uid_t, s: uid_t));
credential_wrapper!(setresgid, SETRESGID, (r: gid_t, e: gid_t, s: gid_t));
credential_wrapper!(setgroups, SETGROUPS, (n: size_t, list: *const gid_t));
// Calls libc's own setgroups, which the wrapper above does not see.
credential_wrapper!(initgroups, INITGROUPS, (user: *const c_char, group: gid_t));
