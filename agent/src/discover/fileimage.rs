//! A module's file as the loader mapped it: the bytes its code had before
//! anything in the process wrote over them. Plans are made from these, and
//! an entry whose live bytes differ (a debugger's `int3`, another tool's
//! patch) is left alone. The file is the mapped one: a path that names
//! another file by now (a package upgraded while the program starts) gives
//! no image.

use crate::discover::maps::Maps;
use crate::discover::modules::{Load, Module};
use crate::error::PlanError;
use std::os::unix::fs::MetadataExt;

/// What identifies a file's contents without reading them: a file changed
/// in place gets a new change time, a replaced one a new inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// The separate debug file its functions were named from (see
    /// `debuginfo`), 0 for none: installing or removing one changes what
    /// the file's plan would be.
    pub debug: u64,
}

impl Identity {
    /// A file's identity from its status (no separate debug file).
    pub fn of(st: &std::fs::Metadata) -> Identity {
        Identity {
            dev: st.dev(),
            ino: st.ino(),
            size: st.size(),
            mtime_ns: st.mtime() * 1_000_000_000 + st.mtime_nsec(),
            ctime_ns: st.ctime() * 1_000_000_000 + st.ctime_nsec(),
            debug: 0,
        }
    }

    /// Whether `self` and `other` name the same file contents (whatever
    /// debug file each was named from).
    pub fn same_file(&self, other: &Identity) -> bool {
        Identity { debug: 0, ..*self } == Identity { debug: 0, ..*other }
    }
}

pub struct FileImage {
    map: memmap2::Mmap,
    bias: u64,
    loads: Vec<Load>,
    pub identity: Identity,
}

impl FileImage {
    /// Maps `m`'s file read-only if it is the file the loader mapped for
    /// `m`: same device and inode as the mapping of its first segment, or,
    /// where the mapping names another file, the same build mapped (see
    /// [`FileImage::same_build_mapped`]).
    pub fn open(m: &Module, maps: &Maps) -> Result<FileImage, PlanError> {
        let f = std::fs::File::open(&m.file).map_err(PlanError::Open)?;
        let st = f.metadata().map_err(PlanError::Stat)?;
        let first = m.loads.first().ok_or(PlanError::NoLoadedSegment)?;
        let mapped = maps
            .at(m.bias.wrapping_add(first.vaddr))
            .ok_or(PlanError::NotMapped)?;
        let dev = st.dev();
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        let same_inode = mapped.inode == st.ino() && mapped.dev == (major, minor);
        // SAFETY: a private read-only mapping of the file at the module's
        // path; a running program's files are not truncated under it (if
        // one were, the program itself would fault first). The bytes are
        // only compared and decoded, never trusted.
        let map = unsafe { memmap2::Mmap::map(&f) }.map_err(PlanError::Map)?;
        let image = FileImage {
            map,
            bias: m.bias,
            loads: m.loads.clone(),
            identity: Identity::of(&st),
        };
        if !same_inode && !image.same_build_mapped() {
            return Err(PlanError::Replaced);
        }
        Ok(image)
    }

    /// Whether the process has this file's build mapped: a GNU build-id
    /// note whose bytes in memory, where its segment is mapped, are the
    /// file's. A file of an overlay filesystem (a container's) is mapped
    /// from the layer beneath it, so its mapping shows that layer's device
    /// (and, without `xino`, another inode) than the file's status does.
    /// A file replaced by another build at the path has another build-id.
    fn same_build_mapped(&self) -> bool {
        let data = self.data();
        let Some(elf) = rtprof_shared::debuginfo::headers(data) else {
            return false;
        };
        if rtprof_shared::debuginfo::build_id(&elf, data).is_none() {
            return false;
        }
        elf.program_headers
            .iter()
            .filter(|p| p.p_type == goblin::elf::program_header::PT_NOTE && p.p_filesz > 0)
            .any(|p| {
                let readable = self
                    .load_holding(p.p_vaddr, p.p_filesz)
                    .is_some_and(|l| l.flags & libc::PF_R != 0);
                let addr = self.bias.wrapping_add(p.p_vaddr);
                let Some(file) = self.bytes(addr, p.p_filesz).filter(|_| readable) else {
                    return false;
                };
                // SAFETY: the range lies in a loaded segment's file bytes,
                // mapped readable by the loader for as long as the module
                // is loaded (it is being instrumented).
                let live = unsafe { std::slice::from_raw_parts(addr as *const u8, file.len()) };
                live == file
            })
    }

    /// The loaded segment whose file bytes hold ELF addresses
    /// `[v, v + len)`.
    fn load_holding(&self, v: u64, len: u64) -> Option<&Load> {
        self.loads
            .iter()
            .find(|l| v >= l.vaddr && v.checked_add(len).is_some_and(|e| e <= l.vaddr + l.filesz))
    }

    /// The whole file.
    pub fn data(&self) -> &[u8] {
        &self.map
    }

    /// The file's bytes for runtime range `[addr, addr + len)`, if a loaded
    /// segment holds all of them in the file.
    pub fn bytes(&self, addr: u64, len: u64) -> Option<&[u8]> {
        let v = addr.wrapping_sub(self.bias);
        let l = self.load_holding(v, len)?;
        let off = usize::try_from(l.offset + (v - l.vaddr)).ok()?;
        self.map.get(off..off.checked_add(len as usize)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_code_matches_its_file() {
        let mods = crate::discover::modules::loaded();
        let main = &mods[0];
        let img = FileImage::open(main, &Maps::current()).unwrap();
        let here = own_code_matches_its_file as *const () as u64;
        // SAFETY: 16 bytes of this function's own code, mapped executable
        // and readable.
        let live = unsafe { std::slice::from_raw_parts(here as *const u8, 16) };
        assert_eq!(img.bytes(here, 16), Some(live));
        // Outside every segment, or past a segment's file bytes: nothing.
        assert_eq!(img.bytes(8, 16), None);
        let (_, hi) = main.span();
        assert_eq!(img.bytes(hi - 4, 16), None);
        assert!(img.identity.size > 0 && img.identity.ino != 0);
    }

    #[test]
    fn another_file_at_the_path_is_refused() {
        let mut m = crate::discover::modules::loaded().remove(0);
        m.file = "/bin/sh".into();
        let e = FileImage::open(&m, &Maps::current()).err();
        assert!(matches!(e, Some(PlanError::Replaced)), "{e:?}");
    }

    /// Each way a module's file is not the one mapped says which.
    #[test]
    fn each_refusal_names_its_reason() {
        let maps = Maps::current();
        let main = crate::discover::modules::loaded().remove(0);
        let open = |m: &Module| FileImage::open(m, &maps).err();

        let mut gone = main.clone();
        gone.file = "/nonexistent/rtprof-test".into();
        let e = open(&gone);
        assert!(
            matches!(&e, Some(PlanError::Open(io)) if io.kind() == std::io::ErrorKind::NotFound),
            "{e:?}"
        );
        assert_eq!(
            e.unwrap().to_string(),
            "cannot open: No such file or directory (os error 2)"
        );

        let mut no_loads = main.clone();
        no_loads.loads.clear();
        assert!(matches!(open(&no_loads), Some(PlanError::NoLoadedSegment)));

        // Its first segment placed at page 0, where nothing is mapped.
        let mut unmapped = main.clone();
        unmapped.bias = 0u64.wrapping_sub(main.loads[0].vaddr);
        let e = open(&unmapped);
        assert!(matches!(e, Some(PlanError::NotMapped)), "{e:?}");
        assert_eq!(e.unwrap().to_string(), "its first segment is not mapped");
    }
}
