//! Writing a module's function records and their outcomes into the counter
//! segment: the same at start-up and for a library loaded later.

use crate::analysis::ModulePlan;
use crate::install::Outcomes;
use crate::log::vlog;
use crate::modules::Module;
use crate::sampling::addrmap::Present;
use crate::symbols::FuncSym;
use rtprof_shared::{Refusal, SegmentWriter};

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

/// Adds the module and one record per function (slot = function index).
/// Returns the module's place for sample attribution and its first slot
/// (`None` for a module without functions).
pub fn record_module(w: &SegmentWriter, p: &ModulePlan) -> Result<(Present, Option<u32>), Full> {
    let Ok(record) = w.add_module(p.module.path.as_bytes(), p.module.bias) else {
        vlog!("{}: module table full; left unpatched", p.module.path);
        return Err(Full);
    };
    let mut first = None;
    for c in &p.funcs {
        let size = c.size.min(u32::MAX as u64) as u32;
        match w.add_function(c.name.as_bytes(), c.vaddr, size) {
            Ok(slot) => {
                first.get_or_insert(slot);
            }
            Err(_) => {
                refuse_from(w, first.unwrap_or(w.func_count()));
                vlog!("{}: counter segment full; left unpatched", p.module.path);
                return Err(Full);
            }
        }
    }
    let present = Present {
        record,
        exec: exec_ranges(&p.module),
    };
    Ok((present, first))
}

/// Adds a module that is not instrumented, with `funcs` listed so samples
/// in it are attributed by name. Functions that do not fit are left out
/// (their samples count for the module).
pub fn record_sampled(w: &SegmentWriter, m: &Module, funcs: &[FuncSym]) -> Option<Present> {
    let path = if m.path.is_empty() { "[vdso]" } else { &m.path };
    let record = w.add_sampled_module(path.as_bytes(), m.bias).ok()?;
    for f in funcs.iter().filter(|f| f.size > 0) {
        let size = f.size.min(u32::MAX as u64) as u32;
        if w.add_function(f.name.as_bytes(), f.vaddr, size).is_err() {
            vlog!("{path}: counter segment full; some functions unnamed in samples");
            break;
        }
    }
    Some(Present {
        record,
        exec: exec_ranges(m),
    })
}

/// Marks every function recorded from slot `first` on as refused for lack
/// of counter space.
pub fn refuse_from(w: &SegmentWriter, first: u32) {
    for slot in first..w.func_count() {
        w.set_status(slot, Some(Refusal::NoCounterSpace));
    }
}

/// Records the outcome of each function from slot `first`; returns how
/// many were patched.
pub fn record_outcomes(w: &SegmentWriter, first: u32, outcomes: &Outcomes) -> usize {
    for (k, o) in outcomes.iter().enumerate() {
        w.set_status(first + k as u32, *o);
    }
    outcomes.iter().filter(|o| o.is_none()).count()
}
