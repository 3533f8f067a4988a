//! Where the probes of a function's loops go (`RTPROF_LOOPS`). A loop is
//! counted with a probe at its header (counting entries) and one on every
//! block that branches back to it (counting the branches back, and going
//! on to the header's probe past its count). A loop that tests at its top
//! (its header's block leaves the loop and is no branch back) also counts
//! the times it leaves from there: then the header ran once more than the
//! body. Iterations = entries + branches back - leavings from the top. A
//! block that only jumps back and is too short for a probe (`inc; jmp`)
//! is counted on every way into it instead; those branches back reach the
//! header's probe, which subtracts them from its entries. A loop is
//! counted only if all its probes fit.
//!
//! A probe's window is the fewest whole instructions that hold a jump: at
//! the start of a header's block, or ending a block with its branch. A
//! header's block too short for a jump lends the window the blocks it runs
//! on into, when nothing else enters them; one window at a block's start
//! that reaches its end serves as both.

use crate::arch::{InstructionSet, LoopSpan, LoopWindow, Native};
use rtprof_abi::loops::LoopRefusal;
use rtprof_shared::cfg::{Cfg, Flow};

/// One loop of a function: its header's address, and whether its probes
/// fit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoopSite {
    pub header: u64,
    pub outcome: Result<(), LoopRefusal>,
}

/// What a way out of a probe counts (a way may count several).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WayCount {
    /// A branch back to the header of the loop (index in the sites), sent
    /// past its probe's count of entries.
    Back(usize),
    /// A way into a block that only jumps back to the loop's header: a
    /// branch back that reaches the header's probe, counted as an entry
    /// there too.
    BackThrough(usize),
    /// The loop left from its top.
    TopExit(usize),
}

/// One probe: its window, the loop (index in the sites) whose arrivals at
/// its header it counts, and what each way on counts (as
/// `LoopWindow::ways`).
#[derive(Clone, Debug)]
pub struct ProbeSpec {
    pub window: LoopWindow,
    pub head: Option<usize>,
    pub ways: Vec<Vec<WayCount>>,
    /// Its counts save the flags.
    pub flags: bool,
}

impl ProbeSpec {
    /// The loops (indices in the sites) whose counters it bumps.
    pub fn loops(&self) -> Vec<usize> {
        let ways = self.ways.iter().flatten().map(|w| match *w {
            WayCount::Back(k) | WayCount::BackThrough(k) | WayCount::TopExit(k) => k,
        });
        self.head.into_iter().chain(ways).collect()
    }
}

/// The loops of one function and the probes of those that are counted.
#[derive(Clone, Debug, Default)]
pub struct FunctionLoops {
    /// Index of the function in its module's plan.
    pub func: usize,
    pub sites: Vec<LoopSite>,
    pub probes: Vec<ProbeSpec>,
}

/// What the module's analysis knows of a function beyond its code.
pub struct Context<'a> {
    /// No probe starts before this (the entry patch's bytes end there).
    pub entry_end: u64,
    /// Sorted targets of branches and jump tables elsewhere in the module
    /// (and other functions' entries): none may land inside a window.
    pub foreign: &'a [u64],
    /// It jumps through a table or register.
    pub indirect: bool,
}

/// Most blocks a header's window runs through.
const MAX_RUN: usize = 4;

/// The loops of the function whose `size` bytes are `code` at `start`.
pub fn plan(code: &[u8], start: u64, size: u64, cx: &Context) -> FunctionLoops {
    let code = &code[..(size as usize).min(code.len())];
    let insns = Native::decode_flow(code, start);
    let end = start + code.len() as u64;
    let whole = insns.last().is_some_and(|i| i.end == end);
    // The function's own branches to no instruction's start (a jump into
    // the middle of one): no window may hold them.
    let mut foreign = cx.foreign.to_vec();
    foreign.extend(insns.iter().filter_map(|i| match i.flow {
        Flow::Branch(t) | Flow::Jump(t)
            if (start..end).contains(&t) && insns.binary_search_by_key(&t, |i| i.addr).is_err() =>
        {
            Some(t)
        }
        _ => None,
    }));
    foreign.sort_unstable();
    let cfg = Cfg::new(&insns);
    let loops = cfg.loops();
    let refuse_all = |why| FunctionLoops {
        func: 0,
        sites: loops
            .iter()
            .map(|l| LoopSite {
                header: cfg.spans[l.header].0,
                outcome: Err(why),
            })
            .collect(),
        probes: Vec::new(),
    };
    if loops.is_empty() {
        return FunctionLoops::default();
    }
    if !whole {
        return refuse_all(LoopRefusal::Undecoded);
    }
    if cfg.indirect || cx.indirect {
        return refuse_all(LoopRefusal::JumpTable);
    }
    let n = cfg.spans.len();
    let mut preds = vec![Vec::new(); n];
    for (b, ss) in cfg.succ.iter().enumerate() {
        for &s in ss {
            if !preds[s].contains(&b) {
                preds[s].push(b);
            }
        }
    }
    let latches: Vec<Vec<usize>> = loops
        .iter()
        .map(|l| {
            let mut v: Vec<usize> = preds[l.header]
                .iter()
                .copied()
                .filter(|&p| l.body[p])
                .collect();
            v.sort_unstable();
            v
        })
        .collect();
    // A loop that tests at its top: its header's block leaves it, and is
    // not a branch back.
    let top_exit: Vec<bool> = loops
        .iter()
        .zip(&latches)
        .map(|(l, ls)| {
            let h = l.header;
            !ls.contains(&h) && cfg.succ[h].iter().any(|&s| !l.body[s])
        })
        .collect();
    // A loop with a branch out of the function (to a `.cold` part that
    // may come back, or a tail call that does not) has ways nobody sees.
    let split: Vec<bool> = loops
        .iter()
        .map(|l| {
            (0..n).filter(|&b| l.body[b]).any(|b| match cfg.last[b] {
                Flow::Branch(t) | Flow::Jump(t) => !(start..end).contains(&t),
                _ => false,
            })
        })
        .collect();
    let mut need_head = vec![false; n];
    let mut need_ways = vec![false; n];
    for ((l, ls), &top) in loops.iter().zip(&latches).zip(&top_exit) {
        need_head[l.header] = true;
        need_ways[l.header] |= top;
        for &u in ls {
            need_ways[u] = true;
        }
    }
    let check = |w: LoopWindow, short: LoopRefusal| -> Result<LoopWindow, LoopRefusal> {
        if w.at < cx.entry_end {
            return Err(LoopRefusal::AtEntry);
        }
        let i = foreign.partition_point(|&t| t <= w.at);
        if foreign.get(i).is_some_and(|&t| t < w.end) {
            return Err(LoopRefusal::BranchInside);
        }
        // A branch to the entry bytes may be sent elsewhere by the entry's
        // plan: not one a probe moves.
        if w.ways()
            .iter()
            .any(|&(_, t)| t >= start && t < cx.entry_end)
        {
            return Err(short);
        }
        Ok(w)
    };
    // A header's window, through the blocks its short block runs on into
    // (each entered from the one before only, and no header).
    let head_window = |b: usize| -> Result<LoopWindow, LoopRefusal> {
        let (lo, mut hi) = cfg.spans[b];
        // Only into the loop's own blocks: a way out inside the window
        // would leave it unseen.
        let body = loops.iter().find(|l| l.header == b).map(|l| &l.body);
        let mut last = b;
        loop {
            let got = Native::loop_window(code, start, lo, hi, LoopSpan::Head)
                .and_then(|w| check(w, LoopRefusal::ShortHeader));
            let next = last + 1;
            let runs_on = got == Err(LoopRefusal::ShortHeader)
                && next < n
                && next - b < MAX_RUN
                && cfg.spans[next].0 == hi
                && preds[next] == [last]
                && body.is_some_and(|body| body[next])
                && !need_head[next];
            if !runs_on {
                return got;
            }
            last = next;
            hi = cfg.spans[next].1;
        }
    };
    // Windows for the blocks `need_head` and `need_ways` name, in address
    // order: per block, the window at its start (its loop's header probe)
    // and the window that takes its end (with its ways out).
    type Choice = (
        Vec<LoopWindow>,
        Vec<Result<usize, LoopRefusal>>,
        Vec<Result<usize, LoopRefusal>>,
    );
    let choose = |need_head: &[bool], need_ways: &[bool]| -> Choice {
        let mut windows: Vec<LoopWindow> = Vec::new();
        let mut heads = vec![Err(LoopRefusal::ShortHeader); n];
        let mut ends = vec![Err(LoopRefusal::ShortLatch); n];
        let mut taken_until = start;
        for b in 0..n {
            let (lo, hi) = cfg.spans[b];
            // A block inside the last window (a header's run) has no
            // start of its own to take.
            if need_head[b] && lo >= taken_until {
                match head_window(b) {
                    Ok(w) => {
                        let i = windows.len();
                        heads[b] = Ok(i);
                        // Every block whose end it takes.
                        for (c, s) in cfg.spans.iter().enumerate().skip(b) {
                            if s.1 > w.end {
                                break;
                            }
                            ends[c] = Ok(i);
                        }
                        taken_until = w.end;
                        windows.push(w);
                    }
                    Err(why) => heads[b] = Err(why),
                }
            }
            if need_ways[b] && ends[b].is_err() {
                let get = |span| {
                    Native::loop_window(code, start, lo, hi, span)
                        .and_then(|w| check(w, LoopRefusal::ShortLatch))
                };
                match get(LoopSpan::Tail) {
                    Ok(t) if t.at >= taken_until => {
                        ends[b] = Ok(windows.len());
                        taken_until = t.end;
                        windows.push(t);
                    }
                    // Head and tail overlap: one window of the whole
                    // block serves as both.
                    Ok(_) if heads[b].is_ok() => match get(LoopSpan::Whole) {
                        Ok(w) => {
                            let i = heads[b].unwrap_or(0);
                            ends[b] = Ok(i);
                            taken_until = w.end;
                            windows[i] = w;
                        }
                        Err(why) => ends[b] = Err(why),
                    },
                    Ok(_) => ends[b] = Err(LoopRefusal::ShortLatch),
                    Err(why) => ends[b] = Err(why),
                }
            }
        }
        (windows, heads, ends)
    };
    let (mut windows, mut heads, mut ends) = choose(&need_head, &need_ways);
    // A latch too short for a probe whose only way on is its header:
    // counted on the ways into it, if the blocks they leave have room.
    let mut through: Vec<Option<usize>> = vec![None; n];
    for (k, (l, ls)) in loops.iter().zip(&latches).enumerate() {
        for &u in ls {
            // Only a block that surely reaches the header once entered:
            // arithmetic on registers and locals, and its jump (no call
            // that may not return, no access through a pointer).
            let (lo, hi) = cfg.spans[u];
            if ends[u] == Err(LoopRefusal::ShortLatch)
                && u != l.header
                && cfg.succ[u] == [l.header]
                && !preds[u].is_empty()
                && Native::loop_block_plain(code, start, lo, hi)
            {
                through[u] = Some(k);
            }
        }
    }
    if through.iter().any(Option::is_some) {
        for u in (0..n).filter(|&u| through[u].is_some()) {
            for &p in &preds[u] {
                need_ways[p] = true;
            }
        }
        (windows, heads, ends) = choose(&need_head, &need_ways);
    }
    // A way into `u` from `p`'s window: the window takes `p`'s end and
    // does not run on into `u`.
    let way_into = |p: usize, u: usize| -> Result<(), LoopRefusal> {
        let w = &windows[ends[p]?];
        let inside = w.at < cfg.spans[u].0 && cfg.spans[u].0 < w.end;
        if inside {
            Err(LoopRefusal::ShortLatch)
        } else {
            Ok(())
        }
    };
    let latch_ok = |u: usize| -> Result<(), LoopRefusal> {
        match (ends[u], through[u]) {
            (Ok(_), _) => Ok(()),
            (Err(_), Some(_)) => preds[u].iter().try_for_each(|&p| way_into(p, u)),
            (Err(why), None) => Err(why),
        }
    };
    let sites: Vec<LoopSite> = loops
        .iter()
        .zip(&latches)
        .zip(&top_exit)
        .map(|((l, ls), &top)| {
            let h = l.header;
            let outcome = heads[h]
                .and_then(|_| ls.iter().try_for_each(|&u| latch_ok(u)))
                .and_then(|()| match top {
                    true => ends[h].map(|_| ()).map_err(|_| LoopRefusal::ShortHeader),
                    false => Ok(()),
                });
            LoopSite {
                header: cfg.spans[h].0,
                outcome,
            }
        })
        .zip(&split)
        .map(|(site, &split)| match split {
            true => LoopSite {
                outcome: Err(LoopRefusal::Split),
                ..site
            },
            false => site,
        })
        .collect();
    let counted = |k: usize| sites[k].outcome.is_ok();
    let loop_at_header = |b: usize| loops.iter().position(|l| l.header == b);
    let flags_at = |b: usize| {
        let (lo, hi) = cfg.spans[b];
        Native::loop_flags_live(code, start, lo, hi)
    };
    let mut probes = Vec::new();
    for (wi, w) in windows.into_iter().enumerate() {
        let b = cfg.block_of(w.at).unwrap_or(0);
        let head = (heads[b] == Ok(wi))
            .then(|| loop_at_header(b))
            .flatten()
            .filter(|&k| counted(k));
        let mut flags = head.is_some_and(|k| flags_at(loops[k].header));
        let ways: Vec<Vec<WayCount>> = w
            .ways()
            .iter()
            .map(|&(from, to)| {
                // Only a way that ends a block is an edge of the graph.
                let Some(c) = cfg.block_of(from).filter(|&c| cfg.spans[c].1 <= w.end) else {
                    return Vec::new();
                };
                let s = cfg.block_of(to).filter(|&s| cfg.spans[s].0 == to);
                let mut counts = Vec::new();
                if let Some(k) = s.and_then(loop_at_header) {
                    if loops[k].body[c] && counted(k) {
                        flags |= flags_at(loops[k].header);
                        counts.push(WayCount::Back(k));
                    }
                }
                if let Some((k, u)) = s.and_then(|u| Some((through[u]?, u))) {
                    if counted(k) && ends[u].is_err() {
                        flags |= flags_at(u);
                        counts.push(WayCount::BackThrough(k));
                    }
                }
                if let Some(k) = loop_at_header(c) {
                    if top_exit[k] && counted(k) && s.is_none_or(|s| !loops[k].body[s]) {
                        // Where it goes may read the flags.
                        flags |= s.is_none_or(flags_at);
                        counts.push(WayCount::TopExit(k));
                    }
                }
                counts
            })
            .collect();
        if head.is_none() && ways.iter().all(Vec::is_empty) {
            continue;
        }
        probes.push(ProbeSpec {
            window: w,
            head,
            ways,
            flags,
        });
    }
    FunctionLoops {
        func: 0,
        sites,
        probes,
    }
}
