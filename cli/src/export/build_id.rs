//! The GNU build ID of an ELF file (its NT_GNU_BUILD_ID note), which pprof
//! uses to match a mapping with the binary's symbols and sources. Read
//! from the program headers' notes; the file may be anything (replaced
//! since the run, truncated, not ELF), so every offset and length is
//! checked and anything unexpected is simply no build ID.

use std::os::unix::fs::FileExt;
use std::path::Path;

const PT_NOTE: u64 = 4;
const NT_GNU_BUILD_ID: u64 = 3;
/// More program headers or a larger note segment than any real binary has.
const MAX_PHNUM: u64 = 4096;
const MAX_NOTES: u64 = 1 << 16;

/// The build ID of the ELF file at `path`, in lowercase hex.
pub fn read(path: &Path) -> Option<String> {
    let f = std::fs::File::open(path).ok()?;
    from(|off, len| {
        let mut b = vec![0; len];
        f.read_exact_at(&mut b, off).ok()?;
        Some(b)
    })
}

/// Reads of the file's integers in its byte order, `None` past the end.
#[derive(Clone, Copy)]
struct Order {
    big: bool,
}

impl Order {
    fn bytes<const N: usize>(self, b: &[u8], at: usize) -> Option<[u8; N]> {
        let mut a: [u8; N] = b.get(at..at.checked_add(N)?)?.try_into().ok()?;
        if self.big {
            a.reverse();
        }
        Some(a)
    }
    fn u16(self, b: &[u8], at: usize) -> Option<u64> {
        self.bytes(b, at).map(|a| u16::from_le_bytes(a) as u64)
    }
    fn u32(self, b: &[u8], at: usize) -> Option<u64> {
        self.bytes(b, at).map(|a| u32::from_le_bytes(a) as u64)
    }
    fn u64(self, b: &[u8], at: usize) -> Option<u64> {
        self.bytes(b, at).map(u64::from_le_bytes)
    }
}

/// The build ID of the ELF image `read(offset, length)` reads.
fn from(read: impl Fn(u64, usize) -> Option<Vec<u8>>) -> Option<String> {
    let ident = read(0, 16)?;
    if ident[..4] != *b"\x7fELF" {
        return None;
    }
    let wide = match ident[4] {
        1 => false,
        2 => true,
        _ => return None,
    };
    let o = match ident[5] {
        1 => Order { big: false },
        2 => Order { big: true },
        _ => return None,
    };
    // Word-sized fields: 8 bytes in ELF64, 4 in ELF32, at other offsets.
    let word = |b: &[u8], at32: usize, at64: usize| {
        if wide {
            o.u64(b, at64)
        } else {
            o.u32(b, at32)
        }
    };
    let header = read(0, if wide { 64 } else { 52 })?;
    let phoff = word(&header, 28, 32)?;
    let phentsize = o.u16(&header, if wide { 54 } else { 42 })?;
    let phnum = o.u16(&header, if wide { 56 } else { 44 })?;
    if phnum > MAX_PHNUM || phentsize < if wide { 56 } else { 32 } {
        return None;
    }
    let table = read(phoff, (phentsize * phnum) as usize)?;
    for ph in table.chunks_exact(phentsize as usize) {
        if o.u32(ph, 0)? != PT_NOTE {
            continue;
        }
        let (offset, filesz, align) = (word(ph, 4, 8)?, word(ph, 16, 32)?, word(ph, 28, 48)?);
        if filesz > MAX_NOTES {
            continue;
        }
        // A segment that cannot be read or parsed: the next may hold it.
        let id = read(offset, filesz as usize).and_then(|n| build_id_note(&n, align, o));
        if id.is_some() {
            return id;
        }
    }
    None
}

/// The build ID in a note segment, whose notes are aligned to 4 bytes, or
/// to 8 in a segment aligned to 8 (.note.gnu.property).
fn build_id_note(notes: &[u8], align: u64, o: Order) -> Option<String> {
    let pad = |n: usize| n.checked_next_multiple_of(if align == 8 { 8 } else { 4 });
    let mut at = 0;
    while at < notes.len() {
        let namesz = o.u32(notes, at)? as usize;
        let descsz = o.u32(notes, at + 4)? as usize;
        let kind = o.u32(notes, at + 8)?;
        let name_at = at + 12;
        let name = notes.get(name_at..name_at.checked_add(namesz)?)?;
        let desc_at = pad(name_at + namesz)?;
        let desc = notes.get(desc_at..desc_at.checked_add(descsz)?)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" && !desc.is_empty() {
            return Some(desc.iter().map(|b| format!("{b:02x}")).collect());
        }
        at = pad(desc_at + descsz)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ELF64 little-endian image: its header, one PT_NOTE program
    /// header per (notes, alignment), then the notes.
    fn elf64(segments: &[(&[u8], u64)]) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[32..40].copy_from_slice(&64u64.to_le_bytes());
        b[54..56].copy_from_slice(&56u16.to_le_bytes());
        b[56..58].copy_from_slice(&(segments.len() as u16).to_le_bytes());
        let mut at = 64 + 56 * segments.len() as u64;
        for (notes, align) in segments {
            let mut ph = vec![0u8; 56];
            ph[..4].copy_from_slice(&(PT_NOTE as u32).to_le_bytes());
            ph[8..16].copy_from_slice(&at.to_le_bytes());
            ph[32..40].copy_from_slice(&(notes.len() as u64).to_le_bytes());
            ph[48..56].copy_from_slice(&align.to_le_bytes());
            b.extend(ph);
            at += notes.len() as u64;
        }
        for (notes, _) in segments {
            b.extend(*notes);
        }
        b
    }

    fn note(name: &[u8], kind: u64, desc: &[u8]) -> Vec<u8> {
        let mut n = Vec::new();
        n.extend((name.len() as u32).to_le_bytes());
        n.extend((desc.len() as u32).to_le_bytes());
        n.extend((kind as u32).to_le_bytes());
        n.extend(name);
        n.resize(n.len().next_multiple_of(4), 0);
        n.extend(desc);
        n.resize(n.len().next_multiple_of(4), 0);
        n
    }

    fn of(image: &[u8]) -> Option<String> {
        from(|off, len| {
            let start = usize::try_from(off).ok()?;
            image
                .get(start..start.checked_add(len)?)
                .map(<[u8]>::to_vec)
        })
    }

    #[test]
    fn the_gnu_build_id_note_is_found_after_other_notes() {
        let mut notes = note(b"GNU\0", 1, &[0; 16]);
        notes.extend(note(b"Go\0\0", NT_GNU_BUILD_ID, b"not this"));
        notes.extend(note(b"GNU\0", NT_GNU_BUILD_ID, &[0xde, 0xad, 0x01]));
        assert_eq!(of(&elf64(&[(&notes, 4)])).as_deref(), Some("dead01"));
        // Linkers put .note.gnu.property first, in a segment aligned to 8,
        // where the descriptor starts at the next multiple of 8.
        let mut property = note(b"GNU\0", 5, &[0; 16]);
        property.truncate(12 + 4 + 16);
        let build_id = note(b"GNU\0", NT_GNU_BUILD_ID, &[7; 20]);
        let image = elf64(&[(&property, 8), (&build_id, 4)]);
        assert_eq!(of(&image), Some("07".repeat(20)));
    }

    #[test]
    fn damaged_or_foreign_files_have_no_build_id() {
        let id = note(b"GNU\0", NT_GNU_BUILD_ID, &[1, 2]);
        let good = elf64(&[(&id, 4)]);
        assert_eq!(of(&good).as_deref(), Some("0102"));
        for cut in [0, 10, 63, 100, 130, good.len() - 2] {
            assert_eq!(of(&good[..cut]), None, "cut at {cut}");
        }
        let mut huge = good.clone();
        // A descriptor size past the end of the notes.
        huge[120 + 4..120 + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(of(&huge), None);
        assert_eq!(of(b"#!/bin/sh\nexit 0\n"), None);
        assert_eq!(read(Path::new("/nonexistent/rtprof")), None);
    }

    /// This test's own executable, as readelf (binutils) reads it.
    #[test]
    fn a_real_binary_has_the_build_id_readelf_reads() {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new("readelf")
            .arg("-n")
            .arg(&exe)
            .output()
            .expect("readelf (binutils) runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let want = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("Build ID: "))
            .map(str::to_string);
        assert_eq!(read(&exe), want, "{text}");
    }
}
