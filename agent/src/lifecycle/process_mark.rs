//! Which process this code runs in, told without a system call. A page
//! marked `MADV_WIPEONFORK` holds 1 in the process the agent started in
//! (and in each child whose fork handlers ran, which marks it again): the
//! kernel hands any other child made by copying this process's memory
//! (`clone()` without `CLONE_VM`, a raw `fork` or `clone` system call) the
//! page zeroed. Such a child has one task, but glibc there still lists the
//! agent's threads, which do not exist in it.
//!
//! A vfork child (or any task sharing our memory) reads the parent's mark:
//! telling those apart still takes `getpid`, which
//! `sampling::in_own_process` makes only while no seccomp filter may exist.

use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

static MARK: AtomicPtr<AtomicU32> = AtomicPtr::new(std::ptr::null_mut());

/// What the mark says of the memory this code runs in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Memory {
    /// The agent's process, a fork child its handlers made its own, or a
    /// task sharing their memory (vfork).
    Own,
    /// A copy of it no handler of ours saw: the child of `clone()` or of a
    /// raw system call.
    Copied,
    /// No mark could be made (the kernel lacks `MADV_WIPEONFORK`).
    Unknown,
}

/// Marks this process, making the page on first use. From start-up, after
/// any seccomp filter present has been tried (mmap and madvise are among
/// start-up's calls), and from the fork child's handler (no system call
/// then: the page exists, its copy was zeroed).
pub fn mark_this_process() {
    let mut p = MARK.load(Ordering::Acquire);
    if p.is_null() {
        p = new_page();
        if p.is_null() {
            return;
        }
        MARK.store(p, Ordering::Release);
    }
    // SAFETY: our page, mapped for the life of the process.
    unsafe { (*p).store(1, Ordering::Release) };
}

/// What the mark says here (a load, no system call).
pub fn memory() -> Memory {
    let p = MARK.load(Ordering::Acquire);
    if p.is_null() {
        return Memory::Unknown;
    }
    // SAFETY: our page, mapped for the life of the process (a child's copy
    // of the mapping included).
    match unsafe { (*p).load(Ordering::Acquire) } {
        0 => Memory::Copied,
        _ => Memory::Own,
    }
}

/// The second word of the page: threads this copied child started (zero in
/// every new copy, as the mark is).
fn threads_word() -> Option<&'static AtomicU32> {
    let p = MARK.load(Ordering::Acquire);
    // SAFETY: the page holds 1,024 words; ours for the life of the process.
    (!p.is_null()).then(|| unsafe { &*p.add(1) })
}

/// A thread is being started: in a copied child, noted (its credential
/// calls can no longer be made for one task alone).
pub fn note_thread_started() {
    if memory() == Memory::Copied {
        if let Some(w) = threads_word() {
            w.store(1, Ordering::Release);
        }
    }
}

/// A copied child with the one task it was made with: a credential call
/// made directly changes the whole process.
pub fn copy_with_one_task() -> bool {
    memory() == Memory::Copied && threads_word().is_some_and(|w| w.load(Ordering::Acquire) == 0)
}

/// A private anonymous page zeroed in every child, or null.
fn new_page() -> *mut AtomicU32 {
    // SAFETY: a fresh private anonymous page; nothing is replaced.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    // SAFETY: advice on the page just mapped, ours alone.
    if unsafe { libc::madvise(p, 4096, libc::MADV_WIPEONFORK) } != 0 {
        // SAFETY: the page mapped above, never handed out.
        unsafe { libc::munmap(p, 4096) };
        return std::ptr::null_mut();
    }
    p as *mut AtomicU32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_without_our_handlers_sees_the_mark_zeroed() {
        mark_this_process();
        assert_eq!(memory(), Memory::Own);
        // A raw fork: no handler of ours runs in the child.
        // SAFETY: the child only reads memory and exits.
        let pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) };
        if pid == 0 {
            let code = if memory() == Memory::Copied { 0 } else { 1 };
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(code) };
        }
        assert!(pid > 0);
        let mut status = 0;
        // SAFETY: waits for the child just made.
        unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        assert_eq!(memory(), Memory::Own, "the parent's mark stays");
    }
}
