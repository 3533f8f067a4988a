//! Moments the agent must act on that the program reaches through libc:
//! the image ending without exit handlers (`_exit`, `_Exit`, the exec
//! family: the last samples are drained first), and entering a user
//! namespace (`unshare`, `setns`: only a single-threaded process may, so
//! the drain thread steps aside for the call).
//!
//! Each wrapper forwards to the next definition (libc's). The real
//! functions are looked up at start-up, so a vfork child, which must not
//! take the loader's locks, never calls `dlsym` here.

use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering};

struct Real {
    name: &'static CStr,
    addr: AtomicUsize,
}

impl Real {
    const fn new(name: &'static CStr) -> Real {
        Real {
            name,
            addr: AtomicUsize::new(0),
        }
    }
    fn get(&self) -> usize {
        let mut f = self.addr.load(Ordering::Acquire);
        if f == 0 {
            f = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) } as usize;
            self.addr.store(f, Ordering::Release);
        }
        f
    }
}

static EXIT: Real = Real::new(c"_exit");
static EXIT2: Real = Real::new(c"_Exit");
static EXECVE: Real = Real::new(c"execve");
static EXECV: Real = Real::new(c"execv");
static EXECVP: Real = Real::new(c"execvp");
static EXECVPE: Real = Real::new(c"execvpe");
static FEXECVE: Real = Real::new(c"fexecve");
static UNSHARE: Real = Real::new(c"unshare");
static SETNS: Real = Real::new(c"setns");

/// Looks every wrapped function up now (start-up).
pub fn resolve() {
    for r in [
        &EXIT, &EXIT2, &EXECVE, &EXECV, &EXECVP, &EXECVPE, &FEXECVE, &UNSHARE, &SETNS,
    ] {
        r.get();
    }
}

type Argv = *const *const libc::c_char;

fn no_such_function() -> libc::c_int {
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    -1
}

/// Drains, then calls `f`; errno is the program's again afterwards.
fn ending<T>(f: impl FnOnce() -> T) -> T {
    let errno = unsafe { *libc::__errno_location() };
    let _ = std::panic::catch_unwind(crate::sampling::image_ending);
    unsafe { *libc::__errno_location() = errno };
    f()
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
            let _ = std::panic::catch_unwind(crate::sampling::image_ending);
            match $real.get() {
                0 => libc::syscall(libc::SYS_exit_group, status) as usize,
                f => std::mem::transmute::<usize, F>(f)(status),
            };
            libc::abort()
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
            ending(|| match $real.get() {
                0 => no_such_function(),
                f => std::mem::transmute::<usize, F>(f)($($arg),*),
            })
        }
    };
}

exec_wrapper!(execve, EXECVE, (path: *const libc::c_char, argv: Argv, envp: Argv));
exec_wrapper!(execv, EXECV, (path: *const libc::c_char, argv: Argv));
exec_wrapper!(execvp, EXECVP, (file: *const libc::c_char, argv: Argv));
exec_wrapper!(execvpe, EXECVPE, (file: *const libc::c_char, argv: Argv, envp: Argv));
exec_wrapper!(fexecve, FEXECVE, (fd: libc::c_int, argv: Argv, envp: Argv));

/// Runs `f` with the drain thread stopped if `needs_one_thread`.
fn single_threaded(needs_one_thread: bool, f: impl Fn() -> libc::c_int) -> libc::c_int {
    let paused = needs_one_thread && crate::sampling::pause_drain();
    let budget_paused = needs_one_thread && crate::budget::pause();
    let mut rc = f();
    // A joined thread leaves the kernel's thread group a moment after
    // join returns; until then the kernel still says EINVAL.
    for _ in 0..200 {
        if !(paused && rc == -1 && unsafe { *libc::__errno_location() } == libc::EINVAL) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
        rc = f();
    }
    if paused || budget_paused {
        let errno = unsafe { *libc::__errno_location() };
        if paused {
            let _ = std::panic::catch_unwind(crate::sampling::resume_drain);
        }
        if budget_paused {
            let _ = std::panic::catch_unwind(crate::budget::resume);
        }
        unsafe { *libc::__errno_location() = errno };
    }
    rc
}

/// # Safety
/// Same contract as `unshare(2)`.
#[cfg_attr(not(test), no_mangle)]
#[cfg_attr(test, allow(dead_code))]
pub unsafe extern "C" fn unshare(flags: libc::c_int) -> libc::c_int {
    type F = unsafe extern "C" fn(libc::c_int) -> libc::c_int;
    single_threaded(flags & libc::CLONE_NEWUSER != 0, || match UNSHARE.get() {
        0 => no_such_function(),
        f => std::mem::transmute::<usize, F>(f)(flags),
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
    single_threaded(user, || match SETNS.get() {
        0 => no_such_function(),
        f => std::mem::transmute::<usize, F>(f)(fd, nstype),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn real_functions_resolve() {
        super::resolve();
        assert_ne!(super::EXECVE.get(), 0);
        assert_ne!(super::UNSHARE.get(), 0);
    }
}
