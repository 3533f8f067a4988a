//! Calling functions inside a held process, as debuggers do: one held
//! thread's registers are saved, set up for the call with its arguments
//! written below its stack, and the thread runs until the call returns to
//! address 0 and faults; then every register is put back.

use super::arch::{Regs, Xstate};
use super::ptrace::{self, Event, Stopped};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

/// A call that has not returned by then lets the other threads run (it
/// may wait for a lock one of them holds) ...
const RELEASE_AFTER: Duration = Duration::from_secs(5);
/// ... and one that still has not returned is given up.
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);
/// Room left below the interrupted code's stack for our strings.
const SCRATCH: u64 = 4096;

#[derive(Debug)]
pub enum CallError {
    Ptrace(&'static str, i32),
    /// The argument strings could not be written into the target.
    Memory(std::io::Error),
    /// The call faulted somewhere other than its return (pc there).
    Crashed(u64),
    /// The target ended during the call.
    Gone,
    /// The call never returned (its thread is left running it).
    Hung,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Ptrace(what, e) => {
                write!(f, "{what}: {}", std::io::Error::from_raw_os_error(*e))
            }
            CallError::Memory(e) => write!(f, "cannot write into the process: {e}"),
            CallError::Crashed(pc) => write!(f, "the call faulted at {pc:#x}"),
            CallError::Gone => write!(f, "the process ended during the call"),
            CallError::Hung => write!(
                f,
                "the call did not return within {} s",
                GIVE_UP_AFTER.as_secs()
            ),
        }
    }
}

/// Calls `func(args...)` in the first held thread; each `Arg::Str` is
/// written into the target first and passed as a pointer. Returns the
/// call's return value. The thread's registers are restored whatever
/// happens, unless the call never returns.
pub fn call(s: &mut Stopped, func: u64, args: &[Arg]) -> Result<u64, CallError> {
    let tid = s.threads[0].tid;
    let saved = Regs::get(tid).map_err(|e| CallError::Ptrace("PTRACE_GETREGS", e))?;
    let mut xsaved = Xstate::get(tid).map_err(|e| CallError::Ptrace("PTRACE_GETREGSET", e))?;
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{}/mem", s.pid))
        .map_err(CallError::Memory)?;
    // Strings go below the red zone, the call's own stack below them.
    let mut at = saved.stack_floor() - SCRATCH;
    let mut values = Vec::with_capacity(args.len());
    for a in args {
        match a {
            Arg::Int(v) => values.push(*v),
            Arg::Str(text) => {
                let mut b = text.as_bytes().to_vec();
                b.push(0);
                at = (at - b.len() as u64) & !15;
                mem.write_all_at(&b, at).map_err(CallError::Memory)?;
                values.push(at);
            }
        }
    }
    let (regs, ret_slot) = saved.for_call(func, &values, at - 64);
    mem.write_all_at(&0u64.to_le_bytes(), ret_slot)
        .map_err(CallError::Memory)?;
    let outcome = run_call(s, tid, &regs);
    if matches!(outcome, Err(CallError::Hung) | Err(CallError::Gone)) {
        return outcome;
    }
    // Back exactly as it was: general registers (with a system call to
    // restart, if it was in one) and the vector state.
    saved
        .set(tid)
        .map_err(|e| CallError::Ptrace("PTRACE_SETREGS (restore)", e))?;
    xsaved
        .set(tid)
        .map_err(|e| CallError::Ptrace("PTRACE_SETREGSET (restore)", e))?;
    outcome
}

/// Lets the calling thread run on (a signal it was stopped in the delivery
/// of is withheld until detach).
fn resume(s: &mut Stopped, tid: i32) -> Result<(), CallError> {
    let t = s.threads.iter_mut().find(|t| t.tid == tid);
    let t = t.ok_or(CallError::Gone)?;
    t.resume(libc::PTRACE_CONT)
        .map_err(|e| CallError::Ptrace("PTRACE_CONT", e))
}

fn run_call(s: &mut Stopped, tid: i32, regs: &Regs) -> Result<u64, CallError> {
    regs.set(tid)
        .map_err(|e| CallError::Ptrace("PTRACE_SETREGS", e))?;
    resume(s, tid)?;
    let started = Instant::now();
    let mut released = false;
    loop {
        let deadline = if released {
            started + GIVE_UP_AFTER
        } else {
            started + RELEASE_AFTER
        };
        match ptrace::wait(tid, deadline) {
            None if !released => {
                // Perhaps waiting for a lock a held thread owns.
                s.release_others(tid);
                released = true;
            }
            None => return Err(CallError::Hung),
            Some(Event::Gone) => return Err(CallError::Gone),
            Some(Event::Stopped { sig, event }) => {
                if event == 0 && sig == libc::SIGSEGV {
                    let now = Regs::get(tid).map_err(|e| CallError::Ptrace("PTRACE_GETREGS", e))?;
                    if now.pc() == 0 {
                        return Ok(now.ret());
                    }
                    return Err(CallError::Crashed(now.pc()));
                }
                // A signal for the program (handed back at detach), or an
                // interrupt left pending: on with the call.
                if let Some(t) = s.threads.iter_mut().find(|t| t.tid == tid) {
                    t.stopped(sig, event);
                }
                resume(s, tid)?;
            }
        }
    }
}

pub enum Arg<'a> {
    Int(u64),
    Str(&'a str),
}

/// One line of /proc/PID/maps with a file behind it.
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub path: String,
    pub exec: bool,
}

pub fn mappings(maps: &str) -> Vec<Mapping> {
    maps.lines()
        .filter_map(|l| {
            let mut f = l.splitn(6, ' ');
            let range = f.next()?;
            let perms = f.next()?;
            let offset = u64::from_str_radix(f.next()?, 16).ok()?;
            let _dev = f.next()?;
            let _inode = f.next()?;
            let path = f.next()?.trim_start();
            if !path.starts_with('/') {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            Some(Mapping {
                start: u64::from_str_radix(a, 16).ok()?,
                end: u64::from_str_radix(b, 16).ok()?,
                offset,
                path: path.to_string(),
                exec: perms.contains('x'),
            })
        })
        .collect()
}

/// The value (virtual address in the file) of the first of `names` that
/// the ELF file's dynamic symbols define.
pub fn symbol_value(file: &str, names: &[&str]) -> Option<u64> {
    let bytes = std::fs::read(file).ok()?;
    let elf = goblin::elf::Elf::parse(&bytes).ok()?;
    dynamic_symbol(&elf, names)
}

fn dynamic_symbol(elf: &goblin::elf::Elf, names: &[&str]) -> Option<u64> {
    names.iter().find_map(|want| {
        elf.dynsyms.iter().find_map(|s| {
            let defined = s.st_value != 0 && s.st_shndx != 0;
            (defined && elf.dynstrtab.get_at(s.st_name) == Some(*want)).then_some(s.st_value)
        })
    })
}

/// Eight bytes of the target's memory.
pub fn read_u64(pid: i32, addr: u64) -> Option<u64> {
    let f = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, addr).ok()?;
    Some(u64::from_le_bytes(b))
}

/// The address in the target of the first of `names` that `path`'s
/// dynamic symbols define, from the file as the target sees it.
pub fn remote_symbol(pid: i32, maps: &[Mapping], path: &str, names: &[&str]) -> Option<u64> {
    let bytes = std::fs::read(format!("/proc/{pid}/root{path}")).ok()?;
    let elf = goblin::elf::Elf::parse(&bytes).ok()?;
    let value = dynamic_symbol(&elf, names)?;
    // Symbol value -> file offset (its PT_LOAD) -> the mapping of that
    // offset.
    let load = elf.program_headers.iter().find(|p| {
        p.p_type == goblin::elf::program_header::PT_LOAD
            && value >= p.p_vaddr
            && value < p.p_vaddr + p.p_memsz
    })?;
    let off = value - load.p_vaddr + load.p_offset;
    maps.iter()
        .find(|m| m.path == path && off >= m.offset && off < m.offset + (m.end - m.start))
        .map(|m| m.start + off - m.offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_with_files_are_read() {
        let maps = "\
55d0c0a00000-55d0c0a02000 r--p 00000000 fd:01 1234 /usr/bin/app\n\
7f00aa000000-7f00aa028000 r-xp 00028000 fd:01 99 /lib/x86_64-linux-gnu/libc.so.6\n\
7ffd1d3e0000-7ffd1d401000 rw-p 00000000 00:00 0 [stack]\n\
7f00ab000000-7f00ab001000 rw-p 00000000 00:00 0 \n\
7f00ac000000-7f00ac001000 r--p 00000000 fd:01 7 /tmp/a b (deleted)\n";
        let m = mappings(maps);
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].start, 0x7f00aa000000);
        assert_eq!(m[1].end, 0x7f00aa028000);
        assert_eq!(m[1].offset, 0x28000);
        assert_eq!(m[1].path, "/lib/x86_64-linux-gnu/libc.so.6");
        assert_eq!(m[2].path, "/tmp/a b (deleted)");
    }

    #[test]
    fn our_own_libc_defines_dlopen_where_dlsym_finds_it() {
        let maps = mappings(&std::fs::read_to_string("/proc/self/maps").unwrap());
        let libc = super::super::refuse::libc_path(&maps)
            .expect("a libc")
            .to_string();
        let me = std::process::id() as i32;
        let at = remote_symbol(me, &maps, &libc, &["dlopen", "__libc_dlopen_mode"]).unwrap();
        // SAFETY: a NUL-terminated name; RTLD_DEFAULT searches every module.
        let want = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"dlopen".as_ptr()) } as u64;
        assert_eq!(at, want);
    }
}
