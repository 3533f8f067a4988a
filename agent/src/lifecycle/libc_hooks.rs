//! Loaded late (`rtprof attach`), the agent's `pthread_create` and `fork`
//! are not the ones the program calls: the program's calls were bound to
//! libc's long before. So libc's entries are sent to ours, as any patched
//! entry is sent to its stub, and ours reach the originals through a
//! detour: libc's first instructions, moved, then a jump back past them.
//! Threads created while attached then get a stripe, a timer and a fold at
//! their end, and a forked child its sampler, as under a preloaded agent.
//! The entries are kept with the others: detach restores them, a later
//! attach writes them again.

use crate::arch::{CounterRef, EntryPlan, Native, Planner, StubWriter};
use crate::error::LifecycleError;
use crate::lifecycle::interpose;
use crate::patch::install::StubMap;
use crate::patch::stubmem::StubArea;
use crate::patch::switch::EntrySwitch;

/// The functions hooked: libc's definition, and ours (by a name of this
/// library alone: an exported name would resolve to libc's).
fn hooks() -> [(&'static str, &'static interpose::Real, u64); 2] {
    [
        (
            "pthread_create",
            &interpose::PTHREAD_CREATE,
            interpose::create_thread as *const () as u64,
        ),
        (
            "fork",
            &interpose::FORK,
            interpose::fork_child as *const () as u64,
        ),
    ]
}

/// Prepares every hook (see [`prepare_one`]); says which could not be.
pub fn prepare(
    stubs: &mut StubMap,
    tls_offset: i32,
    shared: u64,
) -> Vec<(&'static str, LifecycleError)> {
    hooks()
        .into_iter()
        .filter_map(|(name, real, ours)| {
            prepare_one(stubs, real, ours, tls_offset, shared)
                .err()
                .map(|e| (name, e))
        })
        .collect()
}

/// Address and size of libc's definition, from its symbol.
fn definition(real: &interpose::Real) -> Option<(u64, usize)> {
    let addr = real.original()?;
    #[repr(C)]
    struct Sym {
        name: u32,
        info: u8,
        other: u8,
        shndx: u16,
        value: u64,
        size: u64,
    }
    extern "C" {
        fn dladdr1(
            addr: *const libc::c_void,
            info: *mut libc::Dl_info,
            extra: *mut *mut libc::c_void,
            flags: libc::c_int,
        ) -> libc::c_int;
    }
    const RTLD_DL_SYMENT: libc::c_int = 1;
    // SAFETY: `Dl_info` is pointers, for which zeros are valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut sym: *mut libc::c_void = std::ptr::null_mut();
    // SAFETY: dladdr1 fills `info` and points `sym` at the loader's own
    // symbol entry (an Elf64_Sym, laid out as `Sym`), or fails.
    let ok = unsafe { dladdr1(addr as *const _, &mut info, &mut sym, RTLD_DL_SYMENT) } != 0;
    if !ok || sym.is_null() || info.dli_saddr as u64 != addr {
        return None;
    }
    // SAFETY: as above: a live Elf64_Sym of a loaded library.
    let size = unsafe { (*(sym as *const Sym)).size } as usize;
    (size > 0).then_some((addr, size))
}

/// Prepares one hook: the detour (or, when libc is instrumented, its
/// counting stub) becomes what ours calls as `real`, and the entry that
/// sends libc's to `ours` joins `stubs`' entries, to be written with them.
/// Call before the entries are written, with libc's code as loaded.
fn prepare_one(
    stubs: &mut StubMap,
    real: &interpose::Real,
    ours: u64,
    tls_offset: i32,
    shared: u64,
) -> Result<(), LifecycleError> {
    let (addr, size) = definition(real).ok_or(LifecycleError::NotFound)?;
    // SAFETY: the function's own bytes, in libc's text, mapped for good.
    let code = unsafe { std::slice::from_raw_parts(addr as *const u8, size) };
    let plan = Native::plan_window(code, addr, size, 0).map_err(LifecycleError::Unmovable)?;
    let scan = Native::scan_function(code, addr);
    let window = addr..plan.resume_at().max(plan.patch_at() + plan.window() as u64);
    if scan.decode_error
        || scan.has_indirect_jump
        || scan.branch_targets.iter().any(|t| window.contains(t))
    {
        return Err(LifecycleError::BranchInto);
    }
    let counted = stubs.entries().iter().position(|e| e.at == plan.patch_at());
    let detour_len = match counted {
        Some(_) => 0,
        None => Native::stub_len(&plan, false),
    };
    let (tramp, tramp_len) = Native::absolute_jump(ours);
    let align = Native::STUB_ALIGN as usize;
    let detour_at = tramp_len.div_ceil(align) * align;
    let area = StubArea::near(addr, addr + size as u64, (detour_at + detour_len) as u64)
        .ok_or(LifecycleError::NoMemory)?;
    // SAFETY: the area is freshly mapped read-write, ours alone, and
    // nothing runs in it until it is sealed.
    let mem = unsafe { std::slice::from_raw_parts_mut(area.addr as *mut u8, area.len as usize) };
    mem.fill(Native::TRAP);
    mem[..tramp_len].copy_from_slice(&tramp[..tramp_len]);
    let original = match counted {
        // Its counting stub counts the call, then runs the moved code.
        Some(i) => stubs.entries()[i].stub,
        None => {
            // A stub whose counting is switched off: only the moved code
            // and the jump back run. Its counter is never touched.
            let at = area.addr + detour_at as u64;
            let counter = CounterRef {
                tls_offset,
                slot: 0,
                shared_counter: shared,
                caller_hook: 0,
                ..CounterRef::default()
            };
            let out = &mut mem[detour_at..];
            if let Err(r) = Native::emit_stub(&plan, at, &counter, out) {
                area.release();
                return Err(LifecycleError::Unmovable(r));
            }
            out[..2].copy_from_slice(&Native::counting_switch(false));
            at
        }
    };
    // Replacing a counted entry keeps its slot and stub (its counting
    // switch); otherwise the entry has a slot of no function, from the top.
    let (slot, stub) = match counted {
        Some(i) => (stubs.entries()[i].slot, original),
        None => (
            u32::MAX
                - stubs
                    .entries()
                    .iter()
                    .filter(|e| e.slot > u32::MAX / 2)
                    .count() as u32,
            area.addr,
        ),
    };
    let entry =
        Native::entry_patch(&plan, area.addr).and_then(|p| EntrySwitch::new(&plan, slot, stub, &p));
    let Some(entry) = entry else {
        area.release();
        return Err(LifecycleError::NoMemory);
    };
    if !area.seal() {
        area.release();
        return Err(LifecycleError::NoMemory);
    }
    // From now on ours calls the original through the detour; libc's
    // entry is not written yet, so either way reaches libc's code.
    real.redirect(original);
    stubs.put_entry(entry);
    Ok(())
}
