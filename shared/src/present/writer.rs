//! The daemon's side: builds each span's table and publishes it into the
//! idle buffer.

use super::layout::{
    key_hash, now_ns, BufferHeader, PresentError, PresentHeader, ProcEntry, Row, EMPTY, MAGIC,
    PROC_ENDED, ROW_ACCELERATED, ROW_COUNTED, ROW_COUNTING_OFF, ROW_ESTIMATED, ROW_GLOBAL, VERSION,
};
use std::mem::size_of;
use std::sync::atomic::{fence, AtomicU64, Ordering};

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
    /// The caller's id of (executable, name): rows with one id merge into
    /// one global row, without their names compared. Ids are small
    /// integers, unique per (executable, name). With [`RowNames`] every
    /// row has one, and `name` is not read; without, ids are assigned
    /// here from the names.
    pub id: Option<u32>,
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

/// Names and hash keys (`key_hash(exe, name)`) of the caller's row ids.
/// The caller keeps every name in one string, published as it is: a tick
/// copies it whole instead of touching each name.
pub trait RowNames {
    /// Every name, end to end (names not in use may be among them).
    fn strings(&self) -> &str;
    /// Where id's name lies in [`RowNames::strings`].
    fn span(&self, id: u32) -> (u32, u32);
    fn key(&self, id: u32) -> u32;
}

/// Slots of the hash index for up to `globals` global rows: at most half
/// full, so probes stay short.
fn hash_cap(globals: usize) -> u32 {
    (globals * 2).next_power_of_two().max(8) as u32
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
    /// Process rows, then global rows.
    rows: Vec<Row>,
    hash: Vec<u32>,
    /// Processes in pid order (readers find one by binary search).
    order: Vec<u32>,
    /// Each row's id, in publishing order, and the global row (counted
    /// from the first global row) of each id seen so far, `EMPTY`
    /// otherwise.
    ids: Vec<u32>,
    global_of: Vec<u32>,
    /// Each global row's id and key.
    global_ids: Vec<(u32, u32)>,
    /// Without the caller's names: where each id's name was written.
    name_of: Vec<(u32, u32)>,
    /// Processes by executable.
    by_exe: Vec<u32>,
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

    /// Publishes a span's table: written into the idle buffer, then made
    /// current. Rows are named by their `name`s.
    pub fn publish(
        &mut self,
        span_end_ns: u64,
        span_ns: u64,
        procs: &[ProcTable],
    ) -> Result<(), PresentError> {
        self.publish_with(span_end_ns, span_ns, procs, None)
    }

    /// [`PresentWriter::publish`] for rows named by their ids: every row
    /// has one, `names` names it.
    pub fn publish_named(
        &mut self,
        span_end_ns: u64,
        span_ns: u64,
        procs: &[ProcTable],
        names: &dyn RowNames,
    ) -> Result<(), PresentError> {
        self.publish_with(span_end_ns, span_ns, procs, Some(names))
    }

    fn publish_with(
        &mut self,
        span_end_ns: u64,
        span_ns: u64,
        procs: &[ProcTable],
        names: Option<&dyn RowNames>,
    ) -> Result<(), PresentError> {
        let gen_off = std::mem::offset_of!(PresentHeader, generation) as u64;
        let gen = self.word(gen_off).load(Ordering::Relaxed);
        let b = ((gen + 1) & 1) as usize;
        let boff = self.header.buffer_off[b];
        let (mut hdr, need) = build(&mut self.scratch, span_end_ns, span_ns, procs, names);
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
        // The caller's names come first in the string region.
        let (names_bytes, own_strings) = match names {
            Some(n) => (
                n.strings().as_bytes(),
                hdr.strings_off + n.strings().len() as u32,
            ),
            None => (&[][..], hdr.strings_off),
        };
        // SAFETY: `need` (the end of the last region) fits in the buffer,
        // checked above, and the buffer lies inside the segment (`init`
        // placed it), so every region starts and ends inside it.
        let at = |off: u32| unsafe { self.base.add(boff as usize + off as usize) };
        // SAFETY: every destination range is inside the idle buffer (as
        // above); the sources are the scratch vectors and `hdr`, which do
        // not overlap the segment. Readers do not use the idle buffer: the
        // odd sequence number stored above makes any who still do discard
        // what they read.
        unsafe {
            let h = as_bytes(std::slice::from_ref(&hdr));
            std::ptr::copy_nonoverlapping(h.as_ptr().add(8), at(8), h.len() - 8);
            for (off, bytes) in [
                (hdr.procs_off, as_bytes(&sc.entries)),
                (hdr.rows_off, as_bytes(&sc.rows)),
                (hdr.hash_off, as_bytes(&sc.hash)),
                (hdr.strings_off, names_bytes),
                (own_strings, &sc.strings[..]),
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
    // SAFETY: `T` is one of the layout's `repr(C)` records of integers (or
    // `u32`), with no padding (their sizes are asserted in `layout`), so
    // all `size_of_val(v)` bytes behind `v` are initialised, and `u8` needs
    // no alignment.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// Each row's id, in publishing order: the caller's (with `names`), or
/// assigned from (executable, name).
fn row_ids(procs: &[ProcTable], order: &[u32], named: bool, ids: &mut Vec<u32>) {
    ids.clear();
    let rows = order.iter().flat_map(|&pi| {
        let p = &procs[pi as usize];
        p.rows.iter().map(move |r| (p.exe, r))
    });
    if named {
        ids.extend(rows.map(|(_, r)| r.id.unwrap_or(0)));
    } else {
        let mut by_name = std::collections::HashMap::<(&str, &str), u32>::new();
        for (exe, r) in rows {
            let next = by_name.len() as u32;
            ids.push(*by_name.entry((exe, r.name)).or_insert(next));
        }
    }
}

/// One buffer's regions, in `sc`, and the header that places them.
///
/// Global rows are merged by row id while the process rows are written;
/// a global row's name is written once and shared by its process rows.
/// Executables and modules are interned. The hash index of (executable,
/// name) is built from the global rows' keys at the end.
fn build<'a>(
    sc: &mut Scratch,
    span_end_ns: u64,
    span_ns: u64,
    procs: &[ProcTable<'a>],
    names: Option<&'a dyn RowNames>,
) -> (BufferHeader, u64) {
    let Scratch {
        strings,
        entries,
        rows,
        hash,
        order,
        ids,
        global_of,
        global_ids,
        name_of,
        by_exe,
    } = sc;
    strings.clear();
    entries.clear();
    rows.clear();
    global_ids.clear();
    order.clear();
    order.extend(0..procs.len() as u32);
    // Stable: an image replaced by exec stays before its successor.
    order.sort_by_key(|&i| procs[i as usize].pid);
    row_ids(procs, order, names.is_some(), ids);
    if let Some(&max) = ids.iter().max() {
        if global_of.len() <= max as usize {
            global_of.resize(max as usize + 1, EMPTY);
        }
    }
    // The writer's own strings follow the caller's names.
    let base = names.map_or(0, |n| n.strings().len());
    let push_str = |strings: &mut Vec<u8>, s: &str| {
        let off = (base + strings.len()) as u32;
        strings.extend_from_slice(s.as_bytes());
        (off, s.len() as u32)
    };
    let mut interned = std::collections::HashMap::<&str, (u32, u32)>::new();
    let mut intern = |strings: &mut Vec<u8>, s: &'a str| -> (u32, u32) {
        *interned.entry(s).or_insert_with(|| push_str(strings, s))
    };
    // Without the caller's names, each id's name is written once, where
    // it first comes.
    if names.is_none() && name_of.len() < global_of.len() {
        name_of.resize(global_of.len(), (EMPTY, 0));
    }
    let global_first = ids.len() as u32;
    // The process rows, in pid order.
    let mut next_id = ids.iter();
    for (pi, p) in order.iter().map(|&i| &procs[i as usize]).enumerate() {
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
        for (r, &id) in p.rows.iter().zip(&mut next_id) {
            if !std::ptr::eq(r.module, last_module.0) {
                last_module = (r.module, intern(strings, r.module));
            }
            let (module_off, module_len) = last_module.1;
            let (name_off, name_len) = match names {
                Some(n) => n.span(id),
                None => {
                    let at = &mut name_of[id as usize];
                    if at.0 == EMPTY {
                        *at = push_str(strings, r.name);
                    }
                    *at
                }
            };
            rows.push(Row {
                name_off,
                name_len,
                module_off,
                module_len,
                proc_index: pi as u32,
                flags: if r.counted { ROW_COUNTED } else { 0 }
                    | if r.estimated { ROW_ESTIMATED } else { 0 }
                    | if r.accelerated { ROW_ACCELERATED } else { 0 }
                    | if r.counting_off { ROW_COUNTING_OFF } else { 0 },
                calls: r.calls,
                samples: r.samples,
                time_ns: r.time_ns,
                total_calls: r.total_calls,
                check: 0,
            });
        }
    }
    // The global rows, merged executable by executable: the rows of one
    // program's processes share ids, so what they add up stays in cache.
    // They follow the process rows in place (no copy of either).
    by_exe.clear();
    by_exe.extend(0..entries.len() as u32);
    by_exe.sort_by_key(|&pi| (entries[pi as usize].exe_off, pi));
    for &pi in by_exe.iter() {
        let e = &entries[pi as usize];
        let p = &procs[order[pi as usize] as usize];
        let first = e.first_row as usize;
        for k in first..first + e.row_count as usize {
            let (id, row) = (ids[k], rows[k]);
            let at = (global_first as usize).saturating_add(global_of[id as usize] as usize);
            let g = match rows.get_mut(at) {
                Some(g) => g,
                None => {
                    global_of[id as usize] = (rows.len() - global_first as usize) as u32;
                    let key = names
                        .map_or_else(|| key_hash(p.exe, p.rows[k - first].name), |n| n.key(id));
                    global_ids.push((id, key));
                    // Its process: the first of the executable in pid order.
                    rows.push(Row {
                        flags: ROW_GLOBAL,
                        calls: 0,
                        samples: 0,
                        time_ns: 0,
                        total_calls: 0,
                        ..row
                    });
                    rows.last_mut().unwrap()
                }
            };
            // Rows come from segments the daemon does not trust.
            g.calls = g.calls.saturating_add(row.calls);
            g.samples = g.samples.saturating_add(row.samples);
            g.time_ns = g.time_ns.saturating_add(row.time_ns);
            g.total_calls = g.total_calls.saturating_add(row.total_calls);
            g.flags |= row.flags;
        }
    }
    // Ready for the next publish; every global row is distinct, so its
    // hash slot is the first free one.
    let cap = hash_cap(global_ids.len());
    hash.clear();
    hash.resize(cap as usize, EMPTY);
    for (k, &(id, key)) in global_ids.iter().enumerate() {
        global_of[id as usize] = EMPTY;
        if let Some(at) = name_of.get_mut(id as usize) {
            *at = (EMPTY, 0);
        }
        let mut h = key & (cap - 1);
        while hash[h as usize] != EMPTY {
            h = (h + 1) & (cap - 1);
        }
        hash[h as usize] = global_first + k as u32;
    }
    let global_count = global_ids.len() as u32;
    let procs_off = size_of::<BufferHeader>();
    let rows_off = procs_off + entries.len() * 64;
    let hash_off = rows_off + rows.len() * 64;
    let strings_off = hash_off + hash.len() * 4;
    for r in rows.iter_mut() {
        r.check = r.checksum();
    }
    // Offsets are 32-bit: a larger table cannot be published at all.
    let strings_len = base + strings.len();
    let need = (strings_off + strings_len) as u64;
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
        strings_len: strings_len as u32,
        procs_off: procs_off as u32,
        rows_off: rows_off as u32,
        hash_off: hash_off as u32,
        strings_off: strings_off as u32,
        reserved: [0; 7],
    };
    (h, need)
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
                    id: None,
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

    /// Rows merged by the caller's ids publish the same table as rows
    /// merged by name; processes come out in pid order either way.
    #[test]
    fn ids_merge_rows_as_names_do() {
        /// (executable, name) of each id / 7, and the names end to end.
        struct Names(Vec<(&'static str, &'static str)>, String, Vec<(u32, u32)>);
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
        }
        let mut by_name = table(3);
        by_name.swap(0, 2);
        let mut by_id = by_name.clone();
        // A name no row uses, as a daemon's strings hold after a process left.
        let mut names = Names(Vec::new(), "unused".to_string(), Vec::new());
        for p in &mut by_id {
            for r in &mut p.rows {
                // Sparse ids, as a daemon's are after processes left.
                let k = match names.0.iter().position(|&n| n == (p.exe, r.name)) {
                    Some(k) => k,
                    None => {
                        names.0.push((p.exe, r.name));
                        names.2.push((names.1.len() as u32, r.name.len() as u32));
                        names.1.push_str(r.name);
                        names.0.len() - 1
                    }
                };
                r.id = Some(7 * k as u32);
                // Not read: the names come from `names`.
                r.name = "";
            }
        }
        let view = |t: &[ProcTable], names: Option<&dyn RowNames>| {
            let (mem, mut w) = segment(64 * 1024);
            // Twice: what one publish leaves behind must not leak into the next.
            for k in 1..=2 {
                match names {
                    Some(n) => w.publish_named(k, 1, t, n).unwrap(),
                    None => w.publish(k, 1, t).unwrap(),
                }
            }
            let v = read_view(bytes(&mem)).unwrap();
            (mem, v)
        };
        let ((_, a), (mem, b)) = (view(&by_name, None), view(&by_id, Some(&names)));
        let pids: Vec<u32> = a.procs.iter().map(|p| p.pid).collect();
        assert_eq!(pids, [10, 11, 12]);
        assert_eq!(a.procs, b.procs);
        assert_eq!(a.rows, b.rows);
        assert_eq!(a.global, b.global);
        let globals = &b.rows[b.global.clone()];
        let main = globals.iter().find(|g| g.name == "main").unwrap();
        assert_eq!(main.calls, 3 + 3, "two processes of /bin/app");
        assert_eq!(globals.len(), 4);
        // Found through the hash index, built from the names' keys.
        let hot = super::super::reader::lookup(bytes(&mem), "/bin/other", "hot")
            .unwrap()
            .unwrap();
        assert_eq!((hot.name.as_str(), hot.calls), ("hot", 3));
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
