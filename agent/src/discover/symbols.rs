//! The functions of an ELF file: `.symtab`, else the `.symtab` of its
//! separate debug file (`debuginfo`), else `.dynsym` plus the function
//! ranges of `.eh_frame` for code no symbol names (stripped binaries),
//! named `sub_<hex address>`.

use crate::arch::{Native, ThreadContext};
use crate::error::DiscoverError;
use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindContext, UnwindSection};
use goblin::elf::{sym, Elf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FuncSym {
    pub name: String,
    /// ELF virtual address.
    pub vaddr: u64,
    /// 0 when the symbol gives no size.
    pub size: u64,
    /// Known only from `.eh_frame` (named `sub_<hex>`): it may be a cold
    /// fragment of another function rather than a function.
    pub unnamed: bool,
    /// Its unwind entry starts in a mid-function state (a frame already
    /// set up, registers saved): a sign of a split-off fragment.
    pub mid_function_cfi: bool,
}

/// Entry points that are not called like functions.
const NOT_CALLED: &[&str] = &[
    "_start",
    "_init",
    "_fini",
    "__restore_rt",
    "__libc_csu_init",
    "__libc_csu_fini",
];
/// Split-off parts of a function are entered by a jump from it, with its
/// frame, flags and red zone live: not functions. GCC and LLVM name their
/// cold paths `foo.cold` (`foo.cold.3`), BOLT its hot/cold splits
/// `foo.warm` and `foo.cold.N`. A suffix component anywhere after the
/// first (`foo.isra.0.cold`) counts; `foo.coldstart` does not.
fn is_fragment(name: &str) -> bool {
    name.split('.')
        .skip(1)
        .any(|part| matches!(part, "cold" | "warm"))
}

/// Sections whose code is not a function's body (loader stubs, init arrays).
const EXCLUDED_SECTIONS: &[&str] = &[".plt", ".plt.got", ".plt.sec", ".iplt", ".init", ".fini"];

#[derive(Debug, Default)]
pub struct FunctionList {
    pub funcs: Vec<FuncSym>,
    /// Where the names came from: "symtab", "dynsym", "eh_frame" or a mix.
    pub source: &'static str,
    /// The loader writes into this file's code (DT_TEXTREL).
    pub text_relocations: bool,
}

/// The functions of a module that is only sampled: names and ranges
/// suffice, so unwind entries are not evaluated (that only serves to tell
/// split-off fragments from functions before patching). Empty on error.
pub fn list_for_sampling(data: &[u8], debug: Option<&[u8]>) -> Vec<FuncSym> {
    list(data, debug, false)
        .map(|l| l.funcs)
        .unwrap_or_default()
}

/// Which alias names a function: global before weak before local, then
/// fewer leading underscores, then the shorter name.
type Rank = (u8, usize, usize);
/// A named symbol before aliases are merged: (vaddr, rank, name, size).
type Named = (u64, Rank, String, u64);

fn rank(bind: u8, name: &str) -> Rank {
    let b = match bind {
        sym::STB_GLOBAL => 0,
        sym::STB_WEAK => 1,
        _ => 2,
    };
    let underscores = name.bytes().take_while(|&c| c == b'_').count();
    (b, underscores, name.len())
}

/// The functions of the file `data`, named from `debug` (its separate
/// debug file's bytes) where the file itself has no symbol table.
pub fn list_functions(data: &[u8], debug: Option<&[u8]>) -> Result<FunctionList, DiscoverError> {
    list(data, debug, true)
}

fn has_functions(elf: &Elf) -> bool {
    elf.syms
        .iter()
        .any(|s| s.st_type() == sym::STT_FUNC && s.st_shndx != 0)
}

/// `for_patching`: also find, for functions known only from unwind entries,
/// whether they start in a mid-function frame state (split-off fragments).
fn list(
    data: &[u8],
    debug: Option<&[u8]>,
    for_patching: bool,
) -> Result<FunctionList, DiscoverError> {
    let elf = Elf::parse(data).map_err(|e| DiscoverError::Parse(e.to_string()))?;
    if !elf.is_64 {
        return Err(DiscoverError::NotElf64);
    }
    // A debug file that does not parse, or names nothing, is not used.
    let debug = debug
        .and_then(|d| Elf::parse(d).ok())
        .filter(|d| d.is_64 && !has_functions(&elf) && has_functions(d));
    let excluded: Vec<(u64, u64)> = elf
        .section_headers
        .iter()
        .filter(|s| {
            elf.shdr_strtab
                .get_at(s.sh_name)
                .is_some_and(|n| EXCLUDED_SECTIONS.contains(&n))
        })
        .map(|s| (s.sh_addr, s.sh_addr + s.sh_size))
        .collect();
    let entry = if elf.header.e_type == goblin::elf::header::ET_EXEC || elf.interpreter.is_some() {
        Some(elf.header.e_entry)
    } else {
        None
    };
    // Unwind state at entry only matters for functions known by no name.
    let symtab_has_functions = has_functions(&elf) || debug.is_some();
    let eh = eh_frame_functions(&elf, data, for_patching && !symtab_has_functions);
    let signal_frames: Vec<u64> = eh.iter().filter(|e| e.signal).map(|e| e.start).collect();
    let wanted = |name: &str, vaddr: u64| {
        !NOT_CALLED.contains(&name)
            && !excluded.iter().any(|&(lo, hi)| vaddr >= lo && vaddr < hi)
            && Some(vaddr) != entry
            && !signal_frames.contains(&vaddr)
    };

    let mut named: Vec<Named> = Vec::new();
    let from_table =
        |syms: &goblin::elf::Symtab, strtab: &goblin::strtab::Strtab, out: &mut Vec<_>| {
            for s in syms.iter() {
                if s.st_type() != sym::STT_FUNC || s.st_shndx == 0 || s.st_value == 0 {
                    continue;
                }
                let Some(name) = strtab.get_at(s.st_name) else {
                    continue;
                };
                if name.is_empty() || is_fragment(name) || !wanted(name, s.st_value) {
                    continue;
                }
                out.push((
                    s.st_value,
                    rank(s.st_bind(), name),
                    name.to_string(),
                    s.st_size,
                ));
            }
        };
    let mut source = "symtab";
    from_table(&elf.syms, &elf.strtab, &mut named);
    if let Some(d) = &debug {
        source = "debug symtab";
        from_table(&d.syms, &d.strtab, &mut named);
    }
    let have_symtab = !named.is_empty();
    if !have_symtab {
        source = "dynsym";
        from_table(&elf.dynsyms, &elf.dynstrtab, &mut named);
    }
    named.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    infer_sizes(&mut named, &eh, &elf);
    let mut funcs: Vec<FuncSym> = Vec::with_capacity(named.len());
    for (vaddr, _, name, size) in named {
        match funcs.last_mut() {
            // An alias: one function, counted once, under its best name.
            Some(last) if last.vaddr == vaddr => last.size = last.size.max(size),
            _ => funcs.push(FuncSym {
                name,
                vaddr,
                size,
                unnamed: false,
                mid_function_cfi: false,
            }),
        }
    }
    if !have_symtab {
        // Without a full symbol table, .eh_frame knows every function that
        // can be unwound, including the static ones dynsym never lists.
        let before = funcs.len();
        for e in eh.iter().filter(|e| !e.signal) {
            let vaddr = e.start;
            if wanted("", vaddr)
                && funcs[..before]
                    .binary_search_by_key(&vaddr, |f| f.vaddr)
                    .is_err()
            {
                funcs.push(FuncSym {
                    name: format!("sub_{vaddr:x}"),
                    vaddr,
                    size: e.len,
                    unnamed: true,
                    mid_function_cfi: !e.entry_state,
                });
            }
        }
        if funcs.len() > before {
            source = if before == 0 {
                "eh_frame"
            } else {
                "dynsym+eh_frame"
            };
        }
        funcs.sort_by_key(|f| f.vaddr);
        funcs.dedup_by_key(|f| f.vaddr);
    }
    let text_relocations = elf.dynamic.as_ref().is_some_and(|d| d.info.textrel);
    Ok(FunctionList {
        funcs,
        source,
        text_relocations,
    })
}

/// Symbols without a size (crt files, hand-written assembly) take the length
/// of their unwind entry, else extend to the next symbol or their section's
/// end. Too large a size only makes the analysis more cautious.
fn infer_sizes(named: &mut [Named], eh: &[Fde], elf: &Elf) {
    let mut fde: Vec<(u64, u64)> = eh.iter().map(|e| (e.start, e.len)).collect();
    fde.sort_unstable();
    let starts: Vec<u64> = named.iter().map(|n| n.0).collect();
    for n in named.iter_mut().filter(|n| n.3 == 0) {
        if let Ok(i) = fde.binary_search_by_key(&n.0, |f| f.0) {
            n.3 = fde[i].1;
            continue;
        }
        let Some(sec) = elf
            .section_headers
            .iter()
            .find(|s| s.is_executable() && n.0 >= s.sh_addr && n.0 < s.sh_addr + s.sh_size)
        else {
            continue;
        };
        let next = starts[starts.partition_point(|&s| s <= n.0)..]
            .first()
            .copied()
            .unwrap_or(u64::MAX);
        n.3 = next.min(sec.sh_addr + sec.sh_size) - n.0;
    }
}

/// One `.eh_frame` entry.
struct Fde {
    start: u64,
    len: u64,
    /// A signal-return trampoline ('S' augmentation).
    signal: bool,
    /// At its first byte the frame is as a call leaves it (the canonical
    /// frame address right above the return address, nothing else saved).
    entry_state: bool,
}

fn eh_frame_functions(elf: &Elf, data: &[u8], entry_states: bool) -> Vec<Fde> {
    let mut out = Vec::new();
    let find = |name: &str| {
        elf.section_headers
            .iter()
            .find(|s| elf.shdr_strtab.get_at(s.sh_name) == Some(name))
    };
    let Some(sh) = find(".eh_frame") else {
        return out;
    };
    let Some(bytes) = data.get(sh.sh_offset as usize..(sh.sh_offset + sh.sh_size) as usize) else {
        return out;
    };
    let eh = EhFrame::new(bytes, LittleEndian);
    let mut bases = BaseAddresses::default().set_eh_frame(sh.sh_addr);
    if let Some(t) = find(".text") {
        bases = bases.set_text(t.sh_addr);
    }
    let mut ctx = UnwindContext::new();
    let mut entries = eh.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else {
            continue;
        };
        if fde.len() == 0 {
            continue;
        }
        let entry_state = !entry_states
            || fde
                .unwind_info_for_address(&eh, &bases, &mut ctx, fde.initial_address())
                .is_ok_and(Native::is_call_entry_frame);
        out.push(Fde {
            start: fde.initial_address(),
            len: fde.len(),
            signal: fde.is_signal_trampoline(),
            entry_state,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cold_fragments_are_not_functions() {
        assert!(is_fragment("foo.cold"));
        assert!(is_fragment("foo.cold.12"));
        assert!(is_fragment("XXH3_hashLong_64b.warm"));
        assert!(is_fragment("foo.isra.0.cold"));
        assert!(!is_fragment("foo.constprop.0"));
        assert!(!is_fragment("foo.part.0"));
        assert!(!is_fragment("coldstart"));
        assert!(!is_fragment("foo.coldstart"));
        assert!(!is_fragment("cold"));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(list_functions(b"not an elf at all", None).is_err());
        assert!(list_functions(&[], None).is_err());
        let mut bytes = std::fs::read("/proc/self/exe").unwrap();
        bytes.truncate(200);
        assert!(list_functions(&bytes, None).is_err());
    }

    #[test]
    fn own_executable_has_named_functions_without_aliases() {
        let l = list_functions(&std::fs::read("/proc/self/exe").unwrap(), None).unwrap();
        assert_eq!(l.source, "symtab");
        assert!(l.funcs.len() > 100);
        assert!(l.funcs.windows(2).all(|w| w[0].vaddr < w[1].vaddr));
        assert!(l.funcs.iter().all(|f| f.name != "_start"));
    }
}
