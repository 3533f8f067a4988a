//! Separate debug information, found the way gdb and perf find it: by the
//! file's build-id under a debug directory
//! (`/usr/lib/debug/.build-id/ab/cdef….debug`, as Debian's `-dbg` and
//! `-dbgsym` packages install it), else by the file's `.gnu_debuglink`
//! name beside it, in `.debug/` beside it, or under a debug directory at
//! the file's own path. A stripped binary then gets its functions' names
//! and sizes back instead of `sub_<hex>`.
//!
//! Its symbols decide which entries are patched, so a debug file is used
//! only if this user or root owns it and no one else may write it, and only
//! if it belongs to the file: the same build-id, or (without one) the CRC
//! its debuglink names.

use goblin::elf::Elf;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where the system keeps debug files unless `RTPROF_DEBUG_DIR` says
/// otherwise.
pub const DEFAULT_DIR: &str = "/usr/lib/debug";

static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();

/// The debug directories `RTPROF_DEBUG_DIR`'s value names
/// (colon-separated absolute paths), or the default.
pub fn dirs_from(value: Option<&str>) -> Vec<PathBuf> {
    match value {
        Some(v) => v
            .split(':')
            .filter(|d| d.starts_with('/'))
            .map(Into::into)
            .collect(),
        None => vec![PathBuf::from(DEFAULT_DIR)],
    }
}

/// Sets the debug directories (start-up, from the configuration).
pub fn set_dirs(dirs: Vec<PathBuf>) {
    let _ = DIRS.set(dirs);
}

fn dirs() -> &'static [PathBuf] {
    DIRS.get_or_init(|| vec![PathBuf::from(DEFAULT_DIR)])
}

/// A debug file found for a module, mapped read-only.
pub struct DebugFile {
    map: memmap2::Mmap,
    pub path: PathBuf,
    /// Changes when the file is replaced or changed (plans cached without
    /// it, or with another one, do not apply).
    pub identity: u64,
}

impl DebugFile {
    pub fn data(&self) -> &[u8] {
        &self.map
    }
}

/// An ELF file's headers and section names only: what finding its build-id
/// and debuglink needs. A full parse also splits every symbol name
/// (milliseconds for libc's debug file, at every start).
pub fn headers(data: &[u8]) -> Option<Elf<'_>> {
    use goblin::elf::{ProgramHeader, SectionHeader};
    let header = Elf::parse_header(data).ok()?;
    let ctx = goblin::container::Ctx::new(header.container().ok()?, header.endianness().ok()?);
    let mut elf = Elf::lazy_parse(header).ok()?;
    let (phoff, phnum) = (
        usize::try_from(header.e_phoff).ok()?,
        usize::from(header.e_phnum),
    );
    elf.program_headers = ProgramHeader::parse(data, phoff, phnum, ctx).ok()?;
    let (shoff, shnum) = (
        usize::try_from(header.e_shoff).ok()?,
        usize::from(header.e_shnum),
    );
    if shoff != 0 && shnum != 0 {
        elf.section_headers = SectionHeader::parse(data, shoff, shnum, ctx).ok()?;
        let names_at = match u32::from(header.e_shstrndx) {
            goblin::elf::section_header::SHN_XINDEX => elf.section_headers[0].sh_link as usize,
            i => i as usize,
        };
        if let Some(names) = elf.section_headers.get(names_at) {
            let (at, len) = (
                usize::try_from(names.sh_offset).ok()?,
                usize::try_from(names.sh_size).ok()?,
            );
            elf.shdr_strtab = goblin::strtab::Strtab::parse(data, at, len, 0).ok()?;
        }
    }
    Some(elf)
}

/// The GNU build-id of an ELF file, from its notes.
pub fn build_id<'a>(elf: &Elf<'a>, data: &'a [u8]) -> Option<&'a [u8]> {
    let from = |it: Option<goblin::elf::note::NoteIterator<'a>>| {
        it?.filter_map(Result::ok)
            .find(|n| n.n_type == goblin::elf::note::NT_GNU_BUILD_ID && n.name == "GNU")
            .map(|n| n.desc)
    };
    from(elf.iter_note_headers(data))
        .or_else(|| from(elf.iter_note_sections(data, Some(".note.gnu.build-id"))))
        .filter(|id| !id.is_empty())
}

/// The `.gnu_debuglink` section: the debug file's name and its CRC-32.
fn debuglink<'a>(elf: &Elf<'a>, data: &'a [u8]) -> Option<(&'a str, u32)> {
    let sh = elf
        .section_headers
        .iter()
        .find(|s| elf.shdr_strtab.get_at(s.sh_name) == Some(".gnu_debuglink"))?;
    let start = usize::try_from(sh.sh_offset).ok()?;
    let b = data.get(start..start.checked_add(usize::try_from(sh.sh_size).ok()?)?)?;
    let nul = b.iter().position(|&c| c == 0)?;
    let name = std::str::from_utf8(&b[..nul]).ok()?;
    // The CRC follows the name's NUL, 4-aligned.
    let at = (nul + 1).next_multiple_of(4);
    let crc = u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?);
    (!name.is_empty() && !name.contains('/')).then_some((name, crc))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where to look, in gdb's order: the build-id path under each debug
/// directory, then the debuglink name beside the file, in `.debug/` beside
/// it, and under each debug directory at the file's directory.
fn candidates(
    path: &Path,
    id: Option<&[u8]>,
    link: Option<&str>,
    dirs: &[PathBuf],
) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(id) = id.filter(|id| id.len() >= 2) {
        let h = hex(id);
        for d in dirs {
            v.push(
                d.join(".build-id")
                    .join(&h[..2])
                    .join(format!("{}.debug", &h[2..])),
            );
        }
    }
    if let (Some(link), Some(dir)) = (link, path.parent()) {
        v.push(dir.join(link));
        v.push(dir.join(".debug").join(link));
        let rel = dir.strip_prefix("/").unwrap_or(dir);
        for d in dirs {
            v.push(d.join(rel).join(link));
        }
    }
    v
}

/// Owned by this user or root, and writable by no one else.
fn trusted(meta: &std::fs::Metadata) -> bool {
    // SAFETY: a system call without arguments.
    let euid = unsafe { libc::geteuid() };
    (meta.uid() == euid || meta.uid() == 0) && meta.mode() & 0o022 == 0 && meta.is_file()
}

/// The debug file of the module at `path` whose bytes are `data`, if one is
/// installed, trusted and belongs to it.
pub fn find(path: &Path, data: &[u8]) -> Option<DebugFile> {
    find_in(path, data, dirs())
}

fn find_in(path: &Path, data: &[u8], dirs: &[PathBuf]) -> Option<DebugFile> {
    let elf = headers(data)?;
    let id = build_id(&elf, data);
    let link = debuglink(&elf, data);
    if id.is_none() && link.is_none() {
        return None;
    }
    candidates(path, id, link.map(|l| l.0), dirs)
        .into_iter()
        // The file itself (a debuglink naming the file) is not its debug file.
        .filter(|c| c.as_path() != path)
        .find_map(|c| open_matching(&c, id, link.map(|l| l.1)))
}

fn open_matching(path: &Path, id: Option<&[u8]>, crc: Option<u32>) -> Option<DebugFile> {
    let f = std::fs::File::open(path).ok()?;
    let meta = f.metadata().ok()?;
    if !trusted(&meta) {
        return None;
    }
    // SAFETY: a read-only private mapping of a file owned by this user or
    // root; its bytes are parsed with bounds checks and never executed.
    let map = unsafe { memmap2::Mmap::map(&f) }.ok()?;
    // Closed before the (slow) parse: a program listing its descriptors
    // (another of its threads) sees ours for as short a time as can be.
    drop(f);
    let belongs = match id {
        Some(id) => headers(&map).is_some_and(|e| build_id(&e, &map) == Some(id)),
        None => crc.is_some_and(|c| crc32fast::hash(&map) == c),
    };
    belongs.then(|| DebugFile {
        identity: meta.dev()
            ^ meta.ino().rotate_left(17)
            ^ (meta.size() << 1)
            ^ (meta.mtime() as u64).rotate_left(29)
            ^ (meta.ctime_nsec() as u64).rotate_left(43),
        path: path.to_path_buf(),
        map,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn build_id_paths_come_first_then_debuglink_places() {
        let c = candidates(
            Path::new("/usr/lib/x/libfoo.so.1"),
            Some(&[0xab, 0xcd, 0xef, 0x01]),
            Some("libfoo.so.1.debug"),
            &[PathBuf::from(DEFAULT_DIR)],
        );
        let shown: Vec<String> = c.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(
            shown,
            [
                "/usr/lib/debug/.build-id/ab/cdef01.debug",
                "/usr/lib/x/libfoo.so.1.debug",
                "/usr/lib/x/.debug/libfoo.so.1.debug",
                "/usr/lib/debug/usr/lib/x/libfoo.so.1.debug",
            ]
        );
    }

    fn run(cmd: &mut Command) {
        let o = cmd.output().expect("tool runs");
        assert!(
            o.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// A program built in `dir` with `build_id` (`none` or `sha1`), its
    /// debug information split out to `<dir>/prog.debug`, stripped to
    /// `<dir>/prog` with a debuglink to it.
    fn split_build(dir: &Path, build_id: &str, add: i32) -> (PathBuf, PathBuf) {
        std::fs::create_dir_all(dir).unwrap();
        let src = dir.join("p.c");
        let text =
            format!("int f(int x){{return x+{add};}}\nint main(void){{return f(0)-{add};}}\n");
        std::fs::write(&src, text).unwrap();
        let full = dir.join("prog.full");
        let (prog, debug) = (dir.join("prog"), dir.join("prog.debug"));
        run(Command::new("gcc")
            .args(["-O1", "-g", &format!("-Wl,--build-id={build_id}"), "-o"])
            .arg(&full)
            .arg(&src));
        run(Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&full)
            .arg(&debug));
        run(Command::new("objcopy")
            .arg("--strip-all")
            .arg(format!("--add-gnu-debuglink={}", debug.display()))
            .arg(&full)
            .arg(&prog));
        (prog, debug)
    }

    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("rtprof-debuginfo-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn found_by_build_id_under_a_debug_directory() {
        let d = scratch("buildid");
        let (prog, debug) = split_build(&d, "sha1", 1);
        let data = std::fs::read(&prog).unwrap();
        let elf = Elf::parse(&data).unwrap();
        let id = hex(build_id(&elf, &data).expect("built with a build-id"));
        let dbg_dir = d.join("debug");
        let at = dbg_dir.join(".build-id").join(&id[..2]);
        std::fs::create_dir_all(&at).unwrap();
        let placed = at.join(format!("{}.debug", &id[2..]));
        std::fs::rename(&debug, &placed).unwrap();
        let got = find_in(&prog, &data, std::slice::from_ref(&dbg_dir)).expect("found");
        assert_eq!(got.path, placed);
        // Another build's debug file at that path is not this file's.
        let (_, other) = split_build(&d.join("other"), "sha1", 2);
        let other_data = std::fs::read(&other).unwrap();
        std::fs::write(&placed, &other_data).unwrap();
        let other_id = build_id(&Elf::parse(&other_data).unwrap(), &other_data).map(hex);
        assert_ne!(other_id, Some(id), "two programs, two build-ids");
        assert!(find_in(&prog, &data, std::slice::from_ref(&dbg_dir)).is_none());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn found_by_debuglink_with_its_crc_and_only_if_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let d = scratch("link");
        let (prog, debug) = split_build(&d, "none", 1);
        let data = std::fs::read(&prog).unwrap();
        assert!(build_id(&Elf::parse(&data).unwrap(), &data).is_none());
        let got = find_in(&prog, &data, &[]).expect("found beside the file");
        assert_eq!(got.path, debug);
        assert!(!Elf::parse(got.data()).unwrap().syms.is_empty());
        // Writable by others: not used (its symbols decide what is patched).
        std::fs::set_permissions(&debug, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(find_in(&prog, &data, &[]).is_none());
        std::fs::set_permissions(&debug, std::fs::Permissions::from_mode(0o644)).unwrap();
        // A file whose CRC differs from the debuglink's is another file.
        let mut bytes = std::fs::read(&debug).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&debug, bytes).unwrap();
        assert!(find_in(&prog, &data, &[]).is_none());
        let _ = std::fs::remove_dir_all(&d);
    }
}
