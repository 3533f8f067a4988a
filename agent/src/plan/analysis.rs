//! Deciding, for every function of a module, whether its entry can be
//! patched: the window plan plus the module-wide checks that no branch,
//! jump table or other function's entry lands inside the overwritten bytes.

use crate::arch::{EntryPlan, FunctionScan, Native, Plan, Planner};
use crate::discover::fileimage::FileImage;
use crate::discover::maps::Maps;
use crate::discover::modules::Module;
use crate::discover::symbols::{FuncSym, FunctionList};
use crate::options::loops::counts::wanted_for;
use crate::options::loops::plan::{Context, FunctionLoops};
use rtprof_abi::Refusal;

/// Alignment fill considered after a function (GCC pads to 16 bytes).
const MAX_PAD: u64 = 32;

/// A function's plan, as its index in its module's `plans`, or why it has
/// none. Plans are large and a module mapped from its page image needs
/// none: its function list stays a few words a function.
pub type Outcome = Result<u32, Refusal>;

/// A function's name: where it is in its module's `names`. (One string
/// for a module's tens of thousands of names, not one allocation each.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NameAt {
    pub off: u32,
    pub len: u32,
}

impl NameAt {
    /// Appends `name` to `names`: where it is there.
    pub fn push(names: &mut String, name: &str) -> NameAt {
        let off = names.len() as u32;
        names.push_str(name);
        NameAt {
            off,
            len: name.len() as u32,
        }
    }

    /// The name in `names`.
    pub fn of<'a>(&self, names: &'a str) -> &'a str {
        &names[self.off as usize..(self.off + self.len) as usize]
    }
}

pub struct Candidate {
    pub name: NameAt,
    pub vaddr: u64,
    pub size: u64,
    /// Alignment fill after the function that its window may use.
    pub pad: u64,
    pub outcome: Outcome,
}

/// Keeps `plan` in `plans`: the outcome that refers to it.
pub fn keep(plans: &mut Vec<Plan>, plan: Result<Plan, Refusal>) -> Outcome {
    plan.map(|p| {
        plans.push(p);
        (plans.len() - 1) as u32
    })
}

pub struct ModulePlan {
    pub module: Module,
    pub funcs: Vec<Candidate>,
    /// The plans the functions' outcomes refer to.
    pub plans: Vec<Plan>,
    /// The functions' names, one after another.
    pub names: String,
    pub source: &'static str,
    /// The loader writes into this file's code (DT_TEXTREL).
    pub text_relocations: bool,
    /// Functions whose entry can take no jump got trap entries.
    pub traps: bool,
    /// The loops of the functions named in `RTPROF_LOOPS` (never cached).
    pub loops: Vec<FunctionLoops>,
    /// The identity of the file the plan was made for (what a page image
    /// of its patched code is kept under), if known.
    pub identity: Option<crate::discover::fileimage::Identity>,
    /// Its code is mapped from a page image prepared for it (see
    /// `patch::image`): its plans were not decoded (each function that has
    /// one holds `NotAttempted`) nor checked against memory.
    pub mapped: bool,
}

impl ModulePlan {
    /// Function `c`'s plan, or why it has none.
    pub fn plan_of(&self, c: &Candidate) -> Result<&Plan, Refusal> {
        c.outcome.map(|k| &self.plans[k as usize])
    }

    /// Function `c`'s name.
    pub fn name_of(&self, c: &Candidate) -> &str {
        c.name.of(&self.names)
    }
}

/// A function's code with its trailing fill: (bytes, size, fill), or why not.
type Code<'a> = Result<(&'a [u8], u64, u64), Refusal>;

/// Runtime bytes [addr, addr+len) if they are mapped readable now. They
/// live as long as the borrow of `maps`, the snapshot of the memory map
/// they were checked against: a module's code stays mapped while one event
/// (start-up, or one run of the loader hook under the state lock) uses it.
fn mem(maps: &Maps, addr: u64, len: u64) -> Option<&[u8]> {
    // SAFETY: mapped readable as the memory map said; a loaded module's
    // code, which stays mapped while it is analysed (start-up, or the
    // loader hook under the state lock), so while `maps` is borrowed.
    maps.readable(addr, len)
        .then(|| unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) })
}

fn any_in(sorted: &[u64], lo: u64, hi: u64) -> bool {
    let i = sorted.partition_point(|&t| t < lo);
    i < sorted.len() && sorted[i] < hi
}

fn contains(sorted: &[u64], v: u64) -> bool {
    sorted.binary_search(&v).is_ok()
}

/// What one decode of a function found that concerns its own entry.
#[derive(Default)]
struct Own {
    branches: Vec<u64>,
    tables: Vec<u64>,
    decode_error: bool,
    /// Branches to the function's first bytes: targets and rel32 fields
    /// (`None` for a short branch).
    entry_branches: Vec<(u64, Option<u64>)>,
    /// The function may run on into the fill after it.
    falls_through: bool,
    /// It jumps through a table or register: where to is not all known.
    indirect: bool,
}

/// The module's functions as address ranges, in the list's order (by
/// start).
struct Ranges {
    starts: Vec<u64>,
    ends: Vec<u64>,
}

impl Ranges {
    fn new(m: &Module, funcs: &[FuncSym]) -> Ranges {
        let starts: Vec<u64> = funcs.iter().map(|f| m.bias.wrapping_add(f.vaddr)).collect();
        let ends = funcs.iter().zip(&starts).map(|(f, s)| s + f.size).collect();
        Ranges { starts, ends }
    }

    /// The function whose range holds `t`.
    fn holder(&self, t: u64) -> Option<usize> {
        let i = self.starts.partition_point(|&s| s <= t).checked_sub(1)?;
        (t < self.ends[i]).then_some(i)
    }
}

/// The module's executable segments, and their bytes as the file has
/// them.
struct Text<'a> {
    maps: &'a Maps,
    file: &'a FileImage,
    spans: Vec<(u64, u64)>,
}

impl<'a> Text<'a> {
    fn new(m: &Module, maps: &'a Maps, file: &'a FileImage) -> Text<'a> {
        let spans = m
            .loads
            .iter()
            .filter(|l| l.executable())
            .map(|l| (m.bias + l.vaddr, m.bias + l.vaddr + l.memsz))
            .collect();
        Text { maps, file, spans }
    }

    fn contains(&self, a: u64) -> bool {
        self.spans.iter().any(|&(lo, hi)| a >= lo && a < hi)
    }

    /// Code is decoded as the file has it: a debugger may already have
    /// written breakpoints into the mapped copy.
    fn code_at(&self, a: u64, len: u64) -> Option<&'a [u8]> {
        let file = self.file;
        self.maps
            .readable(a, len)
            .then(|| file.bytes(a, len))
            .flatten()
    }
}

/// What the module-wide passes found, which each function's plan reads.
struct Facts<'a> {
    ranges: Ranges,
    text: Text<'a>,
    own: Vec<Own>,
    /// Every direct branch and call target and every function's entry,
    /// sorted.
    direct: Vec<u64>,
    /// Every jump-table target, sorted.
    tables: Vec<u64>,
    /// Branch targets in code no listed function covers, sorted (only
    /// where loops are counted).
    unlisted: Vec<u64>,
}

/// Decides every function of `m` from its file's bytes alone: the result
/// depends on nothing else, and may be cached (see [`check_live`] for what
/// must be checked in each process).
/// With `traps`, a function no jump can enter gets a trap entry where one
/// is safe. With `loops`, the loops of the functions `RTPROF_LOOPS` names
/// get probes where they fit.
pub fn analyze(
    m: Module,
    list: FunctionList,
    maps: &Maps,
    file: &FileImage,
    traps: bool,
    loops: bool,
) -> ModulePlan {
    let funcs = list.funcs;
    let ranges = Ranges::new(&m, &funcs);
    let text = Text::new(&m, maps, file);
    let code = function_code(&m, &funcs, &ranges.starts, &text);
    // One decode of every function.
    let scans: Vec<Option<FunctionScan>> = code
        .iter()
        .zip(&ranges.starts)
        .map(|(c, &start)| {
            c.as_ref()
                .ok()
                .map(|(b, size, _)| Native::scan_function(&b[..*size as usize], start))
        })
        .collect();
    let fragment = fragments(&funcs, &scans, &ranges);
    let (own, direct, tables) = own_and_targets(scans, &ranges, &fragment, &text);
    let loops = loops && funcs.iter().any(|f| wanted_for(&f.name));
    let unlisted = match loops {
        true => unlisted_targets(&text.spans, &ranges, |a, len| text.code_at(a, len)),
        false => Vec::new(),
    };
    let facts = Facts {
        ranges,
        text,
        own,
        direct,
        tables,
        unlisted,
    };
    let mut out = Vec::with_capacity(funcs.len());
    let mut plans = Vec::with_capacity(funcs.len());
    let mut names = String::with_capacity(funcs.iter().map(|f| f.name.len()).sum());
    let mut function_loops = Vec::new();
    // Where the last planned entry's moved bytes end.
    let mut prev_end = 0;
    for (i, (f, c)) in funcs.into_iter().zip(code).enumerate() {
        if fragment[i] {
            continue;
        }
        let outcome = facts.entry(i, c, prev_end, traps);
        if let (true, Ok((bytes, size, _))) = (loops && wanted_for(&f.name), c) {
            let mut fl = facts.loops(i, bytes, size, &outcome);
            if !fl.sites.is_empty() {
                fl.func = out.len();
                function_loops.push(fl);
            }
        }
        if let Ok(p) = &outcome {
            prev_end = p.start() + p.original().len() as u64;
        }
        out.push(Candidate {
            name: NameAt::push(&mut names, &f.name),
            vaddr: f.vaddr,
            size: f.size,
            pad: c.map_or(0, |(_, _, pad)| pad),
            outcome: keep(&mut plans, outcome),
        });
    }
    ModulePlan {
        module: m,
        funcs: out,
        plans,
        names,
        source: list.source,
        text_relocations: list.text_relocations,
        traps,
        loops: function_loops,
        identity: None,
        mapped: false,
    }
}

/// Each function's code with the alignment fill after it (up to
/// [`MAX_PAD`], before the next function and its segment's end), or why
/// there is none.
fn function_code<'a>(
    m: &Module,
    funcs: &[FuncSym],
    starts: &[u64],
    text: &Text<'a>,
) -> Vec<Code<'a>> {
    let code = |(i, f): (usize, &FuncSym)| -> Code<'a> {
        let start = starts[i];
        if f.size == 0 {
            return Err(Refusal::UnknownSize);
        }
        let Some(load) = m.load_containing(start, f.size).filter(|l| l.executable()) else {
            return Err(Refusal::OutsideText);
        };
        let end = start + f.size;
        let load_end = m.bias + load.vaddr + load.memsz;
        let next = starts.get(i + 1).copied().unwrap_or(u64::MAX).min(load_end);
        let pad = next.saturating_sub(end).min(MAX_PAD);
        // The fill is optional: without it the function may still do.
        match text
            .code_at(start, f.size + pad)
            .or_else(|| text.code_at(start, f.size))
        {
            Some(c) => Ok((c, f.size, c.len() as u64 - f.size)),
            None => Err(Refusal::OutsideText),
        }
    };
    funcs.iter().enumerate().map(code).collect()
}

/// Sorted targets of the branches from each decoded function: its calls,
/// and its jumps and conditional jumps to outside its own range.
struct Reached {
    calls: Vec<u64>,
    jumps: Vec<u64>,
    cond_jumps: Vec<u64>,
}

impl Reached {
    fn new(scans: &[Option<FunctionScan>], ranges: &Ranges) -> Reached {
        let mut r = Reached {
            calls: Vec::new(),
            jumps: Vec::new(),
            cond_jumps: Vec::new(),
        };
        for (i, s) in scans.iter().enumerate() {
            let Some(s) = s else { continue };
            let outside = |t: &&u64| !(ranges.starts[i]..ranges.ends[i]).contains(*t);
            r.calls.extend_from_slice(&s.call_targets);
            r.jumps.extend(s.branch_targets.iter().filter(outside));
            r.cond_jumps.extend(s.cond_targets.iter().filter(outside));
        }
        for v in [&mut r.calls, &mut r.jumps, &mut r.cond_jumps] {
            v.sort_unstable();
        }
        r
    }
}

/// Which functions are split-off parts of others, not counted. Code that
/// other functions jump to but nobody calls may be a cold or BOLT-split
/// path, entered with live flags and frame. It is one if it jumps back
/// into the middle of another function, or, without a name, if it is
/// reached by a conditional jump or its unwind entry starts mid-frame.
/// (An unnamed function reached only by unconditional tail jumps, like a
/// static function in a stripped binary, is still counted; named
/// fragments are recognised by their suffix, see `symbols`.)
fn fragments(funcs: &[FuncSym], scans: &[Option<FunctionScan>], ranges: &Ranges) -> Vec<bool> {
    let reached = Reached::new(scans, ranges);
    let fragment = |i: usize| {
        let start = ranges.starts[i];
        if contains(&reached.calls, start) || !contains(&reached.jumps, start) {
            return false;
        }
        let jumps_back = || {
            scans[i].as_ref().is_some_and(|s| {
                s.branch_targets.iter().any(|&t| {
                    ranges
                        .holder(t)
                        .is_some_and(|j| j != i && t != ranges.starts[j])
                })
            })
        };
        jumps_back()
            || (funcs[i].unnamed
                && (contains(&reached.cond_jumps, start) || funcs[i].mid_function_cfi))
    };
    (0..funcs.len()).map(fragment).collect()
}

/// Each function's own findings, and the module-wide targets: every
/// direct branch and call, every function's entry (a second entry inside
/// a window), and jump-table entries (sorted). A table's entries run
/// while they point into this function, a fragment of it, or code no
/// function covers; the first one that points into another function ends
/// it.
fn own_and_targets(
    scans: Vec<Option<FunctionScan>>,
    ranges: &Ranges,
    fragment: &[bool],
    text: &Text,
) -> (Vec<Own>, Vec<u64>, Vec<u64>) {
    let mut direct: Vec<u64> = ranges.starts.clone();
    let mut tables: Vec<u64> = Vec::new();
    let mut own: Vec<Own> = Vec::with_capacity(scans.len());
    let read = |a: u64, len: usize| mem(text.maps, a, len as u64);
    for (i, s) in scans.into_iter().enumerate() {
        let Some(s) = s else {
            // Not decoded: nothing is known of how it ends.
            own.push(Own {
                falls_through: true,
                ..Own::default()
            });
            continue;
        };
        let (lo, hi) = (ranges.starts[i], ranges.ends[i]);
        let keep =
            |t: u64| text.contains(t) && ranges.holder(t).is_none_or(|j| j == i || fragment[j]);
        let jt = Native::jump_table_targets(&s, lo, hi, &keep, &read);
        // A branch within the function itself is the function's own: its
        // plan sends those into its entry bytes to their moved copies.
        direct.extend(
            s.branch_targets
                .iter()
                .filter(|&&t| ranges.holder(t) != Some(i)),
        );
        direct.extend_from_slice(&s.call_targets);
        tables.extend_from_slice(&jt);
        own.push(Own {
            branches: s.branch_targets,
            tables: jt.into_iter().filter(|t| (lo..hi).contains(t)).collect(),
            decode_error: s.decode_error,
            entry_branches: s.entry_branches,
            falls_through: s.falls_through,
            indirect: s.has_indirect_jump,
        });
    }
    for v in [&mut direct, &mut tables] {
        v.sort_unstable();
        v.dedup();
    }
    (own, direct, tables)
}

/// Direct branch and call targets in the code of `spans` no function of
/// `ranges` covers (sorted): `.cold` parts, which the list leaves out, may
/// jump into a loop's blocks.
fn unlisted_targets<'a>(
    spans: &[(u64, u64)],
    ranges: &Ranges,
    code_at: impl Fn(u64, u64) -> Option<&'a [u8]>,
) -> Vec<u64> {
    let mut unlisted: Vec<u64> = Vec::new();
    for &(lo, hi) in spans {
        let mut at = lo;
        let gaps = ranges
            .starts
            .iter()
            .zip(&ranges.ends)
            .filter(|(s, _)| (lo..hi).contains(*s));
        for (&s, &e) in gaps.chain(std::iter::once((&hi, &hi))) {
            if s > at {
                if let Some(bytes) = code_at(at, s - at) {
                    unlisted.extend(Native::sweep_targets(bytes, at));
                }
            }
            at = at.max(e);
        }
    }
    unlisted.sort_unstable();
    unlisted
}

impl Facts<'_> {
    /// Function `i`'s entry plan, or why not: a full window; where a
    /// branch lands in its first bytes, a short entry; where neither does
    /// and `traps`, a trap entry. `prev_end`: where the moved bytes of the
    /// last function planned before it end.
    fn entry(&self, i: usize, code: Code, prev_end: u64, traps: bool) -> Result<Plan, Refusal> {
        let (start, own) = (self.ranges.starts[i], &self.own[i]);
        let outcome = code.and_then(|(bytes, size, pad)| {
            let full = plan_full(bytes, start, size, pad, own, &self.direct, &self.tables);
            if full != Err(Refusal::BranchIntoWindow) || own.decode_error {
                return full;
            }
            self.short_entry(i, bytes, size, prev_end).unwrap_or(full)
        });
        match (outcome, code) {
            (Err(why), Ok((bytes, size, _))) if traps && trap_may_help(why) => {
                plan_trap(bytes, start, size, own, &self.direct, &self.tables).map_err(|_| why)
            }
            (outcome, _) => outcome,
        }
    }

    /// Function `i`'s short entry, where a branch lands within its first
    /// 5 bytes past the first instructions: those move, and a short jump
    /// reaches the stub through a trampoline in fill (before the function,
    /// else inside it). `None` where there is no such branch or no fill.
    fn short_entry(
        &self,
        i: usize,
        bytes: &[u8],
        size: u64,
        prev_end: u64,
    ) -> Option<Result<Plan, Refusal>> {
        let start = self.ranges.starts[i];
        let t = first_landing(&self.own[i], &self.direct, &self.tables, start)?;
        let tramp = match self.fill_before(i, prev_end) {
            true => -5,
            false => self.inner_fill(i, bytes, size as usize)?,
        };
        let limit = (t - start) as usize;
        Some(Native::plan_short(
            bytes,
            start,
            size as usize,
            limit,
            tramp,
        ))
    }

    /// Whether a trampoline fits at the end of the fill before function
    /// `i`: alignment fill only, no function's, no branch lands in it, and
    /// the function before does not reach it with its own plan (its moved
    /// bytes end at `prev_end`).
    fn fill_before(&self, i: usize, prev_end: u64) -> bool {
        let before = i.checked_sub(1).map(|j| &self.own[j]);
        if !before.is_some_and(|b| !b.falls_through && !b.decode_error) {
            return false;
        }
        // Fill decodes from where the function before ends, which never
        // runs on into it (it ends in a return, jump or trap).
        let (lo, start) = (self.ranges.ends[i - 1], self.ranges.starts[i]);
        start >= lo.max(prev_end) + 5
            && self.ranges.holder(start - 5).is_none()
            && !any_in(&self.direct, lo, start)
            && !any_in(&self.tables, lo, start)
            && self
                .text
                .code_at(lo, start - lo)
                .is_some_and(Native::is_fill)
    }

    /// Dead fill inside function `i` for a short entry's trampoline, as
    /// its offset from the entry: alignment fill after a return or jump,
    /// ending on an 8-byte boundary (or the function's end), that no
    /// branch lands in and no other function's range holds, past the bytes
    /// a short entry moves and within its jump's reach. Not in a function
    /// that jumps through tables or registers (a missed table could land
    /// in it).
    fn inner_fill(&self, i: usize, bytes: &[u8], size: usize) -> Option<i8> {
        let (start, own) = (self.ranges.starts[i], &self.own[i]);
        if own.indirect {
            return None;
        }
        let landed = |lo: u64, hi: u64| {
            any_in(&self.direct, lo, hi)
                || any_in(&self.tables, lo, hi)
                || own
                    .branches
                    .iter()
                    .chain(&own.tables)
                    .any(|t| (lo..hi).contains(t))
        };
        let code = &bytes[..size.min(bytes.len())];
        Native::dead_fill(code, start)
            .into_iter()
            .find_map(|(lo, hi)| {
                let at = lo.max(start + INNER_TRAMP_FROM);
                let aligned = hi % 8 == 0 || hi == start + size as u64;
                let alone =
                    self.ranges.holder(lo) == Some(i) && self.ranges.holder(hi - 1) == Some(i);
                (aligned
                    && alone
                    && at + 5 <= hi
                    && at - start <= i8::MAX as u64
                    && !landed(lo, hi))
                .then(|| (at - start) as i8)
            })
    }

    /// The loops of function `i` and where their probes go: past what its
    /// entry's patch (`outcome`) takes, and off every target of branches
    /// from elsewhere.
    fn loops(
        &self,
        i: usize,
        bytes: &[u8],
        size: u64,
        outcome: &Result<Plan, Refusal>,
    ) -> FunctionLoops {
        let start = self.ranges.starts[i];
        let entry_end = outcome.as_ref().map_or(start, |p| {
            (p.start() + p.original().len() as u64).max(p.patch_at() + p.window() as u64)
        });
        let foreign = landing_inside(
            start,
            start + size,
            [&self.direct, &self.tables, &self.unlisted],
        );
        let cx = Context {
            entry_end,
            foreign: &foreign,
            indirect: self.own[i].indirect,
        };
        crate::options::loops::plan::plan(bytes, start, size, &cx)
    }
}

/// Where the first branch into a function's first bytes lands (past its
/// first byte, within a full plan's reach): the limit of what a short
/// entry moves. `None` if none does, or if the function branches to its
/// own first byte (a loop a short entry cannot send past the count).
fn first_landing(own: &Own, direct: &[u64], tables: &[u64], start: u64) -> Option<u64> {
    if own.branches.contains(&start) || own.tables.contains(&start) {
        return None;
    }
    let reach = start + MAX_REACH;
    own.branches
        .iter()
        .chain(own.tables.iter())
        .copied()
        .chain(first_in(direct, start + 1, reach))
        .chain(first_in(tables, start + 1, reach))
        .filter(|&t| t > start && t < reach)
        .min()
}

/// The targets in (lo, hi) of each of the sorted `lists`, merged and
/// sorted: the function's first byte, its own entry, is not one.
fn landing_inside(lo: u64, hi: u64, lists: [&[u64]; 3]) -> Vec<u64> {
    let mut v: Vec<u64> = lists
        .iter()
        .flat_map(|l| &l[l.partition_point(|&t| t <= lo)..l.partition_point(|&t| t < hi)])
        .copied()
        .collect();
    v.sort_unstable();
    v
}

/// Refusals a trap entry avoids: those of the bytes after the first one.
fn trap_may_help(why: Refusal) -> bool {
    matches!(
        why,
        Refusal::TooSmall
            | Refusal::BranchIntoWindow
            | Refusal::JumpTableIntoWindow
            | Refusal::CallInWindow
    )
}

/// A trap entry's plan, or why not: only the first instruction moves, so
/// only branches into it matter. The function's own branches to its entry
/// (a loop, not a call) would count as calls: none may exist.
fn plan_trap(
    bytes: &[u8],
    start: u64,
    size: u64,
    own: &Own,
    direct: &[u64],
    tables: &[u64],
) -> Result<Plan, Refusal> {
    if own.decode_error {
        return Err(Refusal::DecodeError);
    }
    let plan = Native::plan_trap(bytes, start, size as usize)?;
    let moved = start..plan.resume_at();
    if own
        .branches
        .iter()
        .chain(&own.tables)
        .any(|t| moved.contains(t))
    {
        return Err(Refusal::BranchIntoWindow);
    }
    if any_in(direct, plan.patch_at() + 1, plan.resume_at())
        || any_in(tables, plan.patch_at() + 1, plan.resume_at())
    {
        return Err(Refusal::BranchIntoWindow);
    }
    Ok(plan)
}

/// How far before a trampoline's bytes, and past them, the fill they lie
/// in is decoded (an x86 instruction is at most 15 bytes).
const TRAMP_LEAD: u64 = 15;
const TRAMP_TAIL: u64 = 15;

/// Reach of a full plan's entry bytes from a function's first byte.
const MAX_REACH: u64 = 24;
/// Where a trampoline in a function's own fill may start at the earliest:
/// past the most a short entry moves (an `endbr64` and 4 bytes).
const INNER_TRAMP_FROM: u64 = 8;

/// The first of sorted `v` in [lo, hi), if any.
fn first_in(v: &[u64], lo: u64, hi: u64) -> Option<u64> {
    v.get(v.partition_point(|&x| x < lo))
        .copied()
        .filter(|&x| x < hi)
}

/// A function's plan with a `jmp rel32` entry, or why not: `own` is what
/// the function's own decode found, `direct` and `tables` every branch
/// and jump-table target of the module (sorted).
fn plan_full(
    bytes: &[u8],
    start: u64,
    size: u64,
    pad: u64,
    own: &Own,
    direct: &[u64],
    tables: &[u64],
) -> Result<Plan, Refusal> {
    let plan = Native::plan_window(bytes, start, size as usize, pad as usize)?;
    if own.decode_error {
        return Err(Refusal::DecodeError);
    }
    // A loop back to the entry is not a call: it must not reach the
    // stub's count. Where each of the function's own branches into its
    // entry bytes is a rel32 to one of the moved instructions (the
    // entry's, or a later one's), it is sent to that instruction's copy
    // in the stub, past the count.
    let entry_range = start..plan.resume_at().max(plan.patch_at() + plan.window() as u64);
    let mut plan = plan;
    let back = own
        .branches
        .iter()
        .filter(|t| entry_range.contains(t))
        .count();
    if back > 0 {
        let fields: Option<Vec<(u64, u64)>> = own
            .entry_branches
            .iter()
            .filter(|(t, _)| entry_range.contains(t))
            .map(|&(t, f)| f.map(|f| (f, t)))
            .collect();
        plan = fields
            .filter(|f| f.len() == back)
            .and_then(|f| plan.with_redirects(&f))
            .ok_or(Refusal::BranchIntoWindow)?;
    }
    if own.tables.iter().any(|t| entry_range.contains(t)) {
        return Err(Refusal::JumpTableIntoWindow);
    }
    let (lo, hi) = (plan.patch_at() + 1, plan.patch_at() + plan.window() as u64);
    if any_in(direct, lo, hi) {
        return Err(Refusal::BranchIntoWindow);
    }
    if any_in(tables, lo, hi) {
        return Err(Refusal::JumpTableIntoWindow);
    }
    Ok(plan)
}

/// What every process must check for itself: the bytes to be overwritten
/// and moved are, in memory, those the plan was made from (not a
/// debugger's breakpoint, not another tool's patch); where they are not,
/// the function is refused. `false` if a plan was not made from `file`'s
/// bytes at all (a cache entry that cannot be trusted).
pub fn check_live(p: &mut ModulePlan, maps: &Maps, file: &FileImage) -> bool {
    for c in &mut p.funcs {
        let Ok(k) = c.outcome else { continue };
        let plan = &p.plans[k as usize];
        // A short entry's trampoline goes over fill that must still be fill
        // (a cache entry saying otherwise is not trusted). Its 5 bytes may
        // begin or end inside a multi-byte fill instruction: they are
        // decoded from up to 15 bytes before them, and on past them.
        if let Some(t) = plan.trampoline() {
            let lead = t.min(TRAMP_LEAD);
            let around = (0..=TRAMP_TAIL)
                .rev()
                .find_map(|tail| file.bytes(t - lead, lead + 5 + tail));
            let Some(around) = around.filter(|b| Native::within_fill(b, lead as usize, 5)) else {
                return false;
            };
            let fill = &around[lead as usize..lead as usize + 5];
            if mem(maps, t, 5) != Some(fill) {
                c.outcome = Err(Refusal::ModifiedInMemory);
                continue;
            }
        }
        let want = plan.original();
        let len = want.len() as u64;
        if mem(maps, plan.start(), len) == Some(want) {
            continue;
        }
        if file.bytes(plan.start(), len) != Some(want) {
            return false;
        }
        c.outcome = Err(Refusal::ModifiedInMemory);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_in_is_half_open() {
        let v = [1, 5, 9];
        assert!(any_in(&v, 5, 6));
        assert!(!any_in(&v, 6, 9));
        assert!(any_in(&v, 0, 2));
        assert!(!any_in(&v, 10, 100));
    }

    fn ranges(spans: &[(u64, u64)]) -> Ranges {
        Ranges {
            starts: spans.iter().map(|s| s.0).collect(),
            ends: spans.iter().map(|s| s.1).collect(),
        }
    }

    #[test]
    fn holder_is_the_range_that_holds_an_address() {
        let r = ranges(&[(0x10, 0x20), (0x20, 0x28), (0x30, 0x40)]);
        assert_eq!(r.holder(0x0f), None);
        assert_eq!(r.holder(0x10), Some(0));
        assert_eq!(r.holder(0x1f), Some(0));
        assert_eq!(r.holder(0x20), Some(1));
        // Between functions, and past the last.
        assert_eq!(r.holder(0x28), None);
        assert_eq!(r.holder(0x2f), None);
        assert_eq!(r.holder(0x3f), Some(2));
        assert_eq!(r.holder(0x40), None);
    }

    fn sym(name: &str, vaddr: u64, size: u64, unnamed: bool) -> FuncSym {
        FuncSym {
            name: name.into(),
            vaddr,
            size,
            unnamed,
            mid_function_cfi: false,
        }
    }

    fn scan(jumps: &[u64], cond: &[u64], calls: &[u64]) -> Option<FunctionScan> {
        Some(FunctionScan {
            branch_targets: jumps.iter().chain(cond).copied().collect(),
            cond_targets: cond.to_vec(),
            call_targets: calls.to_vec(),
            ..FunctionScan::default()
        })
    }

    #[test]
    fn fragments_are_jumped_to_never_called_and_belong_to_another() {
        let funcs = [
            sym("a", 0x100, 0x40, false),
            // Jumped to by `a`, jumps back into its middle: a fragment.
            sym("a.part", 0x200, 0x20, false),
            // The same, but also called: a function.
            sym("c", 0x300, 0x10, false),
            // Unnamed, reached by a conditional jump: a fragment.
            sym("sub_400", 0x400, 0x10, true),
            // Unnamed, reached by a tail jump only: a function.
            sym("sub_500", 0x500, 0x10, true),
            // Jumps to its own start and into `a`, nobody else jumps to it.
            sym("f", 0x600, 0x20, false),
        ];
        let scans = [
            scan(&[0x200, 0x300, 0x500, 0x110], &[0x400], &[0x300]),
            scan(&[0x110], &[], &[]),
            scan(&[0x120], &[], &[]),
            scan(&[], &[], &[]),
            scan(&[0x100], &[], &[]),
            scan(&[0x600, 0x110], &[], &[]),
        ];
        let spans: Vec<(u64, u64)> = funcs.iter().map(|f| (f.vaddr, f.vaddr + f.size)).collect();
        let got = fragments(&funcs, &scans, &ranges(&spans));
        assert_eq!(got, [false, true, false, true, false, false]);
        // Its unwind entry starting mid-frame makes an unnamed function
        // reached by a tail jump one too.
        let mut funcs = funcs;
        funcs[4].mid_function_cfi = true;
        let got = fragments(&funcs, &scans, &ranges(&spans));
        assert_eq!(got, [false, true, false, true, true, false]);
    }

    #[test]
    fn unlisted_code_is_swept_between_and_after_functions() {
        let base = 0x1000u64;
        let mut code = [0x90u8; 0x20];
        // 0x1000, no function's: jmp 0x1012.
        code[0..2].copy_from_slice(&[0xeb, 0x10]);
        // Function 0x1004..0x1008: jmp 0x1006, not swept.
        code[4..6].copy_from_slice(&[0xeb, 0x00]);
        // 0x1008, no function's: call 0x1004.
        code[8..13].copy_from_slice(&[0xe8, 0xf7, 0xff, 0xff, 0xff]);
        // Function 0x1010..0x1018: jmp 0x1014, not swept.
        code[0x10..0x12].copy_from_slice(&[0xeb, 0x02]);
        // 0x1018, after the last function: jne 0x1000.
        code[0x18..0x1a].copy_from_slice(&[0x75, 0xe6]);
        let code_at = |a: u64, len: u64| {
            let lo = a.checked_sub(base)? as usize;
            code.get(lo..lo + len as usize)
        };
        let r = ranges(&[(0x1004, 0x1008), (0x1010, 0x1018)]);
        let got = unlisted_targets(&[(base, base + 0x20)], &r, code_at);
        assert_eq!(got, [0x1000, 0x1004, 0x1012]);
    }

    #[test]
    fn a_short_entry_moves_what_comes_before_the_first_landing() {
        let start = 0x100;
        let own = Own {
            branches: vec![start + 9, start + 40],
            ..Own::default()
        };
        // The entry itself and targets out of reach do not count.
        let direct = [start, start + 7, start + 30];
        let tables = [start + 24];
        assert_eq!(
            first_landing(&own, &direct, &tables, start),
            Some(start + 7)
        );
        assert_eq!(
            first_landing(&own, &[start + 3], &tables, start),
            Some(start + 3)
        );
        let none = Own::default();
        assert_eq!(first_landing(&none, &[start], &tables, start), None);
        // A loop back to the entry: no short entry.
        let loops = Own {
            branches: vec![start + 9, start],
            ..Own::default()
        };
        assert_eq!(first_landing(&loops, &direct, &tables, start), None);
    }

    #[test]
    fn targets_inside_a_function_are_past_its_entry_and_before_its_end() {
        let (lo, hi) = (0x100, 0x120);
        let direct = [0x80, lo, 0x104, hi];
        let tables = [0x102, 0x11f];
        let unlisted = [0x10f, 0x200];
        let got = landing_inside(lo, hi, [&direct, &tables, &unlisted]);
        assert_eq!(got, [0x102, 0x104, 0x10f, 0x11f]);
    }
}
