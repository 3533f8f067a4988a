//! A module's patched code kept as page images in the plan cache, mapped
//! instead of written at a warm start.
//!
//! A module's stubs are placed at a fixed distance from it (one of
//! [`DISTANCES`]) and reach their counters through the link words beside
//! them (`arch::LinkWords`), so its patched text and its stubs are the same
//! bytes in every process, wherever the loader put the module. The first
//! process that installs a module that way writes an image: a copy of the
//! module's file whose code segments hold the patched code, with the stubs
//! after it and a trailer that says what the image was made for. A later
//! process maps the image's stubs at the same distance and its code over
//! the module's own, from the same file offsets: no page of code is
//! written, and the page cache shares the pages between processes as it
//! shares the library's. The copy is a whole file, so tools that read the
//! file a mapping names (perf, for symbols) read an ELF file like the
//! original.
//!
//! An image is made and used only where nothing but the file decides the
//! code: no text relocations, no trap entries, loop probes, caller hooks
//! or kept entry states, every function counted, every moved instruction
//! relative, and no page of the module's code written before (a page of
//! it that is not the file's, as `/proc/self/pagemap` tells, could hold
//! another tool's patch). Anything else is today's path, and said.

use crate::arch::{CounterRef, EntryPlan, LinkWords, Native, StubWriter, ThreadContext};
use crate::discover::fileimage::Identity;
use crate::discover::modules::{Load, Module};
use crate::lifecycle::lock::Lock;
use crate::log::vlog;
use crate::patch::stubmem::StubArea;
use crate::plan::analysis::ModulePlan;
use crate::plan::cache;
use rtprof_abi::Refusal;
use rtprof_shared::cachedir::{fnv, FNV_START};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

const PAGE: u64 = 4096;
const MAGIC: [u8; 8] = *b"RTPRIMG1";
/// Bumped whenever the trailer's layout changes.
const FORMAT: u32 = 2;
/// Where a module's stubs go, from the start of its lowest segment: far
/// enough that libraries the loader packs next to each other leave it
/// free, near enough for a `jmp rel32` from anywhere in a module of up to
/// 1 GiB. Each distance is its own image (a variant, numbered by its
/// place here).
const DISTANCES: [i64; 2] = [-(1 << 30), 1 << 30];

/// The variants to try for `m`, in order: below the executable (its heap
/// grows up from its end), above a library (the counter segment, mapped
/// before, usually lies right below the libraries).
fn variants(m: &Module) -> [u8; 2] {
    if m.is_main {
        [0, 1]
    } else {
        [1, 0]
    }
}
/// Bytes a function takes in the trailer.
const PER_FUNCTION: usize = 9;
/// Bytes of the trailer before its functions.
const TRAILER_HEAD: usize = 8 + 4 + 4 + 8 + 40 + 8 + 8 + 4 + 4;

static ALLOWED: AtomicBool = AtomicBool::new(false);

/// Decides, once at start-up, whether this process makes and uses images:
/// not with `RTPROF_IMAGES=0`, nor with an option that puts something of
/// the process's own into stubs or entries (counting chosen by name, a
/// budget, exact callers, trap entries, loop probes).
pub fn configure(cfg: &crate::config::Config) {
    let plain = cfg.count.is_empty()
        && cfg.nocount.is_empty()
        && cfg.budget.is_none()
        && !cfg.callers
        && !cfg.traps
        && cfg.loops.is_empty();
    ALLOWED.store(cfg.images && plain, Ordering::Relaxed);
}

fn enabled() -> bool {
    ALLOWED.load(Ordering::Relaxed)
}

/// Why a module's code is installed the usual way, not as an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoImage {
    Off,
    TextRelocations,
    Options,
    NoIdentity,
    AbsoluteCode,
    Unreadable,
    CodeWritten,
}

impl NoImage {
    pub fn why(self) -> &'static str {
        match self {
            NoImage::Off => "images are off",
            NoImage::TextRelocations => "the loader writes into its code",
            NoImage::Options => "options that change its stubs",
            NoImage::NoIdentity => "its file's identity is unknown",
            NoImage::AbsoluteCode => "a moved instruction holds an absolute address",
            NoImage::Unreadable => "its code is not readable",
            NoImage::CodeWritten => "a page of its code was written before",
        }
    }
}

/// Whether module `mp` may be installed as an image (`plain`: the process
/// adds nothing of its own to stubs or entries), or why not.
pub fn eligible(mp: &ModulePlan, plain: bool) -> Result<Identity, NoImage> {
    if !enabled() {
        return Err(NoImage::Off);
    }
    if mp.text_relocations {
        return Err(NoImage::TextRelocations);
    }
    if !plain || mp.traps || !mp.loops.is_empty() {
        return Err(NoImage::Options);
    }
    let id = mp.identity.ok_or(NoImage::NoIdentity)?;
    let absolute = mp
        .funcs
        .iter()
        .filter_map(|c| mp.plan_of(c).ok())
        .any(|p| !p.position_independent() && mp.module.bias != 0);
    if absolute {
        return Err(NoImage::AbsoluteCode);
    }
    if code_loads(&mp.module).any(|l| !l.readable()) {
        return Err(NoImage::Unreadable);
    }
    // A module whose image was prepared was checked then (no code of it
    // has run since).
    if !mp.mapped && !code_is_the_files(&mp.module) {
        return Err(NoImage::CodeWritten);
    }
    Ok(id)
}

fn code_loads(m: &Module) -> impl Iterator<Item = &Load> {
    m.loads.iter().filter(|l| l.executable())
}

/// A code segment's pages as the loader mapped them: (address, length,
/// file offset).
fn code_pages(m: &Module, l: &Load) -> (u64, u64, u64) {
    let start = m.bias.wrapping_add(l.vaddr);
    let lo = start / PAGE * PAGE;
    let hi = (start + l.filesz).div_ceil(PAGE) * PAGE;
    (lo, hi - lo, l.offset / PAGE * PAGE)
}

/// The thread-pointer offset of the stripe pointer in this process: its
/// stubs hold it, so an image is made for one offset (the same in every
/// process of an executable without thread-local storage of its own).
fn tls_offset() -> i32 {
    i32::try_from(Native::stripe_tls_offset()).unwrap_or(i32::MIN)
}

/// Where stubs at distance `d` from `m` start.
pub fn stub_base(m: &Module, d: i64) -> Option<u64> {
    let (lo, _) = m.span();
    let base = (lo / PAGE * PAGE).checked_add_signed(d)?;
    (0x10_0000..Native::USER_END)
        .contains(&base)
        .then_some(base)
}

/// Whether every page of `m`'s code now in memory is the file's (none
/// written, so none private): `/proc/self/pagemap` marks a page that is
/// present and not file-backed.
fn code_is_the_files(m: &Module) -> bool {
    let Ok(f) = File::open("/proc/self/pagemap") else {
        return false;
    };
    let mut words = Vec::new();
    code_loads(m).all(|l| {
        let (addr, len, _) = code_pages(m, l);
        words.resize((len / PAGE) as usize * 8, 0u8);
        f.read_exact_at(&mut words, addr / PAGE * 8).is_ok()
            && words.chunks_exact(8).all(|w| {
                let e = u64::from_le_bytes(w.try_into().unwrap_or_default());
                let (present, file) = (e >> 63 & 1 == 1, e >> 61 & 1 == 1);
                !present || file
            })
    })
}

/// A module installed from an image: its stubs' area, each function's
/// outcome, and (start, end, slot) of each stub.
pub struct Mapped {
    pub area: StubArea,
    pub outcomes: Vec<Option<Refusal>>,
    pub ranges: Vec<(u64, u64, u32)>,
    pub variant: u8,
}

/// What the trailer of an image says.
struct Trailer {
    variant: u8,
    stub_off: u64,
    code_len: u64,
    /// Per function: its stub's (offset in the area, length), or why it
    /// has none.
    funcs: Vec<Result<(u32, u32), Refusal>>,
}

fn encode_trailer(id: &Identity, t: &Trailer) -> Vec<u8> {
    let (key, build) = cache::image_key(id);
    let mut b = Vec::with_capacity(TRAILER_HEAD + t.funcs.len() * PER_FUNCTION + 24);
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&FORMAT.to_le_bytes());
    b.extend_from_slice(&(t.variant as u32).to_le_bytes());
    b.extend_from_slice(&build.to_le_bytes());
    b.extend_from_slice(&key);
    b.extend_from_slice(&t.stub_off.to_le_bytes());
    b.extend_from_slice(&t.code_len.to_le_bytes());
    b.extend_from_slice(&(t.funcs.len() as u32).to_le_bytes());
    b.extend_from_slice(&tls_offset().to_le_bytes());
    for f in &t.funcs {
        match f {
            Ok((off, len)) => {
                b.push(0);
                b.extend_from_slice(&off.to_le_bytes());
                b.extend_from_slice(&len.to_le_bytes());
            }
            Err(r) => {
                b.push(r.code() as u8);
                b.extend_from_slice(&[0; 8]);
            }
        }
    }
    let sum = fnv(&b, FNV_START);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

/// The trailer of an image whose last 16 bytes say where it is and how
/// long: `None` if anything in it disagrees with what the module needs.
fn read_trailer(f: &File, size: u64, id: &Identity, variant: u8) -> Option<Trailer> {
    let mut tail = [0u8; 16];
    f.read_exact_at(&mut tail, size.checked_sub(16)?).ok()?;
    let at = u64::from_le_bytes(tail[..8].try_into().ok()?);
    let len = u64::from_le_bytes(tail[8..].try_into().ok()?) as usize;
    let funcs = len.checked_sub(TRAILER_HEAD + 8)? / PER_FUNCTION;
    if len != TRAILER_HEAD + funcs * PER_FUNCTION + 8 || at.checked_add(len as u64)? + 16 != size {
        return None;
    }
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, at).ok()?;
    let (body, sum) = b.split_at(len - 8);
    if fnv(body, FNV_START).to_le_bytes() != sum {
        return None;
    }
    let (key, build) = cache::image_key(id);
    let u32_at = |i: usize| u32::from_le_bytes(body[i..i + 4].try_into().unwrap_or_default());
    let u64_at = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().unwrap_or_default());
    if body[..8] != MAGIC
        || u32_at(8) != FORMAT
        || u32_at(12) != variant as u32
        || u64_at(16) != build
        || body[24..64] != key
        || u32_at(80) as usize != funcs
        || u32_at(84) != tls_offset() as u32
    {
        return None;
    }
    let (stub_off, code_len) = (u64_at(64), u64_at(72));
    if stub_off % PAGE != 0 || code_len % PAGE != 0 || stub_off + code_len > at {
        return None;
    }
    let mut out = Vec::with_capacity(funcs);
    for r in body[TRAILER_HEAD..].chunks_exact(PER_FUNCTION) {
        let (off, n) = (
            u32::from_le_bytes(r[1..5].try_into().ok()?),
            u32::from_le_bytes(r[5..9].try_into().ok()?),
        );
        out.push(match r[0] {
            0 if off as u64 + n as u64 <= code_len => Ok((off, n)),
            0 => return None,
            c => Err(Refusal::from_code(c as u32)?),
        });
    }
    Some(Trailer {
        variant,
        stub_off,
        code_len,
        funcs: out,
    })
}

/// An image found for a module, its place held: what [`map`] maps.
struct Found {
    /// Start of the module's lowest segment, and its path: which module.
    module: (u64, String),
    file: File,
    trailer: Trailer,
    area: StubArea,
}

/// Images found for modules planned but not installed yet.
static PREPARED: Lock<Vec<Found>> = Lock::new(Vec::new());

/// In a forked child: a parent's thread that held the list does not
/// exist here.
pub fn forget_in_child() {
    PREPARED.reset_in_child();
}

/// The image of `m` (file identity `id`) for the first distance whose
/// place is free, that place held; `None` (said under `RTPROF_VERBOSE`)
/// if there is none to use.
fn find(m: &Module, id: &Identity) -> Option<Found> {
    for variant in variants(m) {
        let Some(base) = stub_base(m, DISTANCES[variant as usize]) else {
            continue;
        };
        let name = cache::image_name(&m.path, id, variant, tls_offset());
        let Some((file, size)) = cache::open_image(&name) else {
            continue;
        };
        let Some(trailer) = read_trailer(&file, size, id, variant) else {
            vlog!("{}: image {name} not used: not one for this file", m.path);
            continue;
        };
        let Some(area) = StubArea::at(base, trailer.code_len) else {
            vlog!("{}: image {name} not used: its place is taken", m.path);
            continue;
        };
        return Some(Found {
            module: (m.span().0, m.path.clone()),
            file,
            trailer,
            area,
        });
    }
    None
}

/// Whether `m`'s code will be mapped from an image (asked while it is
/// planned, before its plans are read): one is found for its file and its
/// place held until [`map`] maps it, so that its plans need not be decoded
/// nor checked against memory.
pub fn prepare(m: &Module, id: &Identity) -> bool {
    if !enabled() || !code_is_the_files(m) {
        return false;
    }
    let Some(found) = find(m, id) else {
        return false;
    };
    match PREPARED.lock() {
        Some(mut v) => {
            v.push(found);
            true
        }
        None => {
            found.area.release();
            false
        }
    }
}

/// The image prepared for `m`, if any.
fn take_prepared(m: &Module) -> Option<Found> {
    let mut v = PREPARED.lock()?;
    let key = (m.span().0, m.path.as_str());
    let i = v
        .iter()
        .position(|f| (f.module.0, f.module.1.as_str()) == key)?;
    Some(v.swap_remove(i))
}

/// Maps `mp`'s image: the one prepared for it, else one the cache has for
/// a distance whose place is free: its stubs there, the link words `link`
/// after them, its code over the module's. `None`: nothing was changed
/// (said under `RTPROF_VERBOSE`).
pub fn map(mp: &ModulePlan, id: &Identity, first_slot: u32, link: LinkWords) -> Option<Mapped> {
    let found = take_prepared(&mp.module).or_else(|| find(&mp.module, id))?;
    let (t, mut area) = (&found.trailer, found.area);
    if t.funcs.len() != mp.funcs.len() {
        vlog!(
            "{}: image not used: made for another list of functions",
            mp.module.path
        );
        area.release();
        return None;
    }
    if let Err(e) = map_into(&mp.module, &found.file, t, &area, link) {
        vlog!("{}: image not used: {e}", mp.module.path);
        area.release();
        return None;
    }
    area.from_image = true;
    let mut outcomes = Vec::with_capacity(t.funcs.len());
    let mut ranges = Vec::new();
    for (i, r) in t.funcs.iter().enumerate() {
        match r {
            Ok((off, n)) => {
                let at = area.addr + *off as u64;
                ranges.push((at, at + *n as u64, first_slot + i as u32));
                outcomes.push(None);
            }
            Err(why) => outcomes.push(Some(*why)),
        }
    }
    Some(Mapped {
        area,
        outcomes,
        ranges,
        variant: t.variant,
    })
}

/// Maps the image's stubs over `area`'s, writes the link words, then maps
/// each code segment at a free address and moves it over the module's:
/// every check the kernel makes of the file (a mount without exec, say)
/// is made before the module's own code is touched.
fn map_into(
    m: &Module,
    f: &File,
    t: &Trailer,
    area: &StubArea,
    link: LinkWords,
) -> std::io::Result<()> {
    // Every page mapped lies inside the file, before its stubs: a page
    // past its end would fault when run.
    if code_loads(m).any(|l| {
        let (_, len, off) = code_pages(m, l);
        off + len > t.stub_off
    }) {
        return Err(std::io::Error::other("its code lies past its stubs"));
    }
    let rx = libc::PROT_READ | libc::PROT_EXEC;
    let fixed = libc::MAP_PRIVATE | libc::MAP_FIXED;
    // SAFETY: [area.addr, + code_len) is our own fresh mapping (the
    // area's stubs part), replaced by the image's stubs; nothing runs
    // there yet.
    let p = unsafe {
        libc::mmap(
            area.addr as *mut libc::c_void,
            t.code_len as usize,
            rx,
            fixed,
            f.as_raw_fd(),
            t.stub_off as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the link page is the area's own read-write last page.
    unsafe { std::ptr::write(area.link() as *mut LinkWords, link) };
    let mut staged = Vec::new();
    for l in code_loads(m) {
        let (addr, len, off) = code_pages(m, l);
        // SAFETY: a fresh private mapping of the image wherever the
        // kernel finds room: nothing of ours or the program's is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                rx,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            for (q, n, _) in staged {
                // SAFETY: our staging mappings, used by nothing.
                unsafe { libc::munmap(q, n) };
            }
            return Err(e);
        }
        staged.push((p, len as usize, addr));
    }
    for (p, n, addr) in staged {
        // SAFETY: moves our staging mapping over the module's code pages
        // [addr, + n): the same file offsets of a file whose code bytes
        // are the module's with the patches this process would write
        // (the trailer names the module's file and this agent build). The
        // constructor runs single-threaded, and a library the loader just
        // mapped has run none of its code.
        let q = unsafe {
            libc::mremap(
                p,
                n,
                n,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                addr as *mut libc::c_void,
            )
        };
        if q == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Writes the image of module `mp`, just installed with its stubs in
/// `area` at distance `variant`, its code now holding every patch: a copy
/// of its file (checked to be the one planned) with the code segments as
/// they are in memory, the stubs, the trailer. Failures are only said.
pub fn store(
    mp: &ModulePlan,
    id: &Identity,
    area: &StubArea,
    variant: u8,
    funcs: &[Result<(u32, u32), Refusal>],
) {
    let name = cache::image_name(&mp.module.path, id, variant, tls_offset());
    let m = &mp.module;
    let written = (|| -> Result<(), String> {
        let src = File::open(&m.file).map_err(|e| format!("cannot open {}: {e}", m.file))?;
        let st = src.metadata().map_err(|e| e.to_string())?;
        if !Identity::of(&st).same_file(id) {
            return Err("the file changed since it was planned".into());
        }
        let size = st.len();
        let stub_off = code_loads(m)
            .map(|l| {
                let (_, len, off) = code_pages(m, l);
                off + len
            })
            .fold(size, u64::max)
            .div_ceil(PAGE)
            * PAGE;
        let t = Trailer {
            variant,
            stub_off,
            code_len: area.code_len,
            funcs: funcs.to_vec(),
        };
        let trailer = encode_trailer(id, &t);
        cache::write_image(
            &name,
            stub_off + area.code_len + trailer.len() as u64,
            |f| {
                copy_all(&src, f, size)?;
                for l in code_loads(m) {
                    let (addr, len, off) = code_pages(m, l);
                    // SAFETY: the module's code pages, mapped readable (checked
                    // by `eligible`) while it is installed.
                    let code =
                        unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
                    f.write_all_at(code, off)?;
                }
                // SAFETY: the area's stubs, mapped readable.
                let stubs = unsafe {
                    std::slice::from_raw_parts(area.addr as *const u8, area.code_len as usize)
                };
                f.write_all_at(stubs, stub_off)?;
                let at = stub_off + area.code_len;
                f.write_all_at(&trailer, at)?;
                let mut tail = [0u8; 16];
                tail[..8].copy_from_slice(&at.to_le_bytes());
                tail[8..].copy_from_slice(&(trailer.len() as u64).to_le_bytes());
                f.write_all_at(&tail, at + trailer.len() as u64)
            },
        )
        .map_err(|e| e.to_string())
    })();
    match written {
        Ok(()) => vlog!("{}: image {name} written", m.path),
        Err(e) => vlog!("{}: image not written: {e}", m.path),
    }
}

/// Copies `size` bytes of `src` to the start of `dst`: in the kernel
/// where it can, else through a buffer (the kernel copies within one
/// filesystem only: a program on another one than the cache, an overlay,
/// gets `EXDEV`; a seccomp filter may refuse the call). A refused first
/// call goes the other way; a real failure fails that way too.
fn copy_all(src: &File, dst: &File, size: u64) -> std::io::Result<()> {
    let (mut from, mut to) = (0i64, 0i64);
    while (from as u64) < size {
        // SAFETY: two open descriptors and offsets of ours.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut from,
                dst.as_raw_fd(),
                &mut to,
                (size - from as u64) as usize,
                0,
            )
        };
        match n {
            n if n > 0 => {}
            0 => return Err(std::io::Error::other("the file ended early")),
            _ if from == 0 => return copy_through_buffer(src, dst, size),
            _ => return Err(std::io::Error::last_os_error()),
        }
    }
    Ok(())
}

/// Copies `size` bytes of `src` to the start of `dst`, a buffer at a time.
fn copy_through_buffer(src: &File, dst: &File, size: u64) -> std::io::Result<()> {
    let mut buf = vec![0u8; 1 << 18];
    let mut at = 0u64;
    while at < size {
        let want = (size - at).min(buf.len() as u64) as usize;
        let n = src.read_at(&mut buf[..want], at)?;
        if n == 0 {
            return Err(std::io::Error::other("the file ended early"));
        }
        dst.write_all_at(&buf[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// The counter of the function in `slot` of a module whose counters start
/// at `first_slot` and whose link words are at `link`, for stripe
/// pointers at `tls_offset` from the thread pointer.
pub fn linked_counter(
    link: u64,
    tls_offset: i32,
    first_slot: u32,
    slot: u32,
    hook: u64,
) -> CounterRef {
    CounterRef {
        tls_offset,
        slot,
        local: slot - first_slot,
        link,
        caller_hook: hook,
        ..CounterRef::default()
    }
}

/// A stub area for `bound` bytes of `m`'s stubs at the first distance
/// whose place is free and in reach, with the variant it is.
pub fn place(m: &Module, bound: u64) -> Option<(StubArea, u8)> {
    let (lo, hi) = m.span();
    let code_len = bound.div_ceil(PAGE) * PAGE;
    variants(m).into_iter().find_map(|v| {
        let base = stub_base(m, DISTANCES[v as usize])?;
        let end = base + code_len + PAGE;
        let reach = Native::BRANCH_RANGE;
        if base < hi.saturating_sub(reach) || end > lo.saturating_add(reach) {
            return None;
        }
        Some((StubArea::at(base, code_len)?, v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Across filesystems (or where the kernel refuses to copy) an image's
    /// copy of the file goes through a buffer: the same bytes, whatever
    /// the size, and an error rather than a short copy.
    #[test]
    fn a_copy_through_a_buffer_is_the_file() {
        let dir = std::env::temp_dir().join(format!("rtprof-copy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bytes: Vec<u8> = (0..(1u32 << 19) + 12345)
            .map(|i| (i.wrapping_mul(7) ^ (i >> 9)) as u8)
            .collect();
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::write(&a, &bytes).unwrap();
        let src = File::open(&a).unwrap();
        let dst = File::create(&b).unwrap();
        copy_through_buffer(&src, &dst, bytes.len() as u64).unwrap();
        assert_eq!(std::fs::read(&b).unwrap(), bytes);
        assert!(copy_through_buffer(&src, &dst, bytes.len() as u64 + 1).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
