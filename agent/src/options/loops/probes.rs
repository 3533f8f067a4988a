//! Installing the probes of the loops `RTPROF_LOOPS` names: counters
//! claimed, probes laid out and written into their own area near the
//! module, sealed, then each window overwritten with a jump to its probe.
//! Runs while the process is single-threaded (the constructor), for the
//! modules present at start-up.

use crate::arch::{LoopProber, Native, ProbeCounter, StubWriter, Way};
use crate::discover::maps::Maps;
use crate::log::vlog;
use crate::options::loops::counts::{Counter, Counters};
use crate::options::loops::plan::{FunctionLoops, ProbeSpec, WayCount};
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
        let mut outcome: Vec<Outcome> = fl
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

/// Each loop's counters, or why it has none.
type Outcome = Result<Counters, LoopRefusal>;

/// The probes of one function: written if the loops they serve have
/// counters (`outcome`, which a failure here turns into a refusal), with
/// the area they are in.
fn install_function(
    mp: &ModulePlan,
    fl: &FunctionLoops,
    outcome: &mut [Outcome],
) -> (Placed, Option<StubArea>) {
    let serves: Vec<Vec<usize>> = fl.probes.iter().map(ProbeSpec::loops).collect();
    spread_refusals(&serves, outcome);
    let probes = live_probes(&serves, outcome);
    if probes.is_empty() {
        return (Vec::new(), None);
    }
    let sizes = probe_sizes(fl, &probes, outcome);
    let bound: usize = sizes.iter().map(|s| s.len + ALIGN).sum();
    let (lo, hi) = mp.module.span();
    let Some(area) = StubArea::near(lo, hi, bound as u64) else {
        vlog!(
            "{}: no memory within jump range for loop probes",
            mp.module.path
        );
        refuse_all(outcome, LoopRefusal::NoMemory);
        return (Vec::new(), None);
    };
    let (at, bodies) = lay_out(area.addr, &sizes, outcome.len());
    let Some(patches) = emit_probes(fl, &probes, &at, &bodies, outcome, &area) else {
        vlog!("{}: a loop probe is out of reach", mp.module.path);
        area.release();
        refuse_all(outcome, LoopRefusal::Unmovable);
        return (Vec::new(), None);
    };
    if !area.seal() {
        area.release();
        refuse_all(outcome, LoopRefusal::WriteFailed);
        return (Vec::new(), None);
    }
    let slices: Vec<(u64, &[u8])> = patches.iter().map(|(a, b)| (*a, b.as_slice())).collect();
    let written = write_entries(&mp.module, &slices);
    for (k, &i) in probes.iter().enumerate() {
        if !written[k] {
            refuse(outcome, &serves[i], LoopRefusal::WriteFailed);
        }
    }
    let fstart = mp.module.bias.wrapping_add(mp.funcs[fl.func].vaddr);
    let placed = probes
        .iter()
        .zip(&at)
        .zip(&sizes)
        .map(|((&i, &a), s)| {
            let w = &fl.probes[i].window;
            (a, a + s.len as u64, (w.at - fstart) as u32)
        })
        .collect();
    (placed, Some(area))
}

/// Refuses the loops `ks` that still have counters, for `why`; a refusal
/// already given stays (it is the first reason).
fn refuse(outcome: &mut [Outcome], ks: &[usize], why: LoopRefusal) {
    for &k in ks {
        if outcome[k].is_ok() {
            outcome[k] = Err(why);
        }
    }
}

/// Refuses every loop of the function still with counters: what failed
/// (memory, the area) takes all its probes.
fn refuse_all(outcome: &mut [Outcome], why: LoopRefusal) {
    refuse(outcome, &(0..outcome.len()).collect::<Vec<_>>(), why);
}

/// A probe serves the loops whose counters it bumps (`serves`, per
/// probe); with any of them without counters it is left out, and so are
/// they. Repeated until nothing changes: a loop left out takes the probes
/// it shares, and with them the other loops they serve.
fn spread_refusals(serves: &[Vec<usize>], outcome: &mut [Outcome]) {
    let mut changed = true;
    while changed {
        changed = false;
        for ks in serves {
            if let Some(Err(why)) = ks.iter().map(|&k| outcome[k]).find(|o| o.is_err()) {
                if ks.iter().any(|&k| outcome[k].is_ok()) {
                    refuse(outcome, ks, why);
                    changed = true;
                }
            }
        }
    }
}

/// The probes (indices) all of whose loops have counters: those written.
fn live_probes(serves: &[Vec<usize>], outcome: &[Outcome]) -> Vec<usize> {
    (0..serves.len())
        .filter(|&i| serves[i].iter().all(|&k| outcome[k].is_ok()))
        .collect()
}

/// The ways on of probe `p`, with their counters; a branch back goes to
/// its header's probe body in `bodies` (zeros while laying out: lengths
/// do not depend on it).
fn probe_ways(p: &ProbeSpec, outcome: &[Outcome], bodies: &[u64]) -> Vec<Way> {
    p.window
        .ways()
        .iter()
        .zip(&p.ways)
        .map(|(&(_, to), counts)| way(to, counts, outcome, bodies))
        .collect()
}

/// One way on, to `to`, counting `counts` (uncounted: a plain jump).
fn way(to: u64, counts: &[WayCount], outcome: &[Outcome], bodies: &[u64]) -> Way {
    if counts.is_empty() {
        return Way::To(to);
    }
    // Only loops with counters have probes: the default is never used.
    let none = ProbeCounter {
        number: 0,
        shared: 0,
    };
    let counter = |k: usize, pick: fn(&Counters) -> Counter| outcome[k].as_ref().map_or(none, pick);
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
}

/// A live probe's bytes, and for a header's probe its loop and the bytes
/// of its count of entries (where its body starts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Size {
    len: usize,
    head: Option<(usize, usize)>,
}

/// The sizes of the live `probes`, known before the area is: it is
/// allocated to fit them.
fn probe_sizes(fl: &FunctionLoops, probes: &[usize], outcome: &[Outcome]) -> Vec<Size> {
    let none = vec![0u64; outcome.len()];
    probes
        .iter()
        .map(|&i| {
            let p = &fl.probes[i];
            let ways = probe_ways(p, outcome, &none);
            let len = Native::probe_len(&p.window, p.head.is_some(), &ways, p.flags);
            let head = p.head.map(|k| {
                let without = Native::probe_len(&p.window, false, &ways, p.flags);
                (k, len - without)
            });
            Size { len, head }
        })
        .collect()
}

/// Places the probes of `sizes` one after another from `base`, each
/// aligned; returns their addresses and, per loop (of `loops`), where its
/// header probe's body starts (what its branches back jump to).
fn lay_out(base: u64, sizes: &[Size], loops: usize) -> (Vec<u64>, Vec<u64>) {
    let mut at = Vec::with_capacity(sizes.len());
    let mut used = 0usize;
    let mut bodies = vec![0u64; loops];
    for s in sizes {
        let a = base + used as u64;
        if let Some((k, count)) = s.head {
            bodies[k] = a + count as u64;
        }
        at.push(a);
        used = (used + s.len).div_ceil(ALIGN) * ALIGN;
    }
    (at, bodies)
}

/// Writes the live `probes` at their places `at` in `area` (the rest
/// traps) and returns the patch of each one's window, in order; `None`
/// if one cannot be written or reached (the area is not sealed yet).
fn emit_probes(
    fl: &FunctionLoops,
    probes: &[usize],
    at: &[u64],
    bodies: &[u64],
    outcome: &[Outcome],
    area: &StubArea,
) -> Option<Vec<(u64, Vec<u8>)>> {
    // SAFETY: the area is freshly mapped read-write, ours alone, and
    // nothing runs in it until the caller seals it.
    let code = unsafe { std::slice::from_raw_parts_mut(area.addr as *mut u8, area.len as usize) };
    code.fill(Native::TRAP);
    let mut patches = Vec::with_capacity(probes.len());
    for (&i, &a) in probes.iter().zip(at) {
        let p = &fl.probes[i];
        let off = (a - area.addr) as usize;
        let head = p
            .head
            .and_then(|h| outcome[h].as_ref().ok())
            .map(|c| c.arrivals);
        let ways = probe_ways(p, outcome, bodies);
        Native::emit_probe(&p.window, a, head, &ways, p.flags, &mut code[off..])?;
        patches.push((p.window.at, Native::window_patch(&p.window, a)?));
    }
    Some(patches)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loop `k`'s counters, numbered `10 * k + 1..`.
    fn counters(k: u32) -> Counters {
        let c = |n: u32| ProbeCounter {
            number: 10 * k + n,
            shared: 0x100 * k as u64 + n as u64,
        };
        Counters {
            index: k,
            arrivals: c(1),
            back: c(2),
            back_through: c(3),
            top_exits: c(4),
        }
    }

    /// A refused loop takes the probes it shares, and through them the
    /// loops those serve; a probe of other loops is kept, and a refusal
    /// keeps its first reason.
    #[test]
    fn a_refusal_spreads_through_shared_probes() {
        let serves = vec![vec![0, 1], vec![1, 2], vec![3], vec![2, 4]];
        let mut outcome: Vec<Outcome> = (0..5).map(|k| Ok(counters(k))).collect();
        outcome[2] = Err(LoopRefusal::Changed);
        outcome[4] = Err(LoopRefusal::TooMany);
        spread_refusals(&serves, &mut outcome);
        let why: Vec<Option<LoopRefusal>> = outcome.iter().map(|o| o.err()).collect();
        let changed = Some(LoopRefusal::Changed);
        assert_eq!(
            why,
            [changed, changed, changed, None, Some(LoopRefusal::TooMany)]
        );
        assert_eq!(live_probes(&serves, &outcome), [2]);
        refuse_all(&mut outcome, LoopRefusal::NoMemory);
        assert_eq!(outcome[3], Err(LoopRefusal::NoMemory));
        assert_eq!(outcome[0], Err(LoopRefusal::Changed));
    }

    /// Probes follow each other aligned; a header's branches back land
    /// past its count of entries.
    #[test]
    fn probes_are_laid_out_aligned_with_their_bodies() {
        let sizes = [
            Size {
                len: 20,
                head: Some((1, 7)),
            },
            Size { len: 5, head: None },
            Size {
                len: 16,
                head: Some((0, 3)),
            },
        ];
        let (at, bodies) = lay_out(0x1000, &sizes, 3);
        assert_eq!(at, [0x1000, 0x1020, 0x1030]);
        assert_eq!(bodies, [0x1033, 0x1007, 0]);
    }

    /// An uncounted way jumps on; a counted one bumps each of its loops'
    /// counters, and a branch back goes to its header probe's body.
    #[test]
    fn ways_count_their_loops_and_branches_back_skip_the_entry_count() {
        let outcome: Vec<Outcome> = vec![Ok(counters(0)), Ok(counters(1))];
        let bodies = [0x2000, 0x3000];
        assert_eq!(way(0x50, &[], &outcome, &bodies), Way::To(0x50));
        let (c0, c1) = (counters(0), counters(1));
        assert_eq!(
            way(
                0x50,
                &[WayCount::Back(1), WayCount::TopExit(0)],
                &outcome,
                &bodies
            ),
            Way::Counted {
                counters: vec![c1.back, c0.top_exits],
                to: 0x3000
            }
        );
        assert_eq!(
            way(0x60, &[WayCount::BackThrough(0)], &outcome, &bodies),
            Way::Counted {
                counters: vec![c0.back_through],
                to: 0x60
            }
        );
    }
}
