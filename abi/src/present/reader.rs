//! The readers' side: schedulers and `rtprof top/report`. Every offset
//! and count is checked before it is used, and a buffer the
//! daemon rewrote while it was read is read again (`Busy` once that keeps
//! happening).

use super::layout::{
    key_hash, BufferHeader, Claim, PresentError, PresentHeader, ProcEntry, Row, EMPTY, MAGIC,
    PROC_ENDED, ROW_ACCELERATED, ROW_ACTIVE, ROW_AGENT, ROW_AT_LEAST, ROW_COUNTED,
    ROW_COUNTING_OFF, ROW_ESTIMATED, ROW_GLOBAL, ROW_IMPLEMENTATION, ROW_OFFERED, ROW_THREAD,
    ROW_THREAD_HEAD, STALE_SLACK_NS, STALE_TICKS, VERSION,
};
use std::mem::size_of;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{fence, AtomicU64, Ordering};

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
    /// With `estimated`: too uncertain to estimate, the calls counted in
    /// bursts (at least that many were made).
    pub at_least: bool,
    /// The process's `[rtprof]` row: what rtprof cost it over the span.
    pub agent: bool,
    /// Calls added by the program through the C API (an accelerator's).
    pub accelerated: bool,
    /// Counting switched off now.
    pub counting_off: bool,
    /// The program offered other implementations of the function.
    pub offered: bool,
    /// An implementation's row (`function [name]`).
    pub implementation: bool,
    /// The implementation that runs the function's calls now.
    pub active: bool,
    pub calls: u64,
    pub samples: u64,
    pub time_ns: u64,
    pub total_calls: u64,
    /// A thread row's thread (see [`ProcView::threads`]).
    pub thread: Option<u32>,
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
    /// Its executable, as the kernel said when it registered.
    pub exe: String,
    /// What its own counter segment says its executable is, if that is
    /// something else: its claim, not to be trusted.
    pub claimed: Option<String>,
    pub ended: bool,
    pub span_ns: u64,
    pub samples: u64,
    pub period_ns: u64,
    pub lost: u64,
    /// Its rows in [`View::rows`].
    pub rows: Range<usize>,
    /// Its live threads with calls in the span (`rtprofd --thread-rows`),
    /// with their rows in [`View::rows`] (after the process's own); none
    /// from [`read_process`], which reads the process's own rows only.
    pub threads: Vec<ThreadView>,
}

/// One thread of a process and its rows: its functions' calls over the
/// span, hottest first.
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadView {
    pub tid: u32,
    pub name: String,
    /// Its calls over the span (of the functions in its rows).
    pub calls: u64,
    /// Its samples over the span (in any function), and their CPU time.
    pub samples: u64,
    pub time_ns: u64,
    pub rows: Range<usize>,
}

impl ThreadView {
    /// Its hottest function in `v` (the daemon lists a thread's rows
    /// hottest first).
    pub fn hottest<'v>(&self, v: &'v View) -> Option<&'v RowView> {
        v.rows.get(self.rows.clone())?.first()
    }
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
    pub global: Range<usize>,
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
    /// How old the table is at `now_ns` (CLOCK_REALTIME, see
    /// [`now_ns`](super::now_ns)), and whether it is stale (older than a
    /// few ticks: the daemon that published it is gone or stuck).
    pub fn age(&self, now_ns: u64) -> (u64, bool) {
        age(self.publish_ns, self.tick_ns, now_ns)
    }
}

/// A `T` (one of the layout's records, or an integer) from `b` at `off`.
fn get<T: Copy + Default>(b: &[u8], off: usize) -> Result<T, PresentError> {
    let end = off
        .checked_add(size_of::<T>())
        .ok_or(PresentError::BadRegion("record"))?;
    let s = b.get(off..end).ok_or(PresentError::BadRegion("record"))?;
    // SAFETY: `s` holds exactly `size_of::<T>()` bytes, read unaligned, and
    // every `T` read here is a record of plain integers, valid for any bit
    // pattern.
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
        within(h.claims_off, h.claim_count as u64 * 16, "claims")?;
        if h.global_first.checked_add(h.global_count) != Some(h.row_count)
            || !h.hash_cap.is_power_of_two()
        {
            return Err(PresentError::BadRegion("global rows"));
        }
        Ok(Buffer { b, h })
    }
    /// The bytes of a string of the strings region.
    fn str_bytes(&self, off: u32, len: u32) -> Result<&'a [u8], PresentError> {
        let end = off
            .checked_add(len)
            .filter(|&e| e <= self.h.strings_len)
            .ok_or(PresentError::BadRegion("string"))?;
        let base = self.h.strings_off as usize;
        Ok(&self.b[base + off as usize..base + end as usize])
    }
    fn string(&self, off: u32, len: u32) -> Result<String, PresentError> {
        Ok(String::from_utf8_lossy(self.str_bytes(off, len)?).into_owned())
    }
    /// The claim of process `i`, if it made one.
    fn claim(&self, i: u32) -> Result<Option<String>, PresentError> {
        for k in 0..self.h.claim_count as usize {
            let c: Claim = get(self.b, self.h.claims_off as usize + k * 16)?;
            if c.proc_index == i {
                return self.string(c.exe_off, c.exe_len).map(Some);
            }
        }
        Ok(None)
    }
    fn entry(&self, i: u32) -> Result<ProcEntry, PresentError> {
        get(self.b, self.h.procs_off as usize + i as usize * 64)
    }
    /// The index of process `pid`'s entry.
    /// The first process entry of `pid`: entries are in pid order, so a
    /// binary search (a segment that breaks the order only gets no or the
    /// wrong entry, every read stays checked).
    fn find(&self, pid: u32) -> Result<Option<u32>, PresentError> {
        let (mut lo, mut hi) = (0, self.h.proc_count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.entry(mid)?.pid < pid {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if lo < self.h.proc_count && self.entry(lo)?.pid == pid {
            return Ok(Some(lo));
        }
        Ok(None)
    }
    /// A process's rows, which must lie before the global rows.
    fn rows_of(&self, e: &ProcEntry) -> Result<Range<u32>, PresentError> {
        match e.first_row.checked_add(e.row_count) {
            Some(end) if end <= self.h.global_first => Ok(e.first_row..end),
            _ => Err(PresentError::BadRegion("process rows")),
        }
    }
    /// A process's threads: the thread rows after its own, each thread's
    /// head row (its name) first.
    fn threads_of(&self, e: &ProcEntry, after: u32) -> Result<Vec<ThreadView>, PresentError> {
        let end = u32::try_from(e.thread_rows)
            .ok()
            .and_then(|n| after.checked_add(n))
            .filter(|&end| end <= self.h.global_first)
            .ok_or(PresentError::BadRegion("thread rows"))?;
        let mut out: Vec<ThreadView> = Vec::new();
        for i in after..end {
            let r = self.raw_row(i)?;
            if r.flags & ROW_THREAD == 0 {
                return Err(PresentError::BadRegion("thread rows"));
            }
            if r.flags & ROW_THREAD_HEAD != 0 {
                out.push(ThreadView {
                    tid: r.tid as u32,
                    name: self.string(r.name_off, r.name_len)?,
                    calls: r.calls,
                    samples: r.samples,
                    time_ns: r.time_ns,
                    rows: i as usize + 1..i as usize + 1,
                });
            } else {
                let t = out
                    .last_mut()
                    .ok_or(PresentError::BadRegion("thread rows"))?;
                t.rows.end = i as usize + 1;
            }
        }
        Ok(out)
    }
    /// Process `i`, with its threads if `threads` (their rows are in the
    /// whole table only).
    fn proc(&self, i: u32, threads: bool) -> Result<ProcView, PresentError> {
        let e = self.entry(i)?;
        let rows = self.rows_of(&e)?;
        let threads = match e.thread_rows {
            n if n == 0 || !threads => Vec::new(),
            _ => self.threads_of(&e, rows.end)?,
        };
        Ok(ProcView {
            pid: e.pid,
            exe: self.string(e.exe_off, e.exe_len)?,
            claimed: self.claim(i)?,
            ended: e.flags & PROC_ENDED != 0,
            span_ns: e.span_ns,
            samples: e.samples,
            period_ns: e.period_ns,
            lost: e.lost,
            rows: rows.start as usize..rows.end as usize,
            threads,
        })
    }
    /// Row `i` as stored, unchecked.
    fn raw_row(&self, i: u32) -> Result<Row, PresentError> {
        get(self.b, self.h.rows_off as usize + i as usize * 64)
    }
    /// Row `i`, which must exist.
    fn checked_row(&self, i: u32) -> Result<Row, PresentError> {
        if i >= self.h.row_count {
            return Err(PresentError::BadRegion("row index"));
        }
        self.raw_row(i)
    }
    fn row(&self, i: u32) -> Result<RowView, PresentError> {
        let r = self.checked_row(i)?;
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
            at_least: r.flags & ROW_AT_LEAST != 0,
            agent: r.flags & ROW_AGENT != 0,
            accelerated: r.flags & ROW_ACCELERATED != 0,
            counting_off: r.flags & ROW_COUNTING_OFF != 0,
            offered: r.flags & ROW_OFFERED != 0,
            implementation: r.flags & ROW_IMPLEMENTATION != 0,
            active: r.flags & ROW_ACTIVE != 0,
            calls: r.calls,
            samples: r.samples,
            time_ns: r.time_ns,
            total_calls: r.total_calls,
            thread: (r.flags & ROW_THREAD != 0).then_some(r.tid as u32),
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
    // number, at 8-aligned offsets) lie inside it, so each word is in
    // bounds and aligned for as long as `bytes` is borrowed. The daemon
    // stores to these words only atomically, and they are only loaded here.
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
            .map(|i| b.proc(i, true))
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
        let Some(i) = b.find(pid)? else {
            return Ok(None);
        };
        let p = b.proc(i, false)?;
        let rows = p
            .rows
            .clone()
            .map(|r| b.row(r as u32))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some((p, rows)))
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
    /// `strings` is UTF-8 as a whole (checked once a read, not per row).
    utf8: bool,
}

/// A row of [`ProcessRows`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowRef<'a> {
    pub name: &'a str,
    pub module: &'a str,
    pub counted: bool,
    pub estimated: bool,
    pub at_least: bool,
    pub agent: bool,
    pub accelerated: bool,
    pub counting_off: bool,
    /// The program offered other implementations of the function.
    pub offered: bool,
    /// An implementation's row (`function [name]`).
    pub implementation: bool,
    /// The implementation that runs the function's calls now.
    pub active: bool,
    pub calls: u64,
    pub samples: u64,
    pub time_ns: u64,
    pub total_calls: u64,
}

impl ProcessRows {
    fn text(&self, (off, len): (u32, u32)) -> &str {
        let (off, end) = (off as usize, (off + len) as usize);
        let name = if self.utf8 {
            // SAFETY: `strings` was checked to be UTF-8 as a whole when it
            // was read; `get` below still checks that both ends fall on
            // character boundaries.
            unsafe { std::str::from_utf8_unchecked(&self.strings) }.get(off..end)
        } else {
            std::str::from_utf8(&self.strings[off..end]).ok()
        };
        name.unwrap_or("?")
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
            at_least: r.flags & ROW_AT_LEAST != 0,
            agent: r.flags & ROW_AGENT != 0,
            accelerated: r.flags & ROW_ACCELERATED != 0,
            counting_off: r.flags & ROW_COUNTING_OFF != 0,
            offered: r.flags & ROW_OFFERED != 0,
            implementation: r.flags & ROW_IMPLEMENTATION != 0,
            active: r.flags & ROW_ACTIVE != 0,
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
        out.utf8 = false;
        let Some(i) = b.find(pid)? else {
            return Ok(false);
        };
        let e = b.entry(i)?;
        let rows = b.rows_of(&e)?;
        // Strings are copied next to the rows, which then point at the copy.
        let copy = |strings: &mut Vec<u8>, off: u32, len: u32| {
            let at = strings.len() as u32;
            strings.extend_from_slice(b.str_bytes(off, len)?);
            Ok::<_, PresentError>((at, len))
        };
        out.exe = copy(&mut out.strings, e.exe_off, e.exe_len)?;
        // Rows of a process share a few modules: each copied once in a row.
        let mut module = ((u32::MAX, 0), (0, 0));
        for ix in rows {
            let mut r = b.checked_row(ix)?;
            (r.name_off, r.name_len) = copy(&mut out.strings, r.name_off, r.name_len)?;
            if module.0 != (r.module_off, r.module_len) {
                module = (
                    (r.module_off, r.module_len),
                    copy(&mut out.strings, r.module_off, r.module_len)?,
                );
            }
            (r.module_off, r.module_len) = module.1;
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
        out.utf8 = std::str::from_utf8(&out.strings).is_ok();
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
            let r0 = b.raw_row(ix)?;
            if r0.proc_index >= b.h.proc_count {
                return Err(PresentError::BadRegion("global row process"));
            }
            let e = b.entry(r0.proc_index)?;
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
    use super::super::layout::{now_ns, STALE_SLACK_NS};
    use super::super::writer::tests::{bytes, bytes_mut, segment, table};
    use super::*;

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
        // Row 0 gets calls through the C API, row 1 is switched off.
        assert!(r[0].accelerated && !r[1].accelerated);
        assert!(r[1].counting_off && !r[0].counting_off);
        let rows10 = v.process(10).unwrap().1;
        assert!(rows10[0].accelerated && rows10[1].counting_off && g.counting_off);
        assert!(!rows10[2].accelerated && !rows10[2].counting_off);
        assert!(!read_process_into(bytes(&mem), 7, &mut pr).unwrap());
    }

    /// The current buffer's offset and header.
    fn current(b: &[u8]) -> (usize, BufferHeader) {
        let h: PresentHeader = get(b, 0).unwrap();
        let off = h.buffer_off[(h.generation & 1) as usize] as usize;
        (off, get(b, off).unwrap())
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
        // A row's counts are the daemon's to say: read as they are (the
        // sequence number keeps torn rows out, the bounds stay checked).
        let mut m = mem.clone();
        bytes_mut(&mut m)[at(std::mem::offset_of!(Row, calls))] ^= 1;
        let (good, bad) = (
            read_view(bytes(&mem)).unwrap(),
            read_view(bytes(&m)).unwrap(),
        );
        assert_eq!(bad.rows[1].calls, good.rows[1].calls ^ 1);
        // A name that is not UTF-8 reads as "?", and only that one.
        let mut m = mem.clone();
        let strings = off + bh.strings_off as usize;
        let b = &mut bytes_mut(&mut m)[strings..strings + bh.strings_len as usize];
        let at = b.windows(4).position(|w| w == b"main").unwrap();
        b[at + 1] = 0xff;
        let mut pr = ProcessRows::default();
        assert!(read_process_into(bytes(&m), 10, &mut pr).unwrap());
        let names: Vec<_> = pr.rows().map(|r| r.name).collect();
        assert_eq!(names, ["?", "hot", "memcpy"]);
        assert!(read_process_into(bytes(&mem), 10, &mut pr).unwrap());
        assert_eq!(pr.rows().next().unwrap().name, "main");
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
    fn hostile_bytes_never_panic() {
        let (mem, mut w) = segment(16 * 1024);
        w.publish(1, 1, &table(3)).unwrap();
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        for _ in 0..3000 {
            let mut m = mem.clone();
            let b = bytes_mut(&mut m);
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
}
