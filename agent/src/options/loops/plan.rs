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

use crate::arch::{LoopProber, LoopSpan, LoopWindow, Native, Planner};
use rtprof_abi::loops::LoopRefusal;
use rtprof_shared::cfg::{Cfg, Flow, Insn, Loop};

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
    let foreign = with_mid_targets(cx.foreign, &insns, start, end);
    let cfg = Cfg::new(&insns);
    let loops = cfg.loops();
    if loops.is_empty() {
        return FunctionLoops::default();
    }
    if !whole {
        return refuse_all(&cfg, &loops, LoopRefusal::Undecoded);
    }
    if cfg.indirect || cx.indirect {
        return refuse_all(&cfg, &loops, LoopRefusal::JumpTable);
    }
    let g = Graph::new(code, start, cfg, loops);
    let (need_head, mut need_ways) = g.needs();
    let place = Placer {
        g: &g,
        entry_end: cx.entry_end,
        foreign: &foreign,
        need_head: &need_head,
    };
    let mut choice = place.choose(&need_ways);
    let through = g.through(&choice.ends);
    if through.iter().any(Option::is_some) {
        // Each block leading into a latch counted through needs a window
        // that takes its end.
        for (u, _) in through.iter().enumerate().filter(|(_, k)| k.is_some()) {
            for &p in &g.preds[u] {
                need_ways[p] = true;
            }
        }
        choice = place.choose(&need_ways);
    }
    let sites = g.sites(&choice, &through);
    let probes = g.probes(choice, &through, &sites);
    FunctionLoops {
        func: 0,
        sites,
        probes,
    }
}

/// `foreign` with the function's own branches to no instruction's start
/// (a jump into the middle of one), sorted: no window may hold them.
fn with_mid_targets(foreign: &[u64], insns: &[Insn], start: u64, end: u64) -> Vec<u64> {
    let mut foreign = foreign.to_vec();
    foreign.extend(insns.iter().filter_map(|i| match i.flow {
        Flow::Branch(t) | Flow::Jump(t)
            if (start..end).contains(&t) && insns.binary_search_by_key(&t, |i| i.addr).is_err() =>
        {
            Some(t)
        }
        _ => None,
    }));
    foreign.sort_unstable();
    foreign
}

/// Every loop of the function, refused for `why`.
fn refuse_all(cfg: &Cfg, loops: &[Loop], why: LoopRefusal) -> FunctionLoops {
    FunctionLoops {
        func: 0,
        sites: loops
            .iter()
            .map(|l| LoopSite {
                header: cfg.spans[l.header].0,
                outcome: Err(why),
            })
            .collect(),
        probes: Vec::new(),
    }
}

/// A function's blocks and loops, with what placing probes asks of them.
struct Graph<'a> {
    code: &'a [u8],
    start: u64,
    cfg: Cfg,
    loops: Vec<Loop>,
    /// Each block's predecessors, each once.
    preds: Vec<Vec<usize>>,
    /// Per loop: its blocks that branch back to its header, sorted.
    latches: Vec<Vec<usize>>,
    /// Per loop: it tests at its top (its header's block leaves it, and is
    /// not a branch back).
    top_exit: Vec<bool>,
    /// Per loop: it branches out of the function (to a `.cold` part that
    /// may come back, or a tail call that does not), ways nobody sees.
    split: Vec<bool>,
}

impl<'a> Graph<'a> {
    fn new(code: &'a [u8], start: u64, cfg: Cfg, loops: Vec<Loop>) -> Graph<'a> {
        let end = start + code.len() as u64;
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
        let top_exit = loops
            .iter()
            .zip(&latches)
            .map(|(l, ls)| {
                let h = l.header;
                !ls.contains(&h) && cfg.succ[h].iter().any(|&s| !l.body[s])
            })
            .collect();
        let split = loops
            .iter()
            .map(|l| {
                (0..n).filter(|&b| l.body[b]).any(|b| match cfg.last[b] {
                    Flow::Branch(t) | Flow::Jump(t) => !(start..end).contains(&t),
                    _ => false,
                })
            })
            .collect();
        Graph {
            code,
            start,
            cfg,
            loops,
            preds,
            latches,
            top_exit,
            split,
        }
    }

    /// Per block: whether a probe must start it (a loop's header, to count
    /// entries), and whether one must take its end (a latch, to count the
    /// branches back; a top-testing loop's header, to count leavings).
    fn needs(&self) -> (Vec<bool>, Vec<bool>) {
        let n = self.cfg.spans.len();
        let mut need_head = vec![false; n];
        let mut need_ways = vec![false; n];
        for ((l, ls), &top) in self.loops.iter().zip(&self.latches).zip(&self.top_exit) {
            need_head[l.header] = true;
            need_ways[l.header] |= top;
            for &u in ls {
                need_ways[u] = true;
            }
        }
        (need_head, need_ways)
    }

    /// Per block, the loop it is counted through: a latch too short for a
    /// probe (per `ends`) whose only way on is its header, counted on the
    /// ways into it instead. Only a block that surely reaches the header
    /// once entered: arithmetic on registers and locals, and its jump (no
    /// call that may not return, no access through a pointer).
    fn through(&self, ends: &[Result<usize, LoopRefusal>]) -> Vec<Option<usize>> {
        let mut through = vec![None; self.cfg.spans.len()];
        for (k, (l, ls)) in self.loops.iter().zip(&self.latches).enumerate() {
            for &u in ls {
                let (lo, hi) = self.cfg.spans[u];
                if ends[u] == Err(LoopRefusal::ShortLatch)
                    && u != l.header
                    && self.cfg.succ[u] == [l.header]
                    && !self.preds[u].is_empty()
                    && Native::loop_block_plain(self.code, self.start, lo, hi)
                {
                    through[u] = Some(k);
                }
            }
        }
        through
    }

    /// Each loop's outcome: counted if its header's block has a probe at
    /// its start, each latch one that takes its end (or, counted through,
    /// one on each way into it that does not run on into it), and a loop
    /// that tests at its top one that takes its header's end; never a loop
    /// that leaves the function.
    fn sites(&self, choice: &Choice, through: &[Option<usize>]) -> Vec<LoopSite> {
        let ends = &choice.ends;
        let way_into = |p: usize, u: usize| -> Result<(), LoopRefusal> {
            let w = &choice.windows[ends[p]?];
            let inside = w.at < self.cfg.spans[u].0 && self.cfg.spans[u].0 < w.end;
            if inside {
                Err(LoopRefusal::ShortLatch)
            } else {
                Ok(())
            }
        };
        let latch_ok = |u: usize| -> Result<(), LoopRefusal> {
            match (ends[u], through[u]) {
                (Ok(_), _) => Ok(()),
                (Err(_), Some(_)) => self.preds[u].iter().try_for_each(|&p| way_into(p, u)),
                (Err(why), None) => Err(why),
            }
        };
        let loops = self.loops.iter().zip(&self.latches);
        loops
            .zip(self.top_exit.iter().zip(&self.split))
            .map(|((l, ls), (&top, &split))| {
                let h = l.header;
                let outcome = match split {
                    true => Err(LoopRefusal::Split),
                    false => choice.heads[h]
                        .and_then(|_| ls.iter().try_for_each(|&u| latch_ok(u)))
                        .and_then(|()| match top {
                            true => ends[h].map(|_| ()).map_err(|_| LoopRefusal::ShortHeader),
                            false => Ok(()),
                        }),
                };
                LoopSite {
                    header: self.cfg.spans[h].0,
                    outcome,
                }
            })
            .collect()
    }

    /// The probes of the chosen windows: each counts the arrivals at the
    /// header it starts (of a counted loop) and what each way on counts. A
    /// window that counts nothing gets none.
    fn probes(
        &self,
        choice: Choice,
        through: &[Option<usize>],
        sites: &[LoopSite],
    ) -> Vec<ProbeSpec> {
        let counted = |k: usize| sites[k].outcome.is_ok();
        let mut probes = Vec::new();
        for (wi, w) in choice.windows.into_iter().enumerate() {
            let b = self.cfg.block_of(w.at).unwrap_or(0);
            let head = (choice.heads[b] == Ok(wi))
                .then(|| self.loop_at_header(b))
                .flatten()
                .filter(|&k| counted(k));
            let mut flags = head.is_some_and(|k| self.flags_at(self.loops[k].header));
            let ways: Vec<Vec<WayCount>> = w
                .ways()
                .iter()
                .map(|&way| {
                    let (counts, f) = self.way_counts(way, w.end, &choice.ends, through, &counted);
                    flags |= f;
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
        probes
    }

    /// What a probe's way `(from, to)` out of its window (ending at
    /// `w_end`) counts, and whether those counts must save the flags.
    fn way_counts(
        &self,
        (from, to): (u64, u64),
        w_end: u64,
        ends: &[Result<usize, LoopRefusal>],
        through: &[Option<usize>],
        counted: &dyn Fn(usize) -> bool,
    ) -> (Vec<WayCount>, bool) {
        let mut flags = false;
        // Only a way that ends a block is an edge of the graph.
        let Some(c) = self
            .cfg
            .block_of(from)
            .filter(|&c| self.cfg.spans[c].1 <= w_end)
        else {
            return (Vec::new(), flags);
        };
        let s = self.cfg.block_of(to).filter(|&s| self.cfg.spans[s].0 == to);
        let mut counts = Vec::new();
        if let Some(k) = s.and_then(|s| self.loop_at_header(s)) {
            if self.loops[k].body[c] && counted(k) {
                flags |= self.flags_at(self.loops[k].header);
                counts.push(WayCount::Back(k));
            }
        }
        if let Some((k, u)) = s.and_then(|u| Some((through[u]?, u))) {
            if counted(k) && ends[u].is_err() {
                flags |= self.flags_at(u);
                counts.push(WayCount::BackThrough(k));
            }
        }
        if let Some(k) = self.loop_at_header(c) {
            if self.top_exit[k] && counted(k) && s.is_none_or(|s| !self.loops[k].body[s]) {
                // Where it goes may read the flags.
                flags |= s.is_none_or(|s| self.flags_at(s));
                counts.push(WayCount::TopExit(k));
            }
        }
        (counts, flags)
    }

    /// The loop whose header is block `b`.
    fn loop_at_header(&self, b: usize) -> Option<usize> {
        self.loops.iter().position(|l| l.header == b)
    }

    /// Whether the flags may be live where block `b` starts.
    fn flags_at(&self, b: usize) -> bool {
        let (lo, hi) = self.cfg.spans[b];
        Native::loop_flags_live(self.code, self.start, lo, hi)
    }
}

/// Windows chosen for a function's blocks, in address order.
struct Choice {
    windows: Vec<LoopWindow>,
    /// Per block: the window at its start (its loop's header probe).
    heads: Vec<Result<usize, LoopRefusal>>,
    /// Per block: the window that takes its end (with its ways out).
    ends: Vec<Result<usize, LoopRefusal>>,
}

/// Chooses the windows of a function's probes.
struct Placer<'a> {
    g: &'a Graph<'a>,
    /// No window starts before this (see `Context`).
    entry_end: u64,
    /// Targets no window may hold (see `with_mid_targets`).
    foreign: &'a [u64],
    /// Blocks a header's probe must start.
    need_head: &'a [bool],
}

impl Placer<'_> {
    /// `w` if a probe may take it, or why not (`short` where it would move
    /// a branch to the entry's bytes).
    fn check(&self, w: LoopWindow, short: LoopRefusal) -> Result<LoopWindow, LoopRefusal> {
        check_window(w, short, self.g.start, self.entry_end, self.foreign)
    }

    /// A header's window, through the blocks its short block runs on into
    /// (each entered from the one before only, and no header).
    fn head_window(&self, b: usize) -> Result<LoopWindow, LoopRefusal> {
        let g = self.g;
        let (lo, mut hi) = g.cfg.spans[b];
        // Only into the loop's own blocks: a way out inside the window
        // would leave it unseen.
        let body = g.loops.iter().find(|l| l.header == b).map(|l| &l.body);
        let mut last = b;
        loop {
            let got = Native::loop_window(g.code, g.start, lo, hi, LoopSpan::Head)
                .and_then(|w| self.check(w, LoopRefusal::ShortHeader));
            let next = last + 1;
            let runs_on = got == Err(LoopRefusal::ShortHeader)
                && next < g.cfg.spans.len()
                && next - b < MAX_RUN
                && g.cfg.spans[next].0 == hi
                && g.preds[next] == [last]
                && body.is_some_and(|body| body[next])
                && !self.need_head[next];
            if !runs_on {
                return got;
            }
            last = next;
            hi = g.cfg.spans[next].1;
        }
    }

    /// Windows for the blocks `need_head` and `need_ways` name, in address
    /// order: per block, the window at its start and the window that takes
    /// its end, one window of the whole block where the two overlap.
    fn choose(&self, need_ways: &[bool]) -> Choice {
        let (code, start, spans) = (self.g.code, self.g.start, &self.g.cfg.spans);
        let n = spans.len();
        let mut windows: Vec<LoopWindow> = Vec::new();
        let mut heads = vec![Err(LoopRefusal::ShortHeader); n];
        let mut ends = vec![Err(LoopRefusal::ShortLatch); n];
        let mut taken_until = start;
        for b in 0..n {
            let (lo, hi) = spans[b];
            // A block inside the last window (a header's run) has no
            // start of its own to take.
            if self.need_head[b] && lo >= taken_until {
                match self.head_window(b) {
                    Ok(w) => {
                        let i = windows.len();
                        heads[b] = Ok(i);
                        // Every block whose end it takes.
                        for (c, s) in spans.iter().enumerate().skip(b) {
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
                        .and_then(|w| self.check(w, LoopRefusal::ShortLatch))
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
        Choice {
            windows,
            heads,
            ends,
        }
    }
}

/// `w` if a probe may take it: not in the entry's patched bytes (before
/// `entry_end`), holding none of the `foreign` targets, and moving no
/// branch to the entry's bytes, which the entry's plan may send elsewhere
/// (`short` then).
fn check_window(
    w: LoopWindow,
    short: LoopRefusal,
    start: u64,
    entry_end: u64,
    foreign: &[u64],
) -> Result<LoopWindow, LoopRefusal> {
    if w.at < entry_end {
        return Err(LoopRefusal::AtEntry);
    }
    let i = foreign.partition_point(|&t| t <= w.at);
    if foreign.get(i).is_some_and(|&t| t < w.end) {
        return Err(LoopRefusal::BranchInside);
    }
    if w.ways().iter().any(|&(_, t)| t >= start && t < entry_end) {
        return Err(short);
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Flow::*;

    /// The graph of one-byte instructions at 0x10 (see
    /// `Insn::one_byte_each`); its shape reads no bytes.
    fn graph(flows: &[Flow]) -> Graph<'static> {
        let cfg = Cfg::new(&Insn::one_byte_each(flows));
        let loops = cfg.loops();
        let code: &'static [u8] = &[0x90; 16];
        Graph::new(&code[..flows.len()], 0x10, cfg, loops)
    }

    #[test]
    fn loops_that_test_at_the_top_or_bottom_or_leave_the_function() {
        // 0x11 header tests and leaves to 0x14; 0x12-0x13 branch back.
        let g = graph(&[Next, Branch(0x14), Next, Jump(0x11), Stop]);
        assert_eq!(
            (g.latches.clone(), g.top_exit.clone()),
            (vec![vec![2]], vec![true])
        );
        assert_eq!(g.split, [false]);
        let (head, ways) = g.needs();
        assert_eq!(head, [false, true, false, false]);
        // The header's end counts leavings, the latch's the branches back.
        assert_eq!(ways, [false, true, true, false]);

        // 0x11-0x12 one block that branches back to itself.
        let g = graph(&[Next, Next, Branch(0x11), Stop]);
        assert_eq!(
            (g.latches.clone(), g.top_exit.clone()),
            (vec![vec![1]], vec![false])
        );
        let (head, ways) = g.needs();
        assert_eq!(
            (head, ways),
            (vec![false, true, false], vec![false, true, false])
        );

        // A way out of the loop to code past the function's end.
        let g = graph(&[Next, Branch(0x100), Jump(0x11), Stop]);
        assert_eq!(g.split, [true]);
    }

    #[test]
    fn branches_into_the_middle_of_an_instruction_are_foreign() {
        let insn = |addr, end, flow| Insn {
            addr,
            end,
            flow,
            filler: false,
        };
        let insns = [
            insn(0x10, 0x12, Next),
            insn(0x12, 0x14, Branch(0x13)),
            insn(0x14, 0x16, Jump(0x10)),
            insn(0x16, 0x18, Branch(0x51)),
        ];
        let got = with_mid_targets(&[0x11, 0x40], &insns, 0x10, 0x18);
        assert_eq!(got, [0x11, 0x13, 0x40]);
    }

    // 0: mov eax,[rip+0x100] (6); 6: add ecx,eax; 8: cmp ecx,edx;
    // 10: jne 0. Its head window is [0, 6), its tail [6, 12).
    const LOOP: [u8; 12] = [
        0x8b, 0x05, 0x00, 0x01, 0x00, 0x00, 0x01, 0xc1, 0x39, 0xd1, 0x75, 0xf4,
    ];

    #[test]
    fn a_window_holds_no_foreign_target_and_moves_no_branch_to_the_entry() {
        let base = 0x40_0000;
        let window = |span| Native::loop_window(&LOOP, base, base, base + 12, span).unwrap();
        let head = || window(LoopSpan::Head);
        let short = LoopRefusal::ShortHeader;
        assert!(check_window(head(), short, base, base, &[]).is_ok());
        let at_entry = check_window(head(), short, base, base + 1, &[]);
        assert_eq!(at_entry.unwrap_err(), LoopRefusal::AtEntry);
        let inside = check_window(head(), short, base, base, &[base + 3]);
        assert_eq!(inside.unwrap_err(), LoopRefusal::BranchInside);
        // A target at the window's first byte or past its end is no harm.
        assert!(check_window(head(), short, base, base, &[base, base + 6]).is_ok());
        // The tail's jne goes to the first byte: moved, it would miss the
        // entry plan's redirect.
        let tail = || window(LoopSpan::Tail);
        let moved = check_window(tail(), LoopRefusal::ShortLatch, base, base + 5, &[]);
        assert_eq!(moved.unwrap_err(), LoopRefusal::ShortLatch);
        assert!(check_window(tail(), LoopRefusal::ShortLatch, base, base, &[]).is_ok());
    }

    #[test]
    fn a_loop_gets_a_header_probe_and_one_on_its_branch_back() {
        let base = 0x40_0000;
        // xor eax,eax; the loop above at 2 (its jne, relative, to 2); ret.
        let mut code = vec![0x31, 0xc0];
        code.extend_from_slice(&LOOP);
        code.push(0xc3);
        let cx = |entry_end, indirect| Context {
            entry_end,
            foreign: &[],
            indirect,
        };
        let fl = plan(&code, base, code.len() as u64, &cx(base, false));
        let header = base + 2;
        assert_eq!(
            fl.sites,
            [LoopSite {
                header,
                outcome: Ok(())
            }]
        );
        let probes: Vec<_> = fl
            .probes
            .iter()
            .map(|p| (p.window.at, p.window.end, p.head, p.ways.clone()))
            .collect();
        assert_eq!(
            probes,
            [
                (header, base + 8, Some(0), vec![vec![]]),
                (
                    base + 8,
                    base + 14,
                    None,
                    vec![vec![WayCount::Back(0)], vec![]]
                ),
            ]
        );
        // The entry's patch takes the header's first bytes.
        let fl = plan(&code, base, code.len() as u64, &cx(base + 4, false));
        assert_eq!(fl.sites[0].outcome, Err(LoopRefusal::AtEntry));
        assert!(fl.probes.is_empty());
        let fl = plan(&code, base, code.len() as u64, &cx(base, true));
        assert_eq!(fl.sites[0].outcome, Err(LoopRefusal::JumpTable));
    }
}
