//! A module's file as the loader mapped it: the bytes its code had before
//! anything in the process wrote over them. Plans are made from these, and
//! an entry whose live bytes differ (a debugger's `int3`, another tool's
//! patch) is left alone.

use crate::modules::{Load, Module};

pub struct FileImage {
    map: Option<memmap2::Mmap>,
    bias: u64,
    loads: Vec<Load>,
}

impl FileImage {
    /// Maps `m`'s file read-only; an unreadable file gives an image with no
    /// bytes, so every lookup fails and nothing is patched from guesses.
    pub fn open(m: &Module) -> FileImage {
        let map = std::fs::File::open(&m.file)
            .ok()
            // SAFETY: a private read-only mapping; the file is the one the
            // loader mapped, which a running program's files are not
            // truncated under (if it were, the program itself would fault
            // first). Bytes are only compared and decoded, never trusted.
            .and_then(|f| unsafe { memmap2::Mmap::map(&f) }.ok());
        FileImage {
            map,
            bias: m.bias,
            loads: m.loads.clone(),
        }
    }

    /// The file's bytes for runtime range `[addr, addr + len)`, if a loaded
    /// segment holds all of them in the file.
    pub fn bytes(&self, addr: u64, len: u64) -> Option<&[u8]> {
        let map = self.map.as_ref()?;
        let v = addr.wrapping_sub(self.bias);
        let l = self.loads.iter().find(|l| {
            v >= l.vaddr && v.checked_add(len).is_some_and(|e| e <= l.vaddr + l.filesz)
        })?;
        let off = usize::try_from(l.offset + (v - l.vaddr)).ok()?;
        map.get(off..off.checked_add(len as usize)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_code_matches_its_file() {
        let mods = crate::modules::loaded();
        let main = &mods[0];
        let img = FileImage::open(main);
        let here = own_code_matches_its_file as *const () as u64;
        // SAFETY: 16 bytes of this function's own code, mapped executable
        // and readable.
        let live = unsafe { std::slice::from_raw_parts(here as *const u8, 16) };
        assert_eq!(img.bytes(here, 16), Some(live));
        // Outside every segment, or past a segment's file bytes: nothing.
        assert_eq!(img.bytes(8, 16), None);
        let (_, hi) = main.span();
        assert_eq!(img.bytes(hi - 4, 16), None);
    }
}
