//! A function's control flow, whatever the instruction set: its code as
//! basic blocks from decoded instructions, and its natural loops. A branch
//! to a block that dominates it (every way in passes there) closes a
//! natural loop, whose body is every block that reaches the branch without
//! passing its header. Code a compiler moved out of line (a rarely taken
//! block after the function's return that jumps back) is so part of its
//! loop. A jump through a table may go to any block nothing else reaches;
//! a block reached no way is in no loop. The report charges samples to
//! loops with it; the agent places exact loop counters with it.

#[cfg(feature = "decode")]
pub mod x86_64;

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

impl Insn {
    /// Instructions of one byte each from 0x10 on, with these flows: a
    /// function's shape, for tests.
    pub fn one_byte_each(flows: &[Flow]) -> Vec<Insn> {
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
}

/// A function's code as basic blocks.
pub struct Cfg {
    /// Each block's first and past-last address, in address order.
    pub spans: Vec<(u64, u64)>,
    /// Each block's successors.
    pub succ: Vec<Vec<usize>>,
    /// Each block's last instruction's flow.
    pub last: Vec<Flow>,
    /// A block ends in a jump through a table or register.
    pub indirect: bool,
}

/// A natural loop: its header block and the blocks of its body (header
/// included).
pub struct Loop {
    pub header: usize,
    pub body: Vec<bool>,
    pub depth: u32,
}

impl Cfg {
    pub fn new(insns: &[Insn]) -> Cfg {
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
        let last = last.iter().map(|&k| insns[k].flow).collect();
        let mut cfg = Cfg {
            spans,
            succ,
            last,
            indirect: !indirect.is_empty(),
        };
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
    pub fn dominators(&self) -> (Vec<Option<usize>>, Vec<Vec<usize>>) {
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
    pub fn loops(&self) -> Vec<Loop> {
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

    /// The block holding `addr`.
    pub fn block_of(&self, addr: u64) -> Option<usize> {
        let b = self.spans.partition_point(|s| s.0 <= addr).checked_sub(1)?;
        (addr < self.spans[b].1).then_some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_loops_share_no_header_and_know_their_depth() {
        use Flow::*;
        // 0x10 entry; 0x11 outer header; 0x12 inner header; 0x13 back to
        // the inner header; 0x14 back to the outer; 0x15 return.
        let cfg = Cfg::new(&Insn::one_byte_each(&[
            Next,
            Next,
            Next,
            Branch(0x12),
            Branch(0x11),
            Stop,
        ]));
        let loops = cfg.loops();
        let got: Vec<_> = loops
            .iter()
            .map(|l| (cfg.spans[l.header].0, l.depth))
            .collect();
        assert_eq!(got, [(0x11, 1), (0x12, 2)]);
        assert!(!cfg.indirect);
        assert_eq!(cfg.last[cfg.block_of(0x13).unwrap()], Branch(0x12));
    }

    #[test]
    fn no_code_no_loops() {
        let cfg = Cfg::new(&[]);
        assert!(cfg.loops().is_empty());
        assert_eq!(cfg.block_of(0x10), None);
    }
}
