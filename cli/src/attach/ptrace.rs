//! Every thread of a target process held still with ptrace (seize +
//! interrupt), and let go again when dropped, whatever happened meanwhile:
//! a signal the stop intercepted is handed back at detach.

use std::time::{Duration, Instant};

/// A thread that does not stop within this (in an uninterruptible sleep,
/// say) gives up the attach.
const STOP_DEADLINE: Duration = Duration::from_secs(2);

pub struct Thread {
    pub tid: i32,
    /// A signal intercepted while the thread was held: re-injected at detach.
    pub pending: i32,
    /// Still attached (a thread let go early is not detached twice).
    attached: bool,
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

pub fn cont(tid: i32, sig: i32) -> Result<(), i32> {
    ptrace(libc::PTRACE_CONT, tid, 0, sig as usize).map(|_| ())
}

fn tasks(pid: i32) -> Vec<i32> {
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
        std::thread::sleep(Duration::from_micros(200));
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
                s.threads.push(Thread {
                    tid,
                    pending: 0,
                    attached: true,
                });
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
        for t in &mut s.threads {
            loop {
                match wait(t.tid, deadline) {
                    None => return Err(SeizeError::Timeout(t.tid)),
                    Some(Event::Gone) => {
                        t.attached = false;
                        break;
                    }
                    // The interrupt (or a group stop): held.
                    Some(Event::Stopped { event, .. }) if event == libc::PTRACE_EVENT_STOP => break,
                    // A signal arrived first: keep it for detach, wait for
                    // the interrupt's stop.
                    Some(Event::Stopped { sig, .. }) => {
                        if t.pending == 0 {
                            t.pending = sig;
                        }
                        if cont(t.tid, 0).is_err() {
                            t.attached = false;
                            break;
                        }
                    }
                }
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

    /// Single-steps the calling thread (the first) until it is outside
    /// `avoid` (libc's and the loader's code: only there does a thread
    /// hold malloc's or the loader's lock, which the calls need) or asleep
    /// in an idle system call. A thread interrupted inside malloc would
    /// otherwise deadlock on its own lock. Steps come in rounds; between
    /// rounds the thread runs freely for a moment (a `rep stos` steps one
    /// byte at a time), until `limit`. False if it never got out.
    pub fn move_caller_out_of(&mut self, avoid: &[(u64, u64)], limit: Duration) -> bool {
        const STEPS_PER_ROUND: u32 = 2000;
        let t = &mut self.threads[0];
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            match step_out(t, avoid, STEPS_PER_ROUND, deadline) {
                Some(out) if out => return true,
                Some(_) => {}
                None => return false,
            }
            if cont(t.tid, 0).is_err() {
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
        for t in self.threads.iter_mut().filter(|t| t.tid != keep) {
            detach(t);
        }
    }
}

/// Up to `steps` single steps of `t` until it is out of `avoid` (or
/// asleep in an idle system call): Some(true) if it got out, Some(false)
/// if not yet, None if the thread is lost or could not be stopped again.
fn step_out(t: &mut Thread, avoid: &[(u64, u64)], steps: u32, deadline: Instant) -> Option<bool> {
    use super::arch::Regs;
    for _ in 0..steps {
        let r = Regs::get(t.tid).ok()?;
        let idle = r.syscall().is_some_and(Regs::idle_syscall);
        if idle || !avoid.iter().any(|&(lo, hi)| r.pc() >= lo && r.pc() < hi) {
            return Some(true);
        }
        ptrace(libc::PTRACE_SINGLESTEP, t.tid, 0, 0).ok()?;
        // The step's SIGTRAP; a thread that blocks in a system call
        // meanwhile is stopped again where it waits.
        match wait(t.tid, deadline) {
            Some(Event::Stopped {
                sig: libc::SIGTRAP,
                event: 0,
            }) => {}
            Some(Event::Stopped { event, .. }) if event == libc::PTRACE_EVENT_STOP => {}
            Some(Event::Stopped { sig, .. }) => {
                if t.pending == 0 {
                    t.pending = sig;
                }
            }
            Some(Event::Gone) => return None,
            None => return interrupt_and_wait(t).then_some(false),
        }
    }
    Some(false)
}

/// Stops a running thread again; a signal that arrives first is kept for
/// detach.
fn interrupt_and_wait(t: &mut Thread) -> bool {
    if ptrace(libc::PTRACE_INTERRUPT, t.tid, 0, 0).is_err() {
        return false;
    }
    let deadline = Instant::now() + STOP_DEADLINE;
    loop {
        match wait(t.tid, deadline) {
            Some(Event::Stopped { event, .. }) if event == libc::PTRACE_EVENT_STOP => return true,
            Some(Event::Stopped { sig, .. }) => {
                if t.pending == 0 {
                    t.pending = sig;
                }
                if cont(t.tid, 0).is_err() {
                    return false;
                }
            }
            _ => return false,
        }
    }
}

fn detach(t: &mut Thread) {
    if !t.attached {
        return;
    }
    t.attached = false;
    if ptrace(libc::PTRACE_DETACH, t.tid, 0, t.pending as usize).is_ok() {
        return;
    }
    // Not in a stop (running after a failed call): stop it, then detach.
    if ptrace(libc::PTRACE_INTERRUPT, t.tid, 0, 0).is_ok() {
        let _ = wait(t.tid, Instant::now() + STOP_DEADLINE);
        let _ = ptrace(libc::PTRACE_DETACH, t.tid, 0, t.pending as usize);
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for t in &mut self.threads {
            detach(t);
        }
    }
}
