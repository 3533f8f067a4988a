//! Writing a module's function records and their outcomes into the counter
//! segment: the same at start-up and for a library loaded later.

use crate::analysis::ModulePlan;
use crate::install::Outcomes;
use crate::log::vlog;
use rtprof_shared::{Refusal, SegmentWriter};

/// The segment has no room for the module: it is recorded as far as it
/// went, all refused, and nothing more can be added.
pub struct Full;

/// Adds the module and one record per function (slot = function index).
/// Returns the first slot (`None` for a module without functions).
pub fn record_module(w: &SegmentWriter, p: &ModulePlan) -> Result<Option<u32>, Full> {
    if w.add_module(p.module.path.as_bytes(), p.module.bias)
        .is_err()
    {
        vlog!("{}: module table full; left unpatched", p.module.path);
        return Err(Full);
    }
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
    Ok(first)
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
