//! The daemon's side: publishes each span's table straight into the idle
//! buffer.
//!
//! A buffer is laid out so that each region's place is known before it is
//! written: strings first (the caller's names, then the executables and
//! modules), then processes, rows and the hash index. Rows go to the
//! buffer as they are built, global rows merged beside them, so a tick
//! touches each row once and copies no table. The caller's names, the
//! bulk of the strings, are copied only when they changed since that
//! buffer last got them.

use super::layout::{
    key_hash, now_ns, BufferHeader, Claim, PresentError, PresentHeader, ProcEntry, Row, EMPTY,
    MAGIC, PROC_ENDED, ROW_ACCELERATED, ROW_COUNTED, ROW_COUNTING_OFF, ROW_ESTIMATED, ROW_GLOBAL,
    ROW_THREAD, ROW_THREAD_HEAD, VERSION,
};
use std::collections::HashMap;
use std::mem::size_of;
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// A process's table with rows named by their names: converted to
/// [`ProcRows`] (ids assigned per executable and name) when published.
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

impl<'a> ProcTable<'a> {
    /// This process with `rows` (modules indexed in `modules`) instead.
    fn with_rows<'b>(&self, modules: &'b [String], rows: &'b [IdRow]) -> ProcRows<'b>
    where
        'a: 'b,
    {
        ProcRows {
            pid: self.pid,
            exe: self.exe,
            claimed: None,
            ended: self.ended,
            span_ns: self.span_ns,
            samples: self.samples,
            period_ns: self.period_ns,
            lost: self.lost,
            modules,
            rows,
            threads: &[],
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct RowIn<'a> {
    pub name: &'a str,
    pub module: &'a str,
    pub counted: bool,
    /// Calls estimated under an overhead budget.
    pub estimated: bool,
    /// Calls added through the C API.
    pub accelerated: bool,
    /// Counting switched off.
    pub counting_off: bool,
    pub calls: u64,
    pub samples: u64,
    pub time_ns: u64,
    pub total_calls: u64,
}

/// [`IdRow::module`] of the samples no module claims.
pub const UNKNOWN_MODULE: u32 = u32::MAX;
/// [`IdRow::module`] of a process's `[rtprof]` row (`ROW_AGENT`): module
/// `rtprof`.
pub const AGENT_MODULE: u32 = u32::MAX - 1;

/// A row as the daemon builds it: named by the caller's id, its module by
/// an index into its process's modules.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdRow {
    /// Unique per (executable, name) (see [`RowNames`]): rows with one id
    /// merge into one global row without their names compared.
    pub id: u32,
    /// Index into [`ProcRows::modules`], or [`UNKNOWN_MODULE`].
    pub module: u32,
    /// `ROW_COUNTED`, `ROW_ESTIMATED`, `ROW_ACCELERATED`,
    /// `ROW_COUNTING_OFF`.
    pub flags: u32,
    pub calls: u64,
    pub samples: u64,
    pub time_ns: u64,
    pub total_calls: u64,
}

/// What the daemon publishes for one process: rows hottest first.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcRows<'a> {
    pub pid: u32,
    /// The executable, as the kernel says.
    pub exe: &'a str,
    /// What its own segment says it is, if that is something else.
    pub claimed: Option<&'a str>,
    pub ended: bool,
    pub span_ns: u64,
    pub samples: u64,
    pub period_ns: u64,
    pub lost: u64,
    pub modules: &'a [String],
    pub rows: &'a [IdRow],
    /// Its live threads' rows (`rtprofd --thread-rows`), each thread's
    /// hottest first.
    pub threads: &'a [ThreadRows],
}

/// One thread's rows: calls and samples of its functions over the span.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadRows {
    pub tid: u32,
    pub name: String,
    /// Its samples over the span, in any function (its CPU time).
    pub samples: u64,
    pub rows: Vec<IdRow>,
}

/// Names and hash keys (`key_hash(exe, name)`) of the caller's row ids.
/// The caller keeps every name in one string, published as it is: a tick
/// copies it whole (when it changed) instead of touching each name.
pub trait RowNames {
    /// Every name, end to end (names not in use may be among them).
    fn strings(&self) -> &str;
    /// Where id's name lies in [`RowNames::strings`].
    fn span(&self, id: u32) -> (u32, u32);
    fn key(&self, id: u32) -> u32;
    /// Moves whenever [`RowNames::strings`] changes; `None`: unknown, so
    /// they are copied every publish.
    fn version(&self) -> Option<u64> {
        None
    }
}

/// Slots of the hash index for up to `globals` global rows: at most half
/// full, so probes stay short.
fn hash_cap(globals: usize) -> u32 {
    (globals * 2).next_power_of_two().max(8) as u32
}

fn align64(n: usize) -> usize {
    n.div_ceil(64) * 64
}

/// The daemon's side.
pub struct PresentWriter {
    base: *mut u8,
    header: PresentHeader,
    /// Kept between publishes: a tick allocates little once these grew.
    scratch: Scratch,
    /// Per buffer: the caller's names it holds (version, address, length),
    /// so unchanged names are not copied again.
    names_in: [Option<(u64, usize, usize)>; 2],
}

#[derive(Default)]
struct Scratch {
    /// The writer's own strings (executables, modules), after the names.
    strings: Vec<u8>,
    /// Per process: its entry (its place in pid order), executable, and
    /// where its modules' spans start in `modules`.
    entry_of: Vec<u32>,
    exe: Vec<(u32, u32)>,
    module_first: Vec<u32>,
    modules: Vec<(u32, u32)>,
    /// Processes in pid order, then by executable (the order rows go in).
    order: Vec<u32>,
    /// The global row (counted from the first) of each id seen so far,
    /// `EMPTY` otherwise; each global row's id and key.
    global_of: Vec<u32>,
    global_ids: Vec<(u32, u32)>,
    hash: Vec<u32>,
    /// Every process's threads' names, and where each process's start.
    thread_names: Vec<(u32, u32)>,
    thread_first: Vec<u32>,
    /// The processes' claims, by entry.
    claims: Vec<Claim>,
}

impl Scratch {
    /// Empties `global_of` of this publish's ids: kept all `EMPTY` between
    /// publishes, so a tick clears only the ids it used.
    fn forget_globals(&mut self) {
        for &(id, _) in self.global_ids.iter() {
            self.global_of[id as usize] = EMPTY;
        }
    }
}

/// Rows a process's threads take: a head row each and theirs.
fn thread_rows(p: &ProcRows) -> usize {
    p.threads.iter().map(|t| 1 + t.rows.len()).sum()
}

// SAFETY: nothing in the writer is tied to the thread that made it: it is
// the segment's only writer and owns its scratch, and `base` stays valid
// for its whole life (`init`'s contract), whichever thread holds it.
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
        unsafe { std::ptr::write_volatile(base as *mut PresentHeader, header) };
        PresentWriter {
            base,
            header,
            scratch: Scratch::default(),
            names_in: [None; 2],
        }
    }

    fn word(&self, off: u64) -> &AtomicU64 {
        // SAFETY: callers pass the generation word or a buffer's first
        // word: 8-aligned offsets (the header's layout, and buffer offsets
        // that are multiples of 64) inside the segment `init` was given,
        // which outlives `self`. Readers in other processes only load these
        // words, atomically too.
        unsafe { &*(self.base.add(off as usize) as *const AtomicU64) }
    }

    /// Publishes a span's table of rows named by their names: ids are
    /// assigned per (executable, name), in names of the writer's own.
    pub fn publish(
        &mut self,
        span_end_ns: u64,
        span_ns: u64,
        procs: &[ProcTable],
    ) -> Result<(), PresentError> {
        let mut names = OwnNames::default();
        let mut modules: Vec<Vec<String>> = Vec::with_capacity(procs.len());
        let mut rows: Vec<Vec<IdRow>> = Vec::with_capacity(procs.len());
        for p in procs {
            let mut mods: Vec<String> = Vec::new();
            let r = p
                .rows
                .iter()
                .map(|r| {
                    let module = match mods.iter().position(|m| m == r.module) {
                        Some(m) => m,
                        None => {
                            mods.push(r.module.to_string());
                            mods.len() - 1
                        }
                    };
                    IdRow {
                        id: names.id(p.exe, r.name),
                        module: module as u32,
                        flags: row_flags(r.counted, r.estimated, r.accelerated, r.counting_off),
                        calls: r.calls,
                        samples: r.samples,
                        time_ns: r.time_ns,
                        total_calls: r.total_calls,
                    }
                })
                .collect();
            modules.push(mods);
            rows.push(r);
        }
        let procs: Vec<ProcRows> = procs
            .iter()
            .zip(modules.iter().zip(&rows))
            .map(|(p, (modules, rows))| p.with_rows(modules, rows))
            .collect();
        self.publish_rows(span_end_ns, span_ns, &procs, &names)
    }

    /// Publishes a span's table: written into the idle buffer, then made
    /// current. Every row's id is named by `names`.
    pub fn publish_rows(
        &mut self,
        span_end_ns: u64,
        span_ns: u64,
        procs: &[ProcRows],
        names: &impl RowNames,
    ) -> Result<(), PresentError> {
        let gen_off = std::mem::offset_of!(PresentHeader, generation) as u64;
        let gen = self.word(gen_off).load(Ordering::Relaxed);
        let b = ((gen + 1) & 1) as usize;
        // Offsets are 32-bit: a larger buffer is used up to 4 GiB.
        let cap = self.header.buffer_len.min(u32::MAX as u64) as usize;
        let names_len = names.strings().len();
        let own = plan(&mut self.scratch, procs, names_len);
        // Refused before a byte is written if even the process rows, without
        // global rows and index, pass the buffer.
        let r = Regions::new(procs, names_len, self.scratch.strings.len(), cap)
            .map_err(|need| self.too_large(need))?;
        let buf = self.idle(b);
        let odd = buf.open();
        self.copy_strings(buf, b, &r, names);
        let global_count = write_rows(&mut self.scratch, buf, &r, procs, names, own);
        let tail = r.tail(global_count, self.scratch.claims.len());
        // Ready for the next publish, whatever happens to this one.
        self.scratch.forget_globals();
        if tail.need > cap {
            // The buffer keeps its odd sequence number: never read.
            self.names_in[b] = None;
            return Err(self.too_large(tail.need));
        }
        let sc = &mut self.scratch;
        fill_hash(&mut sc.hash, &sc.global_ids, tail.hash_cap, r.global_first);
        let hdr = r.header(&tail, span_end_ns, span_ns, procs.len(), sc.claims.len());
        // SAFETY: everything after the rows ends at `tail.need`, checked
        // against `cap` above.
        unsafe { buf.write_tail(&hdr, &tail, &sc.hash, &sc.claims) };
        buf.close(odd);
        self.word(gen_off).store(gen + 1, Ordering::Release);
        Ok(())
    }

    /// The error of a table that needs `need` bytes of a buffer.
    fn too_large(&self, need: usize) -> PresentError {
        PresentError::TooLarge {
            need: need as u64,
            have: self.header.buffer_len,
        }
    }

    /// Buffer `b`, the one readers are not using.
    fn idle(&self, b: usize) -> Idle {
        // SAFETY: `init` placed both buffers inside the segment, which
        // outlives `self`.
        let start = unsafe { self.base.add(self.header.buffer_off[b] as usize) };
        Idle { start }
    }

    /// Copies the strings region of buffer `b`: the caller's names only if
    /// that buffer does not hold this version of them already (they are
    /// most of a tick's bytes), then the writer's own strings.
    fn copy_strings(&mut self, buf: Idle, b: usize, r: &Regions, names: &impl RowNames) {
        let own = &self.scratch.strings;
        let version = names
            .version()
            .map(|v| (v, names.strings().as_ptr() as usize, r.names_len));
        // SAFETY: the strings region ends before `procs_off`, checked
        // against `cap` by `Regions::new`; the sources are the caller's and
        // the scratch's, which do not overlap the segment.
        unsafe {
            if version.is_none() || self.names_in[b] != version {
                let to = buf.at(r.strings_off);
                std::ptr::copy_nonoverlapping(names.strings().as_ptr(), to, r.names_len);
            }
            let to = buf.at(r.strings_off + r.names_len);
            std::ptr::copy_nonoverlapping(own.as_ptr(), to, own.len());
        }
        self.names_in[b] = version;
    }
}

/// Where each region of the idle buffer goes for one publish, fixed before
/// anything is written so that each is written once, in place: strings,
/// processes, their rows, then the global rows (as many as fit in `room`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Regions {
    strings_off: usize,
    /// The caller's names, then the writer's own strings.
    names_len: usize,
    strings_len: usize,
    procs_off: usize,
    rows_off: usize,
    /// Process and thread rows come before it, global rows from it on.
    global_first: usize,
    process_rows_end: usize,
    /// Global rows that fit after the process rows.
    room: usize,
}

/// The regions after the global rows, placed once their number is known:
/// the hash index, then the claims, ending at `need`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tail {
    global_count: usize,
    hash_cap: u32,
    hash_off: usize,
    claims_off: usize,
    need: usize,
}

impl Regions {
    /// Lays out `procs` with `names_len` bytes of the caller's names and
    /// `own_len` of the writer's own strings, in a buffer of `cap` bytes;
    /// `Err(need)` if even the process rows do not fit.
    fn new(
        procs: &[ProcRows],
        names_len: usize,
        own_len: usize,
        cap: usize,
    ) -> Result<Regions, usize> {
        let strings_off = size_of::<BufferHeader>();
        let strings_len = names_len + own_len;
        let procs_off = align64(strings_off + strings_len);
        let rows_off = procs_off + procs.len() * size_of::<ProcEntry>();
        let global_first: usize = procs.iter().map(|p| p.rows.len() + thread_rows(p)).sum();
        let process_rows_end = rows_off + global_first * size_of::<Row>();
        if process_rows_end > cap {
            return Err(process_rows_end);
        }
        Ok(Regions {
            strings_off,
            names_len,
            strings_len,
            procs_off,
            rows_off,
            global_first,
            process_rows_end,
            room: (cap - process_rows_end) / size_of::<Row>(),
        })
    }

    /// The rest, for `global_count` global rows and `claims` claims.
    fn tail(&self, global_count: usize, claims: usize) -> Tail {
        let hash_cap = hash_cap(global_count);
        let hash_off = self.process_rows_end + global_count * size_of::<Row>();
        let claims_off = hash_off + hash_cap as usize * 4;
        Tail {
            global_count,
            hash_cap,
            hash_off,
            claims_off,
            need: claims_off + claims * size_of::<Claim>(),
        }
    }

    /// The buffer's header, stamped with the time it is published.
    fn header(
        &self,
        t: &Tail,
        span_end_ns: u64,
        span_ns: u64,
        proc_count: usize,
        claim_count: usize,
    ) -> BufferHeader {
        BufferHeader {
            seq: 0,
            span_end_ns,
            span_ns,
            // Stamped here, not by the caller: the time readers judge the
            // daemon's liveness by is when the table really became current.
            publish_ns: now_ns(),
            proc_count: proc_count as u32,
            row_count: (self.global_first + t.global_count) as u32,
            global_first: self.global_first as u32,
            global_count: t.global_count as u32,
            hash_cap: t.hash_cap,
            strings_len: self.strings_len as u32,
            procs_off: self.procs_off as u32,
            rows_off: self.rows_off as u32,
            hash_off: t.hash_off as u32,
            strings_off: self.strings_off as u32,
            claims_off: if claim_count == 0 {
                0
            } else {
                t.claims_off as u32
            },
            claim_count: claim_count as u32,
            reserved: [0; 6],
        }
    }
}

/// The idle buffer of one publish: where it starts in the segment.
#[derive(Clone, Copy)]
struct Idle {
    start: *mut u8,
}

impl Idle {
    fn seq(&self) -> &AtomicU64 {
        // SAFETY: as in `word`: the buffer's first word, 8-aligned, inside
        // the segment, which outlives the publish.
        unsafe { &*(self.start as *const AtomicU64) }
    }

    /// Marks the buffer as being written (an odd sequence number) before
    /// any byte of it is; returns that number.
    fn open(&self) -> u64 {
        let seq = self.seq();
        let s = seq.load(Ordering::Relaxed);
        seq.store(s | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        s | 1
    }

    /// Marks the buffer written (the even number after `odd`), after every
    /// byte of it is.
    fn close(&self, odd: u64) {
        self.seq().store(odd + 1, Ordering::Release);
    }

    /// Byte `off` of the buffer.
    fn at(&self, off: usize) -> *mut u8 {
        // SAFETY: callers pass `off` below `cap`, within the idle buffer,
        // which lies inside the segment (`init` placed it). Readers do not
        // use the idle buffer: the odd sequence number `open` stored makes
        // any who still do discard what they read.
        unsafe { self.start.add(off) }
    }

    /// Writes the header (all but its sequence word), the hash index and
    /// the claims: the regions the rows decided the size of.
    ///
    /// # Safety
    /// `t.need` must be within the buffer.
    unsafe fn write_tail(&self, hdr: &BufferHeader, t: &Tail, hash: &[u32], claims: &[Claim]) {
        // SAFETY: the hash index and claims end at `t.need`, within the
        // buffer (the caller's promise); the header is the buffer's first
        // 128 bytes, written after its sequence word.
        unsafe {
            let h = as_bytes(std::slice::from_ref(hdr));
            std::ptr::copy_nonoverlapping(h.as_ptr().add(8), self.at(8), h.len() - 8);
            let hb = as_bytes(hash);
            std::ptr::copy_nonoverlapping(hb.as_ptr(), self.at(t.hash_off), hb.len());
            let cb = as_bytes(claims);
            std::ptr::copy_nonoverlapping(cb.as_ptr(), self.at(t.claims_off), cb.len());
        }
    }
}

/// Writes each process's entry and rows, in `sc.order`: its own rows, each
/// added into its global row, then its threads'. Returns how many global
/// rows they add up to (only the first `r.room` are written).
fn write_rows<N: RowNames>(
    sc: &mut Scratch,
    buf: Idle,
    r: &Regions,
    procs: &[ProcRows],
    names: &N,
    own: OwnSpans,
) -> usize {
    let Scratch {
        entry_of,
        exe,
        module_first,
        modules,
        order,
        global_of,
        global_ids,
        thread_names,
        thread_first,
        ..
    } = sc;
    // SAFETY: `rows_off` is a multiple of 64 from the buffer's start
    // (itself 64-aligned in the page-aligned segment), so `Row`s are
    // aligned; process rows end within `cap` (`Regions::new`) and `room`
    // global rows fit after them.
    let mut out = unsafe {
        let rows = buf.at(r.rows_off) as *mut Row;
        RowsOut::new(rows, r.global_first, r.room, global_of, global_ids)
    };
    let entries = buf.at(r.procs_off) as *mut ProcEntry;
    for &pi in order.iter() {
        let (pi, p) = (pi as usize, &procs[pi as usize]);
        let entry = entry_of[pi];
        let e = proc_entry(p, exe[pi], out.next);
        // SAFETY: entry < procs.len(): inside the processes region.
        unsafe { entries.add(entry as usize).write(e) };
        let first = module_first[pi] as usize;
        let naming = RowNaming {
            names,
            own,
            modules: &modules[first..first + p.modules.len()],
            entry,
        };
        out.process_rows(p, &naming);
        out.thread_rows(p, &naming, &thread_names[thread_first[pi] as usize..]);
    }
    out.global_ids.len()
}

/// A process's entry, its rows from `first_row` on.
fn proc_entry(p: &ProcRows, exe: Span32, first_row: usize) -> ProcEntry {
    ProcEntry {
        pid: p.pid,
        flags: if p.ended { PROC_ENDED } else { 0 },
        exe_off: exe.0,
        exe_len: exe.1,
        first_row: first_row as u32,
        row_count: p.rows.len() as u32,
        span_ns: p.span_ns,
        samples: p.samples,
        period_ns: p.period_ns,
        lost: p.lost,
        thread_rows: thread_rows(p) as u64,
    }
}

/// Makes one process's [`IdRow`]s rows of the buffer: names from the
/// caller's strings, modules from the writer's own.
struct RowNaming<'a, N> {
    names: &'a N,
    own: OwnSpans,
    /// The process's modules, by index.
    modules: &'a [Span32],
    /// The process's entry.
    entry: u32,
}

impl<N: RowNames> RowNaming<'_, N> {
    /// `r` as a row of this process (or of its thread `tid`), with `flags`.
    fn row(&self, r: &IdRow, flags: u32, tid: u64) -> Row {
        let module = match r.module {
            UNKNOWN_MODULE => self.own.unknown,
            AGENT_MODULE => self.own.agent,
            m => self
                .modules
                .get(m as usize)
                .copied()
                .unwrap_or(self.own.bad),
        };
        let (name_off, name_len) = self.names.span(r.id);
        Row {
            name_off,
            name_len,
            module_off: module.0,
            module_len: module.1,
            proc_index: self.entry,
            flags,
            calls: r.calls,
            samples: r.samples,
            time_ns: r.time_ns,
            total_calls: r.total_calls,
            tid,
        }
    }
}

/// The rows region as it is written: process and thread rows in order,
/// and after them the global rows they add up to.
struct RowsOut<'a> {
    rows: *mut Row,
    /// Where the next process or thread row goes.
    next: usize,
    global_first: usize,
    /// Global rows that fit: those past it are counted, not written.
    room: usize,
    /// Per id, its global row (`EMPTY`: none yet); per global row, its id
    /// and key.
    global_of: &'a mut Vec<u32>,
    global_ids: &'a mut Vec<(u32, u32)>,
}

impl<'a> RowsOut<'a> {
    /// # Safety
    /// `rows` must point to `global_first + room` writable, aligned rows
    /// that nothing else uses while this lives.
    unsafe fn new(
        rows: *mut Row,
        global_first: usize,
        room: usize,
        global_of: &'a mut Vec<u32>,
        global_ids: &'a mut Vec<(u32, u32)>,
    ) -> RowsOut<'a> {
        RowsOut {
            rows,
            next: 0,
            global_first,
            room,
            global_of,
            global_ids,
        }
    }

    /// Writes the next process or thread row.
    fn push(&mut self, row: Row) {
        debug_assert!(self.next < self.global_first);
        // SAFETY: next < global_first, the rows `Regions::new` counted for
        // processes and threads: within `new`'s rows.
        unsafe { self.rows.add(self.next).write(row) };
        self.next += 1;
    }

    /// Writes a process's own rows, each added into its global row.
    fn process_rows<N: RowNames>(&mut self, p: &ProcRows, naming: &RowNaming<N>) {
        for r in p.rows {
            let row = naming.row(r, r.flags & !ROW_GLOBAL, 0);
            self.push(row);
            self.add_to_global(r.id, &row, naming.names);
        }
    }

    /// Adds `row` into the global row of `id`: the first process of the
    /// executable with this id (in pid order) names it.
    fn add_to_global(&mut self, id: u32, row: &Row, names: &impl RowNames) {
        let i = id as usize;
        if self.global_of.len() <= i {
            self.global_of.resize(i + 1, EMPTY);
        }
        let g = match self.global_of[i] {
            EMPTY => {
                let g = self.global_ids.len();
                self.global_of[i] = g as u32;
                self.global_ids.push((id, names.key(id)));
                if g < self.room {
                    let first = Row {
                        flags: ROW_GLOBAL,
                        calls: 0,
                        samples: 0,
                        time_ns: 0,
                        total_calls: 0,
                        ..*row
                    };
                    // SAFETY: g < room: within `new`'s rows.
                    unsafe { self.rows.add(self.global_first + g).write(first) };
                }
                g
            }
            g => g as usize,
        };
        if g < self.room {
            // SAFETY: as above; no other reference to it is live.
            let gr = unsafe { &mut *self.rows.add(self.global_first + g) };
            // Rows come from segments the daemon does not trust.
            gr.calls = gr.calls.saturating_add(row.calls);
            gr.samples = gr.samples.saturating_add(row.samples);
            gr.time_ns = gr.time_ns.saturating_add(row.time_ns);
            gr.total_calls = gr.total_calls.saturating_add(row.total_calls);
            gr.flags |= row.flags;
        }
    }

    /// Writes a process's threads' rows, after its own and in no global
    /// row: a head row per thread (its name, calls and CPU time), then its
    /// functions'. `names`: the threads' names.
    fn thread_rows<N: RowNames>(&mut self, p: &ProcRows, naming: &RowNaming<N>, names: &[Span32]) {
        for (t, &(name_off, name_len)) in p.threads.iter().zip(names) {
            self.push(Row {
                name_off,
                name_len,
                proc_index: naming.entry,
                flags: ROW_THREAD | ROW_THREAD_HEAD,
                calls: t.rows.iter().fold(0u64, |a, r| a.saturating_add(r.calls)),
                samples: t.samples,
                time_ns: t.samples.saturating_mul(p.period_ns),
                tid: t.tid as u64,
                ..Row::default()
            });
            for r in &t.rows {
                let flags = (r.flags & !(ROW_GLOBAL | ROW_THREAD_HEAD)) | ROW_THREAD;
                self.push(naming.row(r, flags, t.tid as u64));
            }
        }
    }
}

/// Fills the hash index of the global rows (`global_ids`, numbered from
/// `global_first`) in `hash_cap` slots: open addressing from each key's
/// slot. Every global row is distinct, so its slot is the first free one.
fn fill_hash(hash: &mut Vec<u32>, global_ids: &[(u32, u32)], hash_cap: u32, global_first: usize) {
    hash.clear();
    hash.resize(hash_cap as usize, EMPTY);
    for (k, &(_, key)) in global_ids.iter().enumerate() {
        let mut h = key & (hash_cap - 1);
        while hash[h as usize] != EMPTY {
            h = (h + 1) & (hash_cap - 1);
        }
        hash[h as usize] = (global_first + k) as u32;
    }
}

fn row_flags(counted: bool, estimated: bool, accelerated: bool, counting_off: bool) -> u32 {
    (if counted { ROW_COUNTED } else { 0 })
        | if estimated { ROW_ESTIMATED } else { 0 }
        | if accelerated { ROW_ACCELERATED } else { 0 }
        | if counting_off { ROW_COUNTING_OFF } else { 0 }
}

/// A string's (offset, length) in the buffer.
type Span32 = (u32, u32);

/// Where the writer's fixed module names are among its strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct OwnSpans {
    /// `unknown`: samples no module claims.
    unknown: Span32,
    /// `?`: a module index out of range.
    bad: Span32,
    /// `rtprof`: a process's `[rtprof]` row.
    agent: Span32,
}

/// Sets out `sc` for a publish: processes' entries in pid order, rows by
/// executable (the rows of one program's processes share ids, so the
/// global rows they add up to stay in cache), and the writer's own strings
/// (each executable and module once) at `base` and on. Returns where its
/// fixed module names are.
fn plan<'a>(sc: &mut Scratch, procs: &[ProcRows<'a>], base: usize) -> OwnSpans {
    sc.strings.clear();
    sc.exe.clear();
    sc.module_first.clear();
    sc.modules.clear();
    sc.global_ids.clear();
    let mut interned = HashMap::<&'a str, (u32, u32)>::new();
    let strings = &mut sc.strings;
    let mut intern = |s: &'a str| -> (u32, u32) {
        *interned.entry(s).or_insert_with(|| {
            let off = (base + strings.len()) as u32;
            strings.extend_from_slice(s.as_bytes());
            (off, s.len() as u32)
        })
    };
    let own = OwnSpans {
        unknown: intern("unknown"),
        bad: intern("?"),
        agent: intern("rtprof"),
    };
    sc.thread_names.clear();
    sc.thread_first.clear();
    for p in procs {
        sc.exe.push(intern(p.exe));
        sc.module_first.push(sc.modules.len() as u32);
        for m in p.modules {
            sc.modules.push(intern(m));
        }
        sc.thread_first.push(sc.thread_names.len() as u32);
        for t in p.threads {
            sc.thread_names.push(intern(&t.name));
        }
    }
    // Stable: an image replaced by exec stays before its successor.
    sc.order.clear();
    sc.order.extend(0..procs.len() as u32);
    sc.order.sort_by_key(|&i| procs[i as usize].pid);
    sc.entry_of.clear();
    sc.entry_of.resize(procs.len(), 0);
    for (k, &pi) in sc.order.iter().enumerate() {
        sc.entry_of[pi as usize] = k as u32;
    }
    sc.claims.clear();
    for (p, &entry) in procs.iter().zip(&sc.entry_of) {
        if let Some(c) = p.claimed {
            let (exe_off, exe_len) = intern(c);
            sc.claims.push(Claim {
                proc_index: entry,
                exe_off,
                exe_len,
                reserved: 0,
            });
        }
    }
    let exe = &sc.exe;
    sc.order.sort_by_key(|&i| exe[i as usize].0);
    own
}

/// The bytes of plain `repr(C)` records.
fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: `T` is one of the layout's `repr(C)` records of integers (or
    // `u32`), with no padding (their sizes are asserted in `layout`), so
    // all `size_of_val(v)` bytes behind `v` are initialised, and `u8` needs
    // no alignment.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// Names of [`PresentWriter::publish`]'s rows: one id per (executable,
/// name), in an arena of their own.
#[derive(Default)]
struct OwnNames<'a> {
    ids: HashMap<(&'a str, &'a str), u32>,
    arena: String,
    spans: Vec<(u32, u32)>,
    keys: Vec<u32>,
}

impl<'a> OwnNames<'a> {
    fn id(&mut self, exe: &'a str, name: &'a str) -> u32 {
        let next = self.spans.len() as u32;
        *self.ids.entry((exe, name)).or_insert_with(|| {
            self.spans
                .push((self.arena.len() as u32, name.len() as u32));
            self.arena.push_str(name);
            self.keys.push(key_hash(exe, name));
            next
        })
    }
}

impl RowNames for OwnNames<'_> {
    fn strings(&self) -> &str {
        &self.arena
    }
    fn span(&self, id: u32) -> (u32, u32) {
        self.spans[id as usize]
    }
    fn key(&self, id: u32) -> u32 {
        self.keys[id as usize]
    }
}

/// Fixtures for the writer's tests and the reader's: tables to publish and
/// segments to publish them in.
#[cfg(test)]
pub(super) mod tests {
    use super::super::reader::read_view;
    use super::*;

    /// Three processes, two of them one executable; every count a multiple
    /// of `k`, so a reader can tell which publish a row came from.
    pub(in super::super) fn table(k: u64) -> Vec<ProcTable<'static>> {
        let rows = |names: &[&'static str]| {
            names
                .iter()
                .enumerate()
                .map(|(i, n)| RowIn {
                    name: n,
                    module: "app",
                    counted: i != 2,
                    estimated: i == 1,
                    accelerated: i == 0,
                    counting_off: i == 1,
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

    /// A zeroed segment of `len` bytes and its writer; keep the memory as
    /// long as the writer.
    pub(in super::super) fn segment(len: u64) -> (Vec<u64>, PresentWriter) {
        let mut mem = vec![0u64; (len / 8) as usize];
        // SAFETY: `mem` holds `len` zeroed bytes, 8-aligned (it is `u64`s),
        // and is handed back with the writer for the caller to keep.
        let w = unsafe { PresentWriter::init(mem.as_mut_ptr() as *mut u8, len, 1_000_000_000) };
        (mem, w)
    }

    pub(in super::super) fn bytes(mem: &[u64]) -> &[u8] {
        // SAFETY: the `mem.len() * 8` bytes of `mem`, borrowed as long as
        // `mem`; `u8` needs no alignment and any `u64` is valid as bytes.
        unsafe { std::slice::from_raw_parts(mem.as_ptr() as *const u8, mem.len() * 8) }
    }

    pub(in super::super) fn bytes_mut(mem: &mut [u64]) -> &mut [u8] {
        // SAFETY: the `mem.len() * 8` bytes of `mem`, exclusively borrowed
        // as long as `mem` is; `u8` needs no alignment and whatever bytes
        // are written leave valid `u64`s.
        unsafe { std::slice::from_raw_parts_mut(mem.as_mut_ptr() as *mut u8, mem.len() * 8) }
    }

    /// (executable, name) of each id / 7, the names end to end, and their
    /// version.
    struct Names(
        Vec<(&'static str, &'static str)>,
        String,
        Vec<(u32, u32)>,
        u64,
    );
    impl RowNames for Names {
        fn strings(&self) -> &str {
            &self.1
        }
        fn span(&self, id: u32) -> (u32, u32) {
            self.2[id as usize / 7]
        }
        fn key(&self, id: u32) -> u32 {
            let (exe, name) = self.0[id as usize / 7];
            key_hash(exe, name)
        }
        fn version(&self) -> Option<u64> {
            Some(self.3)
        }
    }

    /// `procs` as rows named by sparse ids, as a daemon's are after
    /// processes left, with their names in `names`.
    fn by_id(procs: &[ProcTable<'static>], names: &mut Names) -> Vec<Vec<IdRow>> {
        procs
            .iter()
            .map(|p| {
                p.rows
                    .iter()
                    .map(|r| {
                        let k = match names.0.iter().position(|&n| n == (p.exe, r.name)) {
                            Some(k) => k,
                            None => {
                                names.0.push((p.exe, r.name));
                                names.2.push((names.1.len() as u32, r.name.len() as u32));
                                names.1.push_str(r.name);
                                names.0.len() - 1
                            }
                        };
                        IdRow {
                            id: 7 * k as u32,
                            module: 0,
                            flags: row_flags(r.counted, r.estimated, r.accelerated, r.counting_off),
                            calls: r.calls,
                            samples: r.samples,
                            time_ns: r.time_ns,
                            total_calls: r.total_calls,
                        }
                    })
                    .collect()
            })
            .collect()
    }

    fn proc_rows<'a>(
        procs: &[ProcTable<'a>],
        rows: &'a [Vec<IdRow>],
        modules: &'a [String],
    ) -> Vec<ProcRows<'a>> {
        procs
            .iter()
            .zip(rows)
            .map(|(p, rows)| p.with_rows(modules, rows))
            .collect()
    }

    /// Rows merged by the caller's ids publish the same table as rows
    /// merged by name; processes come out in pid order either way.
    #[test]
    fn ids_merge_rows_as_names_do() {
        let mut by_name = table(3);
        by_name.swap(0, 2);
        // A name no row uses, as a daemon's strings hold after a process left.
        let mut names = Names(Vec::new(), "unused".to_string(), Vec::new(), 1);
        let rows = by_id(&by_name, &mut names);
        let modules = ["app".to_string()];
        let procs = proc_rows(&by_name, &rows, &modules);
        let view = |named: bool| {
            let (mem, mut w) = segment(64 * 1024);
            // Twice: what one publish leaves behind must not leak into the next.
            for k in 1..=2 {
                match named {
                    true => w.publish_rows(k, 1, &procs, &names).unwrap(),
                    false => w.publish(k, 1, &by_name).unwrap(),
                }
            }
            let v = read_view(bytes(&mem)).unwrap();
            (mem, v)
        };
        let ((_, a), (mem, b)) = (view(false), view(true));
        let pids: Vec<u32> = a.procs.iter().map(|p| p.pid).collect();
        assert_eq!(pids, [10, 11, 12]);
        assert_eq!(a.procs, b.procs);
        for (pa, pb) in a.procs.iter().zip(&b.procs) {
            assert_eq!(a.rows[pa.rows.clone()], b.rows[pb.rows.clone()]);
        }
        let (ga, gb) = (&a.rows[a.global.clone()], &b.rows[b.global.clone()]);
        assert_eq!(ga.len(), 4);
        for g in gb {
            assert!(ga.contains(g), "{g:?}");
        }
        let main = gb.iter().find(|g| g.name == "main").unwrap();
        assert_eq!(main.calls, 3 + 3, "two processes of /bin/app");
        // Found through the hash index, built from the names' keys.
        let hot = super::super::reader::lookup(bytes(&mem), "/bin/other", "hot")
            .unwrap()
            .unwrap();
        assert_eq!((hot.name.as_str(), hot.calls), ("hot", 3));
    }

    /// Thread rows follow their process's own rows, each thread's under a
    /// head row with its name; they join no global row, and a reader of
    /// the process's rows alone never sees them.
    #[test]
    fn thread_rows_stay_with_their_process() {
        let t = table(1);
        let mut names = Names(Vec::new(), String::new(), Vec::new(), 1);
        let rows = by_id(&t, &mut names);
        let modules = ["app".to_string()];
        let mut procs = proc_rows(&t, &rows, &modules);
        let hot = rows[0][1];
        let threads = [
            ThreadRows {
                tid: 41,
                name: "worker".into(),
                samples: 5,
                rows: vec![
                    IdRow { calls: 7, ..hot },
                    IdRow {
                        calls: 2,
                        ..rows[0][0]
                    },
                ],
            },
            ThreadRows {
                tid: 42,
                name: "idle".into(),
                samples: 0,
                rows: Vec::new(),
            },
        ];
        procs[0].threads = &threads;
        let (mem, mut w) = segment(64 * 1024);
        w.publish_rows(1, 1, &procs, &names).unwrap();
        let v = read_view(bytes(&mem)).unwrap();
        let p = v.procs.iter().find(|p| p.pid == 10).unwrap();
        assert_eq!(p.rows.len(), 3);
        assert!(v.rows[p.rows.clone()].iter().all(|r| r.thread.is_none()));
        // (tid, name, calls, [(function, calls)]) per thread.
        type Seen<'a> = (u32, &'a str, u64, Vec<(&'a str, u64)>);
        let head: Vec<(u64, u64)> = p.threads.iter().map(|t| (t.samples, t.time_ns)).collect();
        assert_eq!(head, [(5, 5 * p.period_ns), (0, 0)]);
        assert!(p.period_ns > 0);
        let got: Vec<Seen> = p
            .threads
            .iter()
            .map(|t| {
                let rows = &v.rows[t.rows.clone()];
                assert!(rows.iter().all(|r| r.thread == Some(t.tid)));
                let calls = rows.iter().map(|r| (r.name.as_str(), r.calls)).collect();
                (t.tid, t.name.as_str(), t.calls, calls)
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (41, "worker", 9, vec![("hot", 7), ("main", 2)]),
                (42, "idle", 0, vec![])
            ]
        );
        // Global rows: the processes' own rows only.
        let g = &v.rows[v.global.clone()];
        let hot_all = g
            .iter()
            .find(|r| r.name == "hot" && v.exe_of(r) == Some("/bin/app"));
        assert_eq!(hot_all.unwrap().calls, 2 + 2);
        // One process read alone: its own rows.
        let (_, own) = super::super::reader::read_process(bytes(&mem), 10)
            .unwrap()
            .unwrap();
        assert_eq!(own.len(), 3);
    }

    /// Names of an unchanged version are not copied again into a buffer
    /// that has them; a new version is.
    #[test]
    fn unchanged_names_are_copied_once_per_buffer() {
        let t = table(1);
        let mut names = Names(Vec::new(), String::new(), Vec::new(), 1);
        let rows = by_id(&t, &mut names);
        let modules = ["app".to_string()];
        let procs = proc_rows(&t, &rows, &modules);
        let (mut mem, mut w) = segment(64 * 1024);
        for k in 1..=2 {
            w.publish_rows(k, 1, &procs, &names).unwrap();
        }
        let h = w.header;
        // Both buffers have the names: overwrite them there.
        let scribble = |mem: &mut [u64]| {
            for off in h.buffer_off {
                let at = off as usize + size_of::<BufferHeader>();
                bytes_mut(mem)[at..at + 4].copy_from_slice(b"XXXX");
            }
        };
        scribble(&mut mem);
        w.publish_rows(3, 1, &procs, &names).unwrap();
        let first = |mem: &[u64]| read_view(bytes(mem)).unwrap().rows[0].name.clone();
        assert_eq!(first(&mem), "XXXX", "not copied again");
        names.3 = 2;
        w.publish_rows(4, 1, &procs, &names).unwrap();
        assert_eq!(first(&mem), "main");
        // Both buffers get version 2 of `names`.
        w.publish_rows(5, 1, &procs, &names).unwrap();
        scribble(&mut mem);
        w.publish_rows(6, 1, &procs, &names).unwrap();
        assert_eq!(first(&mem), "XXXX", "version 2 is in both buffers");
        // Another caller's names of the same version are copied.
        let other = Names(names.0.clone(), names.1.clone(), names.2.clone(), 2);
        w.publish_rows(7, 1, &procs, &other).unwrap();
        assert_eq!(first(&mem), "main");
    }

    /// Regions follow one another in order, the processes' on a 64-byte
    /// boundary; a buffer short of the process rows needs their end, and
    /// the global rows take what room is left.
    #[test]
    fn regions_follow_one_another() {
        let rows = [3, 2, 1].map(|n| vec![IdRow::default(); n]);
        let procs: Vec<ProcRows> = rows
            .iter()
            .map(|rows| ProcRows {
                rows,
                ..ProcRows::default()
            })
            .collect();
        let r = Regions::new(&procs, 10, 5, 4096).unwrap();
        assert_eq!((r.strings_off, r.strings_len), (128, 15));
        assert_eq!(r.procs_off, 192);
        assert_eq!(r.rows_off, 192 + 3 * 64);
        assert_eq!(r.global_first, 3 + 2 + 1);
        assert_eq!(r.process_rows_end, r.rows_off + 6 * 64);
        assert_eq!(r.room, (4096 - r.process_rows_end) / 64);
        assert_eq!(
            Regions::new(&procs, 10, 5, r.process_rows_end - 1),
            Err(r.process_rows_end)
        );
        let t = r.tail(4, 1);
        assert_eq!(t.hash_off, r.process_rows_end + 4 * 64);
        assert_eq!(t.claims_off, t.hash_off + 8 * 4);
        assert_eq!(t.need, t.claims_off + 16);
        assert_eq!(r.header(&t, 1, 2, 3, 0).claims_off, 0, "no claims");
    }

    /// Rows of one id add up, saturating, in one global row named by the
    /// first of them; a global row past the room is counted, not written.
    #[test]
    fn rows_of_one_id_add_up_in_their_global_row() {
        let mut names = OwnNames::default();
        let (a, b) = (names.id("/bin/a", "f"), names.id("/bin/a", "g"));
        // Three process rows, room for one global row, and one row past it.
        let mut mem = vec![Row::default(); 5];
        let (mut global_of, mut global_ids) = (Vec::new(), Vec::new());
        // SAFETY: `mem` holds more than 3 + 1 rows and outlives `out`.
        let mut out =
            unsafe { RowsOut::new(mem.as_mut_ptr(), 3, 1, &mut global_of, &mut global_ids) };
        let row = |calls, flags| Row {
            calls,
            flags,
            proc_index: calls as u32,
            ..Row::default()
        };
        out.push(row(u64::MAX, ROW_COUNTED));
        out.add_to_global(a, &row(u64::MAX, ROW_COUNTED), &names);
        out.add_to_global(b, &row(5, 0), &names);
        out.add_to_global(a, &row(2, ROW_ESTIMATED), &names);
        assert_eq!(out.next, 1);
        assert_eq!(
            global_ids,
            [(a, key_hash("/bin/a", "f")), (b, key_hash("/bin/a", "g"))]
        );
        let g = mem[3];
        assert_eq!(g.calls, u64::MAX);
        assert_eq!(g.flags, ROW_GLOBAL | ROW_COUNTED | ROW_ESTIMATED);
        assert_eq!(g.proc_index, u64::MAX as u32, "named by its first row");
        assert_eq!(mem[4], Row::default(), "nothing written past the room");
    }

    /// A module index names the process's module, or `unknown`, `rtprof`,
    /// or `?` out of range; the name is the caller's.
    #[test]
    fn rows_are_named_by_their_module_index() {
        let mut names = OwnNames::default();
        names.id("/bin/a", "skip");
        let f = names.id("/bin/a", "f");
        let own = OwnSpans {
            unknown: (1, 7),
            bad: (8, 1),
            agent: (9, 6),
        };
        let naming = RowNaming {
            names: &names,
            own,
            modules: &[(20, 3)],
            entry: 4,
        };
        let module = |m| {
            let r = naming.row(
                &IdRow {
                    id: f,
                    module: m,
                    ..IdRow::default()
                },
                0,
                9,
            );
            assert_eq!((r.name_off, r.name_len, r.proc_index, r.tid), (4, 1, 4, 9));
            (r.module_off, r.module_len)
        };
        assert_eq!(module(0), (20, 3));
        assert_eq!(module(1), own.bad);
        assert_eq!(module(UNKNOWN_MODULE), own.unknown);
        assert_eq!(module(AGENT_MODULE), own.agent);
    }

    /// Keys that collide take the next free slots, wrapping around; every
    /// global row is found by probing from its key's slot.
    #[test]
    fn hash_index_probes_past_collisions() {
        let mut hash = Vec::new();
        fill_hash(&mut hash, &[(0, 7), (1, 15), (2, 3)], 8, 10);
        assert_eq!(hash, [11, EMPTY, EMPTY, 12, EMPTY, EMPTY, EMPTY, 10]);
    }

    #[test]
    fn too_large_is_an_error() {
        let (_mem, mut w) = segment(1024);
        assert!(matches!(
            w.publish(1, 1, &table(1)),
            Err(PresentError::TooLarge { .. })
        ));
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
                    // SAFETY: `mem`'s `len` bytes, dropped only after the
                    // readers are joined. The writer keeps writing them, as
                    // the daemon writes the mapped segment readers see:
                    // `read_view` loads the generation and sequence words
                    // atomically and discards what a publish overlapped.
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
