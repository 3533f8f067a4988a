//! Where the functions a report shows are defined: the source file and
//! line of each one's first instruction, from its module's DWARF line
//! table, or from the module's separate debug file (`debuginfo`). Only
//! the functions a report lists are looked up, one module at a time.

use rtprof_abi::reader::SourceLine;
use rtprof_abi::Snapshot;
use rtprof_shared::debuginfo;
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

/// Fills in `source` for the functions of `procs` that were called or
/// sampled, where debug information says where they are.
pub fn annotate(procs: &mut [Snapshot]) {
    // Where the agent looked for debug files, this looks too.
    let dirs = std::env::var("RTPROF_DEBUG_DIR").ok();
    debuginfo::set_dirs(debuginfo::dirs_from(dirs.as_deref()));
    // One lookup per module file, whatever the processes.
    let mut wanted: HashMap<String, Vec<u64>> = HashMap::new();
    for s in procs.iter() {
        for f in s.functions.iter().filter(|f| f.calls > 0 || f.samples > 0) {
            if let Some(m) = s.modules.get(f.module as usize) {
                wanted.entry(m.path.clone()).or_default().push(f.vaddr);
            }
        }
    }
    let found: HashMap<(String, u64), SourceLine> = wanted
        .into_iter()
        .flat_map(|(path, addrs)| {
            let lines = lines_of(Path::new(&path), &addrs);
            lines.into_iter().map(move |(a, l)| ((path.clone(), a), l))
        })
        .collect();
    for s in procs.iter_mut() {
        let paths: Vec<String> = s.modules.iter().map(|m| m.path.clone()).collect();
        for f in &mut s.functions {
            if let Some(p) = paths.get(f.module as usize) {
                f.source = found.get(&(p.clone(), f.vaddr)).cloned();
            }
        }
    }
}

/// The source lines of `addrs` (ELF virtual addresses) in the module file
/// at `path`; empty where the file or its debug information is missing.
pub fn lines_of(path: &Path, addrs: &[u64]) -> Vec<(u64, SourceLine)> {
    let Ok(file) = std::fs::File::open(path) else {
        return Vec::new();
    };
    // SAFETY: a read-only private mapping; a module file is not truncated
    // while its report is written (if it were, reading it would fault in
    // this tool, not in a profiled program).
    let Ok(map) = (unsafe { memmap2::Mmap::map(&file) }) else {
        return Vec::new();
    };
    let debug;
    let data: &[u8] = if has_line_table(&map) {
        &map
    } else {
        match debuginfo::find(path, &map) {
            Some(d) => {
                debug = d;
                debug.data()
            }
            None => return Vec::new(),
        }
    };
    resolve(data, addrs).unwrap_or_default()
}

fn has_line_table(data: &[u8]) -> bool {
    goblin::elf::Elf::parse(data).is_ok_and(|e| {
        e.section_headers
            .iter()
            .any(|s| e.shdr_strtab.get_at(s.sh_name) == Some(".debug_line") && s.sh_size > 0)
    })
}

/// A section's bytes, decompressed if the ELF file compressed it (zlib;
/// Debian's debug files are).
fn section<'a>(elf: &goblin::elf::Elf, data: &'a [u8], name: &str) -> Cow<'a, [u8]> {
    const SHF_COMPRESSED: u64 = 0x800;
    const ELFCOMPRESS_ZLIB: u32 = 1;
    let Some(sh) = elf
        .section_headers
        .iter()
        .find(|s| elf.shdr_strtab.get_at(s.sh_name) == Some(name))
    else {
        return Cow::Borrowed(&[]);
    };
    if sh.sh_type == goblin::elf::section_header::SHT_NOBITS {
        return Cow::Borrowed(&[]);
    }
    let range = usize::try_from(sh.sh_offset)
        .ok()
        .and_then(|o| Some(o..o.checked_add(usize::try_from(sh.sh_size).ok()?)?));
    let Some(bytes) = range.and_then(|r| data.get(r)) else {
        return Cow::Borrowed(&[]);
    };
    if sh.sh_flags & SHF_COMPRESSED == 0 {
        return Cow::Borrowed(bytes);
    }
    // Elf64_Chdr: type (u32), reserved (u32), size (u64), alignment (u64).
    let field = |at: usize, n: usize| bytes.get(at..at + n);
    let kind = field(0, 4).map(|b| u32::from_le_bytes(b.try_into().unwrap()));
    let size = field(8, 8).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    match (kind, size) {
        (Some(ELFCOMPRESS_ZLIB), Some(size)) if size < 1 << 31 => {
            let mut out = Vec::with_capacity(size as usize);
            let z = flate2::read::ZlibDecoder::new(&bytes[24..]);
            match z.take(size).read_to_end(&mut out) {
                Ok(_) => Cow::Owned(out),
                Err(_) => Cow::Borrowed(&[]),
            }
        }
        _ => Cow::Borrowed(&[]),
    }
}

fn resolve(data: &[u8], addrs: &[u64]) -> Option<Vec<(u64, SourceLine)>> {
    let elf = goblin::elf::Elf::parse(data).ok()?;
    let endian = if elf.little_endian {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let sections = gimli::DwarfSections::load(|id| -> Result<_, gimli::Error> {
        Ok(section(&elf, data, id.name()))
    })
    .ok()?;
    let dwarf = sections.borrow(|s| gimli::EndianSlice::new(s, endian));
    let ctx = addr2line::Context::from_dwarf(dwarf).ok()?;
    let found = addrs
        .iter()
        .filter_map(|&a| {
            let loc = ctx.find_location(a).ok()??;
            Some((
                a,
                SourceLine {
                    file: loc.file?.to_string(),
                    line: loc.line?,
                },
            ))
        })
        .collect();
    Some(found)
}
