//! Every other thread of the process held still for a moment, where it
//! is, so that function entries can be rewritten under it: a thread that
//! had run part of an entry's original instructions must not resume in
//! the middle of a jump written over them, and only a stopped thread's
//! program counter says whether one has.
//!
//! A thread cannot ptrace its own thread group, so a helper task does it:
//! a `clone` sharing our memory, outside the thread group, with no exit
//! signal (the program's `wait` never sees it). It seizes and interrupts
//! each thread, reads its program counter, runs the caller's work itself
//! (no hand-over back and forth: each costs a wake-up), detaches
//! (re-injecting a signal it intercepted) and exits; the caller waits.
//! A ptrace stop, unlike a signal handler, restarts an interrupted system
//! call transparently: a `nanosleep` or `poll` never sees EINTR; the
//! calls that fail with EINTR after any stop (`epoll_wait`) are set up to
//! be made again (`rtprof_shared::syscall_restart`).
//!
//! The helper runs with every signal blocked and makes only system calls:
//! the threads it stops may hold any lock (malloc's among them), and it
//! shares the calling thread's thread-local storage (the caller waits
//! meanwhile). The caller's `work` runs there, so it must not allocate
//! or take a lock either.

use crate::arch::{Native, ThreadContext};
use crate::error::Errno;
use crate::error::PatchError;
use std::time::{Duration, Instant};

/// More threads than this: the process is not stopped (and not switched).
pub(crate) const MAX_THREADS: usize = 4096;
const STACK_BYTES: usize = 64 * 1024;
/// A thread that does not stop within this (blocked in a vfork whose child
/// never execs, say) gives up the attempt.
pub(crate) const DEADLINE: Duration = Duration::from_secs(2);

/// The helper's outcome, in `Shared::error`: done, or an errno.
const DONE: i32 = 0;
const TOO_MANY: i32 = -1;
const NOT_RUN: i32 = -2;

/// What the helper and the caller share. The caller reads it only after
/// the helper has exited.
#[repr(C)]
struct Shared {
    error: i32,
    caller: i32,
    /// The work, called as `run(work, threads)` by the helper.
    run: unsafe fn(*mut u8, &Held<'_>),
    work: *mut u8,
    n: usize,
    tids: [i32; MAX_THREADS],
    /// Signal intercepted at the stop, re-injected at detach.
    sigs: [i32; MAX_THREADS],
    pcs: [u64; MAX_THREADS],
    /// Each stopped thread's thread pointer (0: unknown).
    tps: [u64; MAX_THREADS],
    /// `/proc/<pid>/task`, NUL-terminated.
    task_dir: [u8; 40],
    dents: [u8; 8192],
}

/// The helper's stack and what it shares with the caller, kept from one
/// stop to the next by a caller that stops the program often.
pub struct Stopper {
    stack: *mut libc::c_void,
    shared: Box<Shared>,
}

// SAFETY: the stack and Shared are only used by `run`, which takes `&mut`.
unsafe impl Send for Stopper {}

impl Stopper {
    pub fn new() -> Result<Stopper, PatchError> {
        preflight()?;
        // SAFETY: a fresh private mapping, released in `drop`.
        let stack = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STACK_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if stack == libc::MAP_FAILED {
            return Err(PatchError::Helper(Errno::last()));
        }
        let mut shared = zeroed_shared();
        // SAFETY: a plain system call.
        let dir = format!("/proc/{}/task\0", unsafe { libc::getpid() });
        shared.task_dir[..dir.len()].copy_from_slice(dir.as_bytes());
        Ok(Stopper { stack, shared })
    }

    /// Runs `work` with every other thread of the process stopped, passing
    /// the program counters they stopped at. `work` must not allocate or
    /// take a lock another thread may hold.
    pub fn run<F: FnOnce(&[u64]) -> R, R>(&mut self, work: F) -> Result<R, PatchError> {
        self.run_held(|h: &Held<'_>| work(h.pcs))
    }

    /// As [`Stopper::run`], with each stopped thread's id and thread
    /// pointer besides its program counter.
    pub fn run_held<F: FnOnce(&Held<'_>) -> R, R>(&mut self, work: F) -> Result<R, PatchError> {
        let mut job = Job {
            work: Some(work),
            result: None,
        };
        let s: &mut Shared = &mut self.shared;
        // SAFETY: a plain system call.
        s.caller = unsafe { libc::gettid() };
        s.error = NOT_RUN;
        s.n = 0;
        s.run = Job::<F, R>::run;
        s.work = &mut job as *mut Job<F, R> as *mut u8;
        let sp: *mut Shared = s;
        let (helper, pidfd) = spawn_helper(self.stack, sp).map_err(PatchError::Helper)?;
        let exited = reap(helper, pidfd);
        // SAFETY: the helper has exited: Shared is ours alone again.
        match (exited, unsafe { (*sp).error }) {
            (false, _) => Err(PatchError::Timeout),
            (true, DONE) => job.result.ok_or(PatchError::Helper(Errno(0))),
            (true, TOO_MANY) => Err(PatchError::TooManyThreads),
            (true, NOT_RUN) => Err(PatchError::Helper(Errno(0))),
            (true, libc::EPERM) if traced() => Err(PatchError::Traced),
            (true, e) => Err(PatchError::NotPermitted(Errno(e))),
        }
    }
}

impl Drop for Stopper {
    fn drop(&mut self) {
        // SAFETY: our mapping; no helper runs on it outside `run`.
        unsafe { libc::munmap(self.stack, STACK_BYTES) };
    }
}

/// The caller's work and its result, run by the helper through a pointer.
struct Job<F, R> {
    work: Option<F>,
    result: Option<R>,
}

/// The threads held for the work, in the same order in each slice.
pub struct Held<'a> {
    pub pcs: &'a [u64],
    pub tids: &'a [i32],
    /// Thread pointers (where its thread-local storage is), 0 if unknown.
    pub tps: &'a [u64],
}

impl<F: FnOnce(&Held<'_>) -> R, R> Job<F, R> {
    /// # Safety
    /// `job` points to a live `Job<F, R>` no one else touches meanwhile.
    unsafe fn run(job: *mut u8, held: &Held<'_>) {
        // SAFETY: see above.
        let job = unsafe { &mut *(job as *mut Job<F, R>) };
        if let Some(w) = job.work.take() {
            job.result = Some(w(held));
        }
    }
}

fn traced() -> bool {
    crate::lifecycle::startup::status().tracer.is_some()
}

/// What refuses ptrace for good here, checked once: Yama above 0 lets
/// only an ancestor trace us (or one named by PR_SET_PTRACER, which would
/// replace the program's own choice). A debugger attached later, or a
/// process made undumpable, makes the seize itself fail.
fn preflight() -> Result<(), PatchError> {
    static YAMA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let restricted = *YAMA.get_or_init(|| {
        let scope =
            std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").unwrap_or_default();
        !matches!(scope.trim(), "" | "0")
    });
    if restricted {
        return Err(PatchError::NotPermitted(Errno(libc::EPERM)));
    }
    Ok(())
}

fn zeroed_shared() -> Box<Shared> {
    let layout = std::alloc::Layout::new::<Shared>();
    // SAFETY: every field of Shared is valid as zero bytes; the layout is
    // Shared's own, so Box may free it.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut Shared;
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Box::from_raw(p)
    }
}

/// Starts the helper on `stack` with every signal blocked (it inherits the
/// mask, so no handler of the program ever runs on it): its pid, and a
/// pidfd to wait on (-1 on kernels without CLONE_PIDFD).
fn spawn_helper(stack: *mut libc::c_void, sp: *mut Shared) -> Result<(i32, i32), Errno> {
    let flags = libc::CLONE_VM | libc::CLONE_FS | libc::CLONE_FILES | libc::CLONE_UNTRACED;
    let mut pidfd: libc::c_int = -1;
    crate::count::threads::with_signals_blocked(|| {
        // SAFETY: the helper gets its own stack and `sp`, which outlive it (the
        // caller reaps it before touching either); `pidfd` is written by the
        // kernel at clone.
        unsafe {
            let top = (stack as *mut u8).add(STACK_BYTES) as *mut libc::c_void;
            let arg = sp as *mut libc::c_void;
            let mut pid = libc::clone(helper, top, flags | libc::CLONE_PIDFD, arg, &mut pidfd);
            if pid < 0 && Errno::last() == Errno(libc::EINVAL) {
                pidfd = -1;
                pid = libc::clone(helper, top, flags, arg);
            }
            let e = Errno::last();
            if pid < 0 {
                Err(e)
            } else {
                Ok((pid, pidfd))
            }
        }
    })
}

/// Waits for the helper to exit: false if it had to be killed (a thread
/// that would not stop; its death detaches every thread it holds).
fn reap(helper: i32, pidfd: i32) -> bool {
    let started = Instant::now();
    let mut status = 0;
    let reaped = loop {
        // SAFETY: waits for our own helper task (`__WALL`: it has no exit signal).
        let r = unsafe { libc::waitpid(helper, &mut status, libc::__WALL | libc::WNOHANG) };
        if r == helper {
            break true;
        }
        if (r < 0 && Errno::last() != Errno(libc::EINTR)) || started.elapsed() > DEADLINE {
            break false;
        }
        if pidfd >= 0 {
            let mut p = libc::pollfd {
                fd: pidfd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd on our stack; readable once the helper exits.
            unsafe { libc::poll(&mut p, 1, 100) };
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    };
    if !reaped {
        // SAFETY: our own helper task; then reaped, now that it is dying.
        unsafe {
            libc::kill(helper, libc::SIGKILL);
            libc::waitpid(helper, &mut status, libc::__WALL);
        }
    }
    if pidfd >= 0 {
        // SAFETY: our descriptor.
        unsafe { libc::close(pidfd) };
    }
    reaped && libc::WIFEXITED(status)
}

/// The helper task: only raw system calls from here on (see the module
/// comment). Returns its exit code.
extern "C" fn helper(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: the caller passes its live Shared and waits for us to exit
    // before reading or freeing it.
    let s = unsafe { &mut *(arg as *mut Shared) };
    // Killed with the thread that made it. A process that exits while its
    // threads are held would leave the helper waiting for ever for a
    // thread the kernel reports only once the others are reaped, and the
    // process a zombie its parent never sees end (a build under
    // `budget = 1` hung so); the helper's death lets its tracees go. If
    // that thread is gone already, the process is ending: nothing to do.
    // SAFETY: plain system calls without pointers.
    let orphaned = unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
        // Signal 0 to that thread of the parent: an error if it is gone
        // (or the whole process is: the helper's parent is then another).
        libc::syscall(libc::SYS_tgkill, libc::getppid(), s.caller, 0) != 0
    };
    if orphaned {
        s.error = libc::ESRCH;
        return 0;
    }
    // Shared is valid as zero bytes: the outcome crosses as its code.
    s.error = match stop_all(s) {
        Ok(()) => {
            for i in 0..s.n {
                // A wait our stop failed with EINTR (`epoll_wait`) is made
                // again on resume, as the kernel restarts the others.
                if s.sigs[i] == 0 {
                    rtprof_shared::syscall_restart::retry_interrupted_call(s.tids[i]);
                }
                let (pc, tp) = Native::stopped_pc_tp(s.tids[i]).unwrap_or((0, 0));
                s.pcs[i] = pc;
                s.tps[i] = tp;
            }
            let held = Held {
                pcs: &s.pcs[..s.n],
                tids: &s.tids[..s.n],
                tps: &s.tps[..s.n],
            };
            // SAFETY: `work` is the caller's Job for `run`, untouched by
            // the caller until we exit.
            unsafe { (s.run)(s.work, &held) };
            DONE
        }
        Err(Halt::TooMany) => TOO_MANY,
        Err(Halt::Os(e)) => e.0,
    };
    detach_all(s);
    0
}

/// Why the helper did not stop every thread.
enum Halt {
    /// More than [`MAX_THREADS`].
    TooMany,
    /// A system call failed (ptrace refused, the task list unreadable).
    Os(Errno),
}

impl From<Errno> for Halt {
    fn from(e: Errno) -> Halt {
        Halt::Os(e)
    }
}

/// Seizes and stops every thread but the caller, listing the task
/// directory again until a listing finds none new (a thread not yet
/// stopped may have made one).
fn stop_all(s: &mut Shared) -> Result<(), Halt> {
    loop {
        let before = s.n;
        // SAFETY: a NUL-terminated path in `s`.
        let fd = unsafe {
            libc::open(
                s.task_dir.as_ptr() as *const libc::c_char,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(Errno::last().into());
        }
        let r = seize_listed(s, fd);
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        // All interrupted first, then waited for: their stops overlap.
        // Waited for even when the listing failed part-way (a thread held
        // by another tracer): detach must hand back the signal a thread
        // stopped in the delivery of, and a thread not yet stopped cannot
        // be detached at all.
        let mut kept = before;
        for i in before..s.n {
            if let Some(sig) = wait_stopped(s.tids[i]) {
                s.tids[kept] = s.tids[i];
                s.sigs[kept] = sig;
                kept += 1;
            }
        }
        s.n = kept;
        r?;
        if s.n == before {
            return Ok(());
        }
    }
}

/// Seizes and interrupts every thread listed in `fd` not seized yet.
fn seize_listed(s: &mut Shared, fd: i32) -> Result<(), Halt> {
    loop {
        // SAFETY: reads directory entries into our buffer.
        let got = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                fd,
                s.dents.as_mut_ptr(),
                s.dents.len(),
            )
        };
        if got < 0 {
            return Err(Errno::last().into());
        }
        if got == 0 {
            return Ok(());
        }
        let mut off = 0usize;
        while off + 19 < got as usize {
            // linux_dirent64: ino u64, off i64, reclen u16, type u8, name.
            let reclen = u16::from_ne_bytes([s.dents[off + 16], s.dents[off + 17]]) as usize;
            let name = &s.dents[off + 19..off + reclen.max(19)];
            let tid = parse_tid(name);
            off += reclen.max(1);
            let Some(tid) = tid else { continue };
            if tid == s.caller || s.tids[..s.n].contains(&tid) {
                continue;
            }
            if s.n == MAX_THREADS {
                return Err(Halt::TooMany);
            }
            if seize(tid)? {
                s.tids[s.n] = tid;
                s.sigs[s.n] = 0;
                s.n += 1;
            }
        }
    }
}

fn parse_tid(name: &[u8]) -> Option<i32> {
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let digits = &name[..end];
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    digits.iter().try_fold(0i32, |v, &d| {
        v.checked_mul(10)?.checked_add((d - b'0') as i32)
    })
}

/// Seizes and interrupts `tid`: false if it has ended.
fn seize(tid: i32) -> Result<bool, Errno> {
    // SAFETY: ptrace requests on a thread id; no memory passed.
    unsafe {
        if libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) != 0 {
            return match Errno::last() {
                Errno(libc::ESRCH) => Ok(false),
                e => Err(e),
            };
        }
        libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0);
    }
    Ok(true)
}

/// Waits for seized `tid` to stop: the signal to re-inject at detach, or
/// None if it ended first.
fn wait_stopped(tid: i32) -> Option<i32> {
    loop {
        let mut status = 0;
        // SAFETY: waits for a tracee of ours.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL) };
        if r < 0 {
            match Errno::last() {
                Errno(libc::EINTR) => continue,
                _ => return None,
            }
        }
        if libc::WIFSTOPPED(status) {
            // An event stop (ours, or a group stop) carries no signal to
            // give back; a signal-delivery stop carries the signal.
            let event = status >> 16;
            let sig = libc::WSTOPSIG(status);
            return Some(if event == 0 { sig } else { 0 });
        }
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            return None;
        }
    }
}

fn detach_all(s: &mut Shared) {
    for i in 0..s.n {
        // SAFETY: detaches a tracee of ours, giving back its signal.
        unsafe { libc::ptrace(libc::PTRACE_DETACH, s.tids[i], 0, s.sigs[i] as usize) };
    }
    s.n = 0;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn refusals_say_what_the_system_said() {
        assert_eq!(
            PatchError::NotPermitted(Errno(libc::EPERM)).to_string(),
            "ptrace of its threads refused: Operation not permitted (os error 1)"
        );
        assert_eq!(
            PatchError::Helper(Errno(libc::EAGAIN)).to_string(),
            "no helper task: Resource temporarily unavailable (os error 11)"
        );
    }

    #[test]
    fn other_threads_make_no_progress_while_stopped() {
        let stop = Arc::new(AtomicBool::new(false));
        let ticks: Arc<Vec<AtomicU64>> = Arc::new((0..3).map(|_| AtomicU64::new(0)).collect());
        let mut handles = Vec::new();
        for i in 0..3 {
            let (stop, ticks) = (stop.clone(), ticks.clone());
            handles.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    ticks[i].fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        // A sleeper, which must not see EINTR.
        let sleeper = std::thread::spawn(|| {
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 300_000_000,
            };
            // SAFETY: a timespec on our stack.
            unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) }
        });
        while ticks.iter().any(|t| t.load(Ordering::Relaxed) == 0) {
            std::thread::yield_now();
        }
        // Nothing allocated while the others are stopped (one may hold
        // malloc's lock): the helper counts in this thread's allocation
        // count, whose thread-local storage it shares.
        let r = Stopper::new().and_then(|mut s| {
            s.run(|pcs| {
                let before = crate::test_alloc::allocs();
                let a: [u64; 3] = std::array::from_fn(|i| ticks[i].load(Ordering::Relaxed));
                std::thread::sleep(Duration::from_millis(20));
                let b: [u64; 3] = std::array::from_fn(|i| ticks[i].load(Ordering::Relaxed));
                let allocated = crate::test_alloc::allocs() - before;
                (a == b, pcs.len(), pcs.iter().all(|&p| p != 0), allocated)
            })
        });
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().unwrap();
        }
        let slept = sleeper.join().unwrap();
        let (still, n, pcs_known, allocated) = r.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(allocated, 0, "allocated with the others stopped");
        assert!(still, "a thread ran while stopped");
        assert!(n >= 4, "stopped {n} threads");
        assert!(pcs_known);
        assert_eq!(slept, 0, "nanosleep interrupted");
    }

    thread_local! {
        static MARK: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    /// Each held thread's thread pointer is where its thread-local
    /// storage is: what attach uses to give threads their stripes.
    #[test]
    fn held_threads_come_with_their_thread_pointers() {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let worker = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                MARK.with(|m| m.set(0x5eed));
                let addr = MARK.with(|m| m.as_ptr() as u64);
                // SAFETY: a system call without arguments.
                tx.send((unsafe { libc::gettid() }, addr)).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        };
        let (tid, addr) = rx.recv().unwrap();
        // The same variable's offset from the thread pointer in any thread.
        let mine = MARK.with(|m| m.as_ptr() as u64);
        let my_tp = Native::thread_word(0);
        let r = Stopper::new().and_then(|mut s| {
            s.run_held(|h| {
                let i = h.tids.iter().position(|&t| t == tid)?;
                Some(h.tps[i])
            })
        });
        stop.store(true, Ordering::Relaxed);
        worker.join().unwrap();
        let tp = r.unwrap_or_else(|e| panic!("{e}")).expect("worker held");
        assert_eq!(tp.wrapping_add(mine.wrapping_sub(my_tp)), addr);
    }
}
#[cfg(test)]
mod timing {
    /// `cargo test --release -p rtprof-agent time_stops -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn time_stops() {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let h = std::thread::spawn(move || while !s2.load(std::sync::atomic::Ordering::Relaxed) {});
        let mut stopper = super::Stopper::new().unwrap();
        for _ in 0..5 {
            let t = std::time::Instant::now();
            for _ in 0..100 {
                stopper.run(|_| ()).unwrap();
            }
            eprintln!("per stop {:?}", t.elapsed() / 100);
        }
        let t = std::time::Instant::now();
        for _ in 0..100 {
            super::Stopper::new().unwrap().run(|_| ()).unwrap();
        }
        eprintln!("one-off stop {:?}", t.elapsed() / 100);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        h.join().unwrap();
    }
}
