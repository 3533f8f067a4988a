//! Counting switched per function while the program's threads run: a
//! stub's first two bytes become a `jmp` over its count, or go back to the
//! start of the count (`InstructionSet::counting_switch`). Each switch is one aligned
//! two-byte store, so no thread ever runs a half-written instruction; the
//! stub's page is made writable for it (still executable: threads keep
//! running through it) and sealed again, and a `membarrier` then makes
//! every core serialise its instruction stream before the call returns.

use crate::arch::{InstructionSet, Native};
use crate::log::vlog;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};

const PAGE: u64 = 4096;

/// Why counting could not be switched.
#[derive(Debug, PartialEq, Eq)]
pub enum SwitchError {
    /// The stub's page could not be made writable (a W^X policy).
    Protect(i32),
}

impl std::fmt::Display for SwitchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SwitchError::Protect(e) => write!(
                f,
                "stub memory cannot be made writable: {}",
                std::io::Error::from_raw_os_error(*e)
            ),
        }
    }
}

/// Sets counting on or off for the stubs starting at `stubs` (sorted, each
/// 2-byte aligned). The caller holds the loader lock: the stubs stay mapped.
pub fn set_counting(stubs: &[u64], on: bool) -> Result<(), SwitchError> {
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

fn protect(page: u64, prot: libc::c_int) -> Result<(), SwitchError> {
    // SAFETY: a page of a stub area we mapped; only its protection changes.
    match unsafe { libc::mprotect(page as *mut libc::c_void, PAGE as usize, prot) } {
        0 => Ok(()),
        _ => Err(SwitchError::Protect(
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        )),
    }
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
