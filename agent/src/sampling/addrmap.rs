//! Where a sampled instruction pointer belongs: a sorted table of address
//! ranges, each pointing straight at the sample counter it feeds (a
//! function's, a stub's owner's, or a module's "elsewhere" bucket).
//!
//! The table is rebuilt when libraries come and go and published through
//! one pointer. Readers (the drain thread, signal handlers) announce
//! themselves in a counter; the publisher frees an old table only once no
//! reader can still hold it. Lookups never allocate or lock.

use crate::lifecycle::lock::Lock;
use rtprof_abi::layout::module_flags;
use rtprof_abi::SegmentWriter;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// [start, end) of a function's code, its stub or a loop probe. Small (24
/// bytes): a process with libpython and libc instrumented has 20,000 of
/// them, and the table is rebuilt whenever a library comes or goes.
#[derive(Clone, Copy, Debug)]
struct Range {
    start: u64,
    end: u64,
    /// The function slot (its sample counter, and its stack frame's id).
    id: u32,
    /// Where in its function a sample here is counted: [`AT_NONE`] (a
    /// stub), [`AT_START`] (its offset from `start`: the function's own
    /// code) or this offset (a loop probe: the code it runs stands for the
    /// window's, in one block of the function).
    at: u32,
}

const AT_NONE: u32 = u32::MAX;
const AT_START: u32 = u32::MAX - 1;

/// [start, end) of a module's executable code.
#[derive(Clone, Copy, Debug)]
struct ModuleRange {
    start: u64,
    end: u64,
    record: u32,
    /// Its functions are named when a sample first lands in it.
    on_demand: bool,
}

trait Span {
    fn start(&self) -> u64;
    fn end(&self) -> u64;
}

impl Span for Range {
    fn start(&self) -> u64 {
        self.start
    }
    fn end(&self) -> u64 {
        self.end
    }
}

impl Span for ModuleRange {
    fn start(&self) -> u64 {
        self.start
    }
    fn end(&self) -> u64 {
        self.end
    }
}

/// A module present in the process: its record in the segment and the
/// runtime ranges of its executable segments.
#[derive(Clone, Debug)]
pub struct Present {
    pub record: u32,
    pub exec: Vec<(u64, u64)>,
}

pub struct AddrMap {
    /// Functions, stubs and loop probes, sorted, not overlapping.
    funcs: Vec<Range>,
    /// Executable ranges of modules, sorted.
    modules: Vec<ModuleRange>,
    /// Loop probes: (first byte, address of the window it stands for),
    /// sorted.
    probes: Vec<(u64, u64)>,
    counters: rtprof_abi::writer::Counters,
}

// SAFETY: `counters` refers to the process's counter segment, mapped for
// good and shared by every thread; the table owns nothing thread-bound.
unsafe impl Send for AddrMap {}
// SAFETY: a shared table is only read, and the counters it points to are
// atomics, updated from any thread.
unsafe impl Sync for AddrMap {}

fn find<T: Span>(v: &[T], ip: u64) -> Option<&T> {
    let i = v.partition_point(|r| r.start() <= ip);
    let r = v.get(i.checked_sub(1)?)?;
    (ip < r.end()).then_some(r)
}

/// Sorts and clips ranges so none overlaps the next (a symbol whose size
/// runs into its successor keeps the part before it).
fn normalise<T: Span + Copy>(v: &mut Vec<T>, clip: impl Fn(&mut T, u64)) {
    // Stable: the input is a few sorted runs (a module's functions, its
    // stubs), which a merge sort joins in linear time.
    v.sort_by_key(|r| (r.start(), std::cmp::Reverse(r.end())));
    v.dedup_by_key(|r| r.start());
    for i in 1..v.len() {
        let next = v[i].start();
        if v[i - 1].end() > next {
            clip(&mut v[i - 1], next);
        }
    }
    v.retain(|r| r.end() > r.start());
}

/// The last table's vectors, kept for the next build: a table is rebuilt
/// for every library loaded, and fresh vectors of its size cost hundreds
/// of page faults each time.
static SPARE: Lock<Option<(Vec<Range>, Vec<ModuleRange>)>> = Lock::new(None);

impl AddrMap {
    /// Builds the table for the modules in `present` from their records in
    /// `w`; `stubs` are (start, end, function slot).
    /// `probes` are loop probes: (start, end, function slot, offset).
    pub fn build(
        w: &SegmentWriter,
        present: &[Present],
        stubs: &[(u64, u64, u32)],
        probes: &[(u64, u64, u32, u32)],
    ) -> AddrMap {
        // Never waited for: new vectors do as well.
        let (mut funcs, mut modules) = SPARE
            .try_lock()
            .and_then(|mut s| s.take())
            .unwrap_or_default();
        funcs.clear();
        modules.clear();
        let func_count = w.func_count();
        for p in present {
            if p.record >= w.module_count() {
                continue;
            }
            let m = w.module(p.record);
            let on_demand = m.flags & module_flags::NAMED_ON_DEMAND != 0;
            modules.extend(p.exec.iter().map(|&(start, end)| ModuleRange {
                start,
                end,
                record: p.record,
                on_demand,
            }));
            let last = m.first_func.saturating_add(m.func_count).min(func_count);
            for slot in m.first_func..last {
                let f = w.function(slot);
                let start = m.base.wrapping_add(f.vaddr);
                if f.size > 0 {
                    funcs.push(Range {
                        start,
                        end: start.saturating_add(f.size as u64),
                        id: slot,
                        at: AT_START,
                    });
                }
            }
        }
        funcs.extend(
            stubs
                .iter()
                .filter(|s| s.2 < func_count)
                .map(|&(start, end, slot)| Range {
                    start,
                    end,
                    id: slot,
                    at: AT_NONE,
                }),
        );
        funcs.extend(
            probes
                .iter()
                .filter(|s| s.2 < func_count && s.3 < AT_START)
                .map(|&(start, end, slot, off)| Range {
                    start,
                    end,
                    id: slot,
                    at: off,
                }),
        );
        let mut origins: Vec<(u64, u64)> = probes
            .iter()
            .filter(|s| s.2 < func_count)
            .map(|&(start, _, slot, off)| {
                let f = w.function(slot);
                let base = w.module(f.module).base;
                (start, base.wrapping_add(f.vaddr) + off as u64)
            })
            .collect();
        origins.sort_unstable();
        normalise(&mut funcs, |r, end| r.end = end);
        normalise(&mut modules, |r, end| r.end = end);
        AddrMap {
            funcs,
            modules,
            probes: origins,
            counters: *w.counters(),
        }
    }

    /// The sample counter of what `ip` is in: its function's (also from
    /// its stub or loop probe), its module's, or the unknown bucket's.
    #[inline]
    fn counter(&self, func: Option<&Range>, module: Option<&ModuleRange>) -> &AtomicU64 {
        match (func, module) {
            (Some(r), _) => self.counters.function_samples(routed_row(r.id)),
            (None, Some(m)) => self.counters.module_samples(m.record),
            (None, None) => self.counters.samples_unknown(),
        }
    }

    /// The counter a sample at `ip` goes to, and the record of the module
    /// named on demand it lands in, if it does (one lookup for both).
    #[inline]
    fn place(&self, ip: u64) -> (&AtomicU64, Option<u32>, Option<&Range>) {
        let func = find(&self.funcs, ip);
        let module = match func {
            Some(_) => None,
            None => find(&self.modules, ip),
        };
        let on_demand = module.filter(|m| m.on_demand).map(|m| m.record);
        (self.counter(func, module), on_demand, func)
    }

    /// Counts `n` samples at `ip`, unless `hold_unnamed` and it lands in a
    /// module named on demand: then counts nothing and says so.
    /// No allocation, no lock: safe in a signal handler.
    #[inline]
    fn count_or_hold(&self, ip: u64, n: u64, hold_unnamed: bool) -> Counted {
        let (counter, on_demand, func) = self.place(ip);
        if let (true, Some(record)) = (hold_unnamed, on_demand) {
            return Counted::Held(record);
        }
        counter.fetch_add(n, Ordering::Relaxed);
        self.counters
            .samples_total()
            .fetch_add(n, Ordering::Relaxed);
        match func {
            Some(r) => {
                match r.at {
                    AT_NONE => {}
                    AT_START => super::offsets::record(r.id, (ip - r.start) as u32, n),
                    off => super::offsets::record(r.id, off, n),
                }
                // A stub (no place in the function) or a loop probe: what
                // counting costs.
                if r.at != AT_START {
                    self.counters
                        .cost(rtprof_abi::layout::cost::IN_STUBS)
                        .fetch_add(n, Ordering::Relaxed);
                }
                Counted::Function(routed_row(r.id))
            }
            None => Counted::Elsewhere,
        }
    }
}

/// Implementations whose routes are active, each as its code's slot and
/// its row (`code << 32 | row`, 0: free): a sample in that code counts for
/// the implementation that runs the routed calls, once, not for the code's
/// own function nor for every offer of the same code.
static ROUTED: [AtomicU64; MAX_ROUTED] = [const { AtomicU64::new(0) }; MAX_ROUTED];
const MAX_ROUTED: usize = 64;
/// Set once any route was active: until then a sample asks nothing.
static ANY_ROUTED: AtomicBool = AtomicBool::new(false);

/// The slot a sample in function `slot`'s code counts for: the row of the
/// implementation routed to it now, or the slot itself.
#[inline]
fn routed_row(slot: u32) -> u32 {
    if !ANY_ROUTED.load(Ordering::Relaxed) {
        return slot;
    }
    for r in &ROUTED {
        let v = r.load(Ordering::Relaxed);
        if v != 0 && (v >> 32) as u32 == slot {
            return v as u32;
        }
    }
    slot
}

/// The function slot whose code holds `ip`, if its module is named.
pub fn slot_at(ip: u64) -> Option<u32> {
    with_current(|m| find(&m.funcs, ip).map(|r| r.id))
}

/// Samples in function `code`'s code count for implementation `row` while
/// `active` (from the routes, under the state lock). Returns false if
/// every place is taken (the samples then stay the code's).
pub fn set_routed(code: u32, row: u32, active: bool) -> bool {
    let v = (code as u64) << 32 | row as u64;
    if !active {
        for r in &ROUTED {
            let _ = r.compare_exchange(v, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
        return true;
    }
    ANY_ROUTED.store(true, Ordering::Release);
    if ROUTED.iter().any(|r| r.load(Ordering::Acquire) == v) {
        return true;
    }
    ROUTED.iter().any(|r| {
        r.compare_exchange(0, v, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })
}

static CURRENT: AtomicPtr<AddrMap> = AtomicPtr::new(std::ptr::null_mut());
/// Readers between announcing themselves and being done with the table.
static READERS: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` on the current table (none yet: `None`), announced as a reader.
#[inline]
fn with_current<R>(f: impl FnOnce(&AddrMap) -> Option<R>) -> Option<R> {
    READERS.fetch_add(1, Ordering::SeqCst);
    let m = CURRENT.load(Ordering::SeqCst);
    // SAFETY: a published table is freed only once no reader is announced.
    let r = if m.is_null() { None } else { f(unsafe { &*m }) };
    READERS.fetch_sub(1, Ordering::Release);
    r
}

/// Where a sample was counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    /// For function `slot` (its own code, or its stub's).
    Function(u32),
    /// For a module's code outside its functions, unknown code, or nothing
    /// (no table yet).
    Elsewhere,
    /// Not counted: it lands in the module of this record, named on
    /// demand, whose functions are not listed yet.
    Held(u32),
}

/// Counts `n` samples at `ip` against the current table (dropped if none
/// yet).
#[inline]
pub fn count(ip: u64, n: u64) -> Counted {
    with_current(|m| Some(m.count_or_hold(ip, n, false))).unwrap_or(Counted::Elsewhere)
}

/// Counts `n` samples at `ip`, unless they land in a module named on
/// demand (none of its functions listed yet): then they are held, and
/// count nothing, so they can wait for the names.
#[inline]
pub fn count_unless_unnamed(ip: u64, n: u64) -> Counted {
    with_current(|m| Some(m.count_or_hold(ip, n, true))).unwrap_or(Counted::Elsewhere)
}

/// What the stack frames at `ips` are (see `stacks`), into `out`: each
/// one's function slot, its module's, or `unknown` outside every known
/// module. One announcement as a reader for the whole stack.
pub fn place_ids(ips: &[u64], out: &mut [u32], unknown: u32) {
    let found = with_current(|m| {
        for (ip, o) in ips.iter().zip(out.iter_mut()) {
            *o = match find(&m.funcs, *ip) {
                Some(r) => r.id,
                None => find(&m.modules, *ip).map_or(unknown, |r| super::stacks::MODULE | r.record),
            };
        }
        Some(())
    });
    if found.is_none() {
        out.iter_mut().for_each(|o| *o = unknown);
    }
}

/// Set once a table with loop probes is published: until then (and in
/// every process that counts no loop) a stacked sample asks nothing.
static ANY_PROBE: AtomicBool = AtomicBool::new(false);

/// If `ip` is in a loop probe: the probe's first byte and the address of
/// the window it stands for.
#[inline]
pub fn probe_at(ip: u64) -> Option<(u64, u64)> {
    if !ANY_PROBE.load(Ordering::Relaxed) {
        return None;
    }
    with_current(|m| {
        let r = find(&m.funcs, ip).filter(|r| r.at < AT_START)?;
        let i = m.probes.binary_search_by_key(&r.start, |p| p.0).ok()?;
        Some((r.start, m.probes[i].1))
    })
}

/// The record of the module named on demand that a sample at `ip` lands
/// in, counting nothing.
pub fn named_on_demand_at(ip: u64) -> Option<u32> {
    with_current(|m| m.place(ip).1)
}

/// Makes `map` current. The old table is freed once no reader is inside
/// [`count`]; a reader that never finishes (a thread stopped in a signal
/// handler) makes us keep it rather than wait for ever.
pub fn publish(map: AddrMap) {
    if !map.probes.is_empty() {
        ANY_PROBE.store(true, Ordering::Relaxed);
    }
    let old = CURRENT.swap(Box::into_raw(Box::new(map)), Ordering::SeqCst);
    if old.is_null() {
        return;
    }
    for i in 0..2000 {
        if READERS.load(Ordering::SeqCst) == 0 {
            // SAFETY: `old` came from Box::into_raw when published, was
            // swapped out of CURRENT (no new reader finds it) and no
            // reader is left that could hold it.
            let old = unsafe { Box::from_raw(old) };
            if let Some(mut spare) = SPARE.try_lock() {
                *spare = Some((old.funcs, old.modules));
            }
            return;
        }
        if i < 100 {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
}

#[cfg(test)]
pub(crate) fn clear_for_test() {
    let old = CURRENT.swap(std::ptr::null_mut(), Ordering::SeqCst);
    if !old.is_null() {
        // SAFETY: published with Box::into_raw; the tests that publish
        // take turns, so no reader holds it.
        drop(unsafe { Box::from_raw(old) });
    }
}

/// In a forked child: a reader of the parent (another thread) that was
/// inside [`count`] at fork time does not exist here, nor one that held
/// the spare vectors.
pub fn reset_readers_in_child() {
    READERS.store(0, Ordering::Relaxed);
    SPARE.reset_in_child();
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rtprof_abi::{Capacities, Layout};

    /// A segment in a Vec: module "app" at 0x10000 with f [0x100,+0x40),
    /// g [0x200,+0x10) and h overlapping g [0x208,+0x100); no-size z.
    pub(crate) fn fixture() -> (Vec<u64>, SegmentWriter) {
        let layout = Layout::new(Capacities {
            modules: 8,
            functions: 8,
            strings: 256,
            stripes: 2,
        });
        let mut buf = vec![0u64; (layout.total_size / 8) as usize];
        // SAFETY: `buf` is zeroed, 8-aligned, `total_size` long, and is
        // returned with `w`, which it outlives.
        let mut w = unsafe { SegmentWriter::init(buf.as_mut_ptr() as *mut u8, layout, 1, 0, 0) };
        w.add_module(b"/app", 0x10000).unwrap();
        for (n, a, s) in [
            ("f", 0x100, 0x40),
            ("g", 0x200, 0x10),
            ("h", 0x208, 0x100),
            ("z", 0x400, 0),
        ] {
            w.add_function(n.as_bytes(), a, s).unwrap();
        }
        (buf, w)
    }

    pub(crate) fn present() -> Vec<Present> {
        vec![Present {
            record: 0,
            exec: vec![(0x10000, 0x11000)],
        }]
    }

    fn samples(w: &SegmentWriter, slot: u32) -> u64 {
        w.counters().function_samples(slot).load(Ordering::Relaxed)
    }

    #[test]
    fn attributes_functions_stubs_modules_and_unknown() {
        let (_buf, w) = fixture();
        let m = AddrMap::build(
            &w,
            &present(),
            &[(0x900000, 0x900020, 1)],
            &[(0xa00000, 0xa00040, 2, 4)],
        );
        for ip in [
            0x10100, 0x1013f, 0x10200, 0x10207, 0x10208, 0x900010, 0x10400, 0x5, 0xa0003f,
        ] {
            m.count_or_hold(ip, 1, false);
        }
        assert_eq!(samples(&w, 0), 2, "f: first and last byte");
        assert_eq!(samples(&w, 1), 3, "g: twice, and once from its stub");
        assert_eq!(
            samples(&w, 2),
            2,
            "h: from where g ends, and its loop probe"
        );
        assert_eq!(samples(&w, 3), 0, "z has no size");
        assert_eq!(w.counters().module_samples(0).load(Ordering::Relaxed), 1);
        assert_eq!(w.counters().samples_unknown().load(Ordering::Relaxed), 1);
        assert_eq!(w.counters().samples_total().load(Ordering::Relaxed), 9);
    }

    #[test]
    fn normalise_clips_and_dedups() {
        let r = |start, end| Range {
            start,
            end,
            id: 0,
            at: AT_START,
        };
        let mut v = vec![r(10, 50), r(0, 20), r(10, 15), r(60, 60)];
        normalise(&mut v, |r, end| r.end = end);
        let got: Vec<_> = v.iter().map(|r| (r.start, r.end)).collect();
        assert_eq!(got, vec![(0, 10), (10, 50)]);
    }
}
