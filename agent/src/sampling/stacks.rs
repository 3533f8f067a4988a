//! Sampled call stacks. With the perf sampler each sample carries the
//! registers unwinding starts from and a copy of the top of its thread's
//! user stack; the drain thread unwinds that copy with the modules'
//! `.eh_frame` (framehop; frame pointers where a module has no unwind
//! entry), names each frame by the function (or module) it is in, and
//! counts the stack in a bounded table. With the timer sampler the signal
//! handler does the same on the interrupted thread's own stack, read in
//! place between its stack pointer and the stack's end. At exit the table
//! is written beside the counter segment, where `rtprof run` reads it.
//!
//! One thread at a time unwinds and counts; a thread that finds the table
//! in use leaves that sample's stack out rather than wait. Modules are
//! loaded into the unwinder where the address table is published (before
//! `main`, or in the loader hook), never by the drain thread or a signal
//! handler; after that a sample allocates nothing and opens nothing.

use super::addrmap;
use crate::arch::{LoopProber, Native};
use crate::lifecycle::lock::Lock;
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{
    ExplicitModuleSectionInfo, FrameAddress, Module, MustNotAllocateDuringUnwind, Unwinder,
};
use std::cell::Cell;
use std::collections::HashMap;

/// Frames kept per stack, leaf first; deeper stacks are cut (and counted).
pub const MAX_DEPTH: usize = 32;
/// Bytes of user stack each sample copies.
pub const STACK_BYTES: u32 = 8192;
/// Distinct stacks kept; samples of further ones are counted as dropped.
const MAX_STACKS: usize = 4096;
/// Stacks of timer samples waiting for their module's names (see `held`),
/// kept at most; a further one is counted as dropped.
const MAX_HELD: usize = 128;

/// A frame the report names: a function slot, `MODULE | record` for code
/// of a module outside its listed functions, or [`UNKNOWN`].
pub const MODULE: u32 = 1 << 31;
pub const UNKNOWN: u32 = u32::MAX;

/// A module the unwinder needs: its file, load bias and executable ranges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleFile {
    pub path: String,
    pub bias: u64,
    pub exec: Vec<(u64, u64)>,
}

/// Frames leaf first, and how many are used.
type Key = ([u32; MAX_DEPTH], u8);

/// A held sample's stack: its frames' addresses, how many, its periods.
struct Held {
    ats: [u64; MAX_DEPTH],
    depth: u8,
    n: u64,
}

struct State {
    unwinder: UnwinderX86_64<Section, MustNotAllocateDuringUnwind>,
    cache: CacheX86_64<MustNotAllocateDuringUnwind>,
    /// The modules in the unwinder, as last synced.
    loaded: Vec<ModuleFile>,
    table: HashMap<Key, u64>,
    /// Stacks of held samples, by their frames' addresses, with their
    /// periods: placed once the sample is counted, so that the leaf is
    /// the function the count went to (stacks and counts must agree).
    held: Vec<Held>,
    truncated: u64,
    dropped: u64,
}

/// The module list to sync the unwinder with, set when the address table
/// is published (libraries come and go), taken by the drain thread.
static PENDING: Lock<Option<Vec<ModuleFile>>> = Lock::new(None);
static STATE: Lock<Option<State>> = Lock::new(None);

/// The modules present now (called where the address table is published:
/// at start-up before `main`, and in the loader hook). They are loaded
/// into the unwinder here and now: reading their files from the drain
/// thread, while the program runs, would show it descriptors it did not
/// open (a program listing its own, as Python's subprocess tests do).
pub fn modules_changed(modules: Vec<ModuleFile>) {
    let mut modules = Some(modules);
    for _ in 0..1000 {
        if PENDING.try_with(|p| *p = modules.take()).is_some() {
            break;
        }
        std::thread::yield_now();
    }
    // The unwinder may be in use for a sample for a moment.
    for _ in 0..1000 {
        if sync_now() {
            return;
        }
        std::thread::yield_now();
    }
}

/// Loads the pending module list into the unwinder; `false` if the
/// unwinder was in use.
pub fn sync_now() -> bool {
    STATE
        .try_with(|st| {
            let s = st.get_or_insert_with(State::new);
            if let Some(now) = PENDING.try_with(Option::take).flatten() {
                s.sync(now);
            }
        })
        .is_some()
}

thread_local! {
    /// This thread's stack, [lowest, end): a signal handler reads only
    /// from an interrupted stack pointer inside it, up to its end (code
    /// running on another stack, a coroutine's or an alternate signal
    /// stack, is not unwound). (0, 0): not known.
    static STACK: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Notes where the calling thread's stack ends (at its start, and for the
/// main thread at start-up; not in a signal handler).
pub fn note_thread_stack() {
    // SAFETY: `attr` is initialised by pthread_getattr_np before it is
    // read, and destroyed once; the out-parameters are live locals.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return;
        }
        let (mut addr, mut size) = (std::ptr::null_mut(), 0usize);
        if libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0 {
            let _ = STACK.try_with(|e| e.set((addr as u64, addr as u64 + size as u64)));
        }
        libc::pthread_attr_destroy(&mut attr);
    }
}

/// Counts the stack of a sample taken by a signal handler on this thread
/// (`n` periods), reading the stack where it is; `held`: the samples are
/// held for their module's names (see `held`). Allocation-free.
pub fn record_here(ip: u64, sp: u64, bp: u64, n: u64, held: bool) {
    let (lowest, end) = STACK.try_with(Cell::get).unwrap_or((0, 0));
    if sp < lowest || sp >= end {
        return;
    }
    let len = (end - sp).min(STACK_BYTES as u64) as usize;
    // SAFETY: `sp` lies in this thread's own stack, which is mapped and
    // readable from its stack pointer to its end while the thread runs
    // (this handler runs on it); the bytes are only read.
    let stack = unsafe { std::slice::from_raw_parts(sp as *const u8, len) };
    STATE.try_with(|st| {
        // Loaded where modules change (`modules_changed`): none yet, no
        // stack.
        if let Some(s) = st.as_mut() {
            s.record(ip, sp, bp, stack, n, held);
        }
    });
}

/// Section `name` of the 64-bit little-endian ELF file `data`: its address
/// range, and its bytes unless it has none in the file (SHT_NOBITS). Read
/// from the section headers alone: parsing the whole file (symbol tables,
/// relocations) would cost every process's start-up.
fn section<'a>(data: &'a [u8], name: &str) -> Option<(std::ops::Range<u64>, Option<&'a [u8]>)> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(data.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(data.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(data.get(o..o + 8)?.try_into().ok()?));
    // ELF64 (class 2), little-endian (data 1).
    if data.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let shoff = usize::try_from(u64_at(0x28)?).ok()?;
    let (entsize, count) = (u16_at(0x3a)? as usize, u16_at(0x3c)? as usize);
    let shstrndx = u16_at(0x3e)? as usize;
    if entsize < 64 {
        return None;
    }
    let header = |i: usize| shoff.checked_add(i.checked_mul(entsize)?);
    let strtab = header(shstrndx)?;
    let (str_off, str_size) = (u64_at(strtab + 24)?, u64_at(strtab + 32)?);
    let names = data.get(
        usize::try_from(str_off).ok()?..usize::try_from(str_off.checked_add(str_size)?).ok()?,
    )?;
    (0..count).find_map(|i| {
        let h = header(i)?;
        let n = u32_at(h)? as usize;
        let here = names.get(n..)?;
        let end = here.iter().position(|&c| c == 0)?;
        if &here[..end] != name.as_bytes() {
            return None;
        }
        let (kind, addr) = (u32_at(h + 4)?, u64_at(h + 16)?);
        let (off, size) = (u64_at(h + 24)?, u64_at(h + 32)?);
        let bytes = (kind != goblin::elf::section_header::SHT_NOBITS)
            .then(|| {
                let o = usize::try_from(off).ok()?;
                data.get(o..o.checked_add(usize::try_from(size).ok()?)?)
            })
            .flatten();
        Some((addr..addr.checked_add(size)?, bytes))
    })
}

/// An unwind section of a module's file, read where it is mapped: a
/// private mapping of the file made here, not the loader's (a module can
/// be unloaded while its entries are still in the unwinder). Nothing is
/// copied at start-up; pages are read as unwinding first needs them.
/// (Empty by default, as framehop's section list wants.)
#[derive(Default)]
pub struct Section {
    map: Option<std::sync::Arc<memmap2::Mmap>>,
    bytes: std::ops::Range<usize>,
}

impl std::ops::Deref for Section {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.map
            .as_ref()
            .and_then(|m| m.get(self.bytes.clone()))
            .unwrap_or(&[])
    }
}

/// The unwind sections of the module file at `path`.
fn module_for(m: &ModuleFile) -> Option<Module<Section>> {
    let file = std::fs::File::open(&m.path).ok()?;
    // SAFETY: a read-only private mapping; its bytes are parsed with
    // bounds checks and never executed.
    let map = std::sync::Arc::new(unsafe { memmap2::Mmap::map(&file) }.ok()?);
    // The mapping stays; the descriptor goes at once (see `modules_changed`).
    drop(file);
    let base = map.as_ptr() as usize;
    let in_map = |b: &[u8]| {
        let start = b.as_ptr() as usize - base;
        Section {
            map: Some(map.clone()),
            bytes: start..start + b.len(),
        }
    };
    let (eh_frame_svma, eh_frame) = section(&map, ".eh_frame").unzip();
    let (eh_frame_hdr_svma, eh_frame_hdr) = section(&map, ".eh_frame_hdr").unzip();
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: section(&map, ".text").map(|s| s.0),
        got_svma: section(&map, ".got").map(|s| s.0),
        eh_frame_svma,
        eh_frame: eh_frame.flatten().map(in_map),
        eh_frame_hdr_svma,
        eh_frame_hdr: eh_frame_hdr.flatten().map(in_map),
        ..Default::default()
    };
    let lo = m.exec.iter().map(|r| r.0).min()?;
    let hi = m.exec.iter().map(|r| r.1).max()?;
    Some(Module::new(m.path.clone(), lo..hi, m.bias, info))
}

impl State {
    fn new() -> State {
        State {
            unwinder: UnwinderX86_64::new(),
            cache: CacheX86_64::new_in(),
            loaded: Vec::new(),
            table: HashMap::with_capacity(MAX_STACKS),
            held: Vec::with_capacity(MAX_HELD),
            truncated: 0,
            dropped: 0,
        }
    }

    /// Brings the unwinder's modules up to date (reads their files: only
    /// when libraries came or went).
    fn sync(&mut self, now: Vec<ModuleFile>) {
        for gone in self.loaded.iter().filter(|m| !now.contains(m)) {
            if let Some(lo) = gone.exec.iter().map(|r| r.0).min() {
                self.unwinder.remove_module(lo);
            }
        }
        for new in now.iter().filter(|m| !self.loaded.contains(m)) {
            if let Some(module) = module_for(new) {
                self.unwinder.add_module(module);
            }
        }
        self.loaded = now;
    }

    /// Counts the stack of `n` samples at `ip`; `held`: their count waits
    /// for the module's names, and so does the stack's leaf.
    fn record(&mut self, ip: u64, sp: u64, bp: u64, stack: &[u8], n: u64, held: bool) {
        let mut read_stack = |addr: u64| {
            let off = addr.checked_sub(sp).ok_or(())? as usize;
            let b = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_le_bytes(b.try_into().map_err(|_| ())?))
        };
        // In a loop probe: unwound from the window it stands for, with the
        // stack pointer where the window's code has it.
        let (ip, at_sp) = match addrmap::probe_at(ip) {
            Some((start, origin)) => {
                // SAFETY: loop probes are never unmapped, and the probe's
                // code runs from `start` to `ip`.
                let code = unsafe {
                    std::slice::from_raw_parts(start as *const u8, (ip - start) as usize)
                };
                (
                    origin,
                    sp.wrapping_add_signed(-Native::probe_sp_shift(code, start)),
                )
            }
            None => (ip, sp),
        };
        let regs = UnwindRegsX86_64::new(ip, at_sp, bp);
        let mut frames = self
            .unwinder
            .iter_frames(ip, regs, &mut self.cache, &mut read_stack);
        let mut ats = [0u64; MAX_DEPTH];
        let mut depth = 0;
        let mut cut = false;
        // An unwinding error ends the stack where it happened.
        while let Ok(Some(frame)) = frames.next() {
            if depth == MAX_DEPTH {
                cut = true;
                break;
            }
            // A return address is the instruction after the call: the
            // byte before it is in the calling function.
            let at = match frame {
                FrameAddress::InstructionPointer(a) => a,
                FrameAddress::ReturnAddress(a) => a.get() - 1,
            };
            ats[depth] = at;
            depth += 1;
        }
        self.truncated += cut as u64;
        match held {
            // Within the room reserved up front: no allocation.
            true if self.held.len() < MAX_HELD => self.held.push(Held {
                ats,
                depth: depth as u8,
                n,
            }),
            true => self.dropped += n,
            false => self.add(&ats[..depth], n),
        }
    }

    /// Counts `n` samples for the stack of frames at `ats`, named by the
    /// address table as it is now.
    fn add(&mut self, ats: &[u64], n: u64) {
        let mut key: Key = ([UNKNOWN; MAX_DEPTH], ats.len() as u8);
        addrmap::place_ids(ats, &mut key.0[..ats.len()], UNKNOWN);
        let full = self.table.len() >= MAX_STACKS;
        match self.table.get_mut(&key) {
            Some(count) => *count += n,
            // With room reserved up front, inserting does not allocate.
            None if !full => {
                self.table.insert(key, n);
            }
            None => self.dropped += n,
        }
    }

    /// Counts the held stacks whose samples are counted now (their module
    /// named; with `all`, every one: at exit, after the last drain), named
    /// by the address table as the count was.
    fn settle_held(&mut self, all: bool) {
        let mut i = 0;
        while i < self.held.len() {
            let h = &self.held[i];
            let waiting = h.depth > 0 && addrmap::named_on_demand_at(h.ats[0]).is_some();
            if waiting && !all {
                i += 1;
                continue;
            }
            let h = self.held.swap_remove(i);
            self.add(&h.ats[..h.depth as usize], h.n);
        }
    }
}

/// Held samples were counted (drain thread, after `held::settle`): their
/// stacks are counted too.
pub fn held_settled() {
    // A handler may be unwinding for a moment.
    for _ in 0..1000 {
        let done = STATE.try_with(|st| {
            if let Some(s) = st.as_mut() {
                s.settle_held(false);
            }
        });
        if done.is_some() {
            return;
        }
        std::thread::yield_now();
    }
}

/// Counts the stack of one sample (drain thread): `ip`, `sp` and `bp` as
/// the sample's registers say, `stack` the bytes copied from `sp` up.
pub fn record(ip: u64, sp: u64, bp: u64, stack: &[u8]) {
    // Modules were loaded where they changed (`modules_changed`): the drain
    // thread opens no file.
    STATE.try_with(|state| {
        if let Some(s) = state.as_mut() {
            s.record(ip, sp, bp, stack, 1, false);
        }
    });
}

/// The stacks counted so far, as text: a first line
/// `rtprof-stacks 1 <truncated> <dropped>`, then one line per stack:
/// its samples, then its frames leaf first.
pub fn text() -> Option<String> {
    // At exit the drain thread may be counting a last sample: waited for
    // a little, never for ever.
    for _ in 0..1000 {
        let text = STATE.try_with(|s| {
            s.as_mut().map(|s| {
                s.settle_held(true);
                s.text()
            })
        });
        if let Some(t) = text {
            return t;
        }
        std::thread::yield_now();
    }
    None
}

impl State {
    fn text(&self) -> String {
        use std::fmt::Write as _;
        let mut out = format!("rtprof-stacks 1 {} {}\n", self.truncated, self.dropped);
        for (key, n) in &self.table {
            let _ = write!(out, "{n}");
            for f in &key.0[..key.1 as usize] {
                let _ = write!(out, " {f}");
            }
            out.push('\n');
        }
        out
    }
}

/// In a forked child (one thread, allocation-free): the parent's stacks
/// are not the child's.
pub fn forget_in_child() {
    PENDING.reset_in_child();
    STATE.reset_in_child();
    STATE.try_with(|s| {
        if let Some(s) = s.as_mut() {
            // Keys and counts are plain values: nothing is freed.
            s.table.clear();
            s.held.clear();
            s.truncated = 0;
            s.dropped = 0;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_are_counted_by_their_frames_and_bounded() {
        let mut s = State::new();
        // No modules: the unwinder gives the sampled address alone.
        for _ in 0..3 {
            s.record(0x1234, 0x7000, 0, &[0; 64], 1, false);
        }
        assert_eq!(s.table.len(), 1);
        let (key, n) = s.table.iter().next().unwrap();
        assert_eq!((*n, key.1), (3, 1));
        assert_eq!(key.0[0], UNKNOWN, "no address table: unknown");
        assert!(s.text().starts_with("rtprof-stacks 1 0 0\n3 4294967295\n"));
        // A full table still counts the stacks it has, and drops new ones.
        s.table.clear();
        for i in 0..MAX_STACKS as u32 {
            s.table.insert(([i; MAX_DEPTH], 1), 1);
        }
        s.record(0x1234, 0x7000, 0, &[0; 64], 1, false);
        assert_eq!((s.dropped, s.table.len()), (1, MAX_STACKS));
        s.table.insert(([UNKNOWN; MAX_DEPTH], 1), 1);
        s.record(0x1234, 0x7000, 0, &[0; 64], 1, false);
        assert_eq!(s.dropped, 1);
    }

    /// A held sample's stack waits outside the table until settled (the
    /// address table names no module on demand here: at once), and the
    /// list of waiting stacks is bounded.
    #[test]
    fn held_stacks_wait_and_are_bounded() {
        let mut s = State::new();
        for _ in 0..MAX_HELD + 2 {
            s.record(0x1234, 0x7000, 0, &[0; 64], 2, true);
        }
        assert_eq!((s.table.len(), s.held.len(), s.dropped), (0, MAX_HELD, 4));
        s.settle_held(false);
        assert!(s.held.is_empty());
        let (key, n) = s.table.iter().next().unwrap();
        assert_eq!((*n, key.1, key.0[0]), (2 * MAX_HELD as u64, 1, UNKNOWN));
    }

    /// The header-only section reader finds what goblin's full parse finds.
    #[test]
    fn sections_are_read_from_the_headers() {
        let data = std::fs::read("/proc/self/exe").unwrap();
        let elf = goblin::elf::Elf::parse(&data).unwrap();
        for name in [".eh_frame", ".eh_frame_hdr", ".text"] {
            let sh = elf
                .section_headers
                .iter()
                .find(|s| elf.shdr_strtab.get_at(s.sh_name) == Some(name))
                .unwrap();
            let (range, bytes) = section(&data, name).unwrap();
            assert_eq!(range, sh.sh_addr..sh.sh_addr + sh.sh_size, "{name}");
            assert_eq!(bytes.map(<[u8]>::len), Some(sh.sh_size as usize), "{name}");
        }
        assert!(section(&data, ".no_such_section").is_none());
        assert!(section(b"not an elf file at all, not at all", ".text").is_none());
        assert!(section(&data[..100], ".text").is_none());
    }
}
