//! Installing the probes of the loops `RTPROF_LOOPS` names: counters
//! claimed, probes laid out and written into their own area near the
//! module, sealed, then each window overwritten with a jump to its probe.
//! Runs while the process is single-threaded (the constructor), for the
//! modules present at start-up.

use crate::arch::{LoopProber, Native, ProbeCounter, StubWriter, Way};
use crate::discover::maps::Maps;
use crate::log::vlog;
use crate::options::loops::counts::{Counter, Counters};
use crate::options::loops::plan::WayCount;
use crate::patch::install::write_entries;
use crate::patch::stubmem::StubArea;
use crate::plan::analysis::ModulePlan;
use rtprof_abi::loops::LoopRefusal;

const ALIGN: usize = 16;

/// A probe's place: (start, end, function slot, the window's offset in
/// its function), for attributing samples taken in it.
pub type ProbeRange = (u64, u64, u32, u32);

/// Installs the loop probes of `mp`, whose functions' counters are slots
/// `first_slot..`; notes every loop with its counters or why none, and
/// returns the probes' places and the areas they are in (released when
/// the module is unloaded). `maps` is the memory map the module's code is
/// checked against.
pub fn install(mp: &ModulePlan, first_slot: u32, maps: &Maps) -> (Vec<ProbeRange>, Vec<StubArea>) {
    let mut ranges = Vec::new();
    let mut areas = Vec::new();
    for fl in &mp.loops {
        let Some(c) = mp.funcs.get(fl.func) else {
            continue;
        };
        let start = mp.module.bias.wrapping_add(c.vaddr);
        let slot = first_slot + fl.func as u32;
        let mut outcome: Vec<Result<Counters, LoopRefusal>> = fl
            .sites
            .iter()
            .map(|s| {
                s.outcome
                    .and_then(|()| crate::options::loops::counts::claim())
            })
            .collect();
        // Probes are made from the file's bytes: a loop whose bytes differ
        // in memory (text relocations, a breakpoint) is left alone.
        for p in &fl.probes {
            let (at, want) = (p.window.at, p.window.original());
            let same = maps.readable(at, want.len() as u64) && {
                // SAFETY: mapped readable, as the memory map says: the
                // module's code, loaded for good at start-up.
                let now = unsafe { std::slice::from_raw_parts(at as *const u8, want.len()) };
                now == want
            };
            if !same {
                for k in p.loops() {
                    outcome[k] = Err(LoopRefusal::Changed);
                }
            }
        }
        let (got, area) = install_function(mp, fl, &mut outcome);
        ranges.extend(got.into_iter().map(|(a, b, off)| (a, b, slot, off)));
        areas.extend(area);
        crate::options::loops::counts::note(
            slot,
            fl.sites
                .iter()
                .zip(&outcome)
                .map(|(s, o)| ((s.header - start) as u32, o.map(|c| c.index))),
        );
    }
    (ranges, areas)
}

/// A probe's (start, end, the window's offset in its function).
type Placed = Vec<(u64, u64, u32)>;

/// The probes of one function: written if the loops they serve have
/// counters (`outcome`, which a failure here turns into a refusal), with
/// the area they are in.
fn install_function(
    mp: &ModulePlan,
    fl: &crate::options::loops::plan::FunctionLoops,
    outcome: &mut [Result<Counters, LoopRefusal>],
) -> (Placed, Option<StubArea>) {
    let fstart = mp.module.bias.wrapping_add(mp.funcs[fl.func].vaddr);
    // A probe serves the loops whose counters it bumps; with any of them
    // without counters, it is left out and so are they.
    let serves = |p: &crate::options::loops::plan::ProbeSpec| p.loops();
    let fail = |outcome: &mut [Result<Counters, LoopRefusal>], ks: &[usize], why| {
        for &k in ks {
            if outcome[k].is_ok() {
                outcome[k] = Err(why);
            }
        }
    };
    // Until nothing changes: a loop left out takes the probes it shares,
    // and with them the other loops they serve.
    let mut changed = true;
    while changed {
        changed = false;
        for p in &fl.probes {
            let ks = serves(p);
            if let Some(Err(why)) = ks.iter().map(|&k| outcome[k]).find(|o| o.is_err()) {
                if ks.iter().any(|&k| outcome[k].is_ok()) {
                    fail(outcome, &ks, why);
                    changed = true;
                }
            }
        }
    }
    let live = |outcome: &[Result<Counters, LoopRefusal>]| -> Vec<usize> {
        (0..fl.probes.len())
            .filter(|&i| serves(&fl.probes[i]).iter().all(|&k| outcome[k].is_ok()))
            .collect()
    };
    let probes = live(outcome);
    if probes.is_empty() {
        return (Vec::new(), None);
    }
    // Ways with their counters; `to` of a branch back is filled in once
    // the header's probe has its place (lengths do not depend on it).
    let ways = |i: usize, bodies: &[u64]| -> Vec<Way> {
        let p = &fl.probes[i];
        // Only loops with counters have probes: the default is never used.
        let none = ProbeCounter {
            number: 0,
            shared: 0,
        };
        let counter =
            |k: usize, pick: fn(&Counters) -> Counter| outcome[k].as_ref().map_or(none, pick);
        p.window
            .ways()
            .iter()
            .zip(&p.ways)
            .map(|(&(_, to), counts)| {
                if counts.is_empty() {
                    return Way::To(to);
                }
                // A branch back sent past its header probe's count.
                let to = counts
                    .iter()
                    .find_map(|w| match *w {
                        WayCount::Back(k) => Some(bodies[k]),
                        _ => None,
                    })
                    .unwrap_or(to);
                let counters = counts
                    .iter()
                    .map(|w| match *w {
                        WayCount::Back(k) => counter(k, |c| c.back),
                        WayCount::BackThrough(k) => counter(k, |c| c.back_through),
                        WayCount::TopExit(k) => counter(k, |c| c.top_exits),
                    })
                    .collect();
                Way::Counted { counters, to }
            })
            .collect()
    };
    let none = vec![0u64; outcome.len()];
    let lens: Vec<usize> = probes
        .iter()
        .map(|&i| {
            let p = &fl.probes[i];
            Native::probe_len(&p.window, p.head.is_some(), &ways(i, &none), p.flags)
        })
        .collect();
    let bound: usize = lens.iter().map(|l| l + ALIGN).sum();
    let (lo, hi) = mp.module.span();
    let Some(area) = StubArea::near(lo, hi, bound as u64) else {
        vlog!(
            "{}: no memory within jump range for loop probes",
            mp.module.path
        );
        fail(
            outcome,
            &(0..outcome.len()).collect::<Vec<_>>(),
            LoopRefusal::NoMemory,
        );
        return (Vec::new(), None);
    };
    // Places, and where each counted header's probe body starts.
    let mut at = Vec::with_capacity(probes.len());
    let mut used = 0usize;
    let mut bodies = vec![0u64; outcome.len()];
    for (&i, &len) in probes.iter().zip(&lens) {
        let p = &fl.probes[i];
        let a = area.addr + used as u64;
        if let Some(k) = p.head {
            let without = Native::probe_len(&p.window, false, &ways(i, &none), p.flags);
            bodies[k] = a + (len - without) as u64;
        }
        at.push(a);
        used = (used + len).div_ceil(ALIGN) * ALIGN;
    }
    // SAFETY: the area is freshly mapped read-write, ours alone, and
    // nothing runs in it until it is sealed below.
    let code = unsafe { std::slice::from_raw_parts_mut(area.addr as *mut u8, area.len as usize) };
    code.fill(Native::TRAP);
    let mut patches: Vec<(u64, Vec<u8>)> = Vec::new();
    for (k, &i) in probes.iter().enumerate() {
        let p = &fl.probes[i];
        let off = (at[k] - area.addr) as usize;
        let head = p
            .head
            .and_then(|h| outcome[h].as_ref().ok())
            .map(|c| c.arrivals);
        let ok = Native::emit_probe(
            &p.window,
            at[k],
            head,
            &ways(i, &bodies),
            p.flags,
            &mut code[off..],
        )
        .is_some()
        .then(|| Native::window_patch(&p.window, at[k]))
        .flatten();
        match ok {
            Some(b) => patches.push((p.window.at, b)),
            None => {
                vlog!("{}: a loop probe is out of reach", mp.module.path);
                area.release();
                fail(
                    outcome,
                    &(0..outcome.len()).collect::<Vec<_>>(),
                    LoopRefusal::Unmovable,
                );
                return (Vec::new(), None);
            }
        }
    }
    if !area.seal() {
        area.release();
        fail(
            outcome,
            &(0..outcome.len()).collect::<Vec<_>>(),
            LoopRefusal::WriteFailed,
        );
        return (Vec::new(), None);
    }
    let slices: Vec<(u64, &[u8])> = patches.iter().map(|(a, b)| (*a, b.as_slice())).collect();
    let written = write_entries(&mp.module, &slices);
    for (k, &i) in probes.iter().enumerate() {
        if !written[k] {
            fail(outcome, &serves(&fl.probes[i]), LoopRefusal::WriteFailed);
        }
    }
    let placed = probes
        .iter()
        .zip(&at)
        .zip(&lens)
        .map(|((&i, &a), &len)| {
            let w = &fl.probes[i].window;
            (a, a + len as u64, (w.at - fstart) as u32)
        })
        .collect();
    (placed, Some(area))
}
