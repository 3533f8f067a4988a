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

use rtprof_abi::loops::{LoopCount, LoopStats};
use rtprof_abi::Snapshot;
use rtprof_shared::cfg::{x86_64, Cfg, Loop};
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

/// The loops of `s`'s functions: those with samples, and every loop of a
/// function whose loops the agent counted exactly (with its counts);
/// each function's in address order.
fn loops_of(s: &Snapshot, files: &mut Files) -> Vec<LoopStats> {
    let mut by_function: HashMap<u32, Vec<(u32, u64)>> = HashMap::new();
    for &(slot, offset, n) in &s.offsets.samples {
        by_function.entry(slot).or_default().push((offset, n));
    }
    let mut counts: HashMap<(u32, u32), LoopCount> = HashMap::new();
    for &(slot, offset, c) in &s.loop_counts.loops {
        by_function.entry(slot).or_default();
        counts.insert((slot, offset), c);
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
        out.extend(charge(&cfg, &loops, samples).into_iter().filter_map(|l| {
            // Headers are in the function: the offset fits.
            let count = counts.get(&(slot, (l.header - f.vaddr) as u32)).copied();
            (l.samples > 0 || count.is_some()).then_some(LoopStats {
                function: slot,
                count,
                ..l
            })
        }));
    }
    out
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
                count: None,
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
    use rtprof_shared::cfg::{Flow, Insn};

    #[test]
    fn nested_loops_and_out_of_line_code() {
        use Flow::*;
        // 0x10 entry; 0x11 outer header; 0x12 inner header; 0x13 branch to
        // out-of-line code at 0x19; 0x14 back to the inner header (0x12);
        // 0x15 back to the outer (0x11); 0x16 a jump through a table;
        // 0x17-0x18 fill; 0x19 the out-of-line block, jumping back to
        // 0x14; 0x1a a loop reached only through the table: 0x1a..0x1b
        // back to 0x1a; 0x1c return.
        let mut c = Insn::one_byte_each(&[
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
}
