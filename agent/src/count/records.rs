//! Writing a module's function records and their outcomes into the counter
//! segment: the same at start-up and for a library loaded later.

use crate::arch::EntryPlan;
use crate::count::segment::Segment;
use crate::discover::modules::Module;
use crate::discover::symbols::FuncSym;
use crate::log::vlog;
use crate::patch::install::Outcomes;
use crate::plan::analysis::ModulePlan;
use crate::sampling::addrmap::Present;
use rtprof_abi::layout::ModuleWhy;
use rtprof_abi::{Refusal, SegmentWriter};

/// The segment has no room for the module: it is recorded as far as it
/// went, all refused, and nothing more can be added.
pub struct Full;

/// Runtime ranges of a module's executable segments.
pub fn exec_ranges(m: &Module) -> Vec<(u64, u64)> {
    m.loads
        .iter()
        .filter(|l| l.executable())
        .map(|l| {
            let lo = m.bias.wrapping_add(l.vaddr);
            (lo, lo.saturating_add(l.memsz))
        })
        .collect()
}

/// Reserves memory for a module record named `path` and, if they fit, for
/// `funcs` more functions whose names take `names` bytes: `Some(true)` with
/// the functions, `Some(false)` for the module record alone, `None` for
/// nothing.
fn reserve(
    seg: &Segment,
    w: &SegmentWriter,
    path: &str,
    funcs: usize,
    names: usize,
) -> Option<bool> {
    let count = w.func_count() as usize;
    let strings = w.strings_len() as usize + path.len();
    let fits = |funcs: usize, strings: usize| {
        let (Ok(funcs), Ok(strings)) = (u32::try_from(funcs), u32::try_from(strings)) else {
            return false;
        };
        seg.reserve_records(funcs, strings)
    };
    if fits(count + funcs, strings + names) {
        Some(true)
    } else if fits(count, strings) {
        Some(false)
    } else {
        None
    }
}

/// Adds the module and one record per function (slot = function index).
/// Returns the module's place for sample attribution and its first slot
/// (`None` for a module without functions, or whose functions found no
/// room: then they count as refused `no_counter_space`, and its samples
/// still count for the module).
pub fn record_module(
    seg: &Segment,
    w: &mut SegmentWriter,
    p: &ModulePlan,
) -> Result<(Present, Option<u32>), Full> {
    let path = p.module.path.as_str();
    let names = p.funcs.iter().map(|c| c.name.len as usize).sum();
    let Some(with_functions) = reserve(seg, w, path, p.funcs.len(), names) else {
        vlog!("{path}: no room in the counter segment; left unpatched");
        return Err(Full);
    };
    let Ok(record) = w.add_module(path.as_bytes(), p.module.bias) else {
        vlog!("{path}: module table full; left unpatched");
        return Err(Full);
    };
    let present = Present {
        record,
        exec: exec_ranges(&p.module),
    };
    if !with_functions {
        let n = u32::try_from(p.funcs.len()).unwrap_or(u32::MAX);
        w.note_unrecorded(Refusal::NoCounterSpace, n);
        vlog!("{path}: no room for its {n} functions in the counter segment; left unpatched");
        return Ok((present, None));
    }
    let mut first = None;
    for c in &p.funcs {
        let size = c.size.min(u32::MAX as u64) as u32;
        match w.add_function(p.name_of(c).as_bytes(), c.vaddr, size) {
            Ok(slot) => {
                first.get_or_insert(slot);
            }
            Err(_) => {
                refuse_from(w, first.unwrap_or(w.func_count()));
                vlog!("{path}: counter segment full; left unpatched");
                return Err(Full);
            }
        }
    }
    Ok((present, first))
}

/// Adds a module that is not instrumented. With `funcs`, they are listed
/// so samples in it are attributed by name (if they do not fit, the module
/// is listed alone: its samples count for it); without, it is named on
/// demand ([`name_sampled`]) when the first sample lands in it.
pub fn record_sampled(
    seg: &Segment,
    w: &mut SegmentWriter,
    m: &Module,
    funcs: Option<&[FuncSym]>,
    why: ModuleWhy,
) -> Option<Present> {
    let path = if m.path.is_empty() { "[vdso]" } else { &m.path };
    let present = |record| Present {
        record,
        exec: exec_ranges(m),
    };
    let Some(funcs) = funcs else {
        reserve(seg, w, path, 0, 0)?;
        let record = w.add_sampled_module(path.as_bytes(), m.bias).ok()?;
        w.set_module_why(record, why);
        w.set_named_on_demand(record, true);
        return Some(present(record));
    };
    let funcs: Vec<&FuncSym> = funcs.iter().filter(|f| f.size > 0).collect();
    let names = funcs.iter().map(|f| f.name.len()).sum();
    let with_functions = reserve(seg, w, path, funcs.len(), names)?;
    let record = w.add_sampled_module(path.as_bytes(), m.bias).ok()?;
    w.set_module_why(record, why);
    if with_functions {
        for f in funcs {
            let size = f.size.min(u32::MAX as u64) as u32;
            if w.add_function(f.name.as_bytes(), f.vaddr, size).is_err() {
                vlog!("{path}: counter segment full; some functions unnamed in samples");
                break;
            }
        }
    } else {
        w.set_module_why(record, ModuleWhy::NoRoom);
        vlog!("{path}: no room for its function names; its samples count for the module");
    }
    Some(present(record))
}

/// Lists `funcs` for module `record`, recorded as named on demand, if
/// they may have the room (`room`) and it can be reserved. Either way it is
/// named for good afterwards (a module whose functions do not fit counts
/// its samples for itself).
pub fn name_sampled(
    seg: &Segment,
    w: &mut SegmentWriter,
    record: u32,
    path: &str,
    funcs: &[FuncSym],
    room: bool,
) {
    let funcs: Vec<&FuncSym> = funcs.iter().filter(|f| f.size > 0).collect();
    let names = funcs.iter().map(|f| f.name.len()).sum();
    if room && reserve(seg, w, "", funcs.len(), names) == Some(true) {
        let listed = w.name_module(
            record,
            funcs.iter().map(|f| {
                (
                    f.name.as_bytes(),
                    f.vaddr,
                    f.size.min(u32::MAX as u64) as u32,
                )
            }),
        );
        vlog!("{path}: {listed} functions named for samples");
    } else {
        w.set_module_why(record, ModuleWhy::NoRoom);
        vlog!("{path}: no room for its function names; its samples count for the module");
    }
    w.set_named_on_demand(record, false);
}

/// Marks every function recorded from slot `first` on as refused for lack
/// of counter space.
pub fn refuse_from(w: &mut SegmentWriter, first: u32) {
    for slot in first..w.func_count() {
        w.set_status(slot, Some(Refusal::NoCounterSpace));
    }
}

/// Flags the functions of `mp` (slots from `first`) patched with a trap
/// entry.
pub fn mark_traps(
    w: &mut SegmentWriter,
    first: u32,
    mp: &crate::plan::analysis::ModulePlan,
    outcomes: &Outcomes,
) {
    for (k, (c, o)) in mp.funcs.iter().zip(outcomes).enumerate() {
        if o.is_none() && mp.plan_of(c).is_ok_and(|p| p.is_trap()) {
            w.set_trapped(first + k as u32);
        }
    }
}

/// Records the outcome of each function from slot `first`; returns how
/// many were patched.
pub fn record_outcomes(w: &mut SegmentWriter, first: u32, outcomes: &Outcomes) -> usize {
    for (k, o) in outcomes.iter().enumerate() {
        w.set_status(first + k as u32, *o);
    }
    outcomes.iter().filter(|o| o.is_none()).count()
}
