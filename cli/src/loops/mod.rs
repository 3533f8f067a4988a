//! Loop profiles of sampled functions. Each function with samples at
//! known places (`Snapshot::offsets`) is decoded from its module's file
//! into basic blocks; a branch to a block that dominates it (every way in
//! passes there) closes a natural loop, whose body is every block that
//! reaches the branch without passing its header. Code a compiler moved
//! out of line (a rarely taken block after the function's return that
//! jumps back) is so part of its loop. Loops nest by their headers; each
//! sample counts for every loop around its block, and for the innermost
//! one's own. A jump through a table may go to any block nothing else
//! reaches; a block reached no way is in no loop.

mod x86_64;

use rtprof_shared::loops::LoopStats;
use rtprof_shared::Snapshot;
use std::collections::HashMap;
use std::path::Path;

/// Fills in `loops` for every process of `procs` with sampled offsets.
pub fn annotate(procs: &mut [Snapshot]) {
    let mut files = Files::default();
    for s in procs.iter_mut() {
        s.loops = loops_of(s, &mut files);
    }
    // Where each loop starts, one module file at a time.
    let mut wanted: HashMap<String, Vec<u64>> = HashMap::new();
    for s in procs.iter() {
        for l in &s.loops {
            if let Some(path) = module_path(s, l.function) {
                wanted.entry(path.to_string()).or_default().push(l.header);
            }
        }
    }
    let found: HashMap<(String, u64), _> = wanted
        .into_iter()
        .flat_map(|(path, addrs)| {
            let lines = crate::source_lines::lines_of(Path::new(&path), &addrs);
            lines.into_iter().map(move |(a, l)| ((path.clone(), a), l))
        })
        .collect();
    for s in procs.iter_mut() {
        for i in 0..s.loops.len() {
            let path = module_path(s, s.loops[i].function).map(str::to_string);
            if let Some(p) = path {
                s.loops[i].source = found.get(&(p, s.loops[i].header)).cloned();
            }
        }
    }
}

fn module_path(s: &Snapshot, function: u32) -> Option<&str> {
    let f = s.functions.get(function as usize)?;
    Some(s.modules.get(f.module as usize)?.path.as_str())
}

/// Where control goes after an instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// To the next instruction (calls included: they return).
    Next,
    /// To the target, or on to the next instruction.
    Branch(u64),
    /// To the target only.
    Jump(u64),
    /// Where the code does not say (a jump through a table or register).
    Indirect,
    /// Nowhere in this function (a return, a trap).
    Stop,
}

/// One decoded instruction.
pub struct Insn {
    pub addr: u64,
    pub end: u64,
    pub flow: Flow,
    /// Alignment fill (a no-op or a trap between pieces of code).
    pub filler: bool,
}

/// The loops of `s`'s sampled functions that have samples, each
/// function's in address order.
fn loops_of(s: &Snapshot, files: &mut Files) -> Vec<LoopStats> {
    let mut by_function: HashMap<u32, Vec<(u32, u64)>> = HashMap::new();
    for &(slot, offset, n) in &s.offsets.samples {
        by_function.entry(slot).or_default().push((offset, n));
    }
    let mut slots: Vec<u32> = by_function.keys().copied().collect();
    slots.sort_unstable();
    let mut out = Vec::new();
    for slot in slots {
        let f = &s.functions[slot as usize];
        let Some(path) = module_path(s, slot) else {
            continue;
        };
        let Some(code) = files.code(path, f.vaddr, f.size as u64) else {
            continue;
        };
        let cfg = Cfg::new(&x86_64::decode(code, f.vaddr));
        let loops = cfg.loops();
        // Offsets are below the function's size: no overflow.
        let samples = by_function[&slot]
            .iter()
            .map(|&(off, n)| (f.vaddr + off as u64, n));
        out.extend(
            charge(&cfg, &loops, samples)
                .into_iter()
                .filter(|l| l.samples > 0)
                .map(|l| LoopStats {
                    function: slot,
                    ..l
                }),
        );
    }
    out
}

/// A function's code as basic blocks.
struct Cfg {
    /// Each block's first and past-last address, in address order.
    spans: Vec<(u64, u64)>,
    succ: Vec<Vec<usize>>,
}

/// A natural loop: its header block and the blocks of its body (header
/// included).
struct Loop {
    header: usize,
    body: Vec<bool>,
    depth: u32,
}

impl Cfg {
    fn new(insns: &[Insn]) -> Cfg {
        // Leaders: the first instruction, branch targets, and what follows
        // a branch, a jump or a stop.
        let mut leaders = vec![false; insns.len()];
        if let Some(l) = leaders.first_mut() {
            *l = true;
        }
        for (k, i) in insns.iter().enumerate() {
            if let Flow::Branch(t) | Flow::Jump(t) = i.flow {
                if let Ok(at) = insns.binary_search_by_key(&t, |i| i.addr) {
                    leaders[at] = true;
                }
            }
            if i.flow != Flow::Next && k + 1 < insns.len() {
                leaders[k + 1] = true;
            }
        }
        let mut spans = Vec::new();
        let mut last = Vec::new();
        let mut filler = Vec::new();
        for (k, i) in insns.iter().enumerate() {
            if leaders[k] {
                spans.push((i.addr, i.end));
                last.push(k);
                filler.push(i.filler);
            } else if let (Some(s), Some(l), Some(f)) =
                (spans.last_mut(), last.last_mut(), filler.last_mut())
            {
                s.1 = i.end;
                *l = k;
                *f &= i.filler;
            }
        }
        let block_at = |a: u64| spans.binary_search_by_key(&a, |s: &(u64, u64)| s.0).ok();
        let mut indirect = Vec::new();
        let succ: Vec<Vec<usize>> = last
            .iter()
            .enumerate()
            .map(|(b, &k)| {
                let i = &insns[k];
                // The next block, if it starts where this one ends.
                let next = (b + 1 < spans.len() && spans[b + 1].0 == i.end).then_some(b + 1);
                match i.flow {
                    Flow::Next => next.into_iter().collect(),
                    Flow::Branch(t) => block_at(t).into_iter().chain(next).collect(),
                    Flow::Jump(t) => block_at(t).into_iter().collect(),
                    Flow::Indirect => {
                        indirect.push(b);
                        Vec::new()
                    }
                    Flow::Stop => Vec::new(),
                }
            })
            .collect();
        let mut cfg = Cfg { spans, succ };
        // A jump through a table may go to any code nothing else reaches
        // (a switch's cases), not to fill.
        if !indirect.is_empty() {
            let reached = cfg.reachable();
            let unreached: Vec<usize> = (0..cfg.spans.len())
                .filter(|&b| !reached[b] && !filler[b])
                .collect();
            for b in indirect {
                cfg.succ[b].extend(&unreached);
            }
        }
        cfg
    }

    fn reachable(&self) -> Vec<bool> {
        let mut seen = vec![false; self.spans.len()];
        let mut stack: Vec<usize> = (!self.spans.is_empty()).then_some(0).into_iter().collect();
        while let Some(b) = stack.pop() {
            if !std::mem::replace(&mut seen[b], true) {
                stack.extend(self.succ[b].iter().copied().filter(|&s| !seen[s]));
            }
        }
        seen
    }

    /// Each reachable block's immediate dominator (the entry's is itself),
    /// by the iterative algorithm over reverse postorder, and each block's
    /// reachable predecessors.
    fn dominators(&self) -> (Vec<Option<usize>>, Vec<Vec<usize>>) {
        let n = self.spans.len();
        // Postorder by an explicit stack: (block, next successor to visit).
        let mut order = Vec::new();
        let mut seen = vec![false; n];
        let mut stack = Vec::new();
        if n > 0 {
            seen[0] = true;
            stack.push((0usize, 0usize));
        }
        while let Some(&mut (b, ref mut k)) = stack.last_mut() {
            if let Some(&s) = self.succ[b].get(*k) {
                *k += 1;
                if !seen[s] {
                    seen[s] = true;
                    stack.push((s, 0));
                }
            } else {
                order.push(b);
                stack.pop();
            }
        }
        let mut rank = vec![usize::MAX; n];
        for (r, &b) in order.iter().enumerate() {
            rank[b] = r;
        }
        let mut preds = vec![Vec::new(); n];
        for (b, ss) in self.succ.iter().enumerate().filter(|(b, _)| seen[*b]) {
            for &s in ss {
                preds[s].push(b);
            }
        }
        let mut idom: Vec<Option<usize>> = vec![None; n];
        if n == 0 {
            return (idom, preds);
        }
        idom[0] = Some(0);
        let intersect = |idom: &[Option<usize>], mut a: usize, mut b: usize| {
            while a != b {
                while rank[a] < rank[b] {
                    a = idom[a].unwrap_or(0);
                }
                while rank[b] < rank[a] {
                    b = idom[b].unwrap_or(0);
                }
            }
            a
        };
        let mut changed = true;
        while changed {
            changed = false;
            for &b in order.iter().rev().filter(|&&b| b != 0) {
                let mut new = None;
                for &p in preds[b].iter().filter(|&&p| idom[p].is_some()) {
                    new = Some(new.map_or(p, |d| intersect(&idom, p, d)));
                }
                if new.is_some() && idom[b] != new {
                    idom[b] = new;
                    changed = true;
                }
            }
        }
        (idom, preds)
    }

    /// The natural loops, one per header, with their depth; in address
    /// order of their headers.
    fn loops(&self) -> Vec<Loop> {
        let (idom, preds) = self.dominators();
        let dominates = |h: usize, mut b: usize| loop {
            if b == h {
                return true;
            }
            match idom[b] {
                Some(d) if d != b => b = d,
                _ => return false,
            }
        };
        let n = self.spans.len();
        let mut by_header: std::collections::BTreeMap<usize, Loop> = Default::default();
        for (u, ss) in self
            .succ
            .iter()
            .enumerate()
            .filter(|(u, _)| idom[*u].is_some())
        {
            for &h in ss.iter().filter(|&&h| dominates(h, u)) {
                let l = by_header.entry(h).or_insert_with(|| {
                    let mut body = vec![false; n];
                    body[h] = true;
                    Loop {
                        header: h,
                        body,
                        depth: 1,
                    }
                });
                // Everything that reaches the branch back without passing
                // the header.
                let mut stack = vec![u];
                while let Some(b) = stack.pop() {
                    if !std::mem::replace(&mut l.body[b], true) {
                        stack.extend(preds[b].iter().copied());
                    }
                }
            }
        }
        let mut loops: Vec<Loop> = by_header.into_values().collect();
        for i in 0..loops.len() {
            let h = loops[i].header;
            let around = loops
                .iter()
                .enumerate()
                .filter(|&(j, m)| j != i && m.body[h])
                .count();
            loops[i].depth = 1 + around as u32;
        }
        loops
    }

    fn block_of(&self, addr: u64) -> Option<usize> {
        let b = self.spans.partition_point(|s| s.0 <= addr).checked_sub(1)?;
        (addr < self.spans[b].1).then_some(b)
    }
}

/// Each loop with the samples at the addresses of `samples`: all that
/// fall in its body, and those of them in no loop nested in it.
fn charge(cfg: &Cfg, loops: &[Loop], samples: impl Iterator<Item = (u64, u64)>) -> Vec<LoopStats> {
    let mut out: Vec<LoopStats> = loops
        .iter()
        .map(|l| {
            // The code its blocks span (out-of-line parts included).
            let blocks = || cfg.spans.iter().zip(&l.body).filter(|(_, &b)| b);
            LoopStats {
                function: 0,
                header: cfg.spans[l.header].0,
                start: blocks().map(|(s, _)| s.0).min().unwrap_or(0),
                end: blocks().map(|(s, _)| s.1).max().unwrap_or(0),
                depth: l.depth,
                samples: 0,
                self_samples: 0,
                source: None,
            }
        })
        .collect();
    for (addr, n) in samples {
        let Some(b) = cfg.block_of(addr) else {
            continue;
        };
        let mut innermost: Option<usize> = None;
        for (i, l) in loops.iter().enumerate().filter(|(_, l)| l.body[b]) {
            out[i].samples = out[i].samples.saturating_add(n);
            if innermost.is_none_or(|j| loops[j].depth < l.depth) {
                innermost = Some(i);
            }
        }
        if let Some(i) = innermost {
            out[i].self_samples = out[i].self_samples.saturating_add(n);
        }
    }
    out
}

/// Module files, mapped once each, with their loadable segments.
#[derive(Default)]
struct Files {
    maps: HashMap<String, Option<(memmap2::Mmap, Vec<Load>)>>,
}

/// A loadable segment: where its bytes lie in the file.
struct Load {
    vaddr: u64,
    offset: u64,
    filesz: u64,
}

impl Files {
    /// The `size` bytes at file address `vaddr` of the module at `path`.
    fn code(&mut self, path: &str, vaddr: u64, size: u64) -> Option<&[u8]> {
        let (map, loads) = self
            .maps
            .entry(path.to_string())
            .or_insert_with(|| open(Path::new(path)))
            .as_ref()?;
        let end = vaddr.checked_add(size)?;
        let l = loads
            .iter()
            .find(|l| vaddr >= l.vaddr && end <= l.vaddr.saturating_add(l.filesz))?;
        let at = usize::try_from(l.offset.checked_add(vaddr - l.vaddr)?).ok()?;
        map.get(at..at.checked_add(usize::try_from(size).ok()?)?)
    }
}

fn open(path: &Path) -> Option<(memmap2::Mmap, Vec<Load>)> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: a read-only private mapping of a module file, read while the
    // report is made; were it truncated meanwhile, this tool would fault,
    // not a profiled program.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let elf = goblin::elf::Elf::parse(&map).ok()?;
    let loads = elf
        .program_headers
        .iter()
        .filter(|p| p.p_type == goblin::elf::program_header::PT_LOAD)
        .map(|p| Load {
            vaddr: p.p_vaddr,
            offset: p.p_offset,
            filesz: p.p_filesz,
        })
        .collect();
    Some((map, loads))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Instructions of one byte each at 0x10 on, as (flow) per address.
    fn code(flows: &[Flow]) -> Vec<Insn> {
        flows
            .iter()
            .enumerate()
            .map(|(k, &flow)| Insn {
                addr: 0x10 + k as u64,
                end: 0x11 + k as u64,
                flow,
                filler: false,
            })
            .collect()
    }

    #[test]
    fn nested_loops_and_out_of_line_code() {
        use Flow::*;
        // 0x10 entry; 0x11 outer header; 0x12 inner header; 0x13 branch to
        // out-of-line code at 0x19; 0x14 back to the inner header (0x12);
        // 0x15 back to the outer (0x11); 0x16 a jump through a table;
        // 0x17-0x18 fill; 0x19 the out-of-line block, jumping back to
        // 0x14; 0x1a a loop reached only through the table: 0x1a..0x1b
        // back to 0x1a; 0x1c return.
        let mut c = code(&[
            Next,
            Next,
            Next,
            Branch(0x19),
            Branch(0x12),
            Branch(0x11),
            Indirect,
            Stop,
            Stop,
            Jump(0x14),
            Next,
            Branch(0x1a),
            Stop,
        ]);
        c[7].filler = true;
        c[8].filler = true;
        let cfg = Cfg::new(&c);
        let loops = cfg.loops();
        let stats = charge(
            &cfg,
            &loops,
            [
                (0x19, 5),
                (0x12, 2),
                (0x15, 1),
                (0x1a, 4),
                (0x16, 9),
                (0x17, 3),
            ]
            .into_iter(),
        );
        // The out-of-line block's jump back is no loop of its own; it is
        // part of the inner loop's code.
        let got: Vec<_> = stats
            .iter()
            .map(|l| (l.header, l.start, l.end, l.depth))
            .collect();
        assert_eq!(
            got,
            [
                (0x11, 0x11, 0x1a, 1),
                (0x12, 0x12, 0x1a, 2),
                (0x1a, 0x1a, 0x1c, 1)
            ]
        );
        let counts: Vec<_> = stats.iter().map(|l| (l.samples, l.self_samples)).collect();
        // The out-of-line block's samples are the inner loop's.
        assert_eq!(counts, [(8, 1), (7, 7), (4, 4)]);
    }

    #[test]
    fn no_code_no_loops() {
        let cfg = Cfg::new(&[]);
        assert!(cfg.loops().is_empty());
        assert_eq!(cfg.block_of(0x10), None);
    }
}
