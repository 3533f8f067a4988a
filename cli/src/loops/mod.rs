//! Loop profiles of sampled functions. Each function with samples at
//! known places (`Snapshot::offsets`) is decoded from its module's file;
//! a loop runs from the target of a branch back (its header) to the end
//! of the last branch back to it; loops nest by containment; each sample
//! counts for every loop around it, and for the innermost one's own
//! instructions. Code a compiler moved out of a loop's address range (a
//! cold block placed after the function's end) counts for the enclosing
//! loop, or none.

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
                wanted.entry(path.to_string()).or_default().push(l.start);
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
                s.loops[i].source = found.get(&(p, s.loops[i].start)).cloned();
            }
        }
    }
}

fn module_path(s: &Snapshot, function: u32) -> Option<&str> {
    let f = s.functions.get(function as usize)?;
    Some(s.modules.get(f.module as usize)?.path.as_str())
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
        let spans = spans(&x86_64::back_edges(code, f.vaddr));
        let samples = by_function[&slot]
            .iter()
            .map(|&(off, n)| (f.vaddr + off as u64, n));
        out.extend(
            charge(&spans, samples)
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

/// Loops from branches back, as (header, end, depth): one per header,
/// ending past its last branch back; sorted by start, outer first; depth
/// 1 for a loop in no other.
fn spans(edges: &[(u64, u64)]) -> Vec<(u64, u64, u32)> {
    let mut by_header: HashMap<u64, u64> = HashMap::new();
    for &(target, end) in edges {
        let e = by_header.entry(target).or_insert(end);
        *e = (*e).max(end);
    }
    let mut v: Vec<(u64, u64)> = by_header.into_iter().collect();
    v.sort_by_key(|&(start, end)| (start, std::cmp::Reverse(end)));
    // Loops that contain the current one, outermost first.
    let mut around: Vec<(u64, u64)> = Vec::new();
    v.into_iter()
        .map(|(start, end)| {
            // What ends before this one does cannot contain it.
            while around.last().is_some_and(|&(_, e)| e < end) {
                around.pop();
            }
            around.push((start, end));
            (start, end, around.len() as u32)
        })
        .collect()
}

/// Each loop of `spans` with the samples at the addresses of `samples`:
/// all that fall in its range, and those of them in no deeper loop.
fn charge(spans: &[(u64, u64, u32)], samples: impl Iterator<Item = (u64, u64)>) -> Vec<LoopStats> {
    let mut out: Vec<LoopStats> = spans
        .iter()
        .map(|&(start, end, depth)| LoopStats {
            function: 0,
            start,
            end,
            depth,
            samples: 0,
            self_samples: 0,
            source: None,
        })
        .collect();
    for (addr, n) in samples {
        let mut innermost: Option<usize> = None;
        for (i, l) in out.iter_mut().enumerate() {
            if (l.start..l.end).contains(&addr) {
                l.samples += n;
                if innermost.is_none_or(|j| spans[j].2 < l.depth) {
                    innermost = Some(i);
                }
            }
        }
        if let Some(i) = innermost {
            out[i].self_samples += n;
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
        let at = usize::try_from(l.offset + (vaddr - l.vaddr)).ok()?;
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

    #[test]
    fn loops_nest_by_containment_and_samples_go_innermost() {
        // Outer loop 0x10..0x40 (two branches back to its header), inner
        // 0x18..0x30, and a loop after it, 0x50..0x60.
        let edges = [
            (0x10, 0x38),
            (0x18, 0x30),
            (0x10, 0x40),
            (0x50, 0x60),
            (0x18, 0x2a),
        ];
        let s = spans(&edges);
        assert_eq!(s, [(0x10, 0x40, 1), (0x18, 0x30, 2), (0x50, 0x60, 1)]);
        let got = charge(
            &s,
            [(0x20, 5), (0x12, 2), (0x3f, 1), (0x55, 4), (0x70, 9)].into_iter(),
        );
        let counts: Vec<_> = got.iter().map(|l| (l.samples, l.self_samples)).collect();
        assert_eq!(counts, [(8, 3), (5, 5), (4, 4)]);
        // A loop overlapping another without lying in it is not nested.
        assert_eq!(
            spans(&[(0x10, 0x30), (0x20, 0x40)]),
            [(0x10, 0x30, 1), (0x20, 0x40, 1)]
        );
    }
}
