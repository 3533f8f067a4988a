//! x86-64 specifics of calling a function in a stopped thread: its
//! registers (general and extended state, saved whole and put back), and
//! the System V calling convention.

#[cfg(not(target_arch = "x86_64"))]
compile_error!("rtprof attach supports x86-64 only");

const NT_X86_XSTATE: usize = 0x202;
/// Enough for every extended state a CPU has today (AVX-512 and AMX tiles).
const XSTATE_BYTES: usize = 16 * 1024;

/// Bytes below the stack pointer the interrupted code may still use.
const RED_ZONE: u64 = 128;

#[derive(Clone, Copy)]
pub struct Regs(libc::user_regs_struct);

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

impl Regs {
    pub fn get(tid: i32) -> Result<Regs, i32> {
        // SAFETY: all-zero is a valid user_regs_struct; the kernel fills it.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        // SAFETY: `tid` is a thread we hold stopped; `r` is the size
        // PTRACE_GETREGS writes.
        let rc = unsafe {
            libc::ptrace(
                libc::PTRACE_GETREGS,
                tid,
                std::ptr::null_mut::<libc::c_void>(),
                &mut r as *mut _ as *mut libc::c_void,
            )
        };
        if rc < 0 {
            return Err(errno());
        }
        Ok(Regs(r))
    }

    pub fn set(&self, tid: i32) -> Result<(), i32> {
        // SAFETY: as in `get`; the kernel only reads the struct.
        let rc = unsafe {
            libc::ptrace(
                libc::PTRACE_SETREGS,
                tid,
                std::ptr::null_mut::<libc::c_void>(),
                &self.0 as *const _ as *mut libc::c_void,
            )
        };
        if rc < 0 {
            return Err(errno());
        }
        Ok(())
    }

    pub fn pc(&self) -> u64 {
        self.0.rip
    }

    pub fn sp(&self) -> u64 {
        self.0.rsp
    }

    /// The code a signal handler returns to (glibc's `__restore_rt`:
    /// `mov rax, 15; syscall`, rt_sigreturn): its address on a thread's
    /// stack marks a handler's frame.
    pub const SIGRETURN: &'static [u8] = &[0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05];

    /// The system call the thread was stopped in, if any.
    pub fn syscall(&self) -> Option<u64> {
        ((self.0.orig_rax as i64) >= 0).then_some(self.0.orig_rax)
    }

    /// Whether a thread stopped in `nr` waits without holding a lock in
    /// user space, as far as one can tell: sleeping, or waiting for I/O,
    /// a child or a signal (futex is left out: it may be waiting inside
    /// malloc or the loader, whose locks a call there would need).
    pub fn idle_syscall(nr: u64) -> bool {
        // read, poll, select, pause, nanosleep, accept, recvfrom, recvmsg,
        // wait4, rt_sigtimedwait, rt_sigsuspend, clock_nanosleep,
        // epoll_wait, pselect6, ppoll, epoll_pwait, accept4, epoll_pwait2.
        matches!(
            nr,
            0 | 7
                | 23
                | 34
                | 35
                | 43
                | 45
                | 47
                | 61
                | 128
                | 130
                | 230
                | 232
                | 270
                | 271
                | 281
                | 288
                | 441
        )
    }

    pub fn ret(&self) -> u64 {
        self.0.rax
    }

    /// Registers for calling `func(args...)` with the stack at `sp` (below
    /// anything of the interrupted code's), returning to address 0: the
    /// return faults, and the tracer sees the SIGSEGV.
    pub fn for_call(&self, func: u64, args: &[u64], sp: u64) -> (Regs, u64) {
        let mut r = self.0;
        // At a function's first instruction rsp + 8 is 16-byte aligned and
        // [rsp] holds the return address.
        let top = sp & !15;
        r.rsp = top - 8;
        r.rip = func;
        let slots = [&mut r.rdi, &mut r.rsi, &mut r.rdx, &mut r.rcx];
        for (s, a) in slots.into_iter().zip(args) {
            *s = *a;
        }
        // Variadic callees read al as the count of vector arguments.
        r.rax = 0;
        // Not in a system call any more: the kernel must not restart one
        // (rewinding rip) when the thread resumes into the call.
        r.orig_rax = u64::MAX;
        (Regs(r), top - 8)
    }

    /// The lowest address of the interrupted code's stack it may still use.
    pub fn stack_floor(&self) -> u64 {
        self.0.rsp - RED_ZONE
    }
}

/// The thread's extended state (x87, SSE, AVX...): a called function may
/// change any vector register, and the interrupted code may be using them.
pub struct Xstate(Vec<u8>);

impl Xstate {
    pub fn get(tid: i32) -> Result<Xstate, i32> {
        let mut buf = vec![0u8; XSTATE_BYTES];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `iov` describes `buf`; the kernel writes at most its
        // length and shrinks iov_len to what it wrote.
        let rc = unsafe {
            libc::ptrace(
                libc::PTRACE_GETREGSET,
                tid,
                NT_X86_XSTATE as *mut libc::c_void,
                &mut iov as *mut _ as *mut libc::c_void,
            )
        };
        if rc < 0 {
            return Err(errno());
        }
        buf.truncate(iov.iov_len);
        Ok(Xstate(buf))
    }

    pub fn set(&mut self, tid: i32) -> Result<(), i32> {
        let mut iov = libc::iovec {
            iov_base: self.0.as_mut_ptr() as *mut libc::c_void,
            iov_len: self.0.len(),
        };
        // SAFETY: `iov` describes our buffer, as GETREGSET filled it.
        let rc = unsafe {
            libc::ptrace(
                libc::PTRACE_SETREGSET,
                tid,
                NT_X86_XSTATE as *mut libc::c_void,
                &mut iov as *mut _ as *mut libc::c_void,
            )
        };
        if rc < 0 {
            return Err(errno());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_starts_with_an_aligned_stack_and_a_zero_return_address_slot() {
        // SAFETY: all-zero is a valid user_regs_struct.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        r.rsp = 0x7fff_0000_1234;
        r.orig_rax = 35;
        let saved = Regs(r);
        assert_eq!(saved.syscall(), Some(35));
        assert!(saved.stack_floor() < r.rsp - 127);
        let (c, slot) = saved.for_call(0x1000, &[1, 2, 3], 0x7fff_0000_0f09);
        assert_eq!(c.pc(), 0x1000);
        assert_eq!(c.0.rsp, slot);
        assert_eq!((c.0.rsp + 8) % 16, 0, "misaligned at entry");
        assert!(c.0.rsp <= 0x7fff_0000_0f09 - 8);
        assert_eq!((c.0.rdi, c.0.rsi, c.0.rdx, c.0.rcx), (1, 2, 3, 0));
        assert_eq!(c.syscall(), None, "a system call would be restarted");
        assert!(Regs::idle_syscall(35) && !Regs::idle_syscall(202));
    }
}
