//! Which patched functions count now: `RTPROF_COUNT` / `RTPROF_NOCOUNT`
//! (stubs written switched off, at start-up and for libraries loaded
//! later), and the C API's `rtprof_set_counting` while the program runs
//! (stubs switched in place, `patch::switch`). The segment says which are
//! off.

use crate::config::{glob_match, Config};
use crate::error::PatchError;
use crate::lifecycle::locked::Locked;
use crate::log::vlog;
use crate::options::routes::Routes;
use crate::patch::install::{Outcomes, StubMap};
use crate::patch::switch::set_counting;
use crate::plan::analysis::ModulePlan;
use crate::Agent;
use rtprof_abi::SegmentWriter;
use std::sync::atomic::{AtomicBool, Ordering};

/// Switches the patched functions whose names `select` to `on`; returns
/// how many. `map` and `w` are the stub map and records the caller holds
/// locked.
fn switch_where(
    map: &StubMap,
    routes: &Routes,
    w: &mut SegmentWriter,
    on: bool,
    select: &dyn Fn(&[u8]) -> bool,
) -> Result<usize, PatchError> {
    let chosen: Vec<u32> = (0..w.func_count())
        .filter(|&slot| {
            let f = w.function(slot);
            // Only patched functions have a stub to switch; an
            // implementation's route stub follows its function's.
            f.status == 0
                && w.module(f.module).flags & rtprof_abi::layout::module_flags::IMPLEMENTATIONS == 0
                && select(w.function_name(slot))
        })
        .collect();
    if chosen.is_empty() {
        return Ok(0);
    }
    // Stubs in address order, for one page protection change per page.
    let mut stubs: Vec<u64> = map
        .ranges()
        .iter()
        .filter(|r| chosen.binary_search(&r.2).is_ok())
        .map(|r| r.0)
        .collect();
    routes.counting_stubs(&chosen, &mut stubs);
    set_counting(&stubs, on)?;
    for &slot in &chosen {
        w.set_counting_off(slot, !on);
    }
    Ok(chosen.len())
}

/// Marks in the segment the functions of `plan` (slots `first..`) that
/// were patched with their counting off (`RTPROF_COUNT`,
/// `RTPROF_NOCOUNT`: `install` wrote their stubs switched off).
pub fn mark_off_from_start(
    w: &mut SegmentWriter,
    cfg: &Config,
    plan: &ModulePlan,
    first: u32,
    outcomes: &Outcomes,
) {
    if cfg.count.is_empty() && cfg.nocount.is_empty() {
        return;
    }
    let mut n = 0;
    for (k, (c, o)) in plan.funcs.iter().zip(outcomes).enumerate() {
        if o.is_none() && !cfg.counts_from_start(plan.name_of(c).as_bytes()) {
            w.set_counting_off(first + k as u32, true);
            n += 1;
        }
    }
    if n > 0 {
        vlog!(
            "{}: {n} functions not counted (RTPROF_COUNT, RTPROF_NOCOUNT)",
            plan.module.path
        );
    }
}

/// Answers a switch or route request rtprofd relayed through the segment
/// (see `rtprof_abi::layout::control`): called by the agent's threads on
/// every tick; two loads when there is none.
pub fn serve_control(a: &Agent) {
    use rtprof_abi::layout::control;
    /// The drain and budget threads both serve: one at a time, so that a
    /// request is answered once (a late second answer would write over
    /// the next request).
    static SERVING: AtomicBool = AtomicBool::new(false);
    struct Serving;
    impl Drop for Serving {
        fn drop(&mut self) {
            SERVING.store(false, Ordering::Release);
        }
    }
    if SERVING.swap(true, Ordering::Acquire) {
        return;
    }
    let _serving = Serving;
    // Offers of libraries loaded since, once relocated.
    crate::options::routes::read_pending(a);
    let w = &a.segment.counters;
    let mut pattern = [0u8; control::PATTERN_MAX];
    let Some((seq, kind, len)) = w.control_request(&mut pattern) else {
        return;
    };
    let on = match kind {
        control::ON => true,
        control::OFF => false,
        control::ROUTE => {
            let outcome = crate::options::routes::serve(a, &pattern[..len]);
            w.control_answer(seq, outcome);
            return;
        }
        _ => {
            w.control_answer(seq, rtprof_abi::route::RouteOutcome::Malformed);
            return;
        }
    };
    let glob = &pattern[..len];
    match set_by_name(a, glob, on) {
        Ok(n) => vlog!(
            "rtprofd: counting of {n} functions matching {} switched {}",
            String::from_utf8_lossy(glob),
            if on { "on" } else { "off" }
        ),
        Err(e) => vlog!("rtprofd's switch request: {e}"),
    }
    w.control_done(seq);
}

/// Switches counting of every patched function whose name matches `glob`
/// on or off, while the program runs; returns how many.
pub fn set_by_name(a: &Agent, glob: &[u8], on: bool) -> Result<usize, PatchError> {
    let Some(mut state) = a.state.lock() else {
        // Called from inside the loader hook: the stubs may be changing.
        return Ok(0);
    };
    let Locked {
        stubs,
        writer,
        routes,
        ..
    } = &mut *state;
    switch_where(stubs, routes, writer, on, &|name| glob_match(glob, name))
}
