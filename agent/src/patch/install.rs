//! Writing stubs near each module and overwriting function entries with a
//! jump to them. Runs while the process is single-threaded (the constructor).

use crate::arch::{CounterRef, EntryPatch, EntryPlan, LinkWords, Native, StubWriter};
use crate::discover::modules::Module;
use crate::log::vlog;
use crate::patch::image;
use crate::patch::stubmem::StubArea;
use crate::patch::switch::EntrySwitch;
use crate::plan::analysis::ModulePlan;
use rtprof_abi::Refusal;

const STUB_ALIGN: u64 = Native::STUB_ALIGN;
const PAGE: u64 = 4096;

/// Maps stub addresses back to functions (samples and unwinds land there),
/// and, for an overhead budget, keeps each entry's two states.
#[derive(Default)]
pub struct StubMap {
    /// (stub start, stub end, counter slot), sorted by start.
    ranges: Vec<(u64, u64, u32)>,
    /// Entries that can be switched between jump and original, by slot.
    entries: Option<Vec<EntrySwitch>>,
    /// Loop probes: (start, end, function slot, its window's offset in
    /// the function), sorted by start.
    probes: Vec<crate::options::loops::probes::ProbeRange>,
}

impl StubMap {
    /// A map that also keeps every patched entry's original bytes (56
    /// bytes a function: only when a budget may switch entries).
    pub fn keeping_entries() -> StubMap {
        StubMap {
            ranges: Vec::new(),
            entries: Some(Vec::new()),
            probes: Vec::new(),
        }
    }

    /// The two states of the entry of the function in `slot`, if kept.
    pub fn entry(&self, slot: u32) -> Option<&EntrySwitch> {
        let e = self.entries.as_ref()?;
        e.get(e.binary_search_by_key(&slot, |e| e.slot).ok()?)
    }

    /// Every kept entry, by slot (empty unless kept).
    pub fn entries(&self) -> &[EntrySwitch] {
        self.entries.as_deref().unwrap_or(&[])
    }

    /// (start, end, counter slot) of every stub, sorted.
    pub fn ranges(&self) -> &[(u64, u64, u32)] {
        &self.ranges
    }
    /// Every loop probe's place, sorted.
    pub fn probes(&self) -> &[crate::options::loops::probes::ProbeRange] {
        &self.probes
    }

    /// Adds loop probes' places.
    pub fn add_probes(&mut self, mut v: Vec<crate::options::loops::probes::ProbeRange>) {
        self.probes.append(&mut v);
        self.probes.sort_unstable_by_key(|r| r.0);
    }

    /// Keeps `e`, in place of the entry of the same slot if there is one.
    pub fn put_entry(&mut self, e: EntrySwitch) {
        let Some(v) = &mut self.entries else { return };
        match v.binary_search_by_key(&e.slot, |x| x.slot) {
            Ok(i) => v[i] = e,
            Err(i) => v.insert(i, e),
        }
    }

    /// Forgets the stubs and loop probes in [lo, hi) (an unloaded
    /// module's area).
    pub fn remove(&mut self, lo: u64, hi: u64) {
        self.ranges.retain(|r| r.0 < lo || r.0 >= hi);
        self.probes.retain(|r| r.0 < lo || r.0 >= hi);
        if let Some(e) = &mut self.entries {
            e.retain(|e| e.stub < lo || e.stub >= hi);
        }
    }

    fn add(&mut self, mut v: Vec<(u64, u64, u32)>) {
        // A module's stubs come in address order, in an area of their own:
        // they go in as one run where they belong. Modules load downwards,
        // so appending and sorting the whole table (tens of thousands of
        // stubs for cc1) at each module was a tenth of a warm start.
        if !v.is_sorted_by_key(|r| r.0) {
            v.sort_unstable_by_key(|r| r.0);
        }
        let (Some(first), Some(last)) = (v.first(), v.last()) else {
            return;
        };
        let at = self.ranges.partition_point(|r| r.0 < first.0);
        let fits = self.ranges.get(at).is_none_or(|next| last.0 < next.0);
        if fits {
            self.ranges.splice(at..at, v);
        } else {
            // Runs that interleave: merged by the stable sort, which finds
            // the two sorted runs.
            self.ranges.append(&mut v);
            self.ranges.sort_by_key(|r| r.0);
        }
    }
}

/// The bytes that send the branch whose rel32 field is at `field` to `to`,
/// if the field still reaches `target` (as in the bytes the plan was made
/// from).
fn redirect_bytes(field: u64, target: u64, to: u64) -> Option<[u8; 4]> {
    // SAFETY: the field lies inside the function's code (the plan put it
    // there, past the entry's bytes), mapped readable with the module.
    let rel = unsafe { std::ptr::read_unaligned(field as *const i32) };
    let now = (field + 4).wrapping_add(rel as i64 as u64);
    if now != target {
        return None;
    }
    Native::redirect(field, to)
}

/// Outcome per function of one module, in the plan's order.
pub type Outcomes = Vec<Option<Refusal>>;

/// Writes `patches` (address, bytes) into the module's code.
pub(crate) fn write_entries(m: &Module, patches: &[(u64, &[u8])]) -> Vec<bool> {
    let mut ok = vec![false; patches.len()];
    for load in m.loads.iter().filter(|l| l.executable()) {
        let lo = (m.bias + load.vaddr) / PAGE * PAGE;
        let hi = (m.bias + load.vaddr + load.memsz).div_ceil(PAGE) * PAGE;
        let mine: Vec<usize> = (0..patches.len())
            .filter(|&i| patches[i].0 >= lo && patches[i].0 + patches[i].1.len() as u64 <= hi)
            .collect();
        if mine.is_empty() {
            continue;
        }
        let mut prot = libc::PROT_EXEC;
        if load.readable() {
            prot |= libc::PROT_READ;
        }
        if load.flags & libc::PF_W != 0 {
            prot |= libc::PROT_WRITE;
        }
        let (base, len) = (lo as *mut libc::c_void, (hi - lo) as usize);
        // Writable and still executable: the module's own code (libc's
        // mprotect, say) may run while its pages are being patched.
        // SAFETY: [base, base + len) is this loaded segment rounded out to
        // whole pages, all mapped by the loader; adding write permission
        // changes no byte.
        if unsafe {
            libc::mprotect(
                base,
                len,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
            )
        } == 0
        {
            for &i in &mine {
                let (addr, bytes) = (patches[i].0 as *mut u8, patches[i].1);
                for (k, b) in bytes.iter().enumerate() {
                    // SAFETY: the patch lies inside [lo, hi) (`mine`), now
                    // writable; no thread runs these entry bytes meanwhile:
                    // the constructor patches single-threaded, and a module
                    // the loader just mapped has run none of its code yet.
                    unsafe { std::ptr::write_volatile(addr.add(k), *b) };
                }
                ok[i] = true;
            }
            // SAFETY: the same pages, back to the segment's own protection.
            if unsafe { libc::mprotect(base, len, prot) } != 0 {
                vlog!(
                    "{}: could not restore code protection: {}",
                    m.path,
                    std::io::Error::last_os_error()
                );
            }
        } else {
            // W^X policies refuse writable code; the kernel's ptrace path does not.
            vlog!(
                "{}: mprotect refused ({}), writing through /proc/self/mem",
                m.path,
                std::io::Error::last_os_error()
            );
            // A refusal may still have changed some pages: put them back.
            // SAFETY: as above: the segment's pages, its own protection.
            unsafe { libc::mprotect(base, len, prot) };
            let Ok(f) = std::fs::OpenOptions::new()
                .write(true)
                .open("/proc/self/mem")
            else {
                continue;
            };
            use std::os::unix::fs::FileExt;
            for &i in &mine {
                ok[i] = f.write_all_at(patches[i].1, patches[i].0).is_ok();
            }
        }
    }
    ok
}

/// Installs the patchable functions of `mp`, whose counters are slots
/// `first_slot..`; those whose names `counted` rejects get stubs switched
/// off from the start. Returns each function's outcome, and the stub area
/// (to release if the module is unloaded).
pub fn install(
    mp: &ModulePlan,
    first_slot: u32,
    tls_offset: i32,
    shared_stripe: u64,
    map: &mut StubMap,
    counted: &dyn Fn(&str) -> bool,
) -> (Outcomes, Option<StubArea>) {
    install_with(
        mp,
        first_slot,
        tls_offset,
        shared_stripe,
        map,
        counted,
        true,
    )
}

/// As [`install`], but with the entries left as they are: for a process
/// whose threads run (attach), they are written later with the threads
/// held still (`switch::write_entries_stopped`) from the entries `map`
/// keeps, which it must (`StubMap::keeping_entries`).
pub fn install_stubs_only(
    mp: &ModulePlan,
    first_slot: u32,
    tls_offset: i32,
    shared_stripe: u64,
    map: &mut StubMap,
    counted: &dyn Fn(&str) -> bool,
) -> (Outcomes, Option<StubArea>) {
    debug_assert!(map.entries.is_some());
    install_with(
        mp,
        first_slot,
        tls_offset,
        shared_stripe,
        map,
        counted,
        false,
    )
}

fn install_with(
    mp: &ModulePlan,
    first_slot: u32,
    tls_offset: i32,
    shared_stripe: u64,
    map: &mut StubMap,
    counted: &dyn Fn(&str) -> bool,
    write_now: bool,
) -> (Outcomes, Option<StubArea>) {
    let hook = crate::options::callers::hook();
    let mut outcomes: Outcomes = mp.funcs.iter().map(|c| c.outcome.err()).collect();
    let link = LinkWords {
        first_counter: first_slot as u64 * 8,
        shared_first: shared_stripe + first_slot as u64 * 8,
    };
    // A page image of the module's patched code: mapped if the cache has
    // one, else made once the module is installed at an image's distance.
    let plain = hook == 0 && write_now && map.entries.is_none();
    let image = image::eligible(mp, plain);
    match &image {
        Ok(id) => {
            if let Some(m) = image::map(mp, id, first_slot, link) {
                vlog!(
                    "{}: code mapped from its image (variant {})",
                    mp.module.path,
                    m.variant
                );
                map.add(m.ranges);
                return (m.outcomes, Some(m.area));
            }
        }
        Err(why) => vlog!("{}: no image: {}", mp.module.path, why.why()),
    }
    if mp.mapped {
        // Planned for its image alone (no plan was read): unpatched.
        vlog!(
            "{}: its image could not be mapped; left unpatched",
            mp.module.path
        );
        return (outcomes, None);
    }
    let bound: u64 = mp
        .funcs
        .iter()
        .filter_map(|c| mp.plan_of(c).ok())
        .map(|p| Native::stub_len(p, hook != 0) as u64 + STUB_ALIGN)
        .sum();
    if bound == 0 {
        return (outcomes, None);
    }
    let (lo, hi) = mp.module.span();
    let placed = image
        .as_ref()
        .ok()
        .and_then(|_| image::place(&mp.module, bound));
    let (area, variant) = match placed {
        Some((a, v)) => (a, Some(v)),
        None => match StubArea::near_linked(lo, hi, bound) {
            Some(a) => (a, None),
            None => {
                vlog!(
                    "{}: no free memory within jump range for stubs",
                    mp.module.path
                );
                for (o, c) in outcomes.iter_mut().zip(&mp.funcs) {
                    if c.outcome.is_ok() {
                        *o = Some(Refusal::NoMemoryInRange);
                    }
                }
                return (outcomes, None);
            }
        },
    };
    // SAFETY: the area's link page is its own, read-write, and read by no
    // stub before the stubs are sealed and entered.
    unsafe { std::ptr::write(area.link() as *mut LinkWords, link) };
    let counter =
        |slot: u32| image::linked_counter(area.link(), tls_offset, first_slot, slot, hook);
    let stubs = emit_stubs(
        mp,
        &area,
        first_slot,
        &counter,
        counted,
        write_now,
        &mut outcomes,
    );
    if !area.seal() {
        vlog!(
            "{}: cannot make stubs executable: {}",
            mp.module.path,
            std::io::Error::last_os_error()
        );
        area.release();
        for &i in &stubs.owners {
            outcomes[i] = Some(Refusal::WriteFailed);
        }
        return (outcomes, None);
    }
    let blocked = match write_now {
        true => write_entry_parts(mp, &stubs),
        false => vec![false; stubs.entries.len()],
    };
    let written = write_entries_of(mp, &stubs, &blocked, write_now);
    for (k, &i) in stubs.owners.iter().enumerate() {
        if !written[k] {
            outcomes[i] = Some(Refusal::WriteFailed);
        }
    }
    keep_switches(map, mp, &stubs, &written);
    if let (Ok(id), Some(v)) = (&image, variant) {
        if written.iter().all(|&w| w) {
            let mut funcs: Vec<_> = outcomes
                .iter()
                .map(|o| Err(o.unwrap_or(Refusal::WriteFailed)))
                .collect();
            for (k, &i) in stubs.owners.iter().enumerate() {
                let (at, end, _) = stubs.ranges[k];
                funcs[i] = Ok(((at - area.addr) as u32, (end - at) as u32));
            }
            image::store(mp, id, &area, v, &funcs);
        }
    }
    map.add(
        stubs
            .ranges
            .into_iter()
            .zip(&written)
            .filter(|(_, &w)| w)
            .map(|(r, _)| r)
            .collect(),
    );
    (outcomes, Some(area))
}

/// The stubs of a module written into its area, by the functions that got
/// one (`k` below indexes all three alike).
struct Emitted {
    /// Each one's entry patch, with where it goes.
    entries: Vec<(u64, EntryPatch)>,
    /// Its function's index in the plan.
    owners: Vec<usize>,
    /// Its stub's address range and the function's counter slot.
    ranges: Vec<(u64, u64, u32)>,
}

/// Writes a stub for every function of `mp` whose plan allows one, each
/// aligned and separated by trapping fill; a function whose stub cannot be
/// written gets its refusal in `outcomes`. Without `write_now` (attach:
/// entries are written later, with the threads stopped), functions that
/// need more than their entry written are refused.
fn emit_stubs(
    mp: &ModulePlan,
    area: &StubArea,
    first_slot: u32,
    counter: &dyn Fn(u32) -> CounterRef,
    counted: &dyn Fn(&str) -> bool,
    write_now: bool,
    outcomes: &mut Outcomes,
) -> Emitted {
    // SAFETY: the area is freshly mapped read-write, ours alone, and
    // nothing runs in it until it is sealed.
    let code = unsafe { std::slice::from_raw_parts_mut(area.addr as *mut u8, area.len as usize) };
    let mut used = 0usize;
    let mut out = Emitted {
        entries: Vec::new(),
        owners: Vec::new(),
        ranges: Vec::new(),
    };
    for (i, c) in mp.funcs.iter().enumerate() {
        let Ok(plan) = mp.plan_of(c) else { continue };
        // Branches sent past the count and trampolines are written with the
        // entries, which happens later for a running process (attach): not
        // done there.
        if !write_now
            && (!plan.redirects().is_empty() || plan.trampoline().is_some() || plan.is_trap())
        {
            outcomes[i] = Some(Refusal::BranchIntoWindow);
            continue;
        }
        // A trap entry only where its trap is handled.
        if plan.is_trap() && !crate::options::traps::on() {
            outcomes[i] = Some(Refusal::TooSmall);
            continue;
        }
        let start = used.div_ceil(STUB_ALIGN as usize) * STUB_ALIGN as usize;
        // Alignment fill that traps.
        let fill_end = start.min(code.len());
        code[used..fill_end].fill(Native::TRAP);
        let Some(room) = code.get_mut(start..) else {
            outcomes[i] = Some(Refusal::NoMemoryInRange);
            continue;
        };
        let at = area.addr + start as u64;
        let slot = first_slot + i as u32;
        let counter = counter(slot);
        let stub = crate::arch::stub_and_entry::<Native>(plan, at, &counter, room);
        match stub {
            Ok(e) => {
                if !counted(mp.name_of(c)) {
                    room[..2].copy_from_slice(&Native::counting_switch(false));
                }
                used = start + Native::stub_len(plan, counter.caller_hook != 0);
                out.ranges.push((at, area.addr + used as u64, slot));
                out.entries.push((plan.patch_at(), e));
                out.owners.push(i);
            }
            Err(r) => outcomes[i] = Some(r),
        }
    }
    out
}

/// Writes what an entry relies on before the entry itself: the function's
/// own branches back to its entry sent past the count, a short entry's
/// trampoline, a trap entry's stub made known to the trap handler. Returns,
/// per stub, whether its entry must not be written (a part of it could
/// not be).
fn write_entry_parts(mp: &ModulePlan, stubs: &Emitted) -> Vec<bool> {
    let mut blocked = vec![false; stubs.entries.len()];
    let mut parts: Vec<(u64, [u8; 5], usize, usize)> = Vec::new();
    for (k, &i) in stubs.owners.iter().enumerate() {
        let Ok(plan) = mp.plan_of(&mp.funcs[i]) else {
            continue;
        };
        let stub = stubs.ranges[k].0;
        let moved = Native::uncounted_entry(stub);
        for r in plan.redirects() {
            let field = plan.start() + r.field as u64;
            let (target, to) = (plan.start() + r.target as u64, moved + r.code as u64);
            match redirect_bytes(field, target, to) {
                Some(b) => parts.push((field, [b[0], b[1], b[2], b[3], 0], 4, k)),
                None => blocked[k] = true,
            }
        }
        if plan.trampoline().is_some() {
            match Native::trampoline(plan, stub) {
                Some((at, b)) => parts.push((at, b, 5, k)),
                None => blocked[k] = true,
            }
        }
    }
    let patches: Vec<(u64, &[u8])> = parts.iter().map(|(a, b, n, _)| (*a, &b[..*n])).collect();
    for (ok, &(_, _, _, k)) in write_entries(&mp.module, &patches).iter().zip(&parts) {
        blocked[k] |= !ok;
    }
    // A trap entry's handler must know its stub before the trap is there.
    let traps: Vec<(u64, u64)> = stubs
        .owners
        .iter()
        .enumerate()
        .filter_map(|(k, &i)| {
            let plan = mp.plan_of(&mp.funcs[i]).ok()?;
            (plan.is_trap() && !blocked[k]).then_some((plan.patch_at(), stubs.ranges[k].0))
        })
        .collect();
    crate::options::traps::add(&traps);
    blocked
}

/// Writes the entries not `blocked` (now, or for attach later: taken as
/// written); returns, per stub, whether its entry jumps to it.
fn write_entries_of(
    mp: &ModulePlan,
    stubs: &Emitted,
    blocked: &[bool],
    write_now: bool,
) -> Vec<bool> {
    // Stubs are complete and executable before any entry jumps to them.
    let patches: Vec<(u64, &[u8])> = stubs
        .entries
        .iter()
        .zip(blocked)
        .filter(|(_, b)| !**b)
        .map(|((a, e), _)| (*a, e.as_slice()))
        .collect();
    let mut done = if write_now {
        write_entries(&mp.module, &patches)
    } else {
        vec![true; patches.len()]
    }
    .into_iter();
    blocked
        .iter()
        .map(|b| !b && done.next().unwrap_or(false))
        .collect()
}

/// Keeps each written entry's switch (its bytes both ways), for a map that
/// keeps them (the budget and detach switch entries later), by slot.
fn keep_switches(map: &mut StubMap, mp: &ModulePlan, stubs: &Emitted, written: &[bool]) {
    let Some(kept) = &mut map.entries else {
        return;
    };
    for (k, &i) in stubs.owners.iter().enumerate() {
        let Ok(plan) = mp.plan_of(&mp.funcs[i]) else {
            continue;
        };
        if written[k] {
            let (stub, _, slot) = stubs.ranges[k];
            kept.extend(EntrySwitch::new(plan, slot, stub, &stubs.entries[k].1));
        }
    }
    // Slots grow with each module loaded: usually nothing to do.
    if !kept.is_sorted_by_key(|e| e.slot) {
        kept.sort_unstable_by_key(|e| e.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each module's stubs go in as a run where they belong (modules load
    /// downwards, and in any order after a dlopen); interleaving runs are
    /// merged. The table stays sorted, every stub kept once.
    #[test]
    fn stub_runs_go_in_where_they_belong() {
        let run = |lo: u64, n: u64, step: u64| -> Vec<(u64, u64, u32)> {
            (0..n)
                .map(|i| (lo + i * step, lo + i * step + 8, (lo + i) as u32))
                .collect()
        };
        let mut m = StubMap::default();
        m.add(run(9000, 5, 16));
        m.add(run(1000, 5, 16));
        m.add(run(5000, 5, 16));
        m.add(run(20000, 5, 16));
        m.add(Vec::new());
        // Out of order within itself, and between another run's stubs.
        let mut odd = run(1008, 4, 16);
        odd.reverse();
        m.add(odd);
        let starts: Vec<u64> = m.ranges().iter().map(|r| r.0).collect();
        assert!(starts.is_sorted(), "{starts:?}");
        assert_eq!(starts.len(), 24);
        assert_eq!(&starts[..4], &[1000, 1008, 1016, 1024]);
        assert_eq!(&starts[9..15], &[5000, 5016, 5032, 5048, 5064, 9000]);
    }
}
