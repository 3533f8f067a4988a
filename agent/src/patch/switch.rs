//! Counting switched per function while the program's threads run: a
//! stub's first two bytes become a `jmp` over its count, or go back to the
//! start of the count (`StubWriter::counting_switch`). Each switch is one aligned
//! two-byte store, so no thread ever runs a half-written instruction; the
//! stub's page is made writable for it (still executable: threads keep
//! running through it) and sealed again, and a `membarrier` then makes
//! every core serialise its instruction stream before the call returns.
//!
//! An entry itself (jump to the stub, or the function's own bytes) is
//! switched only with the other threads stopped: see [`EntrySwitch`].

use crate::arch::{EntryPatch, EntryPlan, Native, Plan, StubWriter};
use crate::error::Errno;
use crate::error::PatchError;
use crate::log::vlog;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};

const PAGE: u64 = 4096;

/// Sets counting on or off for the stubs starting at `stubs` (sorted, each
/// 2-byte aligned). The caller holds the loader lock: the stubs stay mapped.
pub fn set_counting(stubs: &[u64], on: bool) -> Result<(), PatchError> {
    let bytes = u16::from_le_bytes(Native::counting_switch(on));
    let mut i = 0;
    while i < stubs.len() {
        let page = stubs[i] / PAGE * PAGE;
        let end = stubs[i..].partition_point(|&s| s / PAGE * PAGE == page) + i;
        // A stub's first two bytes never cross a page (16-byte aligned).
        protect(page, libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC)?;
        for &s in &stubs[i..end] {
            debug_assert_eq!(s % 2, 0);
            // SAFETY: the first two bytes of one of our stubs, 2-byte
            // aligned, in a page made writable just above.
            let cell = unsafe { AtomicU16::from_ptr(s as *mut u16) };
            cell.store(bytes, Ordering::Release);
        }
        protect(page, libc::PROT_READ | libc::PROT_EXEC)?;
        i = end;
    }
    serialise_cores();
    Ok(())
}

/// Stores `bytes` over the first eight bytes of the stub at `stub`
/// (16-byte aligned) in one atomic store, while threads may run through
/// it: each fetches the old instructions or the new ones (see
/// `StubWriter::route_jump`). The caller holds the loader lock.
pub fn store_stub_word(stub: u64, bytes: [u8; 8]) -> Result<(), PatchError> {
    debug_assert_eq!(stub % 8, 0);
    let page = stub / PAGE * PAGE;
    protect(page, libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC)?;
    // SAFETY: the first eight bytes of one of our stubs, 8-byte aligned
    // (stubs are 16-byte aligned, so they never cross a page), on a page
    // made writable just above.
    let cell = unsafe { AtomicU64::from_ptr(stub as *mut u64) };
    cell.store(u64::from_le_bytes(bytes), Ordering::Release);
    // Stored: whether or not the page is sealed again, the route is made.
    if let Err(e) = protect(page, libc::PROT_READ | libc::PROT_EXEC) {
        vlog!("a stub page stays writable: {e}");
    }
    serialise_cores();
    Ok(())
}

/// The first eight bytes of the stub at `stub`, as they are.
pub fn stub_word(stub: u64) -> [u8; 8] {
    // SAFETY: the first eight bytes of one of our stubs, readable and
    // 8-byte aligned; written only by atomic stores.
    let cell = unsafe { AtomicU64::from_ptr(stub as *mut u64) };
    cell.load(Ordering::Acquire).to_le_bytes()
}

fn protect(page: u64, prot: libc::c_int) -> Result<(), PatchError> {
    // SAFETY: a page of a stub area we mapped; only its protection changes.
    match unsafe { libc::mprotect(page as *mut libc::c_void, PAGE as usize, prot) } {
        0 => Ok(()),
        _ => Err(PatchError::Protect(Errno::last())),
    }
}

/// Registers for core serialisation now (it waits for an RCU grace
/// period, ~10 ms), so that no later switch pays it with the program's
/// threads stopped.
pub fn prepare() {
    serialise_cores();
}

/// Every core running this process's threads serialises its instruction
/// fetch (membarrier SYNC_CORE, Linux 4.16+); without it, the two-byte
/// store is still atomic and is seen within a few instructions.
fn serialise_cores() {
    const REGISTER_SYNC_CORE: libc::c_int = 1 << 6;
    const SYNC_CORE: libc::c_int = 1 << 5;
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    static TRIED: AtomicBool = AtomicBool::new(false);
    if !TRIED.swap(true, Ordering::AcqRel) {
        // SAFETY: a plain system call without pointers.
        let r = unsafe { libc::syscall(libc::SYS_membarrier, REGISTER_SYNC_CORE, 0, 0) };
        REGISTERED.store(r == 0, Ordering::Release);
        if r != 0 {
            vlog!("membarrier SYNC_CORE unavailable: switches rely on the atomic store alone");
        }
    }
    if REGISTERED.load(Ordering::Acquire) {
        // SAFETY: as above.
        unsafe { libc::syscall(libc::SYS_membarrier, SYNC_CORE, 0, 0) };
    }
}

/// One patched entry's two states, switched while the program's other
/// threads are stopped (`stopworld`): the jump to its stub (counted), or
/// the function's own bytes (no detour at all).
#[derive(Clone, Copy, Debug, Default)]
pub struct EntrySwitch {
    pub slot: u32,
    /// Where the jump is written.
    pub at: u64,
    pub stub: u64,
    len: u8,
    original: [u8; 24],
    jump: [u8; 24],
}

impl EntrySwitch {
    /// The entry of `plan`'s function, patched with `patch` to reach `stub`.
    pub fn new(plan: &Plan, slot: u32, stub: u64, patch: &EntryPatch) -> Option<EntrySwitch> {
        let from = (plan.patch_at() - plan.start()) as usize;
        let own = plan.original().get(from..from + plan.window())?;
        let jump = patch.as_slice();
        if jump.len() != own.len() || own.len() > 24 {
            return None;
        }
        let mut e = EntrySwitch {
            slot,
            at: plan.patch_at(),
            stub,
            len: own.len() as u8,
            original: [0; 24],
            jump: [0; 24],
        };
        e.original[..own.len()].copy_from_slice(own);
        e.jump[..own.len()].copy_from_slice(jump);
        Some(e)
    }

    /// The bytes of the entry with counting on (the jump) or off.
    pub fn bytes(&self, counted: bool) -> &[u8] {
        let b = if counted { &self.jump } else { &self.original };
        &b[..self.len as usize]
    }

    /// Whether a thread stopped at `pc` is part-way through the entry's
    /// own instructions, and would resume inside a jump written there.
    pub fn cut_by(&self, pc: u64) -> bool {
        pc > self.at && pc < self.at + self.len as u64
    }
}

/// Writes `entries` (sorted by address) in their `counted` state,
/// skipping an entry that a stopped thread (at one of `pcs`) is part-way
/// through when a jump is to be written. Each page is made writable for
/// its entries and sealed again (one protection change per page, not a
/// `/proc/self/mem` write per entry); where a policy refuses writable
/// code, the page's entries go through `mem` (this process's
/// `/proc/self/mem`). Call with every other thread stopped; allocates
/// nothing. Marks each entry written in `done`; returns how many.
pub fn write_entries_stopped(
    mem: &std::fs::File,
    entries: &[EntrySwitch],
    counted: bool,
    pcs: &[u64],
    done: &mut [bool],
) -> usize {
    use std::os::unix::fs::FileExt;
    let mut n = 0;
    let mut i = 0;
    while i < entries.len() {
        let page = entries[i].at / PAGE * PAGE;
        let end = entries[i..].partition_point(|e| e.at / PAGE * PAGE == page) + i;
        // An entry may run into the next page.
        let last = entries[end - 1].at + entries[end - 1].len as u64;
        let span = (last.div_ceil(PAGE) * PAGE - page) as usize;
        // SAFETY: pages of a loaded module's code; only their protection
        // changes, and back (code pages are read and execute).
        let writable = unsafe {
            libc::mprotect(
                page as *mut libc::c_void,
                span,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
            )
        } == 0;
        for k in i..end {
            let e = &entries[k];
            done[k] = false;
            if counted && pcs.iter().any(|&pc| e.cut_by(pc)) {
                continue;
            }
            let b = e.bytes(counted);
            done[k] = if writable {
                for (j, byte) in b.iter().enumerate() {
                    // SAFETY: inside the entry, on a page made writable above.
                    unsafe { std::ptr::write_volatile((e.at as *mut u8).add(j), *byte) };
                }
                true
            } else {
                mem.write_at(b, e.at).is_ok_and(|w| w == b.len())
            };
            n += done[k] as usize;
        }
        if writable {
            // SAFETY: as above.
            unsafe {
                libc::mprotect(
                    page as *mut libc::c_void,
                    span,
                    libc::PROT_READ | libc::PROT_EXEC,
                )
            };
        }
        i = end;
    }
    serialise_cores();
    n
}
