//! Where a thread stopped for a call must not be: in libc's or the
//! loader's code (only there does a thread hold malloc's or the loader's
//! lock, which the calls need), or in a signal handler. A handler may
//! have interrupted `malloc` and runs outside libc: its program counter
//! alone would call it safe. Its frame gives it away: the handler returns
//! to libc's sigreturn code, whose address lies on the stack above it,
//! and while it runs the thread blocks more signals than its frame saved
//! (its own at least). A frame whose saved mask is the thread's mask now
//! is a stale copy (a handler left long ago, or by `siglongjmp`,
//! whose bytes a live function's locals still hold: PostgreSQL's
//! backends carry one from the postmaster's handlers).

use super::arch::Regs;
use super::inject::Mapping;
use super::refuse;
use std::os::unix::fs::FileExt;

/// What makes a stopped thread unsafe to call in, for one process.
pub struct Hazards {
    pid: i32,
    /// Every mapping's extent (the stacks among them).
    ranges: Vec<(u64, u64)>,
    /// libc's and the loader's code.
    code: Vec<(u64, u64)>,
    frames: SignalFrames,
}

impl Hazards {
    /// From the process's memory map (`/proc/PID/maps`).
    pub fn of(pid: i32, maps_text: &str) -> Hazards {
        let maps = super::inject::mappings(maps_text);
        let code = lock_takers(&maps);
        let libc: Vec<(u64, u64)> = maps
            .iter()
            .filter(|m| m.exec && is_libc(refuse::file_name(&m.path)))
            .map(|m| (m.start, m.end))
            .collect();
        let frames = SignalFrames::find(pid, &libc);
        Hazards {
            pid,
            ranges: ranges(maps_text),
            code,
            frames,
        }
    }

    /// Where thread `tid` (held), stopped with `r`, is: safe when outside
    /// libc and the loader (or asleep in an idle system call) and not in a
    /// signal handler.
    pub fn verdict(&self, tid: i32, r: &Regs) -> Verdict {
        let idle = r.syscall().is_some_and(Regs::idle_syscall);
        let inside = self
            .code
            .iter()
            .any(|&(lo, hi)| r.pc() >= lo && r.pc() < hi);
        if inside && !idle {
            Verdict::InLibc
        } else if self
            .frames
            .on_stack(self.pid, &self.ranges, r.sp(), blocked_signals(tid))
        {
            Verdict::InHandler
        } else {
            Verdict::Safe
        }
    }
}

/// Where a stopped thread is, for a call.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Safe,
    /// In libc's or the loader's code: a step or two may get it out.
    InLibc,
    /// In a signal handler: it must finish first.
    InHandler,
}

fn is_libc(name: &str) -> bool {
    name.starts_with("libc.so") || name.starts_with("libc-")
}

/// The code of libc and the loader: a thread stopped there may hold
/// malloc's or the loader's lock, which dlopen takes.
fn lock_takers(maps: &[Mapping]) -> Vec<(u64, u64)> {
    maps.iter()
        .filter(|m| {
            let n = refuse::file_name(&m.path);
            m.exec && (is_libc(n) || n.starts_with("ld-linux"))
        })
        .map(|m| (m.start, m.end))
        .collect()
}

/// Stack bytes above the stack pointer searched for a handler's frame.
const SEARCHED: u64 = 256 * 1024;

/// Where the target's sigreturn code is (in libc).
pub struct SignalFrames {
    sigreturns: Vec<u64>,
}

impl SignalFrames {
    /// Finds the sigreturn code in the target's libc (in its memory, as
    /// it runs).
    pub fn find(pid: i32, libc_code: &[(u64, u64)]) -> SignalFrames {
        let mut sigreturns = Vec::new();
        let Ok(mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
            return SignalFrames { sigreturns };
        };
        for &(lo, hi) in libc_code {
            let mut code = vec![0u8; (hi - lo) as usize];
            if mem.read_exact_at(&mut code, lo).is_err() {
                continue;
            }
            let n = Regs::SIGRETURN.len();
            sigreturns.extend(
                code.windows(n)
                    .enumerate()
                    .filter(|(_, w)| *w == Regs::SIGRETURN)
                    .map(|(i, _)| lo + i as u64),
            );
        }
        SignalFrames { sigreturns }
    }

    /// Whether the stack above `sp` (within its mapping) holds the frame
    /// of a handler still running: its return address, and its signal
    /// among those `blocked` (a mask, bit N-1 for signal N; unknown: all).
    /// Unknown (unreadable) counts as yes.
    pub fn on_stack(&self, pid: i32, known: &[(u64, u64)], sp: u64, blocked: u64) -> bool {
        if self.sigreturns.is_empty() {
            return false;
        }
        let within = |ranges: &[(u64, u64)]| {
            ranges
                .iter()
                .find(|&&(lo, hi)| sp >= lo && sp < hi)
                .map(|&(_, hi)| hi)
        };
        // A stack mapped since the map was read (a new thread's): read again.
        let fresh = || {
            let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
            within(&ranges(&text))
        };
        let Some(end) = within(known).or_else(fresh) else {
            return true;
        };
        let end = end.min(sp.saturating_add(SEARCHED));
        let start = sp & !7;
        let Ok(mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
            return true;
        };
        let mut stack = vec![0u8; end.saturating_sub(start) as usize];
        if mem.read_exact_at(&mut stack, start).is_err() {
            return true;
        }
        let mapped = |a: u64| known.iter().any(|&(lo, hi)| a >= lo && a < hi);
        // A handler runs with more signals blocked than the code it
        // interrupted (its own, at least): the mask its frame saved.
        let running = |saved: u64| blocked & saved == saved && blocked != saved;
        has_frame(&stack, start, &self.sigreturns, &mapped, &running)
    }
}

/// Where the interrupted code's stack pointer and program counter lie in
/// a signal frame, from the word holding the handler's return address:
/// then the ucontext's flags, link and stack (8 + 8 + 24 bytes), and its
/// saved r8-r15, rdi, rsi, rbp, rbx, rdx, rax, rcx (15 words).
const FRAME_SP: usize = 8 + 8 + 8 + 24 + 15 * 8;
const FRAME_PC: usize = FRAME_SP + 8;
/// The signal mask of the interrupted code, after the ucontext's flags,
/// link, stack and machine context (256 bytes). (The siginfo after it is
/// written only for SA_SIGINFO handlers.)
const FRAME_MASK: usize = 8 + 8 + 8 + 24 + 256;

/// Whether `stack` (read from address `at`) holds a signal frame: a word
/// equal to one of `targets` whose frame saved a stack pointer above it
/// (or on another stack: a handler on `sigaltstack`) and a program
/// counter that is `mapped`, whose saved signal mask says it is `running`
/// (the thread blocks more now, as while a handler runs). A stray copy of the address (glibc leaves
/// one in `sigaction`'s locals) is not a frame.
fn has_frame(
    stack: &[u8],
    at: u64,
    targets: &[u64],
    mapped: &dyn Fn(u64) -> bool,
    running: &dyn Fn(u64) -> bool,
) -> bool {
    let word = |i: usize| {
        stack
            .get(i..i + 8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
    };
    (0..stack.len() / 8).map(|k| k * 8).any(|i| {
        if !word(i).is_some_and(|v| targets.contains(&v)) {
            return false;
        }
        match (word(i + FRAME_SP), word(i + FRAME_PC), word(i + FRAME_MASK)) {
            (Some(sp), Some(pc), Some(saved)) => {
                (sp > at + i as u64 || !mapped(sp)) && mapped(pc) && pc != 0 && running(saved)
            }
            // Cut off by the end of what was read: taken as a frame.
            _ => true,
        }
    })
}

/// The signals held thread `tid` blocks (bit N-1 for signal N); all if
/// unknown.
fn blocked_signals(tid: i32) -> u64 {
    let mut mask: u64 = 0;
    // SAFETY: `tid` is held by us; the kernel writes 8 bytes of mask.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_GETSIGMASK,
            tid,
            std::mem::size_of::<u64>() as *mut libc::c_void,
            &mut mask as *mut u64 as *mut libc::c_void,
        )
    };
    if r != 0 {
        return u64::MAX;
    }
    mask
}

/// Every mapping's extent in a `/proc/PID/maps` text, anonymous ones too.
fn ranges(maps_text: &str) -> Vec<(u64, u64)> {
    maps_text
        .lines()
        .filter_map(|l| {
            let (a, b) = l.split(' ').next()?.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_needs_a_saved_stack_pointer_above_it_a_mapped_pc_and_its_signal_blocked() {
        let restorer = 0x7f00_1234u64;
        let mapped = |a: u64| (0x1000..0x9000).contains(&a) || (0x40_0000..0x50_0000).contains(&a);
        // SIGCHLD's handler runs, interrupting code that blocked SIGUSR1:
        // both are blocked now.
        let now = 1u64 << (libc::SIGCHLD - 1) | 1 << (libc::SIGUSR1 - 1);
        let running = |saved: u64| now & saved == saved && now != saved;
        let at = 0x1000u64;
        let frame_of = |sp: u64, pc: u64, saved: u64| {
            let mut stack = vec![0u8; 512];
            stack[40..48].copy_from_slice(&restorer.to_le_bytes());
            stack[40 + FRAME_SP..48 + FRAME_SP].copy_from_slice(&sp.to_le_bytes());
            stack[40 + FRAME_PC..48 + FRAME_PC].copy_from_slice(&pc.to_le_bytes());
            stack[40 + FRAME_MASK..48 + FRAME_MASK].copy_from_slice(&saved.to_le_bytes());
            stack
        };
        let frame = |sp, pc| frame_of(sp, pc, 1 << (libc::SIGUSR1 - 1));
        let found =
            |stack: &[u8], targets: &[u64]| has_frame(stack, at, targets, &mapped, &running);
        assert!(found(&frame(0x1800, 0x40_1000), &[restorer]));
        // Interrupted on another stack (the handler on sigaltstack).
        assert!(found(&frame(0xa000, 0x40_1000), &[restorer]));
        // A stray copy: what follows is no frame.
        assert!(!found(&frame(0x1010, 0x40_1000), &[restorer]));
        assert!(!found(&frame(0x1800, 0), &[restorer]));
        assert!(!found(&frame(0x1800, 0x40_1000), &[restorer + 1]));
        // A whole frame that saved the mask the thread has now: a handler
        // that has returned (or jumped out) left it behind.
        assert!(!found(&frame_of(0x1800, 0x40_1000, now), &[restorer]));
        // Not at a word boundary: not a return address.
        let mut odd = vec![0u8; 512];
        odd[41..49].copy_from_slice(&restorer.to_le_bytes());
        assert!(!found(&odd, &[restorer]));
    }

    #[test]
    fn this_process_has_its_sigreturn_found_and_seen_in_a_handler() {
        use std::sync::atomic::{AtomicBool, Ordering};
        static SEEN: AtomicBool = AtomicBool::new(false);
        static HAZARDS: std::sync::OnceLock<Hazards> = std::sync::OnceLock::new();
        // SAFETY: a system call without pointers.
        let pid = unsafe { libc::getpid() };
        let hazards = Hazards::of(pid, &std::fs::read_to_string("/proc/self/maps").unwrap());
        assert!(
            !hazards.frames.sigreturns.is_empty(),
            "no sigreturn code in libc"
        );
        assert!(
            !frames_here(&hazards),
            "a handler's frame found outside any handler"
        );
        let _ = HAZARDS.set(hazards);
        extern "C" fn on_usr1(_: libc::c_int) {
            SEEN.store(frames_here(HAZARDS.get().unwrap()), Ordering::Relaxed);
        }
        // SAFETY: installs a handler for a signal this test sends itself.
        unsafe {
            libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t);
            libc::raise(libc::SIGUSR1);
        }
        assert!(SEEN.load(Ordering::Relaxed), "no frame found in a handler");
    }

    fn frames_here(h: &Hazards) -> bool {
        let marker = 0u64;
        let sp = &marker as *const u64 as u64;
        // SAFETY: a sigset_t is a bit array: zero bytes are the empty set;
        // a null new mask only reads the current one into `set`.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set) };
        let blocked = (1..=64)
            // SAFETY: `set` is a live, initialised sigset_t.
            .filter(|&s| unsafe { libc::sigismember(&set, s) } == 1)
            .fold(0u64, |m, s| m | 1 << (s - 1));
        h.frames.on_stack(h.pid, &h.ranges, sp, blocked)
    }
}
