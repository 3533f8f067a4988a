//! Deciding, for every function of a module, whether its entry can be
//! patched: the window plan plus the module-wide checks that no branch,
//! jump table or other function's entry lands inside the overwritten bytes.

use crate::arch::{FunctionScan, InstructionSet, Native, Plan};
use crate::discover::fileimage::FileImage;
use crate::discover::maps::Maps;
use crate::discover::modules::Module;
use crate::discover::symbols::FunctionList;
use rtprof_abi::Refusal;

/// Alignment fill considered after a function (GCC pads to 16 bytes).
const MAX_PAD: u64 = 32;

pub struct Candidate {
    pub name: String,
    pub vaddr: u64,
    pub size: u64,
    /// Alignment fill after the function that its window may use.
    pub pad: u64,
    pub outcome: Result<Plan, Refusal>,
}

pub struct ModulePlan {
    pub module: Module,
    pub funcs: Vec<Candidate>,
    pub source: &'static str,
    /// The loader writes into this file's code (DT_TEXTREL).
    pub text_relocations: bool,
    /// Functions whose entry can take no jump got trap entries.
    pub traps: bool,
    /// The loops of the functions named in `RTPROF_LOOPS` (never cached).
    pub loops: Vec<crate::options::loops::plan::FunctionLoops>,
}

/// A function's code with its trailing fill: (bytes, size, fill), or why not.
type Code<'a> = Result<(&'a [u8], u64, u64), Refusal>;

/// Runtime bytes [addr, addr+len) if they are mapped readable now. They
/// live as long as the borrow of `maps`, the snapshot of the memory map
/// they were checked against: a module's code stays mapped while one event
/// (start-up, or one run of the loader hook under the state lock) uses it.
fn mem(maps: &Maps, addr: u64, len: u64) -> Option<&[u8]> {
    // SAFETY: mapped readable as the memory map said; a loaded module's
    // code, which stays mapped while it is analysed (start-up, or the
    // loader hook under the state lock), so while `maps` is borrowed.
    maps.readable(addr, len)
        .then(|| unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) })
}

fn any_in(sorted: &[u64], lo: u64, hi: u64) -> bool {
    let i = sorted.partition_point(|&t| t < lo);
    i < sorted.len() && sorted[i] < hi
}

fn contains(sorted: &[u64], v: u64) -> bool {
    sorted.binary_search(&v).is_ok()
}

/// What one decode of a function found that concerns its own entry.
#[derive(Default)]
struct Own {
    branches: Vec<u64>,
    tables: Vec<u64>,
    decode_error: bool,
    /// Branches to the function's first bytes: targets and rel32 fields
    /// (`None` for a short branch).
    entry_branches: Vec<(u64, Option<u64>)>,
    /// The function may run on into the fill after it.
    falls_through: bool,
    /// It jumps through a table or register: where to is not all known.
    indirect: bool,
}

/// Decides every function of `m` from its file's bytes alone: the result
/// depends on nothing else, and may be cached (see [`check_live`] for what
/// must be checked in each process).
/// With `traps`, a function no jump can enter gets a trap entry where one
/// is safe. With `loops`, the loops of the functions `RTPROF_LOOPS` names
/// get probes where they fit.
pub fn analyze(
    m: Module,
    list: FunctionList,
    maps: &Maps,
    file: &FileImage,
    traps: bool,
    loops: bool,
) -> ModulePlan {
    let funcs = list.funcs;
    let n = funcs.len();
    let starts: Vec<u64> = funcs.iter().map(|f| m.bias.wrapping_add(f.vaddr)).collect();
    let text: Vec<(u64, u64)> = m
        .loads
        .iter()
        .filter(|l| l.executable())
        .map(|l| (m.bias + l.vaddr, m.bias + l.vaddr + l.memsz))
        .collect();
    let in_text = |a: u64| text.iter().any(|&(lo, hi)| a >= lo && a < hi);
    // Code is decoded as the file has it: a debugger may already have
    // written breakpoints into the mapped copy.
    let code_at = |a: u64, len: u64| maps.readable(a, len).then(|| file.bytes(a, len)).flatten();

    // Per function: code (with trailing alignment fill) or why not.
    let mut code: Vec<Code> = Vec::with_capacity(n);
    for (i, f) in funcs.iter().enumerate() {
        let start = starts[i];
        if f.size == 0 {
            code.push(Err(Refusal::UnknownSize));
            continue;
        }
        let Some(load) = m.load_containing(start, f.size).filter(|l| l.executable()) else {
            code.push(Err(Refusal::OutsideText));
            continue;
        };
        let end = start + f.size;
        let load_end = m.bias + load.vaddr + load.memsz;
        let next = starts.get(i + 1).copied().unwrap_or(u64::MAX).min(load_end);
        let pad = next.saturating_sub(end).min(MAX_PAD);
        // The fill is optional: without it the function may still do.
        match code_at(start, f.size + pad).or_else(|| code_at(start, f.size)) {
            Some(c) => code.push(Ok((c, f.size, c.len() as u64 - f.size))),
            None => code.push(Err(Refusal::OutsideText)),
        }
    }

    // One decode of every function.
    let scans: Vec<Option<FunctionScan>> = code
        .iter()
        .enumerate()
        .map(|(i, c)| {
            c.as_ref()
                .ok()
                .map(|(b, size, _)| Native::scan_function(&b[..*size as usize], starts[i]))
        })
        .collect();
    let ends: Vec<u64> = funcs.iter().zip(&starts).map(|(f, s)| s + f.size).collect();
    // The function whose range holds `t` (ranges sorted by start).
    let holder = |t: u64| {
        let i = starts.partition_point(|&s| s <= t).checked_sub(1)?;
        (t < ends[i]).then_some(i)
    };
    let mut calls: Vec<u64> = Vec::new();
    let mut jumps: Vec<u64> = Vec::new();
    let mut cond_jumps: Vec<u64> = Vec::new();
    for (i, s) in scans.iter().enumerate() {
        let Some(s) = s else { continue };
        let outside = |t: &&u64| !(starts[i]..ends[i]).contains(*t);
        calls.extend_from_slice(&s.call_targets);
        jumps.extend(s.branch_targets.iter().filter(outside));
        cond_jumps.extend(s.cond_targets.iter().filter(outside));
    }
    for v in [&mut calls, &mut jumps, &mut cond_jumps] {
        v.sort_unstable();
    }

    // Code that other functions jump to but nobody calls may be a split-off
    // part of a function (a cold or BOLT-split path), entered with live
    // flags and frame: no function to count. It is one if it jumps back
    // into the middle of another function, or, without a name, if it is
    // reached by a conditional jump or its unwind entry starts mid-frame.
    // (An unnamed function reached only by unconditional tail jumps, like
    // a static function in a stripped binary, is still counted; named
    // fragments are recognised by their suffix, see `symbols`.)
    let fragment: Vec<bool> = (0..n)
        .map(|i| {
            let start = starts[i];
            if contains(&calls, start) {
                return false;
            }
            if !contains(&jumps, start) {
                return false;
            }
            let jumps_back = || {
                scans[i].as_ref().is_some_and(|s| {
                    s.branch_targets
                        .iter()
                        .any(|&t| holder(t).is_some_and(|j| j != i && t != starts[j]))
                })
            };
            jumps_back()
                || (funcs[i].unnamed && (contains(&cond_jumps, start) || funcs[i].mid_function_cfi))
        })
        .collect();

    // Module-wide targets: every direct branch and call, every function's
    // entry (a second entry inside a window), and jump-table entries. A
    // table's entries run while they point into this function, a fragment
    // of it, or code no function covers; the first one that points into
    // another function ends it.
    let mut direct: Vec<u64> = starts.clone();
    let mut tables: Vec<u64> = Vec::new();
    let mut own: Vec<Own> = Vec::with_capacity(n);
    let read = |a: u64, len: usize| mem(maps, a, len as u64);
    for (i, s) in scans.into_iter().enumerate() {
        let Some(s) = s else {
            // Not decoded: nothing is known of how it ends.
            own.push(Own {
                falls_through: true,
                ..Own::default()
            });
            continue;
        };
        let (lo, hi) = (starts[i], ends[i]);
        let keep = |t: u64| in_text(t) && holder(t).is_none_or(|j| j == i || fragment[j]);
        let jt = Native::jump_table_targets(&s, lo, hi, &keep, &read);
        // A branch within the function itself is the function's own: its
        // plan sends those into its entry bytes to their moved copies.
        direct.extend(s.branch_targets.iter().filter(|&&t| holder(t) != Some(i)));
        direct.extend_from_slice(&s.call_targets);
        tables.extend_from_slice(&jt);
        own.push(Own {
            branches: s.branch_targets,
            tables: jt.into_iter().filter(|t| (lo..hi).contains(t)).collect(),
            decode_error: s.decode_error,
            entry_branches: s.entry_branches,
            falls_through: s.falls_through,
            indirect: s.has_indirect_jump,
        });
    }
    for v in [&mut direct, &mut tables] {
        v.sort_unstable();
        v.dedup();
    }

    // Where loops are counted: code no listed function covers (`.cold`
    // parts, which the list leaves out) may jump into a loop's blocks.
    let loops = loops
        && funcs
            .iter()
            .any(|f| crate::options::loops::counts::wanted_for(&f.name));
    let mut unlisted: Vec<u64> = Vec::new();
    if loops {
        for &(lo, hi) in &text {
            let mut at = lo;
            let gaps = starts
                .iter()
                .zip(&ends)
                .filter(|(s, _)| (lo..hi).contains(*s));
            for (&s, &e) in gaps.chain(std::iter::once((&hi, &hi))) {
                if s > at {
                    if let Some(bytes) = code_at(at, s - at) {
                        unlisted.extend(Native::sweep_targets(bytes, at));
                    }
                }
                at = at.max(e);
            }
        }
        unlisted.sort_unstable();
    }
    let mut out = Vec::with_capacity(n);
    let mut function_loops = Vec::new();
    for (i, (f, c)) in funcs.into_iter().zip(code).enumerate() {
        let start = starts[i];
        if fragment[i] {
            continue;
        }
        let before = i.checked_sub(1).map(|j| &own[j]);
        let own = &own[i];
        let pad = c.as_ref().map_or(0, |&(_, _, pad)| pad);
        // The fill before the function, if a trampoline fits at its end:
        // alignment fill only, no function's, no branch lands in it, and
        // the function before does not reach it with its own plan. Asked
        // only of the few functions a full plan refuses.
        let tramp_fits = || {
            if !before.is_some_and(|b| !b.falls_through && !b.decode_error) {
                return false;
            }
            // Fill decodes from where the function before ends, which
            // never runs on into it (it ends in a return, jump or trap).
            let lo = ends[i - 1];
            let prev_end = out
                .iter()
                .rev()
                .find_map(|c: &Candidate| c.outcome.as_ref().ok())
                .map_or(0, |p| p.start + p.original().len() as u64);
            start >= lo.max(prev_end) + 5
                && holder(start - 5).is_none()
                && !any_in(&direct, lo, start)
                && !any_in(&tables, lo, start)
                && code_at(lo, start - lo).is_some_and(Native::is_fill)
        };
        // Else dead fill inside the function: alignment fill after a
        // return or jump, ending on an 8-byte boundary (or the function's
        // end), that no branch lands in and no other function's range
        // holds, past the bytes a short entry moves and within its jump's
        // reach. Not in a function that jumps through tables or registers
        // (a missed table could land in it).
        let inner_fill = |bytes: &[u8], size: usize| {
            if own.indirect {
                return None;
            }
            let landed = |lo: u64, hi: u64| {
                any_in(&direct, lo, hi)
                    || any_in(&tables, lo, hi)
                    || own
                        .branches
                        .iter()
                        .chain(&own.tables)
                        .any(|t| (lo..hi).contains(t))
            };
            let code = &bytes[..size.min(bytes.len())];
            Native::dead_fill(code, start)
                .into_iter()
                .find_map(|(lo, hi)| {
                    let at = lo.max(start + INNER_TRAMP_FROM);
                    let aligned = hi % 8 == 0 || hi == start + size as u64;
                    let alone = holder(lo) == Some(i) && holder(hi - 1) == Some(i);
                    (aligned
                        && alone
                        && at + 5 <= hi
                        && at - start <= i8::MAX as u64
                        && !landed(lo, hi))
                    .then(|| (at - start) as i8)
                })
        };
        let outcome = c.and_then(|(bytes, size, pad)| {
            let full = plan_full(bytes, start, size, pad, own, &direct, &tables);
            if full != Err(Refusal::BranchIntoWindow) || own.decode_error {
                return full;
            }
            // A branch lands within the first 5 bytes, past the first
            // instructions: those move, and a short jump reaches the stub
            // through a trampoline in fill.
            let first = own
                .branches
                .iter()
                .chain(own.tables.iter())
                .copied()
                .chain(first_in(&direct, start + 1, start + MAX_REACH))
                .chain(first_in(&tables, start + 1, start + MAX_REACH))
                .filter(|&t| t > start && t < start + MAX_REACH)
                .min();
            let loops_to_entry = own.branches.contains(&start) || own.tables.contains(&start);
            let Some(t) = first.filter(|_| !loops_to_entry) else {
                return full;
            };
            let tramp = if tramp_fits() {
                Some(-5)
            } else {
                inner_fill(bytes, size as usize)
            };
            match tramp {
                Some(k) => Native::plan_short(bytes, start, size as usize, (t - start) as usize, k),
                None => full,
            }
        });
        let outcome = match (outcome, c) {
            (Err(why), Ok((bytes, size, _))) if traps && trap_may_help(why) => {
                plan_trap(bytes, start, size, own, &direct, &tables).map_err(|_| why)
            }
            (outcome, _) => outcome,
        };
        if let (true, Ok((bytes, size, _))) = (
            loops && crate::options::loops::counts::wanted_for(&f.name),
            c,
        ) {
            // Probes start past what the entry's patch takes.
            let entry_end = outcome.as_ref().map_or(start, |p| {
                (p.start + p.original().len() as u64).max(p.patch_at + p.window as u64)
            });
            let lo = direct.partition_point(|&t| t <= start);
            let hi = direct.partition_point(|&t| t < start + size);
            let (tlo, thi) = (
                tables.partition_point(|&t| t <= start),
                tables.partition_point(|&t| t < start + size),
            );
            let (ulo, uhi) = (
                unlisted.partition_point(|&t| t <= start),
                unlisted.partition_point(|&t| t < start + size),
            );
            let mut foreign: Vec<u64> = direct[lo..hi]
                .iter()
                .chain(&tables[tlo..thi])
                .chain(&unlisted[ulo..uhi])
                .copied()
                .collect();
            foreign.sort_unstable();
            let cx = crate::options::loops::plan::Context {
                entry_end,
                foreign: &foreign,
                indirect: own.indirect,
            };
            let mut fl = crate::options::loops::plan::plan(bytes, start, size, &cx);
            if !fl.sites.is_empty() {
                fl.func = out.len();
                function_loops.push(fl);
            }
        }
        out.push(Candidate {
            name: f.name,
            vaddr: f.vaddr,
            size: f.size,
            pad,
            outcome,
        });
    }
    ModulePlan {
        module: m,
        funcs: out,
        source: list.source,
        text_relocations: list.text_relocations,
        traps,
        loops: function_loops,
    }
}

/// Refusals a trap entry avoids: those of the bytes after the first one.
fn trap_may_help(why: Refusal) -> bool {
    matches!(
        why,
        Refusal::TooSmall
            | Refusal::BranchIntoWindow
            | Refusal::JumpTableIntoWindow
            | Refusal::CallInWindow
    )
}

/// A trap entry's plan, or why not: only the first instruction moves, so
/// only branches into it matter. The function's own branches to its entry
/// (a loop, not a call) would count as calls: none may exist.
fn plan_trap(
    bytes: &[u8],
    start: u64,
    size: u64,
    own: &Own,
    direct: &[u64],
    tables: &[u64],
) -> Result<Plan, Refusal> {
    if own.decode_error {
        return Err(Refusal::DecodeError);
    }
    let plan = Native::plan_trap(bytes, start, size as usize)?;
    let moved = start..plan.resume_at;
    if own
        .branches
        .iter()
        .chain(&own.tables)
        .any(|t| moved.contains(t))
    {
        return Err(Refusal::BranchIntoWindow);
    }
    if any_in(direct, plan.patch_at + 1, plan.resume_at)
        || any_in(tables, plan.patch_at + 1, plan.resume_at)
    {
        return Err(Refusal::BranchIntoWindow);
    }
    Ok(plan)
}

/// How far before a trampoline's bytes, and past them, the fill they lie
/// in is decoded (an x86 instruction is at most 15 bytes).
const TRAMP_LEAD: u64 = 15;
const TRAMP_TAIL: u64 = 15;

/// Reach of a full plan's entry bytes from a function's first byte.
const MAX_REACH: u64 = 24;
/// Where a trampoline in a function's own fill may start at the earliest:
/// past the most a short entry moves (an `endbr64` and 4 bytes).
const INNER_TRAMP_FROM: u64 = 8;

/// The first of sorted `v` in [lo, hi), if any.
fn first_in(v: &[u64], lo: u64, hi: u64) -> Option<u64> {
    v.get(v.partition_point(|&x| x < lo))
        .copied()
        .filter(|&x| x < hi)
}

/// A function's plan with a `jmp rel32` entry, or why not: `own` is what
/// the function's own decode found, `direct` and `tables` every branch
/// and jump-table target of the module (sorted).
fn plan_full(
    bytes: &[u8],
    start: u64,
    size: u64,
    pad: u64,
    own: &Own,
    direct: &[u64],
    tables: &[u64],
) -> Result<Plan, Refusal> {
    let plan = Native::plan_window(bytes, start, size as usize, pad as usize)?;
    if own.decode_error {
        return Err(Refusal::DecodeError);
    }
    // A loop back to the entry is not a call: it must not reach the
    // stub's count. Where each of the function's own branches into its
    // entry bytes is a rel32 to one of the moved instructions (the
    // entry's, or a later one's), it is sent to that instruction's copy
    // in the stub, past the count.
    let entry_range = start..plan.resume_at.max(plan.patch_at + plan.window as u64);
    let mut plan = plan;
    let back = own
        .branches
        .iter()
        .filter(|t| entry_range.contains(t))
        .count();
    if back > 0 {
        let fields: Option<Vec<(u64, u64)>> = own
            .entry_branches
            .iter()
            .filter(|(t, _)| entry_range.contains(t))
            .map(|&(t, f)| f.map(|f| (f, t)))
            .collect();
        plan = fields
            .filter(|f| f.len() == back)
            .and_then(|f| plan.with_redirects(&f))
            .ok_or(Refusal::BranchIntoWindow)?;
    }
    if own.tables.iter().any(|t| entry_range.contains(t)) {
        return Err(Refusal::JumpTableIntoWindow);
    }
    let (lo, hi) = (plan.patch_at + 1, plan.patch_at + plan.window as u64);
    if any_in(direct, lo, hi) {
        return Err(Refusal::BranchIntoWindow);
    }
    if any_in(tables, lo, hi) {
        return Err(Refusal::JumpTableIntoWindow);
    }
    Ok(plan)
}

/// What every process must check for itself: the bytes to be overwritten
/// and moved are, in memory, those the plan was made from (not a
/// debugger's breakpoint, not another tool's patch); where they are not,
/// the function is refused. `false` if a plan was not made from `file`'s
/// bytes at all (a cache entry that cannot be trusted).
pub fn check_live(p: &mut ModulePlan, maps: &Maps, file: &FileImage) -> bool {
    for c in &mut p.funcs {
        let Ok(plan) = &c.outcome else { continue };
        // A short entry's trampoline goes over fill that must still be fill
        // (a cache entry saying otherwise is not trusted). Its 5 bytes may
        // begin or end inside a multi-byte fill instruction: they are
        // decoded from up to 15 bytes before them, and on past them.
        if let Some(t) = plan.trampoline() {
            let lead = t.min(TRAMP_LEAD);
            let around = (0..=TRAMP_TAIL)
                .rev()
                .find_map(|tail| file.bytes(t - lead, lead + 5 + tail));
            let Some(around) = around.filter(|b| Native::within_fill(b, lead as usize, 5)) else {
                return false;
            };
            let fill = &around[lead as usize..lead as usize + 5];
            if mem(maps, t, 5) != Some(fill) {
                c.outcome = Err(Refusal::ModifiedInMemory);
                continue;
            }
        }
        let want = plan.original();
        let len = want.len() as u64;
        if mem(maps, plan.start, len) == Some(want) {
            continue;
        }
        if file.bytes(plan.start, len) != Some(want) {
            return false;
        }
        c.outcome = Err(Refusal::ModifiedInMemory);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_in_is_half_open() {
        let v = [1, 5, 9];
        assert!(any_in(&v, 5, 6));
        assert!(!any_in(&v, 6, 9));
        assert!(any_in(&v, 0, 2));
        assert!(!any_in(&v, 10, 100));
    }
}
