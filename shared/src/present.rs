//! The presentation segment: what `rtprofd` publishes every tick for
//! schedulers to read. Two buffers and a generation counter: the daemon
//! writes the buffer readers are not using, then flips the generation, so
//! a reader never waits and never sees a half-written table; each buffer
//! also carries a sequence number (odd while written) so a reader that was
//! lapped by two publishes notices and retries.
//!
//! ```text
//! [PresentHeader][buffer 0][buffer 1]
//! buffer: [BufferHeader][ProcEntry x procs][Row x rows][u32 x hash_cap][strings]
//! ```
//!
//! Rows of each process are contiguous (`ProcEntry::first_row`); after them
//! come the global rows (same executable and function merged across
//! processes), indexed by an open-addressing hash of (executable, name).
//! Little-endian, fixed widths; readers check every offset and count.
//!
//! Each buffer carries the time it was published (`publish_ns`), so a
//! reader can tell a live daemon's table from the last one of a daemon that
//! died: the file stays behind with its last span in it.
//!
//! Version 2 added `BufferHeader::publish_ns` (the buffer header grew from
//! 64 to 128 bytes). `shared/c/rtprof_present.c` is the C reader of the
//! same layout: change both together.

use std::mem::size_of;
use std::path::Path;
use std::sync::atomic::{fence, AtomicU64, Ordering};

pub const MAGIC: [u8; 8] = *b"RTPROFP\0";
pub const VERSION: u32 = 2;
const EMPTY: u32 = u32::MAX;

/// A table is stale once it is older than this many ticks (plus
/// [`STALE_SLACK_NS`]): the daemon has stopped publishing.
pub const STALE_TICKS: u64 = 3;
/// Slack for a daemon delayed by a busy machine.
pub const STALE_SLACK_NS: u64 = 1_000_000_000;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PresentHeader {
    pub magic: [u8; 8],
    pub version: u32,
    pub header_size: u32,
    pub total_size: u64,
    /// Publishes so far; buffer `generation & 1` is the current one.
    pub generation: u64,
    pub buffer_off: [u64; 2],
    pub buffer_len: u64,
    pub tick_ns: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BufferHeader {
    /// Odd while the daemon writes this buffer.
    pub seq: u64,
    /// CLOCK_REALTIME at the end of the span, and its nominal length.
    pub span_end_ns: u64,
    pub span_ns: u64,
    /// CLOCK_REALTIME when the writer published this buffer (stamped by
    /// [`PresentWriter::publish`] itself).
    pub publish_ns: u64,
    pub proc_count: u32,
    pub row_count: u32,
    pub global_first: u32,
    pub global_count: u32,
    pub hash_cap: u32,
    pub strings_len: u32,
    pub procs_off: u32,
    pub rows_off: u32,
    pub hash_off: u32,
    pub strings_off: u32,
    pub reserved: [u64; 7],
}

/// `ProcEntry::flags`: the process ended; these are its last counts.
pub const PROC_ENDED: u32 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcEntry {
    pub pid: u32,
    pub flags: u32,
    pub exe_off: u32,
    pub exe_len: u32,
    pub first_row: u32,
    pub row_count: u32,
    /// The span this process really covers (shorter if it is younger).
    pub span_ns: u64,
    pub samples: u64,
    pub period_ns: u64,
    pub lost: u64,
    pub reserved: u64,
}

/// `Row::flags`: calls are counted (the function is instrumented).
pub const ROW_COUNTED: u32 = 1;
/// `Row::flags`: a global row (its `proc_index` names the first process
/// of its executable).
pub const ROW_GLOBAL: u32 = 2;
/// `Row::flags`: its calls are estimated (counted in bursts under an
/// overhead budget), not exact.
pub const ROW_ESTIMATED: u32 = 4;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Row {
    pub name_off: u32,
    pub name_len: u32,
    pub module_off: u32,
    pub module_len: u32,
    /// Index of the process (of the first process of the executable, in a
    /// global row).
    pub proc_index: u32,
    pub flags: u32,
    /// Over the span.
    pub calls: u64,
    pub samples: u64,
    pub time_ns: u64,
    /// Since the process started (summed over processes in a global row).
    pub total_calls: u64,
    /// Checksum of the fields above: a torn row cannot pass.
    pub check: u64,
}

const _: () = assert!(size_of::<PresentHeader>() == 64);
const _: () = assert!(size_of::<BufferHeader>() == 128);
const _: () = assert!(size_of::<ProcEntry>() == 64);
const _: () = assert!(size_of::<Row>() == 64);

impl Row {
    pub fn checksum(&self) -> u64 {
        let words = [
            self.name_off as u64 | (self.name_len as u64) << 32,
            self.module_off as u64 | (self.module_len as u64) << 32,
            self.proc_index as u64 | (self.flags as u64) << 32,
            self.calls,
            self.samples,
            self.time_ns,
            self.total_calls,
        ];
        words.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, w| {
            (h ^ w).wrapping_mul(0x100_0000_01b3).rotate_left(17)
        })
    }
}

/// FNV-1a over executable, a zero byte, and function name.
pub fn key_hash(exe: &str, name: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in exe.bytes().chain([0]).chain(name.bytes()) {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    h
}

fn hash_cap(globals: usize) -> u32 {
    (globals * 2).next_power_of_two().max(8) as u32
}

/// What the daemon publishes for one process. Borrows its strings: the
/// daemon builds these every tick from names it already holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcTable<'a> {
    pub pid: u32,
    pub exe: &'a str,
    pub ended: bool,
    pub span_ns: u64,
    pub samples: u64,
    pub period_ns: u64,
    pub lost: u64,
    pub rows: Vec<RowIn<'a>>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct RowIn<'a> {
    pub name: &'a str,
    pub module: &'a str,
    /// `key_hash(exe, name)`, when the caller has it at hand; `None`:
    /// computed here.
    pub key: Option<u32>,
    pub counted: bool,
    /// Calls estimated under an overhead budget.
    pub estimated: bool,
    pub calls: u64,
    pub samples: u64,
    pub time_ns: u64,
    pub total_calls: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PresentError {
    TooShort,
    BadMagic,
    UnsupportedVersion(u32),
    BadRegion(&'static str),
    /// Row `row` of the current buffer does not match its checksum: the
    /// segment was corrupted (a torn write cannot reach a reader, the
    /// buffer's sequence number rules that out).
    BadChecksum {
        row: u32,
    },
    /// The daemon kept rewriting the buffer while we read (retries exhausted).
    Busy,
    /// The table does not fit in a buffer of this segment.
    TooLarge {
        need: u64,
        have: u64,
    },
    NotPublished,
}

impl std::fmt::Display for PresentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PresentError::TooShort => f.write_str("presentation segment truncated"),
            PresentError::BadMagic => f.write_str("not an rtprof presentation segment"),
            PresentError::UnsupportedVersion(v) => write!(
                f,
                "presentation segment version {v}, this reader knows version {VERSION} \
                 (rtprofd and its readers come from different rtprof builds)"
            ),
            PresentError::BadRegion(r) => write!(f, "{r} out of bounds"),
            PresentError::BadChecksum { row } => {
                write!(
                    f,
                    "row {row} does not match its checksum (corrupted segment)"
                )
            }
            PresentError::Busy => f.write_str("segment rewritten during every read attempt"),
            PresentError::TooLarge { need, have } => {
                write!(f, "table needs {need} bytes, buffers have {have}")
            }
            PresentError::NotPublished => f.write_str("nothing published yet"),
        }
    }
}

impl std::error::Error for PresentError {}

/// Why a presentation segment file cannot be opened.
#[derive(Debug)]
pub enum OpenError {
    Io(std::io::Error),
    /// Not a regular file: "a directory", "a FIFO", ...
    NotRegular(&'static str),
    /// Smaller than the segment's header.
    TooSmall(u64),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Io(e) => e.fmt(f),
            OpenError::NotRegular(kind) => write!(
                f,
                "is {kind}, not a presentation segment (rtprofd writes a regular file)"
            ),
            OpenError::TooSmall(n) => {
                write!(f, "{n} bytes, too small to be a presentation segment")
            }
        }
    }
}

impl std::error::Error for OpenError {}

/// Opens a presentation segment file for reading, to be mapped by the
/// caller. Refuses what is not a regular file: a FIFO would block the open
/// (it is opened non-blocking, then checked) and a directory or device
/// cannot be mapped as a segment.
pub fn open_file(path: &Path) -> Result<std::fs::File, OpenError> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    // O_NONBLOCK (Linux): opening a FIFO must not wait for a writer.
    const O_NONBLOCK: i32 = 0o4000;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_NONBLOCK)
        .open(path)
        .map_err(OpenError::Io)?;
    let m = f.metadata().map_err(OpenError::Io)?;
    let t = m.file_type();
    let kind = if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else {
        Some("something other than a regular file")
    };
    if let Some(k) = kind {
        return Err(OpenError::NotRegular(k));
    }
    if m.len() < size_of::<PresentHeader>() as u64 {
        return Err(OpenError::TooSmall(m.len()));
    }
    Ok(f)
}

/// CLOCK_REALTIME in nanoseconds, the clock `publish_ns` is stamped with.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// How old a table published at `publish_ns` is at `now_ns` (0 if the
/// clock went back), and whether that is more than a few ticks of
/// `tick_ns`: the daemon stopped publishing.
pub fn age(publish_ns: u64, tick_ns: u64, now_ns: u64) -> (u64, bool) {
    let age = now_ns.saturating_sub(publish_ns);
    let limit = tick_ns
        .saturating_mul(STALE_TICKS)
        .saturating_add(STALE_SLACK_NS);
    (age, age > limit)
}

/// Total segment size for buffers of `buffer_len` bytes.
pub fn segment_bytes(buffer_len: u64) -> u64 {
    64 + 2 * buffer_len.next_multiple_of(64)
}

/// The daemon's side.
pub struct PresentWriter {
    base: *mut u8,
    header: PresentHeader,
    /// Kept between publishes: a tick allocates nothing once these grew.
    scratch: Scratch,
}

#[derive(Default)]
struct Scratch {
    strings: Vec<u8>,
    entries: Vec<ProcEntry>,
    rows: Vec<Row>,
    globals: Vec<Row>,
    global_exe: Vec<u32>,
    hash: Vec<u32>,
}

// SAFETY: the writer is the segment's only writer and owns its scratch;
// `base` stays valid for its life (`init`'s contract), whichever thread
// holds it.
unsafe impl Send for PresentWriter {}

impl PresentWriter {
    /// Initialises a segment of `len` bytes at `base` (zeroed, 8-aligned).
    ///
    /// # Safety
    /// `base` must point to `len` writable bytes that outlive the writer.
    pub unsafe fn init(base: *mut u8, len: u64, tick_ns: u64) -> PresentWriter {
        let buffer_len = ((len.saturating_sub(64)) / 2) / 64 * 64;
        let header = PresentHeader {
            magic: MAGIC,
            version: VERSION,
            header_size: 64,
            total_size: len,
            generation: 0,
            buffer_off: [64, 64 + buffer_len],
            buffer_len,
            tick_ns,
        };
        // SAFETY: the caller gives `len` writable, 8-aligned bytes; the
        // header is the first 64 (a shorter segment gets buffers of length
        // 0, which every publish then refuses as too large).
        std::ptr::write_volatile(base as *mut PresentHeader, header);
        PresentWriter {
            base,
            header,
            scratch: Scratch::default(),
        }
    }

    fn word(&self, off: u64) -> &AtomicU64 {
        // SAFETY: callers pass the generation word or a buffer's first
        // word: 8-aligned offsets inside the segment `init` was given.
        unsafe { &*(self.base.add(off as usize) as *const AtomicU64) }
    }

    /// Publishes a span's table: written into the idle buffer, then made
    /// current.
    pub fn publish(
        &mut self,
        span_end_ns: u64,
        span_ns: u64,
        procs: &[ProcTable],
    ) -> Result<(), PresentError> {
        let gen_off = std::mem::offset_of!(PresentHeader, generation) as u64;
        let gen = self.word(gen_off).load(Ordering::Relaxed);
        let b = ((gen + 1) & 1) as usize;
        let boff = self.header.buffer_off[b];
        let (mut hdr, need) = build(&mut self.scratch, span_end_ns, span_ns, procs);
        // Stamped here, not by the caller: the time readers judge the
        // daemon's liveness by is when the table really became current.
        hdr.publish_ns = now_ns();
        if need > self.header.buffer_len {
            return Err(PresentError::TooLarge {
                need,
                have: self.header.buffer_len,
            });
        }
        let seq = self.word(boff);
        let s = seq.load(Ordering::Relaxed);
        seq.store(s | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        // Straight into the idle buffer: header after the sequence word,
        // then each region in one copy.
        let sc = &self.scratch;
        // SAFETY: `need` (the end of the last region) fits in the buffer,
        // checked above, so every region starts and ends inside it.
        let at = |off: u32| unsafe { self.base.add(boff as usize + off as usize) };
        // SAFETY: as above; the scratch vectors do not overlap the segment.
        unsafe {
            let h = as_bytes(std::slice::from_ref(&hdr));
            std::ptr::copy_nonoverlapping(h.as_ptr().add(8), at(8), h.len() - 8);
            for (off, bytes) in [
                (hdr.procs_off, as_bytes(&sc.entries)),
                (hdr.rows_off, as_bytes(&sc.rows)),
                (hdr.hash_off, as_bytes(&sc.hash)),
                (hdr.strings_off, &sc.strings[..]),
            ] {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), at(off), bytes.len());
            }
        }
        seq.store((s | 1) + 1, Ordering::Release);
        self.word(gen_off).store(gen + 1, Ordering::Release);
        Ok(())
    }
}

/// The bytes of plain `repr(C)` records.
fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: `T` is one of this module's `repr(C)` records of integers,
    // with no padding (their sizes are asserted above).
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// One buffer's regions, in `sc`, and the header that places them.
///
/// Global rows are merged while the process rows are written: a
/// (executable, name) key is looked up in the very hash index that is
/// published, sized for the worst case of every row being distinct.
/// Executables and modules are interned; function names are written once
/// per process row and shared by the global row.
fn build<'a>(
    sc: &mut Scratch,
    span_end_ns: u64,
    span_ns: u64,
    procs: &[ProcTable<'a>],
) -> (BufferHeader, u64) {
    let Scratch {
        strings,
        entries,
        rows,
        globals,
        global_exe,
        hash,
    } = sc;
    strings.clear();
    entries.clear();
    rows.clear();
    globals.clear();
    // Executable string offset of each global row, to tell keys apart.
    global_exe.clear();
    let mut interned = std::collections::HashMap::<&str, (u32, u32)>::new();
    let mut intern = |strings: &mut Vec<u8>, s: &'a str| -> (u32, u32) {
        *interned.entry(s).or_insert_with(|| push_str(strings, s))
    };
    let total_rows: usize = procs.iter().map(|p| p.rows.len()).sum();
    let global_first = total_rows as u32;
    let cap = hash_cap(total_rows);
    hash.clear();
    hash.resize(cap as usize, EMPTY);
    for (pi, p) in procs.iter().enumerate() {
        let (exe_off, exe_len) = intern(strings, p.exe);
        entries.push(ProcEntry {
            pid: p.pid,
            flags: if p.ended { PROC_ENDED } else { 0 },
            exe_off,
            exe_len,
            first_row: rows.len() as u32,
            row_count: p.rows.len() as u32,
            span_ns: p.span_ns,
            samples: p.samples,
            period_ns: p.period_ns,
            lost: p.lost,
            reserved: 0,
        });
        // Rows of a process mostly share a few modules: skip the lookup.
        let mut last_module: (&str, (u32, u32)) = ("", (0, 0));
        for r in &p.rows {
            if !std::ptr::eq(r.module, last_module.0) {
                last_module = (r.module, intern(strings, r.module));
            }
            let (module_off, module_len) = last_module.1;
            let key = r.key.unwrap_or_else(|| key_hash(p.exe, r.name));
            // Find the global row of (exe, name), or claim an empty slot.
            let mut h = key & (cap - 1);
            let found = loop {
                let ix = hash[h as usize];
                if ix == EMPTY {
                    break None;
                }
                let g = &globals[(ix - global_first) as usize];
                let gname = &strings[g.name_off as usize..(g.name_off + g.name_len) as usize];
                if global_exe[(ix - global_first) as usize] == exe_off && gname == r.name.as_bytes()
                {
                    break Some(ix - global_first);
                }
                h = (h + 1) & (cap - 1);
            };
            let (name_off, name_len) = match found {
                Some(gi) => (globals[gi as usize].name_off, globals[gi as usize].name_len),
                None => push_str(strings, r.name),
            };
            let row = Row {
                name_off,
                name_len,
                module_off,
                module_len,
                proc_index: pi as u32,
                flags: if r.counted { ROW_COUNTED } else { 0 }
                    | if r.estimated { ROW_ESTIMATED } else { 0 },
                calls: r.calls,
                samples: r.samples,
                time_ns: r.time_ns,
                total_calls: r.total_calls,
                check: 0,
            };
            rows.push(row);
            let g = match found {
                Some(gi) => &mut globals[gi as usize],
                None => {
                    hash[h as usize] = global_first + globals.len() as u32;
                    global_exe.push(exe_off);
                    globals.push(Row {
                        flags: ROW_GLOBAL,
                        calls: 0,
                        samples: 0,
                        time_ns: 0,
                        total_calls: 0,
                        ..row
                    });
                    globals.last_mut().unwrap()
                }
            };
            g.calls += row.calls;
            g.samples += row.samples;
            g.time_ns += row.time_ns;
            g.total_calls += row.total_calls;
            g.flags |= row.flags;
        }
    }
    let global_count = globals.len() as u32;
    rows.append(globals);
    let procs_off = size_of::<BufferHeader>();
    let rows_off = procs_off + entries.len() * 64;
    let hash_off = rows_off + rows.len() * 64;
    let strings_off = hash_off + hash.len() * 4;
    for r in rows.iter_mut() {
        r.check = r.checksum();
    }
    // Offsets are 32-bit: a larger table cannot be published at all.
    let need = (strings_off + strings.len()) as u64;
    let need = if need > u32::MAX as u64 {
        u64::MAX
    } else {
        need
    };
    let h = BufferHeader {
        seq: 0,
        span_end_ns,
        span_ns,
        publish_ns: 0,
        proc_count: entries.len() as u32,
        row_count: rows.len() as u32,
        global_first,
        global_count,
        hash_cap: cap,
        strings_len: strings.len() as u32,
        procs_off: procs_off as u32,
        rows_off: rows_off as u32,
        hash_off: hash_off as u32,
        strings_off: strings_off as u32,
        reserved: [0; 7],
    };
    (h, need)
}

fn push_str(strings: &mut Vec<u8>, s: &str) -> (u32, u32) {
    let off = strings.len() as u32;
    strings.extend_from_slice(s.as_bytes());
    (off, s.len() as u32)
}

/// A row as a reader sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct RowView {
    pub name: String,
    pub module: String,
    /// Index into [`View::procs`]; `None` for a global row.
    pub proc_index: Option<usize>,
    /// The process it belongs to; for a global row, the first process of
    /// its executable.
    pub owner: usize,
    /// Calls are counted (instrumented); otherwise only sampled.
    pub counted: bool,
    /// Calls estimated under an overhead budget, not exact.
    pub estimated: bool,
    pub calls: u64,
    pub samples: u64,
    pub time_ns: u64,
    pub total_calls: u64,
}

impl RowView {
    /// Estimated time per call over the span.
    pub fn ns_per_call(&self) -> Option<f64> {
        (self.counted && self.calls > 0 && self.samples > 0)
            .then(|| self.time_ns as f64 / self.calls as f64)
    }
    /// Calls per second over a span of `span_ns`.
    pub fn calls_per_s(&self, span_ns: u64) -> f64 {
        if span_ns == 0 {
            0.0
        } else {
            self.calls as f64 * 1e9 / span_ns as f64
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ProcView {
    pub pid: u32,
    pub exe: String,
    pub ended: bool,
    pub span_ns: u64,
    pub samples: u64,
    pub period_ns: u64,
    pub lost: u64,
    /// Its rows in [`View::rows`].
    pub rows: std::ops::Range<usize>,
}

/// One consistent span table.
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    pub generation: u64,
    pub span_end_ns: u64,
    pub span_ns: u64,
    /// CLOCK_REALTIME when the daemon published this table.
    pub publish_ns: u64,
    /// The daemon's tick (from the segment header).
    pub tick_ns: u64,
    pub procs: Vec<ProcView>,
    /// Per-process rows, then the global rows (`global`).
    pub rows: Vec<RowView>,
    pub global: std::ops::Range<usize>,
}

impl View {
    pub fn process(&self, pid: u32) -> Option<(&ProcView, &[RowView])> {
        let p = self.procs.iter().find(|p| p.pid == pid)?;
        Some((p, &self.rows[p.rows.clone()]))
    }
    pub fn global_rows(&self) -> &[RowView] {
        &self.rows[self.global.clone()]
    }
    /// The executable a row belongs to.
    pub fn exe_of(&self, r: &RowView) -> Option<&str> {
        self.procs.get(r.owner).map(|p| p.exe.as_str())
    }
    /// How old the table is at `now_ns` (CLOCK_REALTIME, see [`now_ns`]),
    /// and whether it is stale (older than a few ticks: the daemon that
    /// published it is gone or stuck).
    pub fn age(&self, now_ns: u64) -> (u64, bool) {
        age(self.publish_ns, self.tick_ns, now_ns)
    }
}

fn get<T: Copy + Default>(b: &[u8], off: usize) -> Result<T, PresentError> {
    let end = off
        .checked_add(size_of::<T>())
        .ok_or(PresentError::BadRegion("record"))?;
    let s = b.get(off..end).ok_or(PresentError::BadRegion("record"))?;
    // SAFETY: `s` holds exactly `size_of::<T>()` bytes, and every `T` read
    // here is a record of plain integers, valid for any bit pattern.
    Ok(unsafe { std::ptr::read_unaligned(s.as_ptr() as *const T) })
}

/// Validated access to one buffer's bytes (which may change under us: the
/// caller checks the sequence afterwards and discards what was read).
struct Buffer<'a> {
    b: &'a [u8],
    h: BufferHeader,
}

impl<'a> Buffer<'a> {
    fn new(b: &'a [u8]) -> Result<Buffer<'a>, PresentError> {
        let h: BufferHeader = get(b, 0)?;
        let len = b.len() as u64;
        let within = |off: u32, n: u64, what| {
            (off as u64)
                .checked_add(n)
                .filter(|&e| e <= len)
                .map(|_| ())
                .ok_or(PresentError::BadRegion(what))
        };
        within(h.procs_off, h.proc_count as u64 * 64, "processes")?;
        within(h.rows_off, h.row_count as u64 * 64, "rows")?;
        within(h.hash_off, h.hash_cap as u64 * 4, "hash index")?;
        within(h.strings_off, h.strings_len as u64, "strings")?;
        if h.global_first.checked_add(h.global_count) != Some(h.row_count)
            || !h.hash_cap.is_power_of_two()
        {
            return Err(PresentError::BadRegion("global rows"));
        }
        Ok(Buffer { b, h })
    }
    fn string(&self, off: u32, len: u32) -> Result<String, PresentError> {
        let end = off
            .checked_add(len)
            .filter(|&e| e <= self.h.strings_len)
            .ok_or(PresentError::BadRegion("string"))?;
        let base = self.h.strings_off as usize;
        Ok(String::from_utf8_lossy(&self.b[base + off as usize..base + end as usize]).into_owned())
    }
    fn proc(&self, i: u32) -> Result<ProcView, PresentError> {
        let e: ProcEntry = get(self.b, self.h.procs_off as usize + i as usize * 64)?;
        let end = e.first_row.checked_add(e.row_count);
        if end.is_none_or(|e| e > self.h.global_first) {
            return Err(PresentError::BadRegion("process rows"));
        }
        Ok(ProcView {
            pid: e.pid,
            exe: self.string(e.exe_off, e.exe_len)?,
            ended: e.flags & PROC_ENDED != 0,
            span_ns: e.span_ns,
            samples: e.samples,
            period_ns: e.period_ns,
            lost: e.lost,
            rows: e.first_row as usize..(e.first_row + e.row_count) as usize,
        })
    }
    fn row(&self, i: u32) -> Result<RowView, PresentError> {
        if i >= self.h.row_count {
            return Err(PresentError::BadRegion("row index"));
        }
        let r: Row = get(self.b, self.h.rows_off as usize + i as usize * 64)?;
        if r.check != r.checksum() {
            return Err(PresentError::BadChecksum { row: i });
        }
        if r.proc_index >= self.h.proc_count {
            return Err(PresentError::BadRegion("row process"));
        }
        Ok(RowView {
            name: self.string(r.name_off, r.name_len)?,
            module: self.string(r.module_off, r.module_len)?,
            proc_index: (r.flags & ROW_GLOBAL == 0).then_some(r.proc_index as usize),
            owner: r.proc_index as usize,
            counted: r.flags & ROW_COUNTED != 0,
            estimated: r.flags & ROW_ESTIMATED != 0,
            calls: r.calls,
            samples: r.samples,
            time_ns: r.time_ns,
            total_calls: r.total_calls,
        })
    }
}

fn header(bytes: &[u8]) -> Result<PresentHeader, PresentError> {
    if bytes.len() < 64 {
        return Err(PresentError::TooShort);
    }
    // The generation and sequence words are read as atomics.
    if !(bytes.as_ptr() as usize).is_multiple_of(8) {
        return Err(PresentError::BadRegion("segment alignment"));
    }
    let h: PresentHeader = get(bytes, 0)?;
    if h.magic != MAGIC {
        return Err(PresentError::BadMagic);
    }
    if h.version != VERSION {
        return Err(PresentError::UnsupportedVersion(h.version));
    }
    if h.buffer_len < size_of::<BufferHeader>() as u64 {
        return Err(PresentError::BadRegion("buffer length"));
    }
    for off in h.buffer_off {
        if off % 8 != 0
            || off
                .checked_add(h.buffer_len)
                .is_none_or(|e| e > bytes.len() as u64)
            || off < 64
        {
            return Err(PresentError::BadRegion("buffer"));
        }
    }
    Ok(h)
}

/// Runs `f` on the current buffer until it ran on one the daemon did not
/// touch meanwhile.
fn consistent<T>(
    bytes: &[u8],
    mut f: impl FnMut(&Buffer, u64, &PresentHeader) -> Result<T, PresentError>,
) -> Result<T, PresentError> {
    let h = header(bytes)?;
    // SAFETY: `header` checked that `bytes` is 8-aligned and that the
    // generation word and both buffers (whose first word is the sequence
    // number, at 8-aligned offsets) lie inside it.
    let word = |off: u64| unsafe { &*(bytes.as_ptr().add(off as usize) as *const AtomicU64) };
    let gen_word = word(std::mem::offset_of!(PresentHeader, generation) as u64);
    for _ in 0..1000 {
        let gen = gen_word.load(Ordering::Acquire);
        if gen == 0 {
            return Err(PresentError::NotPublished);
        }
        let off = h.buffer_off[(gen & 1) as usize];
        let seq = word(off);
        let s1 = seq.load(Ordering::Acquire);
        if s1 % 2 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let buf = &bytes[off as usize..(off + h.buffer_len) as usize];
        let r = Buffer::new(buf).and_then(|b| f(&b, gen, &h));
        fence(Ordering::Acquire);
        if seq.load(Ordering::Relaxed) == s1 {
            return r;
        }
    }
    Err(PresentError::Busy)
}

/// The whole current table.
pub fn read_view(bytes: &[u8]) -> Result<View, PresentError> {
    consistent(bytes, |b, generation, h| {
        let procs = (0..b.h.proc_count)
            .map(|i| b.proc(i))
            .collect::<Result<Vec<_>, _>>()?;
        let rows = (0..b.h.row_count)
            .map(|i| b.row(i))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(View {
            generation,
            span_end_ns: b.h.span_end_ns,
            span_ns: b.h.span_ns,
            publish_ns: b.h.publish_ns,
            tick_ns: h.tick_ns,
            procs,
            rows,
            global: b.h.global_first as usize..b.h.row_count as usize,
        })
    })
}

/// One process's rows from the current table, without reading the rest.
pub fn read_process(
    bytes: &[u8],
    pid: u32,
) -> Result<Option<(ProcView, Vec<RowView>)>, PresentError> {
    consistent(bytes, |b, _, _| {
        for i in 0..b.h.proc_count {
            let e: ProcEntry = get(b.b, b.h.procs_off as usize + i as usize * 64)?;
            if e.pid != pid {
                continue;
            }
            let p = b.proc(i)?;
            let rows = p
                .rows
                .clone()
                .map(|r| b.row(r as u32))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(Some((p, rows)));
        }
        Ok(None)
    })
}

/// One process's rows, copied out of the current table into buffers that
/// are reused from one read to the next: a scheduler polling a process
/// every tick allocates nothing once they have grown.
#[derive(Clone, Debug, Default)]
pub struct ProcessRows {
    /// The publish it was read from, when, and the daemon's tick.
    pub generation: u64,
    pub publish_ns: u64,
    pub tick_ns: u64,
    pub pid: u32,
    pub ended: bool,
    pub span_ns: u64,
    pub samples: u64,
    pub period_ns: u64,
    pub lost: u64,
    exe: (u32, u32),
    /// Rows with name and module offsets into `strings`.
    rows: Vec<Row>,
    strings: Vec<u8>,
}

/// A row of [`ProcessRows`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowRef<'a> {
    pub name: &'a str,
    pub module: &'a str,
    pub counted: bool,
    pub estimated: bool,
    pub calls: u64,
    pub samples: u64,
    pub time_ns: u64,
    pub total_calls: u64,
}

impl ProcessRows {
    fn text(&self, (off, len): (u32, u32)) -> &str {
        std::str::from_utf8(&self.strings[off as usize..(off + len) as usize]).unwrap_or("?")
    }
    pub fn exe(&self) -> &str {
        self.text(self.exe)
    }
    /// Age and staleness at `now_ns`, as [`View::age`].
    pub fn age(&self, now_ns: u64) -> (u64, bool) {
        age(self.publish_ns, self.tick_ns, now_ns)
    }
    pub fn len(&self) -> usize {
        self.rows.len()
    }
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
    /// Rows by estimated time, hottest first (as published).
    pub fn rows(&self) -> impl Iterator<Item = RowRef<'_>> {
        self.rows.iter().map(|r| RowRef {
            name: self.text((r.name_off, r.name_len)),
            module: self.text((r.module_off, r.module_len)),
            counted: r.flags & ROW_COUNTED != 0,
            estimated: r.flags & ROW_ESTIMATED != 0,
            calls: r.calls,
            samples: r.samples,
            time_ns: r.time_ns,
            total_calls: r.total_calls,
        })
    }
}

/// Reads the rows of process `pid` from the current table into `out`;
/// `false` if the table has no such process.
pub fn read_process_into(
    bytes: &[u8],
    pid: u32,
    out: &mut ProcessRows,
) -> Result<bool, PresentError> {
    consistent(bytes, |b, generation, h| {
        out.rows.clear();
        out.strings.clear();
        let Some(i) = (0..b.h.proc_count).find(|&i| {
            get::<u32>(b.b, b.h.procs_off as usize + i as usize * 64).is_ok_and(|p| p == pid)
        }) else {
            return Ok(false);
        };
        let e: ProcEntry = get(b.b, b.h.procs_off as usize + i as usize * 64)?;
        if e.first_row
            .checked_add(e.row_count)
            .is_none_or(|end| end > b.h.global_first)
        {
            return Err(PresentError::BadRegion("process rows"));
        }
        let copy = |strings: &mut Vec<u8>, off: u32, len: u32| {
            let end = off
                .checked_add(len)
                .filter(|&e| e <= b.h.strings_len)
                .ok_or(PresentError::BadRegion("string"))?;
            let base = b.h.strings_off as usize;
            let at = strings.len() as u32;
            strings.extend_from_slice(&b.b[base + off as usize..base + end as usize]);
            Ok::<_, PresentError>((at, len))
        };
        out.exe = copy(&mut out.strings, e.exe_off, e.exe_len)?;
        for ix in e.first_row..e.first_row + e.row_count {
            let mut r: Row = get(b.b, b.h.rows_off as usize + ix as usize * 64)?;
            if r.check != r.checksum() {
                return Err(PresentError::BadChecksum { row: ix });
            }
            (r.name_off, r.name_len) = copy(&mut out.strings, r.name_off, r.name_len)?;
            (r.module_off, r.module_len) = copy(&mut out.strings, r.module_off, r.module_len)?;
            out.rows.push(r);
        }
        out.generation = generation;
        out.publish_ns = b.h.publish_ns;
        out.tick_ns = h.tick_ns;
        out.pid = e.pid;
        out.ended = e.flags & PROC_ENDED != 0;
        out.span_ns = e.span_ns;
        out.samples = e.samples;
        out.period_ns = e.period_ns;
        out.lost = e.lost;
        Ok(true)
    })
}

/// The global row of `name` in executable `exe`, through the hash index.
pub fn lookup(bytes: &[u8], exe: &str, name: &str) -> Result<Option<RowView>, PresentError> {
    consistent(bytes, |b, _, _| {
        let cap = b.h.hash_cap;
        let mut h = key_hash(exe, name) & (cap - 1);
        for _ in 0..cap {
            let ix: u32 = get(b.b, b.h.hash_off as usize + h as usize * 4)?;
            if ix == EMPTY {
                return Ok(None);
            }
            if ix < b.h.global_first {
                return Err(PresentError::BadRegion("hash entry"));
            }
            let r0: Row = get(b.b, b.h.rows_off as usize + ix as usize * 64)?;
            if r0.proc_index >= b.h.proc_count {
                return Err(PresentError::BadRegion("global row process"));
            }
            let e: ProcEntry = get(b.b, b.h.procs_off as usize + r0.proc_index as usize * 64)?;
            if b.string(r0.name_off, r0.name_len)? == name && b.string(e.exe_off, e.exe_len)? == exe
            {
                return b.row(ix).map(Some);
            }
            h = (h + 1) & (cap - 1);
        }
        Ok(None)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(k: u64) -> Vec<ProcTable<'static>> {
        let rows = |names: &[&'static str]| {
            names
                .iter()
                .enumerate()
                .map(|(i, n)| RowIn {
                    name: n,
                    module: "app",
                    key: None,
                    counted: i != 2,
                    estimated: i == 1,
                    calls: k * (i as u64 + 1),
                    samples: k,
                    time_ns: k * 1_000_000,
                    total_calls: k * 10,
                })
                .collect()
        };
        vec![
            ProcTable {
                pid: 10,
                exe: "/bin/app",
                span_ns: 5_000_000_000,
                samples: 3 * k,
                period_ns: 1_000_000,
                rows: rows(&["main", "hot", "memcpy"]),
                ..Default::default()
            },
            ProcTable {
                pid: 11,
                exe: "/bin/app",
                ended: true,
                span_ns: 2_000_000_000,
                rows: rows(&["main", "hot"]),
                ..Default::default()
            },
            ProcTable {
                pid: 12,
                exe: "/bin/other",
                rows: rows(&["hot"]),
                ..Default::default()
            },
        ]
    }

    fn segment(len: u64) -> (Vec<u64>, PresentWriter) {
        let mut mem = vec![0u64; (len / 8) as usize];
        let w = unsafe { PresentWriter::init(mem.as_mut_ptr() as *mut u8, len, 1_000_000_000) };
        (mem, w)
    }

    fn bytes(mem: &[u64]) -> &[u8] {
        unsafe { std::slice::from_raw_parts(mem.as_ptr() as *const u8, mem.len() * 8) }
    }

    /// A slice that does not start 8-aligned (an mmap never does that,
    /// a caller's buffer may) is refused, not read through misaligned
    /// atomics, by every reader.
    #[test]
    fn misaligned_segments_are_refused() {
        let (mem, mut w) = segment(64 * 1024);
        w.publish(99, 5_000_000_000, &table(1)).unwrap();
        let off = &bytes(&mem)[1..];
        let e = PresentError::BadRegion("segment alignment");
        assert_eq!(read_view(off).err(), Some(e.clone()));
        assert_eq!(read_process(off, 11).err(), Some(e.clone()));
        assert_eq!(lookup(off, "/bin/app", "hot").err(), Some(e));
        assert!(read_view(bytes(&mem)).is_ok());
    }

    #[test]
    fn publish_read_lookup() {
        let (mem, mut w) = segment(64 * 1024);
        assert_eq!(read_view(bytes(&mem)), Err(PresentError::NotPublished));
        w.publish(99, 5_000_000_000, &table(1)).unwrap();
        w.publish(100, 5_000_000_000, &table(2)).unwrap();
        let v = read_view(bytes(&mem)).unwrap();
        assert_eq!((v.generation, v.span_end_ns), (2, 100));
        assert_eq!(v.procs.len(), 3);
        let (p, rows) = v.process(11).unwrap();
        assert!(p.ended && p.exe == "/bin/app");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].name, "hot");
        assert_eq!(rows[1].calls, 4);
        // Global: /bin/app's hot merges pids 10 and 11; /bin/other's stays apart.
        let g = lookup(bytes(&mem), "/bin/app", "hot").unwrap().unwrap();
        assert_eq!((g.calls, g.samples, g.total_calls), (8, 4, 40));
        assert_eq!(g.proc_index, None);
        let v2 = read_view(bytes(&mem)).unwrap();
        assert_eq!(v2.exe_of(&g), Some("/bin/app"));
        let o = lookup(bytes(&mem), "/bin/other", "hot").unwrap().unwrap();
        assert_eq!(o.calls, 2);
        assert_eq!(lookup(bytes(&mem), "/bin/app", "nope").unwrap(), None);
        assert_eq!(v.global_rows().len(), 4);
        let memcpy = &v.process(10).unwrap().1[2];
        assert!(!memcpy.counted && memcpy.ns_per_call().is_none());
        assert_eq!(v.process(10).unwrap().1[1].ns_per_call(), Some(500_000.0));
        assert_eq!(rows[1].calls_per_s(2_000_000_000), 2.0);
        let (p, rows) = read_process(bytes(&mem), 12).unwrap().unwrap();
        assert_eq!((p.pid, rows.len(), rows[0].calls), (12, 1, 2));
        assert_eq!(read_process(bytes(&mem), 7).unwrap(), None);
        let mut pr = ProcessRows::default();
        assert!(read_process_into(bytes(&mem), 10, &mut pr).unwrap());
        assert_eq!(
            (pr.pid, pr.exe(), pr.len(), pr.samples),
            (10, "/bin/app", 3, 6)
        );
        let r: Vec<_> = pr.rows().collect();
        assert_eq!((r[1].name, r[1].module, r[1].calls), ("hot", "app", 4));
        assert!(!r[2].counted && r[0].counted);
        // Row 1 ("hot") is estimated, in both readers and the global row.
        assert!(r[1].estimated && !r[0].estimated);
        assert!(v.process(10).unwrap().1[1].estimated && g.estimated);
        assert!(!read_process_into(bytes(&mem), 7, &mut pr).unwrap());
    }

    /// The current buffer's offset and header.
    fn current(b: &[u8]) -> (usize, BufferHeader) {
        let h: PresentHeader = get(b, 0).unwrap();
        let off = h.buffer_off[(h.generation & 1) as usize] as usize;
        (off, get(b, off).unwrap())
    }

    fn bytes_mut(mem: &mut [u64]) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(mem.as_mut_ptr() as *mut u8, mem.len() * 8) }
    }

    #[test]
    fn publish_time_says_how_old_a_table_is() {
        let (mem, mut w) = segment(64 * 1024);
        let before = now_ns();
        w.publish(1, 1, &table(1)).unwrap();
        let v = read_view(bytes(&mem)).unwrap();
        assert!(v.publish_ns >= before && v.publish_ns <= now_ns());
        assert_eq!(v.tick_ns, 1_000_000_000);
        assert_eq!(v.age(v.publish_ns + 500_000_000), (500_000_000, false));
        // Three ticks and the slack: still current; a moment more: stale.
        let limit = 3 * v.tick_ns + STALE_SLACK_NS;
        assert_eq!(v.age(v.publish_ns + limit), (limit, false));
        assert_eq!(v.age(v.publish_ns + limit + 1), (limit + 1, true));
        // A clock set back reads as age 0, not as a huge age.
        assert_eq!(v.age(v.publish_ns - 5), (0, false));
        let mut pr = ProcessRows::default();
        assert!(read_process_into(bytes(&mem), 10, &mut pr).unwrap());
        assert_eq!(
            (pr.generation, pr.publish_ns, pr.tick_ns),
            (1, v.publish_ns, v.tick_ns)
        );
        assert!(pr.age(v.publish_ns + 10 * v.tick_ns).1);
    }

    #[test]
    fn malformed_segments_get_their_own_errors() {
        let (mem, mut w) = segment(16 * 1024);
        w.publish(1, 1, &table(1)).unwrap();
        let (off, bh) = current(bytes(&mem));
        let at = |field: usize| off + bh.rows_off as usize + 64 + field;
        // A row whose counts changed after its checksum was computed.
        let mut m = mem.clone();
        bytes_mut(&mut m)[at(std::mem::offset_of!(Row, calls))] ^= 1;
        let want = PresentError::BadChecksum { row: 1 };
        assert_eq!(read_view(bytes(&m)).unwrap_err(), want);
        assert_eq!(read_process(bytes(&m), 10).unwrap_err(), want);
        let mut pr = ProcessRows::default();
        assert_eq!(read_process_into(bytes(&m), 10, &mut pr).unwrap_err(), want);
        assert!(want.to_string().contains("checksum"));
        let set = |field: usize, v: &[u8]| {
            let mut m = mem.clone();
            bytes_mut(&mut m)[field..field + v.len()].copy_from_slice(v);
            read_view(bytes(&m))
        };
        let hdr = |name: &str| match name {
            "version" => std::mem::offset_of!(PresentHeader, version),
            "buffer_len" => std::mem::offset_of!(PresentHeader, buffer_len),
            "buffer_off" => std::mem::offset_of!(PresentHeader, buffer_off) + 8,
            _ => unreachable!(),
        };
        assert_eq!(
            set(hdr("version"), &1u32.to_le_bytes()),
            Err(PresentError::UnsupportedVersion(1))
        );
        // Buffers shorter than their own header.
        assert_eq!(
            set(hdr("buffer_len"), &8u64.to_le_bytes()),
            Err(PresentError::BadRegion("buffer length"))
        );
        // The current buffer placed past the end of the segment.
        assert_eq!(
            set(hdr("buffer_off"), &(1u64 << 40).to_le_bytes()),
            Err(PresentError::BadRegion("buffer"))
        );
        assert_eq!(set(0, b"RTPROFX\0"), Err(PresentError::BadMagic));
        // Strings past the end of the buffer.
        let strings = off + std::mem::offset_of!(BufferHeader, strings_len);
        assert_eq!(
            set(strings, &u32::MAX.to_le_bytes()),
            Err(PresentError::BadRegion("strings"))
        );
        assert_eq!(read_view(&bytes(&mem)[..40]), Err(PresentError::TooShort));
    }

    #[test]
    fn open_file_refuses_what_is_not_a_regular_file() {
        let dir = std::env::temp_dir().join(format!("rtprof-present-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let st = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(st.success());
        // Would block in open(2) if it were opened for reading as is.
        let e = open_file(&fifo).unwrap_err();
        assert!(matches!(e, OpenError::NotRegular("a FIFO")), "{e}");
        assert!(e.to_string().contains("is a FIFO"), "{e}");
        let e = open_file(&dir).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        let small = dir.join("small");
        std::fs::write(&small, [0u8; 8]).unwrap();
        assert!(matches!(open_file(&small), Err(OpenError::TooSmall(8))));
        let e = open_file(&dir.join("missing")).unwrap_err();
        assert!(matches!(&e, OpenError::Io(io) if io.kind() == std::io::ErrorKind::NotFound));
        let ok = dir.join("ok");
        std::fs::write(&ok, [0u8; 64]).unwrap();
        assert!(open_file(&ok).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn too_large_is_an_error() {
        let (_mem, mut w) = segment(1024);
        assert!(matches!(
            w.publish(1, 1, &table(1)),
            Err(PresentError::TooLarge { .. })
        ));
    }

    #[test]
    fn hostile_bytes_never_panic() {
        let (mem, mut w) = segment(16 * 1024);
        w.publish(1, 1, &table(3)).unwrap();
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        for _ in 0..3000 {
            let mut m = mem.clone();
            let b =
                unsafe { std::slice::from_raw_parts_mut(m.as_mut_ptr() as *mut u8, m.len() * 8) };
            for _ in 0..3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Mostly the header and the current buffer's first part.
                let pos = (x as usize) % 2048;
                b[pos] = (x >> 40) as u8;
            }
            let _ = read_view(b);
            let _ = lookup(b, "/bin/app", "hot");
            let _ = read_process(b, 10);
            let _ = read_process_into(b, 10, &mut ProcessRows::default());
        }
        for len in [0, 10, 63, 64, 100, 5000] {
            let _ = read_view(&bytes(&mem)[..len]);
        }
    }

    /// A reader hammering the segment while the daemon publishes never sees
    /// a mixed table: in every view, every row says the same publish.
    #[test]
    fn readers_never_see_a_torn_table() {
        let (mem, mut w) = segment(64 * 1024);
        w.publish(1, 1, &table(1)).unwrap();
        let addr = mem.as_ptr() as usize;
        let len = mem.len() * 8;
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Complete views each reader has checked so far.
        let seen: std::sync::Arc<[AtomicU64; 2]> = Default::default();
        let readers: Vec<_> = (0..2)
            .map(|i| {
                let (done, seen) = (done.clone(), seen.clone());
                std::thread::spawn(move || {
                    let b = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
                    while !done.load(Ordering::Relaxed) {
                        // Lapped a thousand times by a writer publishing
                        // back to back: a correct answer, not a torn one.
                        let v = match read_view(b) {
                            Err(PresentError::Busy) => continue,
                            v => v.unwrap(),
                        };
                        let k = v.span_end_ns;
                        for (p, rows) in v.procs.iter().map(|p| (p, &v.rows[p.rows.clone()])) {
                            for (i, r) in rows.iter().enumerate() {
                                assert_eq!(r.calls, k * (i as u64 + 1), "pid {}", p.pid);
                                assert_eq!(r.samples, k);
                            }
                        }
                        seen[i].fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        // At least 20,000 publishes, and on until both readers have checked
        // views taken while the writer was busy (a minute at most).
        let t = std::time::Instant::now();
        let mut k = 1u64;
        while k < 20_000 || seen.iter().any(|s| s.load(Ordering::Relaxed) < 10) {
            k += 1;
            w.publish(k, 1, &table(k)).unwrap();
            assert!(t.elapsed().as_secs() < 60, "readers made no progress");
        }
        done.store(true, Ordering::Relaxed);
        for r in readers {
            r.join().unwrap();
        }
        drop(mem);
    }
}
