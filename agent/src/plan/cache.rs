//! A persistent cache of what a module's file alone decides: its functions
//! and, for each, its patch plan (the bytes it was made from, the moved
//! code as a template with fixups) or why it has none. A later process
//! that maps the same file takes its plans from the cache instead of
//! reading symbols and decoding every function again; it only checks that
//! memory holds the bytes each plan was made from (`analysis::check_live`)
//! and fills in the template for its own addresses.
//!
//! Trust: an entry decides what becomes code in the process, so it is read
//! only from a directory (and ancestors) and a file owned by this user or
//! root and writable by no one else, checked on descriptors opened without
//! following links (no name can be re-pointed between check and read), and it is validated like the counter
//! segment (magic, format, the agent build that wrote it, the file's
//! identity, lengths, a checksum, every record). Any doubt is a miss, said
//! under `RTPROF_VERBOSE`; the process is then profiled as without a cache.
//!
//! Entries are written by the process that analysed the module, to a
//! temporary file renamed into place, so processes racing on an empty cache
//! each write a whole entry and readers never see a partial one.

use crate::arch::{EntryPlan, Native, Plan, Planner};
use crate::discover::fileimage::Identity;
use crate::discover::modules::Module;
use crate::discover::symbols::FuncSym;
use crate::error::PlanError;
use crate::lifecycle::lock::Lock;
use crate::log::vlog;
use crate::plan::analysis::{keep, Candidate, ModulePlan, NameAt};
use rtprof_abi::Refusal;
use rtprof_shared::cachedir::{self, fnv, ENTRY_HEADER as HEADER, ENTRY_SUFFIX, FNV_START};
use rtprof_shared::files::{Dir, FileError};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const MAGIC: [u8; 8] = *b"RTPRCACH";
/// Bumped whenever the entry layout or what the analysis decides changes.
const FORMAT: u32 = 5;
const RECORD: usize = 40;
/// The cache directory is trimmed to three quarters of this when a write
/// takes it over.
const MAX_BYTES: u64 = 512 << 20;
const SOURCES: [&str; 4] = ["symtab", "dynsym", "eh_frame", "dynsym+eh_frame"];

/// What an entry holds: a module's plan (with trap entries or without),
/// or the function list of a module that is only sampled (names and
/// ranges for attributing samples).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Plan = 0,
    Sampled = 1,
    /// A plan made with trap entries (`RTPROF_TRAPS=1`): only a process
    /// that handles their traps may install it.
    PlanWithTraps = 2,
}
/// Bit of the header's flags that says the entry is [`Kind::Sampled`].
const SAMPLED_FLAG: u32 = 2;
/// Bit of the header's flags that says it is [`Kind::PlanWithTraps`].
const TRAPS_FLAG: u32 = 4;

/// Where entries are looked up (in order) and written.
#[derive(Debug, Default, Clone)]
pub struct Places {
    pub read: Vec<PathBuf>,
    pub write: Option<PathBuf>,
}

static PLACES: OnceLock<Places> = OnceLock::new();

pub use rtprof_shared::cachedir::{user_dir, SYSTEM_DIR};

/// What `RTPROF_CACHE` (`off`, `user`, `system` or a directory) selects.
/// Unset: the user's cache, then root's. In secure-execution mode the
/// environment is not consulted: root's cache only, written only by root.
pub fn places(setting: Option<&str>, secure: bool) -> Places {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let system = PathBuf::from(SYSTEM_DIR);
    let system_write = root.then(|| system.clone());
    if secure {
        return Places {
            read: vec![system],
            write: system_write,
        };
    }
    match setting {
        Some("off") => Places::default(),
        Some("system") => Places {
            read: vec![system],
            write: system_write,
        },
        Some(p) if p.starts_with('/') => Places {
            read: vec![PathBuf::from(p)],
            write: Some(PathBuf::from(p)),
        },
        _ => {
            let user = user_dir();
            Places {
                read: user.iter().cloned().chain([system]).collect(),
                write: user,
            }
        }
    }
}

pub fn configure(p: Places) {
    let _ = PLACES.set(p);
    // Now, at start-up: `dladdr` takes the loader's lock, which the loader
    // holds while it calls our hook; computed later, by the drain thread
    // naming a module under the agent's state lock, it deadlocked with a
    // `dlopen` waiting in the hook for that lock.
    fingerprint();
}

fn configured() -> &'static Places {
    PLACES.get_or_init(Places::default)
}

/// The agent build that writes and reads entries: a rebuilt agent may
/// decide differently, so its entries are its own.
fn fingerprint() -> u64 {
    static F: OnceLock<u64> = OnceLock::new();
    *F.get_or_init(|| {
        let mut h = fnv(env!("CARGO_PKG_VERSION").as_bytes(), FNV_START);
        h = fnv(&FORMAT.to_le_bytes(), h);
        // SAFETY: Dl_info is plain data; all zeros is a valid value.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        let here = fingerprint as *const () as *const libc::c_void;
        // SAFETY: dladdr fills `info` for an address of this library.
        if unsafe { libc::dladdr(here, &mut info) } != 0 && !info.dli_fname.is_null() {
            // SAFETY: a NUL-terminated path owned by the loader.
            let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
            if let Ok(st) = std::fs::metadata(std::ffi::OsStr::from_bytes(path.to_bytes())) {
                h = fnv(&st.size().to_le_bytes(), h);
                h = fnv(&st.mtime().to_le_bytes(), h);
                h = fnv(&st.mtime_nsec().to_le_bytes(), h);
                h = fnv(&st.ino().to_le_bytes(), h);
            }
        }
        h
    })
}

fn key_bytes(id: &Identity) -> [u8; 40] {
    let mut k = [0u8; 40];
    k[0..8].copy_from_slice(&id.dev.to_le_bytes());
    k[8..16].copy_from_slice(&id.ino.to_le_bytes());
    k[16..24].copy_from_slice(&id.size.to_le_bytes());
    k[24..32].copy_from_slice(&id.mtime_ns.to_le_bytes());
    // The change time, mixed with the debug file's identity: the key's
    // size stays that of the entry format.
    k[32..40].copy_from_slice(&(id.ctime_ns as u64 ^ id.debug).to_le_bytes());
    k
}

/// The entry's file name: the module's name (for people) and a hash of the
/// key and the agent build.
pub fn entry_name(module_path: &str, id: &Identity, kind: Kind) -> String {
    let base: String = module_path
        .rsplit('/')
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+'))
        .take(64)
        .collect();
    let h = fnv(&key_bytes(id), fnv(&fingerprint().to_le_bytes(), FNV_START));
    let h = fnv(&[kind as u8], h);
    format!("{base}-{h:016x}{ENTRY_SUFFIX}")
}

/// Whether a file or directory belongs to this user or root and no one
/// else may write it.
fn trusted(uid: u32, mode: u32, euid: u32) -> bool {
    (uid == euid || uid == 0) && mode & 0o022 == 0
}

/// Opens `dir`: resolved once, then opened component by component from
/// `/` without following links, each checked on its descriptor: every
/// directory above it owned by this user or root and writable by no one
/// else (a sticky one such as /tmp may be shared: no one else can rename
/// what is ours inside it), `dir` itself owned by this user or root and
/// writable by no one else. What is read or written later is looked up
/// through the descriptor, so no name can be re-pointed after the check.
fn trusted_dir(dir: &Path, euid: u32) -> Result<Dir, PlanError> {
    let opened = Dir::open(dir, |at, st, last| {
        let mine = st.st_uid == euid || st.st_uid == 0;
        let refuse = if last {
            !trusted(st.st_uid, st.st_mode, euid)
        } else {
            !mine || (st.st_mode & 0o022 != 0 && st.st_mode & 0o1000 == 0)
        };
        match (refuse, last) {
            (false, _) => Ok(()),
            (true, true) => Err(FileError::NotOwnDestination { path: at.into() }),
            (true, false) => Err(FileError::SharedDirectory { path: at.into() }),
        }
    });
    opened.map_err(|e| match e {
        FileError::NotOwnDestination { .. } => PlanError::DirNotTrusted { path: dir.into() },
        FileError::SharedDirectory { path } => PlanError::AncestorWritable { path },
        FileError::Io { path, source } if source.raw_os_error() == Some(libc::ELOOP) => {
            PlanError::DirNotTrusted { path }
        }
        FileError::Io { path, source } => PlanError::Io { path, source },
        other => PlanError::DirNotTrusted {
            path: PathBuf::from(other.to_string()),
        },
    })
}

pub struct Entry {
    pub source: &'static str,
    pub text_relocations: bool,
    /// Every function with its plan (for the module where it is loaded in
    /// this process) or why it has none.
    pub funcs: Vec<Candidate>,
    /// The plans the functions' outcomes refer to (none where they were
    /// not wanted).
    pub plans: Vec<Plan>,
    /// The functions' names, one after another.
    pub names: String,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// The entry's bytes, checked: `Err` says why they are not to be used.
#[cfg(test)]
pub fn decode(b: &[u8], id: &Identity, kind: Kind, bias: u64) -> Result<Entry, PlanError> {
    decode_with(b, id, kind, bias, true)
}

/// As [`decode`]; without `plans`, a function that has a plan gets
/// `Err(Refusal::NotAttempted)` in its place (its code comes from a page
/// image, which says what it got): records and names only, checked alike.
fn decode_with(
    b: &[u8],
    id: &Identity,
    kind: Kind,
    bias: u64,
    plans_wanted: bool,
) -> Result<Entry, PlanError> {
    if b.len() < HEADER || b[..8] != MAGIC {
        return Err(PlanError::NotACacheEntry);
    }
    if (u32_at(b, 12) & SAMPLED_FLAG != 0) != (kind == Kind::Sampled)
        || (u32_at(b, 12) & TRAPS_FLAG != 0) != (kind == Kind::PlanWithTraps)
    {
        return Err(PlanError::OtherKind);
    }
    if u32_at(b, 8) != FORMAT || u64_at(b, 16) != fingerprint() {
        return Err(PlanError::OtherBuild);
    }
    if b[24..64] != key_bytes(id) {
        return Err(PlanError::OtherFile);
    }
    let source = *SOURCES
        .get(u32_at(b, 64) as usize)
        .ok_or(PlanError::BadSource)?;
    let n = u32_at(b, 68) as usize;
    let strings_len = u32_at(b, 72) as usize;
    let plans_len = u32_at(b, 76) as usize;
    let records_end = n
        .checked_mul(RECORD)
        .and_then(|r| r.checked_add(HEADER))
        .ok_or(PlanError::BadLength)?;
    let plans_end = records_end
        .checked_add(plans_len)
        .ok_or(PlanError::BadLength)?;
    if plans_end.checked_add(strings_len) != Some(b.len()) {
        return Err(PlanError::Truncated);
    }
    if cachedir::entry_checksum(b) != cachedir::stored_checksum(b) {
        return Err(PlanError::Checksum);
    }
    let plans = &b[records_end..plans_end];
    // One string for every name: each is checked to lie in it, whole.
    let strings = std::str::from_utf8(&b[plans_end..]).map_err(|_| PlanError::BadName)?;
    let mut funcs = Vec::with_capacity(n);
    let mut kept = Vec::with_capacity(if plans_wanted { n } else { 0 });
    let mut last = None;
    for i in 0..n {
        let r = HEADER + i * RECORD;
        let (vaddr, size) = (u64_at(b, r), u64_at(b, r + 8));
        let (pad, code) = (u32_at(b, r + 16), u32_at(b, r + 20));
        let (off, len) = (u32_at(b, r + 24) as usize, u32_at(b, r + 28) as usize);
        let (plan_off, plan_len) = (u32_at(b, r + 32) as usize, u32_at(b, r + 36) as usize);
        if off
            .checked_add(len)
            .and_then(|end| strings.get(off..end))
            .is_none()
        {
            return Err(PlanError::BadName);
        }
        let outcome = match code {
            0 if kind == Kind::Sampled || !plans_wanted => {
                if plan_off
                    .checked_add(plan_len)
                    .is_none_or(|end| end > plans.len())
                {
                    return Err(PlanError::BadPlan);
                }
                Err(Refusal::NotAttempted)
            }
            0 => plan_off
                .checked_add(plan_len)
                .and_then(|end| plans.get(plan_off..end))
                .and_then(|p| Native::decode_plan(p, bias.wrapping_add(vaddr)))
                // A branch sent elsewhere lies inside the function; a trap
                // entry only where its trap is handled.
                .filter(|p| p.redirects().iter().all(|r| r.field as u64 + 4 <= size))
                .filter(|p| !p.is_trap() || kind == Kind::PlanWithTraps)
                .ok_or(PlanError::BadPlan)
                .map(Ok)?,
            c => Err(Refusal::from_code(c).ok_or(PlanError::BadOutcome)?),
        };
        // Per-process facts are never cached.
        if outcome == Err(Refusal::ModifiedInMemory) || pad > 64 || last >= Some(vaddr) {
            return Err(PlanError::BadRecord);
        }
        last = Some(vaddr);
        funcs.push(Candidate {
            name: NameAt {
                off: off as u32,
                len: len as u32,
            },
            vaddr,
            size,
            pad: pad as u64,
            outcome: keep(&mut kept, outcome),
        });
    }
    Ok(Entry {
        source,
        text_relocations: u32_at(b, 12) & 1 != 0,
        funcs,
        plans: kept,
        names: strings.to_string(),
    })
}

/// The entry for `p`: its plans before any per-process check.
pub fn encode(p: &ModulePlan, id: &Identity) -> Vec<u8> {
    let funcs = p.funcs.iter().map(|c| Rec {
        name: p.name_of(c),
        vaddr: c.vaddr,
        size: c.size,
        pad: c.pad,
        outcome: p.plan_of(c),
    });
    let flags = p.text_relocations as u32 | if p.traps { TRAPS_FLAG } else { 0 };
    encode_records(funcs, p.funcs.len(), flags, p.source, id)
}

/// The entry for a sampled module's function list.
pub fn encode_sampled(funcs: &[FuncSym], id: &Identity) -> Vec<u8> {
    let recs = funcs.iter().map(|f| Rec {
        name: &f.name,
        vaddr: f.vaddr,
        size: f.size,
        pad: 0,
        outcome: Err(Refusal::NotAttempted),
    });
    encode_records(recs, funcs.len(), SAMPLED_FLAG, "symtab", id)
}

/// One function as an entry records it.
struct Rec<'a> {
    name: &'a str,
    vaddr: u64,
    size: u64,
    pad: u64,
    outcome: Result<&'a Plan, Refusal>,
}

/// Records under a header, then their plans and names.
fn encode_records<'a>(
    funcs: impl Iterator<Item = Rec<'a>>,
    n: usize,
    flags: u32,
    source: &str,
    id: &Identity,
) -> Vec<u8> {
    let mut strings = Vec::new();
    let mut plans = Vec::new();
    let mut records = Vec::with_capacity(n * RECORD);
    for f in funcs {
        let plan_off = plans.len();
        let code = match f.outcome {
            Ok(p) => {
                Native::encode_plan(p, &mut plans);
                0
            }
            // A sampled module's functions are listed, not planned.
            Err(Refusal::NotAttempted) if flags & SAMPLED_FLAG != 0 => 0,
            Err(r) => r.code(),
        };
        records.extend_from_slice(&f.vaddr.to_le_bytes());
        records.extend_from_slice(&f.size.to_le_bytes());
        records.extend_from_slice(&(f.pad.min(64) as u32).to_le_bytes());
        records.extend_from_slice(&code.to_le_bytes());
        records.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        records.extend_from_slice(&(f.name.len() as u32).to_le_bytes());
        records.extend_from_slice(&(plan_off as u32).to_le_bytes());
        records.extend_from_slice(&((plans.len() - plan_off) as u32).to_le_bytes());
        strings.extend_from_slice(f.name.as_bytes());
    }
    let mut b = Vec::with_capacity(HEADER + records.len() + plans.len() + strings.len());
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&FORMAT.to_le_bytes());
    b.extend_from_slice(&flags.to_le_bytes());
    b.extend_from_slice(&fingerprint().to_le_bytes());
    b.extend_from_slice(&key_bytes(id));
    let source = SOURCES.iter().position(|s| *s == source).unwrap_or(0);
    b.extend_from_slice(&(source as u32).to_le_bytes());
    b.extend_from_slice(&(n as u32).to_le_bytes());
    b.extend_from_slice(&(strings.len() as u32).to_le_bytes());
    b.extend_from_slice(&(plans.len() as u32).to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    debug_assert_eq!(b.len(), HEADER);
    b.extend_from_slice(&records);
    b.extend_from_slice(&plans);
    b.extend_from_slice(&strings);
    cachedir::seal(&mut b);
    b
}

/// Reads `name` in `dir` (opened by [`trusted_dir`]) if the file may be
/// trusted.
fn read_trusted(dir: &Dir, name: &str, euid: u32) -> Result<Option<memmap2::Mmap>, PlanError> {
    let Some((f, size)) = open_trusted(dir, name, euid)? else {
        return Ok(None);
    };
    if size > MAX_BYTES {
        return Err(PlanError::TooLarge {
            path: dir.path().join(name),
        });
    }
    // SAFETY: a private read-only mapping of a file only this user or root
    // may write; entries are replaced by rename, never rewritten in place.
    // Its bytes are validated before any is used.
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(PlanError::Unreadable)?;
    Ok(Some(map))
}

/// Opens `name` in `dir` (opened by [`trusted_dir`]) if it is a regular
/// file that may be trusted: it and its size, or `None` if absent.
fn open_trusted(
    dir: &Dir,
    name: &str,
    euid: u32,
) -> Result<Option<(std::fs::File, u64)>, PlanError> {
    let path = dir.path().join(name);
    let f = match dir.open_file(name, libc::O_RDONLY, 0) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_at(&path, e)),
    };
    let st = rtprof_shared::files::fstat(&f).map_err(PlanError::Unreadable)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || !trusted(st.st_uid, st.st_mode, euid) {
        return Err(PlanError::EntryNotTrusted { path });
    }
    Ok(Some((f, st.st_size as u64)))
}

/// The places' directories opened during start-up (one walk each, not
/// one per module), closed when it ends: a descriptor kept for longer
/// could be closed under us by the program and its number reused.
static STARTUP_DIRS: Lock<Option<Vec<Option<Opened>>>> = Lock::new(None);

/// A place's directory as opened, or why it could not be (the kind of a
/// failure to open, if that was it: an absent cache is no news).
type Opened = Result<Dir, (Option<std::io::ErrorKind>, String)>;

/// While it lives (start-up's planning), the places' directories are
/// opened once for every module's lookup; dropped (even by a panic), they
/// are closed, and later lookups (libraries loaded by dlopen) open them
/// again each time.
pub struct StartupDirs(());

impl StartupDirs {
    pub fn open() -> StartupDirs {
        if let Some(mut d) = STARTUP_DIRS.lock() {
            *d = Some(Vec::new());
        }
        StartupDirs(())
    }
}

impl Drop for StartupDirs {
    fn drop(&mut self) {
        if let Some(mut d) = STARTUP_DIRS.lock() {
            *d = None;
        }
    }
}

/// In a forked child: a parent's thread that held the directories (a
/// `dlopen` looking up its plan) does not exist here.
pub fn forget_in_child() {
    STARTUP_DIRS.reset_in_child();
}

/// Runs `f` with place `i`'s directory (`dir`), opened and checked.
fn with_place<T>(
    i: usize,
    dir: &Path,
    euid: u32,
    f: impl FnOnce(&Dir) -> Result<T, PlanError>,
) -> Result<T, PlanError> {
    let mut held = STARTUP_DIRS.lock();
    match held.as_mut().and_then(|h| h.as_mut()) {
        Some(dirs) => {
            if dirs.len() <= i {
                dirs.resize_with(i + 1, || None);
            }
            let opened = dirs[i].get_or_insert_with(|| {
                trusted_dir(dir, euid).map_err(|e| match &e {
                    PlanError::Io { source, .. } => (Some(source.kind()), e.to_string()),
                    _ => (None, e.to_string()),
                })
            });
            match opened {
                Ok(d) => f(d),
                Err((kind, why)) => Err(PlanError::Io {
                    path: dir.into(),
                    source: std::io::Error::new(
                        kind.unwrap_or(std::io::ErrorKind::Other),
                        why.clone(),
                    ),
                }),
            }
        }
        None => {
            drop(held);
            f(&trusted_dir(dir, euid)?)
        }
    }
}

/// The cached decisions (or function list) for module `m` (file identity
/// `id`), if a trusted, valid entry exists.
pub fn lookup(m: &Module, id: &Identity, kind: Kind) -> Option<Entry> {
    lookup_with(m, id, kind, true)
}

/// As [`lookup`]; without `plans`, as [`decode_with`] says.
pub fn lookup_with(m: &Module, id: &Identity, kind: Kind, plans: bool) -> Option<Entry> {
    let places = configured();
    if places.read.is_empty() {
        return None;
    }
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    let name = entry_name(&m.path, id, kind);
    for (i, dir) in places.read.iter().enumerate() {
        match with_place(i, dir, euid, |d| read_trusted(d, &name, euid)) {
            Ok(None) => {}
            Ok(Some(bytes)) => match decode_with(&bytes, id, kind, m.bias, plans) {
                Ok(e) => return Some(e),
                Err(why) => vlog!("cache entry {}/{name} not used: {why}", dir.display()),
            },
            // An absent cache is no news.
            Err(PlanError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(why) => vlog!("cache not used: {why}"),
        }
    }
    None
}

/// Writes an entry for module `path`, atomically; failures are only
/// reported.
pub fn store(path: &str, id: &Identity, kind: Kind, bytes: &[u8]) {
    let Some(dir) = &configured().write else {
        return;
    };
    if let Err(e) = write_entry(dir, &entry_name(path, id, kind), bytes) {
        vlog!("cache entry for {path} not written: {e}");
    }
}

fn write_entry(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), PlanError> {
    write_file(dir, name, bytes.len() as u64, |mut f| {
        std::io::Write::write_all(&mut f, bytes)
    })
}

/// Writes file `name` (about `size` bytes) into cache directory `dir`,
/// made if absent: `fill` writes a new file, which is then renamed into
/// place; a failure leaves nothing behind.
fn write_file(
    dir: &Path,
    name: &str,
    size: u64,
    fill: impl FnOnce(&std::fs::File) -> std::io::Result<()>,
) -> Result<(), PlanError> {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    let system = dir == Path::new(SYSTEM_DIR);
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(if system { 0o755 } else { 0o700 })
            .create(dir)
            .map_err(|e| io_at(dir, e))?;
    }
    let d = trusted_dir(dir, euid)?;
    trim(&d, size);
    let (tmp, f) = d
        .create_temp(name, if system { 0o644 } else { 0o600 })
        .map_err(PlanError::Write)?;
    fill(&f).and_then(|()| d.rename(&tmp, name)).map_err(|e| {
        let _ = d.unlink(&tmp);
        PlanError::Write(e)
    })
}

/// A failed look at `path`, with the path.
fn io_at(path: &Path, source: std::io::Error) -> PlanError {
    PlanError::Io {
        path: path.into(),
        source,
    }
}

/// Keeps the directory under [`MAX_BYTES`]: oldest entries go first.
fn trim(dir: &Dir, adding: u64) {
    let Ok(names) = dir.names() else {
        return;
    };
    let mut entries: Vec<(i64, u64, String)> = names
        .into_iter()
        .filter(|n| n.ends_with(ENTRY_SUFFIX))
        .filter_map(|n| {
            let st = dir.stat(&n).ok()??;
            Some((st.st_mtime, st.st_size as u64, n))
        })
        .collect();
    let mut total: u64 = entries.iter().map(|e| e.1).sum::<u64>() + adding;
    if total <= MAX_BYTES {
        return;
    }
    entries.sort();
    for (_, len, name) in entries {
        if total <= MAX_BYTES / 4 * 3 {
            break;
        }
        if dir.unlink(&name).is_ok() {
            total -= len;
        }
    }
}

/// The name a page image of module `path`'s patched code is kept under
/// (see `patch::image`): its `variant` (which distance its stubs are at)
/// and the thread-pointer offset its stubs hold.
pub fn image_name(path: &str, id: &Identity, variant: u8, tls_offset: i32) -> String {
    let entry = entry_name(path, id, Kind::Plan);
    let stem = entry.strip_suffix(ENTRY_SUFFIX).unwrap_or(&entry);
    let tls = tls_offset.unsigned_abs();
    format!("{stem}.image{variant}-t{tls:x}{ENTRY_SUFFIX}")
}

/// What an image must say it was made for: the file's key and the agent
/// build.
pub fn image_key(id: &Identity) -> ([u8; 40], u64) {
    (key_bytes(id), fingerprint())
}

/// Opens image `name` from the first place that has it and may be
/// trusted (as a plan entry is): it and its size; `None` if none does,
/// said under `RTPROF_VERBOSE`.
pub fn open_image(name: &str) -> Option<(std::fs::File, u64)> {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    for (i, dir) in configured().read.iter().enumerate() {
        match with_place(i, dir, euid, |d| open_trusted(d, name, euid)) {
            Ok(Some(f)) => return Some(f),
            Ok(None) => {}
            Err(PlanError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(why) => vlog!("image not used: {why}"),
        }
    }
    None
}

/// Writes image `name` (about `size` bytes) to the cache's write place
/// (see [`write_file`]).
pub fn write_image(
    name: &str,
    size: u64,
    fill: impl FnOnce(&std::fs::File) -> std::io::Result<()>,
) -> Result<(), PlanError> {
    let Some(dir) = &configured().write else {
        return Err(PlanError::Write(std::io::Error::other("no cache to write")));
    };
    write_file(dir, name, size, fill)
}

/// The plan of module `m` from its cache entry.
pub fn plan_from(m: Module, e: Entry, traps: bool) -> ModulePlan {
    ModulePlan {
        module: m,
        funcs: e.funcs,
        plans: e.plans,
        names: e.names,
        source: e.source,
        text_relocations: e.text_relocations,
        traps,
        loops: Vec::new(),
        identity: None,
        mapped: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> Identity {
        Identity {
            dev: 1,
            ino: 2,
            size: 3,
            mtime_ns: 4,
            ctime_ns: 5,
            debug: 0,
        }
    }

    /// A module plan for a module at `bias`: two functions planned (one
    /// with fixups), one refused.
    fn plan_at(bias: u64) -> ModulePlan {
        let mut m = crate::discover::modules::loaded().remove(0);
        m.bias = bias;
        // push rbp; mov rbp,rsp; ret  |  lea rax,[rip+0x10]; call +0x20; ret
        let codes: [&[u8]; 3] = [
            &[0x55, 0x48, 0x89, 0xe5, 0xc3],
            &[],
            &[0x48, 0x8d, 0x05, 0x10, 0, 0, 0, 0xe8, 0x20, 0, 0, 0, 0xc3],
        ];
        let mut plans = Vec::new();
        let mut names = String::new();
        let funcs = ["a", "bb", "ccc"]
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let vaddr = 0x1000 + i as u64 * 16;
                let code = codes[i];
                Candidate {
                    name: NameAt::push(&mut names, n),
                    vaddr,
                    size: code.len().max(1) as u64,
                    pad: i as u64,
                    outcome: keep(
                        &mut plans,
                        if code.is_empty() {
                            Err(Refusal::BranchIntoWindow)
                        } else {
                            Native::plan_window(code, bias + vaddr, code.len(), 0)
                        },
                    ),
                }
            })
            .collect();
        ModulePlan {
            module: m,
            funcs,
            plans,
            names,
            source: "dynsym+eh_frame",
            text_relocations: true,
            traps: false,
            loops: Vec::new(),
            identity: None,
            mapped: false,
        }
    }

    fn plan() -> ModulePlan {
        plan_at(0x5555_0000_0000)
    }

    #[test]
    fn entries_round_trip() {
        let p = plan();
        let bias = p.module.bias;
        let e = decode(&encode(&p, &id()), &id(), Kind::Plan, bias).unwrap();
        assert!(decode(&encode(&p, &id()), &id(), Kind::Sampled, bias).is_err());
        assert_eq!(e.source, "dynsym+eh_frame");
        assert!(e.text_relocations);
        let got: Vec<_> = e
            .funcs
            .iter()
            .map(|c| (c.name.of(&e.names), c.vaddr, c.pad, c.outcome.err()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a", 0x1000, 0, None),
                ("bb", 0x1010, 1, Some(Refusal::BranchIntoWindow)),
                ("ccc", 0x1020, 2, None)
            ]
        );
        // Taken up by a process that has the module elsewhere, the plans
        // are the ones made there.
        let elsewhere = plan_at(0x7f12_3456_0000);
        let e = decode(&encode(&p, &id()), &id(), Kind::Plan, elsewhere.module.bias).unwrap();
        let back = plan_from(elsewhere.module.clone(), e, false);
        for (a, b) in back.funcs.iter().zip(&elsewhere.funcs) {
            assert_eq!(back.plan_of(a), elsewhere.plan_of(b));
        }
    }

    /// A trap entry is cached in an entry of its own kind only, and read
    /// back only as that kind: a process that does not handle the traps
    /// never installs one.
    #[test]
    fn trap_entries_stay_in_their_kind() {
        let mut p = plan();
        let start = p.module.bias + 0x1010;
        // `xor eax,eax; ret`: no room for a jump.
        p.funcs[1].outcome = keep(
            &mut p.plans,
            Native::plan_trap(&[0x31, 0xc0, 0xc3], start, 3),
        );
        assert!(p.plan_of(&p.funcs[1]).unwrap().is_trap());
        let bias = p.module.bias;
        p.traps = true;
        let with = encode(&p, &id());
        let e = decode(&with, &id(), Kind::PlanWithTraps, bias).unwrap();
        let back = plan_from(p.module.clone(), e, true);
        assert_eq!(back.plan_of(&back.funcs[1]), p.plan_of(&p.funcs[1]));
        assert!(matches!(
            decode(&with, &id(), Kind::Plan, bias),
            Err(PlanError::OtherKind)
        ));
        // The same plans in an entry of the other kind: refused whole.
        p.traps = false;
        let without = encode(&p, &id());
        assert!(matches!(
            decode(&without, &id(), Kind::Plan, bias),
            Err(PlanError::BadPlan)
        ));
        assert!(matches!(
            decode(&without, &id(), Kind::PlanWithTraps, bias),
            Err(PlanError::OtherKind)
        ));
    }

    #[test]
    fn every_damaged_entry_is_refused() {
        let good = encode(&plan(), &id());
        let other = Identity {
            ctime_ns: 6,
            ..id()
        };
        assert!(matches!(
            decode(&good, &other, Kind::Plan, 0).err(),
            Some(PlanError::OtherFile)
        ));
        for cut in 0..good.len() {
            assert!(
                decode(&good[..cut], &id(), Kind::Plan, 0).is_err(),
                "truncated at {cut}"
            );
        }
        for i in 0..good.len() {
            for bit in [0x01u8, 0x80] {
                let mut b = good.clone();
                b[i] ^= bit;
                assert!(
                    decode(&b, &id(), Kind::Plan, 0).is_err(),
                    "byte {i} bit {bit:#x} flipped"
                );
            }
        }
    }

    /// Each damage is refused for its own reason, in the words verbose
    /// output says it with.
    #[test]
    fn damaged_entries_say_why() {
        let good = encode(&plan(), &id());
        let why = |b: &[u8], kind: Kind| decode(b, &id(), kind, 0).err().expect("refused");
        // A record's field changed, the checksum made right again.
        let record = |at: usize, v: u32| {
            let mut b = good.clone();
            b[HEADER + at..HEADER + at + 4].copy_from_slice(&v.to_le_bytes());
            cachedir::seal(&mut b);
            b
        };
        let flipped = |at: usize| {
            let mut b = good.clone();
            b[at] ^= 0x80;
            b
        };
        let mut padded = good.clone();
        padded.push(0);
        let cases = [
            (why(&good[..HEADER - 1], Kind::Plan), "not a cache entry"),
            (why(&good, Kind::Sampled), "another kind of entry"),
            (
                why(&flipped(8), Kind::Plan),
                "written by another agent build",
            ),
            (
                why(&flipped(16), Kind::Plan),
                "written by another agent build",
            ),
            (why(&flipped(64), Kind::Plan), "bad symbol source"),
            (why(&padded, Kind::Plan), "truncated or padded"),
            (
                why(&good[..good.len() - 1], Kind::Plan),
                "truncated or padded",
            ),
            (
                why(&flipped(good.len() - 1), Kind::Plan),
                "checksum mismatch",
            ),
            (why(&record(16, 65), Kind::Plan), "bad record"),
            (why(&record(20, u32::MAX), Kind::Plan), "bad outcome"),
            (why(&record(28, u32::MAX), Kind::Plan), "bad name"),
        ];
        for (e, text) in &cases {
            assert_eq!(e.to_string(), *text, "{e:?}");
        }
        let kinds: Vec<_> = cases.iter().map(|(e, _)| e).collect();
        assert!(matches!(
            kinds[..],
            [
                PlanError::NotACacheEntry,
                PlanError::OtherKind,
                PlanError::OtherBuild,
                PlanError::OtherBuild,
                PlanError::BadSource,
                PlanError::Truncated,
                PlanError::Truncated,
                PlanError::Checksum,
                PlanError::BadRecord,
                PlanError::BadOutcome,
                PlanError::BadName,
            ]
        ));
    }

    #[test]
    fn only_private_directories_are_trusted() {
        let dir = std::env::temp_dir().join(format!("rtprof-cache-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: geteuid cannot fail.
        let euid = unsafe { libc::geteuid() };
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(trusted_dir(&dir, euid).is_ok());
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = trusted_dir(&dir, euid).err().unwrap();
        assert!(matches!(&e, PlanError::DirNotTrusted { path } if *path == dir));
        assert!(e
            .to_string()
            .ends_with(": not a directory owned by this user or root and writable only by them"));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        write_entry(&dir, "x.rtc", &encode(&plan(), &id())).unwrap();
        let d = trusted_dir(&dir, euid).ok().unwrap();
        assert!(read_trusted(&d, "x.rtc", euid).unwrap().is_some());
        std::fs::set_permissions(dir.join("x.rtc"), std::fs::Permissions::from_mode(0o666))
            .unwrap();
        let e = read_trusted(&d, "x.rtc", euid).unwrap_err();
        assert!(matches!(&e, PlanError::EntryNotTrusted { path } if *path == dir.join("x.rtc")));
        assert_eq!(
            e.to_string(),
            format!(
                "{}: not owned by this user or root, or writable by others",
                dir.join("x.rtc").display()
            )
        );
        assert!(read_trusted(&d, "missing.rtc", euid).unwrap().is_none());
        // No temporary file is left beside the entries.
        let names = d.names().unwrap();
        assert_eq!(names, vec!["x.rtc".to_string()], "{names:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The cache's directory is reached through a link another user may
    /// re-point (`XDG_CACHE_HOME` at her link): the directory is resolved
    /// once and checked on its descriptor, and entries are read there even
    /// once the link names her directory; an entry that is a link is not
    /// followed.
    #[test]
    fn a_cache_reached_through_a_link_is_read_where_it_was_checked() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("rtprof-cache-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (ours, theirs) = (base.join("ours"), base.join("theirs"));
        for d in [&base, &ours, &theirs] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        // SAFETY: geteuid cannot fail.
        let euid = unsafe { libc::geteuid() };
        write_entry(&ours, "x.rtc", &encode(&plan(), &id())).unwrap();
        std::fs::write(theirs.join("x.rtc"), b"not an entry").unwrap();
        let link = base.join("link");
        std::os::unix::fs::symlink(&ours, &link).unwrap();
        let d = trusted_dir(&link, euid).ok().unwrap();
        assert_eq!(d.path(), ours.as_path());
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&theirs, &link).unwrap();
        let bytes = read_trusted(&d, "x.rtc", euid).unwrap().unwrap();
        assert!(decode(&bytes, &id(), Kind::Plan, 0).is_ok());
        std::os::unix::fs::symlink(theirs.join("x.rtc"), ours.join("y.rtc")).unwrap();
        assert!(read_trusted(&d, "y.rtc", euid).is_err());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
