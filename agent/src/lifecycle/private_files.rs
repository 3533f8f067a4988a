//! The agent's own threads open files while the program runs (a module's
//! symbols when a sample first lands in it, unwind tables, `/proc/self/maps`,
//! cache files, `/proc/self/mem`). In the program's descriptor table each
//! would be visible for a moment to a program that lists its descriptors
//! (a test of `close_fds`, a daemon closing everything it did not open), or
//! inherited by a child forked just then. So each agent thread first gets a
//! descriptor table of its own, empty: what it opens exists only there.
//! Memory stays shared, so what it maps is everyone's.

use std::cell::Cell;

thread_local! {
    /// This thread's descriptor table is its own.
    static PRIVATE: Cell<bool> = const { Cell::new(false) };
}

/// Gives the calling thread an empty descriptor table of its own; numbers
/// 0-2 are taken by placeholders, so that no file this thread opens gets a
/// number that code writes diagnostics to. On a kernel without
/// `CLOSE_RANGE_UNSHARE` (before 5.9) the thread keeps the shared table.
pub fn enter() {
    // SAFETY: unshares and closes this thread's table only; the kernel
    // copies no descriptor at or above 0, so nothing of the program's is
    // held, even for a moment.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            0u32,
            u32::MAX,
            libc::CLOSE_RANGE_UNSHARE,
        )
    };
    if r != 0 {
        return;
    }
    // `/` as a path-only descriptor: always there, and reads and writes
    // on it fail.
    // SAFETY: a static path; the descriptor is this thread's table's own.
    let fd = unsafe { libc::open(c"/".as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd == 0 {
        // SAFETY: duplicates our own descriptor 0 into this table's 1 and 2.
        unsafe {
            libc::dup2(0, 1);
            libc::dup2(0, 2);
        }
    }
    PRIVATE.with(|p| p.set(true));
}

/// Whether the calling thread's descriptors are its own (its 2 is not the
/// program's standard error).
pub fn is_private() -> bool {
    PRIVATE.try_with(Cell::get).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    fn open(path: &std::ffi::CStr) -> i32 {
        // SAFETY: a NUL-terminated path.
        unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) }
    }

    fn is_open(fd: i32) -> bool {
        // SAFETY: F_GETFD only asks.
        unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
    }

    /// Whether the process's table (what the program lists) holds `target`.
    fn process_has(target: &str) -> bool {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .any(|l| l.to_string_lossy() == target)
    }

    #[test]
    fn a_private_thread_opens_nothing_the_others_see() {
        let shared = open(c"/dev/null");
        assert!(shared >= 0);
        let (opened, go_on) = (channel(), channel::<()>());
        let t = std::thread::spawn(move || {
            enter();
            let saw = is_open(shared);
            let f = open(c"/proc/version");
            opened.0.send((is_private(), f, saw)).unwrap();
            go_on.1.recv().unwrap();
        });
        let (private, theirs, saw_shared) = opened.1.recv().unwrap();
        assert!(private);
        assert!(!saw_shared, "the program's descriptors are not in the copy");
        assert!(theirs > 2, "0-2 are placeholders, got {theirs}");
        assert!(!process_has("/proc/version"), "seen in the process's table");
        go_on.0.send(()).unwrap();
        t.join().unwrap();
        assert!(!is_private());
        // SAFETY: our own descriptor.
        unsafe { libc::close(shared) };
    }
}
