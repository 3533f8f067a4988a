//! Every thread of a target process held still with ptrace (seize +
//! interrupt), and let go again when dropped, whatever happened meanwhile:
//! every signal a stop intercepted is handed back at detach, once (a
//! fault of the thread's own instruction is delivered at once instead).
//!
//! A thread asked to stop may stop in the delivery of a signal instead of
//! the interrupt's own stop: the kernel clears a pending interrupt at any
//! stop. That stop holds the thread as well, so it is taken as held; a
//! thread resumed from it and then stopped for good hands the signal back
//! by queueing it again.

use super::hazards::{Hazards, Verdict};
use std::time::{Duration, Instant};

/// A thread that does not stop within this (in an uninterruptible sleep,
/// say) gives up the attach.
const STOP_DEADLINE: Duration = Duration::from_secs(2);

pub struct Thread {
    pub tid: i32,
    /// Signals intercepted while the thread was held and withheld from it
    /// since (it was resumed without them): queued again at detach.
    withheld: Vec<libc::siginfo_t>,
    /// The signal whose delivery stop the thread is in now (0: another
    /// stop): PTRACE_DETACH hands it back itself.
    stopped_at: i32,
    /// Still attached (a thread let go early is not detached twice).
    attached: bool,
}

impl Thread {
    fn new(tid: i32) -> Thread {
        Thread {
            tid,
            withheld: Vec::new(),
            stopped_at: 0,
            attached: true,
        }
    }

    /// Resumes the thread with `req` (PTRACE_CONT, PTRACE_SINGLESTEP): a
    /// signal whose delivery stop it leaves is withheld, its siginfo kept
    /// to queue it again at detach.
    pub fn resume(&mut self, req: libc::c_uint) -> Result<(), i32> {
        if self.stopped_at != 0 {
            // SAFETY: all zero bytes is a valid siginfo_t (a plain C struct).
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let got = ptrace(
                libc::PTRACE_GETSIGINFO,
                self.tid,
                0,
                &mut info as *mut libc::siginfo_t as usize,
            );
            if got.is_err() {
                // No siginfo to be had: a plain signal of that number.
                info.si_signo = self.stopped_at;
                info.si_code = SI_TKILL;
            }
            let sig = std::mem::replace(&mut self.stopped_at, 0);
            if is_fault(&info) {
                // Withheld, the instruction would only fault again: the
                // program's handler runs now (a thread in it is not called
                // in).
                return ptrace(req, self.tid, 0, sig as usize).map(|_| ());
            }
            self.withheld.push(info);
        }
        ptrace(req, self.tid, 0, 0).map(|_| ())
    }

    /// A stop seen while waiting: a signal-delivery stop is noted, so the
    /// signal is handed back; a stop of ours that made a system call fail
    /// with EINTR (`epoll_wait`) has the call made again on resume.
    pub fn stopped(&mut self, sig: i32, event: i32) {
        if event == 0 {
            self.stopped_at = sig;
        } else if self.withheld.is_empty() {
            rtprof_shared::syscall_restart::retry_interrupted_call(self.tid);
        }
    }
}

/// `si_code` of a signal sent with tgkill (not exported by the libc crate).
const SI_TKILL: i32 = -6;

/// Whether `info` is a fault of the thread's own instruction (sent by the
/// kernel, `si_code` above 0): one that happens again if withheld.
fn is_fault(info: &libc::siginfo_t) -> bool {
    matches!(
        info.si_signo,
        libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL | libc::SIGTRAP
    ) && info.si_code > 0
}

/// Why the threads could not be held.
#[derive(Debug)]
pub enum SeizeError {
    /// PTRACE_SEIZE refused with this errno on the first thread.
    Refused(i32),
    /// A thread did not stop in time.
    Timeout(i32),
    /// Another system call failed.
    Other(&'static str, std::io::Error),
}

/// Every thread of `pid`, stopped.
pub struct Stopped {
    pub pid: i32,
    pub threads: Vec<Thread>,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn ptrace(req: libc::c_uint, tid: i32, addr: usize, data: usize) -> Result<libc::c_long, i32> {
    // SAFETY: requests whose pointer arguments (if any) the callers pass
    // as valid buffers of the size the request needs.
    let r = unsafe {
        libc::ptrace(
            req,
            tid,
            addr as *mut libc::c_void,
            data as *mut libc::c_void,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

/// The thread ids of `pid` now (none if its task list cannot be read).
pub(super) fn tasks(pid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// What waitpid said about one thread.
pub enum Event {
    /// Stopped: signal number and ptrace event (`status >> 16`).
    Stopped { sig: i32, event: i32 },
    /// The thread (or process) is gone.
    Gone,
}

/// Waits for `tid`'s next state change, until `deadline`.
pub fn wait(tid: i32, deadline: Instant) -> Option<Event> {
    // A single step or an interrupt stops the thread within microseconds:
    // yielding first, rather than sleeping, keeps stepping out of libc fast.
    let mut yields = 0;
    loop {
        let mut status = 0;
        // SAFETY: waits for a thread we trace; `status` is ours.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        if r == tid {
            if libc::WIFSTOPPED(status) {
                return Some(Event::Stopped {
                    sig: libc::WSTOPSIG(status),
                    event: status >> 16,
                });
            }
            return Some(Event::Gone);
        }
        if r < 0 && errno() != libc::EINTR {
            return Some(Event::Gone);
        }
        if Instant::now() > deadline {
            return None;
        }
        if yields < 100 {
            yields += 1;
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl Stopped {
    /// Seizes and interrupts every thread of `pid`, listing its tasks
    /// again until no new one appears (threads may start meanwhile).
    pub fn seize(pid: i32) -> Result<Stopped, SeizeError> {
        let mut s = Stopped {
            pid,
            threads: Vec::new(),
        };
        loop {
            let new: Vec<i32> = tasks(pid)
                .into_iter()
                .filter(|t| !s.threads.iter().any(|h| h.tid == *t))
                .collect();
            if new.is_empty() {
                break;
            }
            for tid in new {
                match ptrace(libc::PTRACE_SEIZE, tid, 0, 0) {
                    Ok(_) => {}
                    // Ended since it was listed.
                    Err(libc::ESRCH) => continue,
                    Err(e) if s.threads.is_empty() => return Err(SeizeError::Refused(e)),
                    Err(e) => {
                        return Err(SeizeError::Other(
                            "PTRACE_SEIZE",
                            std::io::Error::from_raw_os_error(e),
                        ))
                    }
                }
                s.threads.push(Thread::new(tid));
                if let Err(e) = ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) {
                    if e != libc::ESRCH {
                        return Err(SeizeError::Other(
                            "PTRACE_INTERRUPT",
                            std::io::Error::from_raw_os_error(e),
                        ));
                    }
                }
            }
        }
        if s.threads.is_empty() {
            return Err(SeizeError::Refused(libc::ESRCH));
        }
        let deadline = Instant::now() + STOP_DEADLINE;
        for i in 0..s.threads.len() {
            let t = &mut s.threads[i];
            match wait(t.tid, deadline) {
                None => {
                    // The others may have stopped in a signal's delivery:
                    // noted, so that detach hands it back.
                    let late = t.tid;
                    for t in &mut s.threads[i + 1..] {
                        if let Some(Event::Stopped { sig, event }) = wait(t.tid, Instant::now()) {
                            t.stopped(sig, event);
                        }
                    }
                    return Err(SeizeError::Timeout(late));
                }
                Some(Event::Gone) => t.attached = false,
                // The interrupt's stop, a group stop, or a signal's
                // delivery (which took the interrupt's place): held.
                Some(Event::Stopped { sig, event }) => t.stopped(sig, event),
            }
        }
        s.threads.retain(|t| t.attached);
        Ok(s)
    }

    /// Puts first (where calls are made) the thread least likely to hold
    /// a lock the call needs: one asleep in an idle system call, else one
    /// in any system call but futex, else the first (the main thread).
    /// A thread interrupted inside malloc would deadlock on its own lock.
    pub fn choose_caller(&mut self) {
        use super::arch::Regs;
        let rank = |tid: i32| match Regs::get(tid).ok().and_then(|r| r.syscall()) {
            Some(nr) if Regs::idle_syscall(nr) => 0,
            Some(202) | None => 2,
            Some(_) => 1,
        };
        if let Some(best) = (0..self.threads.len()).min_by_key(|&i| rank(self.threads[i].tid)) {
            self.threads.swap(0, best);
        }
    }

    /// Single-steps the calling thread (the first) until it is where
    /// `hazards` allow a call: outside libc's and the loader's code (or
    /// asleep in an idle system call), and not in a signal handler. A
    /// thread interrupted inside malloc would otherwise deadlock on its
    /// own lock. Steps come in rounds; between rounds the thread runs
    /// freely for a moment (a `rep stos` steps one byte at a time; a
    /// handler is left to finish), until `limit`. False if it never got
    /// out.
    pub fn move_caller_out_of(&mut self, hazards: &Hazards, limit: Duration) -> bool {
        const STEPS_PER_ROUND: u32 = 2000;
        let t = &mut self.threads[0];
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            match step_out(t, hazards, STEPS_PER_ROUND, deadline) {
                Some(out) if out => return true,
                Some(_) => {}
                None => return false,
            }
            if t.resume(libc::PTRACE_CONT).is_err() {
                return false;
            }
            std::thread::sleep(Duration::from_micros(300));
            if !interrupt_and_wait(t) {
                return false;
            }
        }
        false
    }

    /// Lets every thread but `keep` run again.
    pub fn release_others(&mut self, keep: i32) {
        let pid = self.pid;
        for t in self.threads.iter_mut().filter(|t| t.tid != keep) {
            detach(pid, t);
        }
    }
}

/// Up to `steps` single steps of `t` until `hazards` allow a call:
/// Some(true) if it got there, Some(false) if not yet (or it is in a
/// signal handler, which is not stepped through), None if the thread is
/// lost or could not be stopped again.
fn step_out(t: &mut Thread, hazards: &Hazards, steps: u32, deadline: Instant) -> Option<bool> {
    use super::arch::Regs;
    for _ in 0..steps {
        let r = Regs::get(t.tid).ok()?;
        match hazards.verdict(t.tid, &r) {
            Verdict::Safe => return Some(true),
            Verdict::InHandler => return Some(false),
            Verdict::InLibc => {}
        }
        t.resume(libc::PTRACE_SINGLESTEP).ok()?;
        // The step's SIGTRAP; a thread that blocks in a system call
        // meanwhile is stopped again where it waits; a signal may come
        // first (and an interrupt left pending stops it once more).
        match wait(t.tid, deadline) {
            Some(Event::Stopped {
                sig: libc::SIGTRAP,
                event: 0,
            }) if !sent_by_a_process(t.tid) => {}
            Some(Event::Stopped { sig, event }) => t.stopped(sig, event),
            Some(Event::Gone) => return None,
            None => return interrupt_and_wait(t).then_some(false),
        }
    }
    Some(false)
}

/// Whether the SIGTRAP `tid` stopped in was sent by a process (kill,
/// tgkill, sigqueue: the program's own) rather than by a single step.
fn sent_by_a_process(tid: i32) -> bool {
    // SAFETY: all zero bytes is a valid siginfo_t (a plain C struct).
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let at = &mut info as *mut libc::siginfo_t as usize;
    ptrace(libc::PTRACE_GETSIGINFO, tid, 0, at).is_ok() && info.si_code <= 0
}

/// Stops a running thread again: in the interrupt's stop, or in the
/// delivery of a signal that came first (which holds it as well).
fn interrupt_and_wait(t: &mut Thread) -> bool {
    if ptrace(libc::PTRACE_INTERRUPT, t.tid, 0, 0).is_err() {
        return false;
    }
    match wait(t.tid, Instant::now() + STOP_DEADLINE) {
        Some(Event::Stopped { sig, event }) => {
            t.stopped(sig, event);
            true
        }
        _ => false,
    }
}

/// Lets `t` go, handing back the signal it is stopped in the delivery of
/// (with its siginfo, by the kernel) and queueing again those withheld.
fn detach(pid: i32, t: &mut Thread) {
    if !t.attached {
        return;
    }
    t.attached = false;
    // Queued while the thread is still held, they are pending when it
    // resumes: their handlers run before it goes back into the call it
    // waited in (made again: `syscall_restart`). Queued after, one would
    // reach it inside that call and end it with EINTR (an `epoll_wait`),
    // the program's own wait failed by a signal that came during our call
    // (the agent's CPU-time sampling signal, say).
    for info in t.withheld.drain(..) {
        requeue(pid, t.tid, &info);
    }
    if ptrace(libc::PTRACE_DETACH, t.tid, 0, t.stopped_at as usize).is_err() {
        // Not in a stop (running after a failed call): stop it, then
        // detach (a signal queued above may be what it stops in).
        if interrupt_and_wait(t) {
            let _ = ptrace(libc::PTRACE_DETACH, t.tid, 0, t.stopped_at as usize);
        }
    }
}

/// Queues `info`'s signal to `tid` again, with its siginfo where the
/// kernel allows one process to send it (a POSIX timer's, a sigqueue's),
/// else as a plain signal of the same number from rtprof (a kill's, a
/// child's exit, an itimer's).
fn requeue(pid: i32, tid: i32, info: &libc::siginfo_t) {
    let sig = info.si_signo;
    // SAFETY: a signal to a thread of the target, `info` read only.
    let queued = unsafe {
        libc::syscall(
            libc::SYS_rt_tgsigqueueinfo,
            pid,
            tid,
            sig,
            info as *const libc::siginfo_t,
        )
    };
    if queued != 0 {
        // SAFETY: a plain system call.
        unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig) };
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for t in &mut self.threads {
            detach(self.pid, t);
        }
    }
}
