//! Validating reader: turns the bytes of a counter segment, which may be
//! truncated, stale or hostile, into a [`Snapshot`] or a [`SegmentError`].
//! It never trusts an offset, length or count it has not checked. It also
//! reads the files the agent writes beside its segment at exit (stacks,
//! callers, threads, events; loops' in [`crate::loops`]), as strictly.

use crate::layout::*;
use crate::loops::{LoopCounts, LoopStats, Offsets};
use crate::Refusal;
use std::fmt;
use std::mem::size_of;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SegmentError {
    TooShort {
        len: u64,
        need: u64,
    },
    BadMagic,
    UnsupportedVersion(u32),
    BadHeaderSize(u32),
    /// A region lies outside the segment or overlaps the header.
    BadRegion(&'static str),
    /// A count exceeds its capacity.
    BadCount(&'static str),
    /// A string reference points outside the string table.
    BadString(&'static str),
    /// A function references a module that does not exist, or a module's
    /// function range is outside the function table.
    BadReference(&'static str),
    /// Something a reader already took changed (a count went down, the
    /// executable was renamed): segments only ever add.
    Rewritten(&'static str),
    /// The counters kept being folded while read (1,000 tries): no sum of
    /// one moment. Try again later.
    Busy,
}

impl fmt::Display for SegmentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SegmentError::TooShort { len, need } => {
                write!(f, "segment truncated: {len} bytes, need {need}")
            }
            SegmentError::BadMagic => f.write_str("not an rtprof counter segment (bad magic)"),
            SegmentError::Busy => {
                f.write_str("counters kept changing under a fold; no consistent sum")
            }
            SegmentError::UnsupportedVersion(v) => write!(f, "unsupported segment version {v}"),
            SegmentError::BadHeaderSize(s) => write!(f, "bad header size {s}"),
            SegmentError::BadRegion(r) => write!(f, "region {r} out of bounds"),
            SegmentError::BadCount(c) => write!(f, "count {c} exceeds capacity"),
            SegmentError::BadString(s) => write!(f, "string {s} out of bounds"),
            SegmentError::BadReference(r) => write!(f, "bad reference: {r}"),
            SegmentError::Rewritten(what) => {
                write!(
                    f,
                    "{what} rewritten (a segment may only add to what it holds)"
                )
            }
        }
    }
}

impl std::error::Error for SegmentError {}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleStats {
    pub path: String,
    pub base: u64,
    pub functions: u32,
    pub patched: u32,
    /// Non-zero refusal counts, in reason-code order.
    pub refused: Vec<(Refusal, u32)>,
    /// Not instrumented; its functions are listed for samples only.
    pub sampled_only: bool,
    /// Its patched code was mapped from a page image, not written.
    pub code_from_image: bool,
    /// Samples in the module's code outside its listed functions.
    pub samples: u64,
    /// Why it is not instrumented or lists no functions, where a report
    /// should say so.
    pub note: Option<&'static str>,
}

impl ModuleStats {
    /// The file name of the module's path.
    pub fn name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionStats {
    pub name: String,
    pub module: u32,
    pub vaddr: u64,
    pub size: u32,
    /// `None` when patched (or not instrumented, see `instrumented`).
    pub refused: Option<Refusal>,
    /// `false` in a sampled-only module: no call counts.
    pub instrumented: bool,
    pub calls: u64,
    pub samples: u64,
    /// Patched, with counting switched off when the segment was read.
    pub counting_off: bool,
    /// Counted in bursts under an overhead budget: `calls` is an estimate,
    /// within this many hundredths of a percent of the true count.
    pub estimated: Option<u16>,
    /// Entered through a trap (`RTPROF_TRAPS=1`): exact, a signal per call.
    pub trapped: bool,
    /// The program offered other implementations of it.
    pub offered: bool,
    /// An offered function whose own code runs its calls now, or an
    /// implementation that does.
    pub active: bool,
    /// A row of an implementation offered for another function: its
    /// calls are those routed to it, its samples those of the function
    /// whose code it is (`size` 0: it covers no addresses of its own).
    pub implementation: Option<Implementation>,
    /// Where the function is defined, if debug information says (filled in
    /// by the reader of a report for the rows it shows: the segment does
    /// not carry it).
    pub source: Option<SourceLine>,
}

/// What an implementation row is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Implementation {
    /// The slot of the function it implements.
    pub of: u32,
    /// Its name, as offered (`fast` in `work [fast]`).
    pub name: String,
    /// Its address in the process.
    pub address: u64,
    /// The slot of the function its code lies in, if one is listed.
    pub code: Option<u32>,
}

/// A source file and line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceLine {
    pub file: String,
    pub line: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// What the agent cost the process, where its segment says.
    pub cost: Option<AgentCost>,
    pub pid: u32,
    pub ppid: u32,
    pub exe: String,
    pub state: u32,
    pub exit_status: i32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub sample_period_ns: u64,
    pub samples_total: u64,
    pub samples_lost: u64,
    /// Samples outside every known module.
    pub samples_unknown: u64,
    pub sampler: crate::sampling::Sampler,
    pub sampler_why: crate::sampling::Why,
    pub sampler_errno: u32,
    pub setup_ns: u64,
    /// Not in the segment: set by a collector that saw a later image of the
    /// same process (same pid, started later), which means this one exec'd.
    pub replaced_by_exec: bool,
    /// Stripes ever handed out (bounded by the threads alive at once).
    pub stripes: u32,
    pub modules: Vec<ModuleStats>,
    pub functions: Vec<FunctionStats>,
    /// Sampled call stacks (not in the segment: read from the file the
    /// agent writes beside it at exit, see [`Stacks::parse`]).
    pub stacks: Stacks,
    /// Exact callers (`RTPROF_CALLERS=1`; from the file the agent writes
    /// beside its segment, see [`Callers::parse`]).
    pub callers: Callers,
    /// Exact calls per thread (from the file the agent writes beside its
    /// segment at exit, see [`Threads::parse`]).
    pub threads: Threads,
    /// Events sampled besides CPU time (`RTPROF_EVENTS`; from the file the
    /// agent writes beside its segment at exit, see [`Events::parse`]).
    pub events: Events,
    /// Samples by their place in their function (from the file the agent
    /// writes beside its segment at exit, see [`Offsets::parse`]).
    pub offsets: Offsets,
    /// Exact counts of the loops of functions named in `RTPROF_LOOPS`
    /// (from the file the agent writes beside its segment at exit, see
    /// [`LoopCounts::parse`]).
    pub loop_counts: LoopCounts,
    /// Loops of sampled functions with their samples (found by a reader
    /// with the functions' code at hand: the segment does not carry them).
    pub loops: Vec<LoopStats>,
}

/// The events a process asked for: each one's outcome and, for those
/// that ran, its samples per function, module and thread.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Events {
    pub events: Vec<EventCounts>,
    /// Samples of threads past the agent's table (in the totals only).
    pub threads_dropped: u64,
}

/// What became of one event asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventStatus {
    Ran,
    /// Not an event rtprof knows.
    Unknown,
    /// The kernel refused it (`errno` says why).
    Unavailable,
    /// Events are sampled beside the perf sampler, which did not run.
    NoPerfSampler,
}

impl EventStatus {
    fn from_code(c: &str) -> Option<EventStatus> {
        Some(match c {
            "0" => EventStatus::Ran,
            "1" => EventStatus::Unknown,
            "2" => EventStatus::Unavailable,
            "3" => EventStatus::NoPerfSampler,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            EventStatus::Ran => "ran",
            EventStatus::Unknown => "unknown event",
            EventStatus::Unavailable => "unavailable",
            EventStatus::NoPerfSampler => "needs a drain thread (sampling off)",
        }
    }
}

/// One event: its outcome, and its samples (each stands for `period`
/// events) per function, module and thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventCounts {
    pub name: String,
    pub status: EventStatus,
    pub errno: u32,
    pub period: u64,
    /// Counted in user mode only (kernel-mode counting was refused).
    pub user_only: bool,
    /// Samples the kernel reported lost (its ring was full).
    pub lost: u64,
    /// (index in `Snapshot::functions`, samples).
    pub functions: Vec<(u32, u64)>,
    /// (index in `Snapshot::modules`, samples) in modules whose functions
    /// are not listed.
    pub modules: Vec<(u32, u64)>,
    /// Samples outside every known module.
    pub unknown: u64,
    /// (tid, samples).
    pub threads: Vec<(u32, u64)>,
}

impl EventCounts {
    /// Samples in all.
    pub fn samples(&self) -> u64 {
        // Saturating: the numbers come from a file.
        let sum = |v: &[(u32, u64)]| v.iter().fold(0u64, |a, &(_, n)| a.saturating_add(n));
        sum(&self.functions)
            .saturating_add(sum(&self.modules))
            .saturating_add(self.unknown)
    }

    /// The events the samples stand for.
    pub fn estimate(&self, samples: u64) -> u64 {
        samples.saturating_mul(self.period)
    }

    /// Samples in function `slot`.
    pub fn in_function(&self, slot: u32) -> u64 {
        self.functions
            .iter()
            .find(|&&(f, _)| f == slot)
            .map_or(0, |&(_, n)| n)
    }
}

impl Events {
    /// Reads the events file the agent writes: `rtprof-events 1
    /// <threads' samples not kept apart>`, then per event `e <name>
    /// <status> <errno> <period> <user only> <lost>` followed by `f <slot>
    /// <n>`, `m <module> <n>`, `u <n>` and `t <tid> <n>` lines. A slot or
    /// module out of range, or a line that is none of these, refuses the
    /// file.
    pub fn parse(text: &str, s: &Snapshot) -> Result<Events, SegmentError> {
        let bad = SegmentError::BadReference("events file");
        let ([threads_dropped], lines) = side_file(text, "rtprof-events", &bad)?;
        let num = |v: &str| v.parse::<u64>().map_err(|_| bad.clone());
        let index = |v: &str, len: usize| -> Result<u32, SegmentError> {
            match num(v)? {
                i if i < len as u64 => Ok(i as u32),
                _ => Err(bad.clone()),
            }
        };
        let mut out = Events {
            events: Vec::new(),
            threads_dropped,
        };
        for line in lines.filter(|l| !l.is_empty()) {
            let f: Vec<&str> = line.split(' ').collect();
            if let ["e", name, status, errno, period, user_only, lost] = f[..] {
                if name.is_empty() || name.len() > 64 {
                    return Err(bad);
                }
                out.events.push(EventCounts {
                    name: name.to_string(),
                    status: EventStatus::from_code(status).ok_or(bad.clone())?,
                    errno: u32::try_from(num(errno)?).map_err(|_| bad.clone())?,
                    period: num(period)?,
                    user_only: match user_only {
                        "0" => false,
                        "1" => true,
                        _ => return Err(bad),
                    },
                    lost: num(lost)?,
                    functions: Vec::new(),
                    modules: Vec::new(),
                    unknown: 0,
                    threads: Vec::new(),
                });
                continue;
            }
            let e = out.events.last_mut().ok_or(bad.clone())?;
            match f[..] {
                ["f", slot, n] => e.functions.push((index(slot, s.functions.len())?, num(n)?)),
                ["m", m, n] => e.modules.push((index(m, s.modules.len())?, num(n)?)),
                ["u", n] => e.unknown = e.unknown.saturating_add(num(n)?),
                ["t", tid, n] => {
                    let tid = u32::try_from(num(tid)?).map_err(|_| bad.clone())?;
                    e.threads.push((tid, num(n)?));
                }
                _ => return Err(bad),
            }
        }
        Ok(out)
    }
}

/// The calls of each thread of a process: those that ended while it ran
/// (up to the agent's bound) and those alive at its end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Threads {
    pub threads: Vec<ThreadCalls>,
    /// Threads that ended past the agent's bound: their calls are in the
    /// totals only.
    pub dropped: u64,
    /// Samples not counted by thread and function (the agent's table was
    /// full or busy): in their thread's and function's totals only.
    pub function_samples_dropped: u64,
}

/// One thread's calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadCalls {
    pub tid: u32,
    /// Its name (`comm`), as the kernel keeps it: at most 15 bytes.
    pub name: String,
    /// It ended before the process did.
    pub ended: bool,
    /// Samples taken in it (CPU time: times the sample period).
    pub samples: u64,
    /// (index in `Snapshot::functions`, calls), for the functions it called.
    pub calls: Vec<(u32, u64)>,
    /// (index in `Snapshot::functions`, samples), for the functions it was
    /// sampled in.
    pub function_samples: Vec<(u32, u64)>,
}

impl ThreadCalls {
    pub fn total(&self) -> u64 {
        self.calls.iter().map(|&(_, c)| c).sum()
    }
}

/// The first line of a file the agent writes beside its segment,
/// `<magic> 1 <N numbers>`: the numbers, and the lines after it.
pub(crate) fn side_file<'a, const N: usize>(
    text: &'a str,
    magic: &str,
    bad: &SegmentError,
) -> Result<([u64; N], std::str::Lines<'a>), SegmentError> {
    let mut lines = text.lines();
    let mut head = lines.next().ok_or(bad.clone())?.split(' ');
    if head.next() != Some(magic) || head.next() != Some("1") {
        return Err(bad.clone());
    }
    let mut numbers = [0u64; N];
    for v in &mut numbers {
        *v = head
            .next()
            .and_then(|x| x.parse().ok())
            .ok_or(bad.clone())?;
    }
    match head.next() {
        Some(_) => Err(bad.clone()),
        None => Ok((numbers, lines)),
    }
}

impl Threads {
    /// Reads the threads file the agent writes: `rtprof-threads 1
    /// <dropped>`, then per thread `t <tid> <0 live|1 ended> <name in hex>
    /// <samples>` followed by `<slot> <calls>` and `s <slot> <samples>`
    /// lines, and a `d <samples>` line for samples not counted by thread
    /// and function. A slot out of range or a line that is none of these
    /// refuses the file.
    pub fn parse(text: &str, s: &Snapshot) -> Result<Threads, SegmentError> {
        let bad = SegmentError::BadReference("threads file");
        let ([dropped], lines) = side_file(text, "rtprof-threads", &bad)?;
        let num = |v: Option<&str>| v.and_then(|v| v.parse::<u64>().ok()).ok_or(bad.clone());
        let mut out = Threads {
            threads: Vec::new(),
            dropped,
            function_samples_dropped: 0,
        };
        for line in lines.filter(|l| !l.is_empty()) {
            let f: Vec<&str> = line.split(' ').collect();
            match f[..] {
                ["t", tid, ended, name, samples] => {
                    let name = (0..name.len())
                        .step_by(2)
                        .map(|i| {
                            name.get(i..i + 2)
                                .and_then(|h| u8::from_str_radix(h, 16).ok())
                        })
                        .collect::<Option<Vec<u8>>>()
                        .filter(|n| n.len() <= 16)
                        .ok_or(bad.clone())?;
                    out.threads.push(ThreadCalls {
                        tid: u32::try_from(num(Some(tid))?).map_err(|_| bad.clone())?,
                        name: String::from_utf8_lossy(&name).into_owned(),
                        ended: match ended {
                            "0" => false,
                            "1" => true,
                            _ => return Err(bad),
                        },
                        samples: num(Some(samples))?,
                        calls: Vec::new(),
                        function_samples: Vec::new(),
                    });
                }
                ["d", samples] => {
                    out.function_samples_dropped = num(Some(samples))?;
                }
                [slot, calls] => {
                    let t = out.threads.last_mut().ok_or(bad.clone())?;
                    let slot = num(Some(slot))?;
                    if slot >= s.functions.len() as u64 {
                        return Err(bad);
                    }
                    t.calls.push((slot as u32, num(Some(calls))?));
                }
                ["s", slot, samples] => {
                    let t = out.threads.last_mut().ok_or(bad.clone())?;
                    let slot = num(Some(slot))?;
                    if slot >= s.functions.len() as u64 {
                        return Err(bad);
                    }
                    t.function_samples.push((slot as u32, num(Some(samples))?));
                }
                _ => return Err(bad),
            }
        }
        Ok(out)
    }
}

/// Each patched function's callers, counted exactly.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Callers {
    pub edges: Vec<CallerEdge>,
    /// Calls not counted for their caller (the agent's table was full).
    pub dropped: u64,
}

/// Calls of one function from one call site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerEdge {
    /// The function called (its index in `Snapshot::functions`).
    pub callee: u32,
    /// The function the call came from (`Frame::Unknown`: no known
    /// function holds the return address).
    pub caller: Frame,
    /// The return address.
    pub at: u64,
    pub calls: u64,
}

impl Callers {
    /// Reads the callers file the agent writes: `rtprof-callers 1
    /// <dropped>`, then `<slot> <return address> <calls>` per call site.
    /// Each return address is named by the function of `s` that holds the
    /// byte before it (the call); a slot out of range refuses the file.
    pub fn parse(text: &str, s: &Snapshot) -> Result<Callers, SegmentError> {
        let bad = SegmentError::BadReference("callers file");
        let ([dropped], lines) = side_file(text, "rtprof-callers", &bad)?;
        // Functions by address in the process.
        let mut ranges: Vec<(u64, u64, u32)> = s
            .functions
            .iter()
            .enumerate()
            .filter(|(_, f)| f.size > 0)
            .filter_map(|(i, f)| {
                let start = s.modules.get(f.module as usize)?.base.wrapping_add(f.vaddr);
                Some((start, start.saturating_add(f.size as u64), i as u32))
            })
            .collect();
        ranges.sort_unstable();
        let function_at = |a: u64| {
            let i = ranges.partition_point(|r| r.0 <= a);
            let r = ranges.get(i.checked_sub(1)?)?;
            (a < r.1).then_some(r.2)
        };
        let num = |v: Option<&str>| v.and_then(|v| v.parse::<u64>().ok()).ok_or(bad.clone());
        let mut out = Callers {
            edges: Vec::new(),
            dropped,
        };
        for line in lines.filter(|l| !l.is_empty()) {
            let mut it = line.split(' ');
            let (callee, at, calls) = (num(it.next())?, num(it.next())?, num(it.next())?);
            if callee >= s.functions.len() as u64 || it.next().is_some() {
                return Err(bad);
            }
            let caller = function_at(at.wrapping_sub(1)).map_or(Frame::Unknown, Frame::Function);
            out.edges.push(CallerEdge {
                callee: callee as u32,
                caller,
                at,
                calls,
            });
        }
        Ok(out)
    }
}

/// The sampled call stacks of a process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stacks {
    pub stacks: Vec<Stack>,
    /// Samples whose stacks were cut at the agent's depth limit.
    pub truncated: u64,
    /// Samples not counted for their stack (the agent's table was full).
    pub dropped: u64,
}

/// One call stack and the samples taken in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stack {
    /// Leaf first (the sampled function, then its caller, ...).
    pub frames: Vec<Frame>,
    pub samples: u64,
}

/// A frame of a sampled stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Frame {
    /// A function (its index in `Snapshot::functions`).
    Function(u32),
    /// Code of a module outside its listed functions (index in `modules`).
    Module(u32),
    Unknown,
}

impl Stacks {
    /// Reads the stacks file the agent writes: `rtprof-stacks 1 <truncated>
    /// <dropped>`, then `<samples> <frame>...` per stack, frames leaf first
    /// as function slots, `2^31 | module`, or `2^32 - 1`. Frames naming
    /// nothing in `functions`/`modules` counts make the file unreadable.
    pub fn parse(text: &str, functions: usize, modules: usize) -> Result<Stacks, SegmentError> {
        let bad = SegmentError::BadReference("stack file");
        let ([truncated, dropped], lines) = side_file(text, "rtprof-stacks", &bad)?;
        let num = |s: &str| s.parse::<u64>().map_err(|_| bad.clone());
        let mut out = Stacks {
            stacks: Vec::new(),
            truncated,
            dropped,
        };
        for line in lines.filter(|l| !l.is_empty()) {
            let mut it = line.split(' ');
            let samples = num(it.next().ok_or(bad.clone())?)?;
            let frames = it
                .map(|f| {
                    let v = f.parse::<u32>().map_err(|_| bad.clone())?;
                    match v {
                        u32::MAX => Ok(Frame::Unknown),
                        v if v & (1 << 31) != 0 && ((v & !(1 << 31)) as usize) < modules => {
                            Ok(Frame::Module(v & !(1 << 31)))
                        }
                        v if (v as usize) < functions => Ok(Frame::Function(v)),
                        _ => Err(bad.clone()),
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            out.stacks.push(Stack { frames, samples });
        }
        Ok(out)
    }
}

/// Bounds-checked little-endian reads over possibly-shared memory.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u32(&self, off: u64) -> u32 {
        let o = off as usize;
        u32::from_le_bytes(self.0[o..o + 4].try_into().unwrap())
    }
    /// An 8-byte word other threads write, as one atomic load with
    /// `order` where it is aligned (a mapped segment's always are).
    fn atomic(&self, off: u64, order: Ordering) -> u64 {
        match counters(self.0, off, 1) {
            Some([w]) => w.load(order),
            _ => self.counter(off),
        }
    }
    /// Counters are written by other threads: read them with one volatile,
    /// aligned load so a value is never torn.
    fn counter(&self, off: u64) -> u64 {
        let o = off as usize;
        let s = &self.0[o..o + 8];
        if (s.as_ptr() as usize).is_multiple_of(8) {
            // SAFETY: 8 bytes inside the slice (indexed above), 8-aligned
            // (checked): one load, never torn.
            unsafe { std::ptr::read_volatile(s.as_ptr() as *const u64) }
        } else {
            u64::from_le_bytes(s.try_into().unwrap())
        }
    }
}

fn region(name: &'static str, off: u64, len: u64, total: u64) -> Result<(), SegmentError> {
    let end = off.checked_add(len).ok_or(SegmentError::BadRegion(name))?;
    if off < size_of::<Header>() as u64 || end > total || !off.is_multiple_of(8) {
        return Err(SegmentError::BadRegion(name));
    }
    Ok(())
}

fn string(what: &'static str, strings: &[u8], off: u32, len: u32) -> Result<String, SegmentError> {
    let end = (off as usize)
        .checked_add(len as usize)
        .ok_or(SegmentError::BadString(what))?;
    let s = strings
        .get(off as usize..end)
        .ok_or(SegmentError::BadString(what))?;
    Ok(String::from_utf8_lossy(s).into_owned())
}

/// Reads the header and checks every region it describes against `len`.
pub fn read_header(bytes: &[u8]) -> Result<Header, SegmentError> {
    let need = size_of::<Header>() as u64;
    if (bytes.len() as u64) < need {
        return Err(SegmentError::TooShort {
            len: bytes.len() as u64,
            need,
        });
    }
    // Copy out first, so later checks and uses see one consistent header.
    // SAFETY: `bytes` holds at least a Header (checked above), which is
    // plain integers: any bytes are a valid value.
    let mut h: Header = unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const Header) };
    if h.magic != MAGIC {
        return Err(SegmentError::BadMagic);
    }
    let v3 = h.version == VERSION_3;
    if h.version != VERSION && h.version != VERSION_4 && !v3 {
        return Err(SegmentError::UnsupportedVersion(h.version));
    }
    let size = if v3 { HEADER_3_SIZE as u64 } else { need };
    if h.header_size as u64 != size {
        return Err(SegmentError::BadHeaderSize(h.header_size));
    }
    if v3 {
        // What follows its shorter header is not a header field.
        h.thread_samples_off = 0;
    }
    let total = h.total_size;
    if total > bytes.len() as u64 {
        return Err(SegmentError::TooShort {
            len: bytes.len() as u64,
            need: total,
        });
    }
    let mul = |a: u64, b: u64, what| a.checked_mul(b).ok_or(SegmentError::BadRegion(what));
    region(
        "modules",
        h.modules_off,
        mul(
            h.module_cap as u64,
            size_of::<ModuleRecord>() as u64,
            "modules",
        )?,
        total,
    )?;
    region(
        "functions",
        h.funcs_off,
        mul(h.func_cap as u64, 32, "functions")?,
        total,
    )?;
    region("strings", h.strings_off, h.strings_cap as u64, total)?;
    region(
        "samples",
        h.samples_off,
        mul(h.func_cap as u64, 8, "samples")?,
        total,
    )?;
    region(
        "stripe table",
        h.stripe_table_off,
        mul(h.stripe_cap as u64, 8, "stripe table")?,
        total,
    )?;
    if h.stripe_bytes < h.func_cap as u64 * 8 || !h.stripe_bytes.is_multiple_of(8) {
        return Err(SegmentError::BadRegion("stripe size"));
    }
    region(
        "stripes",
        h.stripes_off,
        mul(h.stripe_bytes, h.stripe_cap as u64, "stripes")?,
        total,
    )?;
    if h.module_count > h.module_cap {
        return Err(SegmentError::BadCount("modules"));
    }
    if h.func_count > h.func_cap {
        return Err(SegmentError::BadCount("functions"));
    }
    if h.strings_len > h.strings_cap {
        return Err(SegmentError::BadCount("strings"));
    }
    if h.stripe_count > h.stripe_cap {
        return Err(SegmentError::BadCount("stripes"));
    }
    if h.thread_samples_off != 0 {
        region(
            "thread samples",
            h.thread_samples_off,
            mul(h.stripe_cap as u64, 8, "thread samples")?
                .checked_add(size_of::<TableHead>() as u64)
                .ok_or(SegmentError::BadRegion("thread samples"))?,
            total,
        )?;
    }
    Ok(h)
}

/// Samples of the thread holding stripe `s` (of threads without a stripe
/// for 0); 0 if the segment keeps none. `h` as for [`sum_calls`].
pub fn stripe_samples(bytes: &[u8], h: &Header, s: u32) -> u64 {
    if h.thread_samples_off == 0 || s >= h.stripe_cap {
        return 0;
    }
    let at = h.thread_samples_off + size_of::<TableHead>() as u64 + s as u64 * 8;
    Bytes(bytes).counter(at)
}

/// Calls `f(stripe, function slot, samples)` for every pair the segment
/// counted samples of (the thread holding the stripe now, or the one
/// before it if the stripe is not live); false if it keeps none, or its table is
/// not one (its size is read live, and checked each time). `h` as for
/// [`sum_calls`].
pub fn thread_function_samples(bytes: &[u8], h: &Header, mut f: impl FnMut(u32, u32, u64)) -> bool {
    if h.thread_samples_off == 0 {
        return false;
    }
    let b = Bytes(bytes);
    let head = h.thread_samples_off;
    let cap = b.u32(head + std::mem::offset_of!(TableHead, cap) as u64);
    if !cap.is_power_of_two() || !(64..=1 << 20).contains(&cap) {
        return false;
    }
    let first = thread_entries_off(head, h.stripe_cap);
    if region(
        "thread sample entries",
        first,
        cap as u64 * 16,
        h.total_size,
    )
    .is_err()
    {
        return false;
    }
    let dirty = b.counter(head + std::mem::offset_of!(TableHead, dirty) as u64);
    let per_bit = cap as u64 / 64;
    for bit in (0..64).filter(|b| dirty & 1 << b != 0) {
        for i in bit * per_bit..(bit + 1) * per_bit {
            let at = first + i * 16;
            let key = b.counter(at);
            if key != 0 {
                f((key >> 32) as u32, key as u32, b.counter(at + 8));
            }
        }
    }
    true
}

/// Sums each function's calls over the stripes that count (the shared
/// one, threads' and ended threads' sums: [`stripe_state::counted`]), as of
/// one moment: retried while a fold takes effect (`fold_seq` changed, or
/// odd in a version 4 segment). A process killed in the middle of a fold
/// leaves a segment that sums exactly. `h` must come from [`read_header`]
/// over the same `bytes`; `calls` covers the first `calls.len()` functions
/// (at most `func_count`; slots past `func_count` read as 0: functions a
/// newer header has, not yet counted in this one).
/// False when 1,000 tries saw no quiet moment: `calls` then holds the last
/// sum, which may be torn.
#[must_use = "a torn sum is not one moment's"]
pub fn sum_calls(bytes: &[u8], h: &Header, calls: &mut [u64]) -> bool {
    let b = Bytes(bytes);
    let n = calls.len().min(h.func_count as usize);
    calls[n..].fill(0);
    let seq_off = std::mem::offset_of!(Header, fold_seq) as u64;
    let v5 = h.version >= VERSION;
    for _ in 0..1000 {
        // Acquire, as each slot below: what is read after it is not older.
        let before = b.atomic(seq_off, Ordering::Acquire);
        // The first stripe in use is stored, the others added: one pass
        // over `calls` fewer than zeroing it first.
        let mut first = true;
        for s in 0..h.stripe_count.min(h.stripe_cap) as u64 {
            // A slot's state and tid, in one load.
            let slot = b.atomic(h.stripe_table_off + s * 8, Ordering::Acquire);
            let (state, tid) = (slot as u32, (slot >> 32) as u32);
            let counted = if v5 {
                stripe_state::counted(state, tid, before / 2)
            } else {
                state != stripe_state::FREE
            };
            if !counted {
                continue;
            }
            let base = h.stripes_off + s * h.stripe_bytes;
            match counters(bytes, base, n) {
                Some(stripe) if first => {
                    for (c, v) in calls[..n].iter_mut().zip(stripe) {
                        *c = v.load(Ordering::Relaxed);
                    }
                }
                Some(stripe) => {
                    for (c, v) in calls[..n].iter_mut().zip(stripe) {
                        *c = c.wrapping_add(v.load(Ordering::Relaxed));
                    }
                }
                None if first => {
                    for (i, c) in calls[..n].iter_mut().enumerate() {
                        *c = b.counter(base + i as u64 * 8);
                    }
                }
                None => {
                    for (i, c) in calls[..n].iter_mut().enumerate() {
                        *c = c.wrapping_add(b.counter(base + i as u64 * 8));
                    }
                }
            }
            first = false;
        }
        if first {
            calls[..n].iter_mut().for_each(|c| *c = 0);
        }
        // The counters read before `fold_seq` is read again: a zeroing
        // after a fold's store to it is seen only with that store.
        std::sync::atomic::fence(Ordering::Acquire);
        if before % 2 == 0 && b.atomic(seq_off, Ordering::Relaxed) == before {
            return true;
        }
        std::thread::yield_now();
    }
    false
}

/// The segment's fold sequence now: moved by each fold (see
/// [`stripe_state`]; odd during one in a version 4 segment).
pub fn fold_seq(bytes: &[u8]) -> u64 {
    Bytes(bytes).atomic(
        std::mem::offset_of!(Header, fold_seq) as u64,
        Ordering::Acquire,
    )
}

/// The stripes handed to threads that live now, as (stripe, thread id),
/// into `out`; the shared stripe (0: threads beyond the stripes) and the
/// ended threads' are not among them. `h` as for [`sum_calls`].
pub fn live_stripes(bytes: &[u8], h: &Header, out: &mut Vec<(u32, u32)>) {
    let b = Bytes(bytes);
    out.clear();
    for s in 1..h.stripe_count.min(h.stripe_cap) {
        let slot = b.atomic(h.stripe_table_off + s as u64 * 8, Ordering::Acquire);
        if slot as u32 == stripe_state::LIVE {
            out.push((s, (slot >> 32) as u32));
        }
    }
}

/// Stripe `s`'s calls of the first `out.len()` functions (at most
/// `func_count`); false if the stripe is not in the segment. `h` as for
/// [`sum_calls`].
pub fn stripe_calls(bytes: &[u8], h: &Header, s: u32, out: &mut [u64]) -> bool {
    let n = out.len().min(h.func_count as usize);
    if s >= h.stripe_cap {
        return false;
    }
    match counters(bytes, h.stripes_off + s as u64 * h.stripe_bytes, n) {
        Some(stripe) => {
            for (o, v) in out.iter_mut().zip(stripe) {
                *o = v.load(Ordering::Relaxed);
            }
            true
        }
        None => false,
    }
}

/// Each function's [`function_flags`] (the first `out.len()`, at most
/// `func_count`): they change while the process runs (counting switched,
/// calls estimated), and [`Header::flags_changes`] moves when they do.
/// `h` as for [`sum_calls`].
pub fn read_function_flags(bytes: &[u8], h: &Header, out: &mut [u32]) {
    let b = Bytes(bytes);
    let n = out.len().min(h.func_count as usize);
    let size = std::mem::size_of::<FunctionRecord>() as u64;
    let at = std::mem::offset_of!(FunctionRecord, reserved) as u64;
    for (i, f) in out[..n].iter_mut().enumerate() {
        let o = (h.funcs_off + i as u64 * size + at) as usize;
        // A header that lies about its regions reads as no flags.
        *f =
            b.0.get(o..o + 4)
                .map_or(0, |v| u32::from_le_bytes([v[0], v[1], v[2], v[3]]));
    }
}

/// The `n` counters at `off`, as atomics, if they lie inside `bytes` and
/// are 8-aligned (a segment mapped from a file always is): one bounds
/// check for a whole stripe instead of one per counter.
fn counters(bytes: &[u8], off: u64, n: usize) -> Option<&[AtomicU64]> {
    let start = usize::try_from(off).ok()?;
    let end = start.checked_add(n.checked_mul(8)?)?;
    let region = bytes.get(start..end)?;
    if !(region.as_ptr() as usize).is_multiple_of(8) {
        return None;
    }
    // SAFETY: `region` is `n * 8` bytes inside `bytes`, 8-aligned
    // (checked), and lives as long as `bytes`; AtomicU64 has the size and
    // alignment of u64, and the agent writes these counters only with
    // whole, aligned 8-byte stores, so each load sees a value it wrote.
    Some(unsafe { std::slice::from_raw_parts(region.as_ptr() as *const AtomicU64, n) })
}

/// Each function's samples (the first `out.len()`, at most `func_count`)
/// and each module's samples outside its functions (the first
/// `modules.len()`, at most `module_count`); slots past the counts read
/// as 0, as in [`sum_calls`]. `h` as for [`sum_calls`].
pub fn read_samples(bytes: &[u8], h: &Header, out: &mut [u64], modules: &mut [u64]) {
    let b = Bytes(bytes);
    let n = out.len().min(h.func_count as usize);
    out[n..].fill(0);
    match counters(bytes, h.samples_off, n) {
        Some(samples) => {
            for (v, c) in out[..n].iter_mut().zip(samples) {
                *v = c.load(Ordering::Relaxed);
            }
        }
        None => {
            for (i, v) in out[..n].iter_mut().enumerate() {
                *v = b.counter(h.samples_off + i as u64 * 8);
            }
        }
    }
    let m = modules.len().min(h.module_count as usize);
    modules[m..].fill(0);
    for (i, v) in modules[..m].iter_mut().enumerate() {
        *v = b.counter(
            h.modules_off
                + i as u64 * size_of::<ModuleRecord>() as u64
                + std::mem::offset_of!(ModuleRecord, samples) as u64,
        );
    }
}

/// Names each implementation row's implementation, finds the function
/// its code lies in, and gives the row that function's samples.
fn place_implementations(functions: &mut [FunctionStats], modules: &[ModuleStats]) {
    if functions.iter().all(|f| f.implementation.is_none()) {
        return;
    }
    let mut ranges: Vec<(u64, u64, u32)> = functions
        .iter()
        .enumerate()
        .filter(|(_, f)| f.size > 0 && f.implementation.is_none())
        .filter_map(|(i, f)| {
            let start = modules.get(f.module as usize)?.base.wrapping_add(f.vaddr);
            Some((start, start.saturating_add(f.size as u64), i as u32))
        })
        .collect();
    ranges.sort_unstable();
    for i in 0..functions.len() {
        let Some(imp) = &functions[i].implementation else {
            continue;
        };
        let at = ranges.partition_point(|r| r.0 <= imp.address);
        let code = at
            .checked_sub(1)
            .map(|k| ranges[k])
            .filter(|r| imp.address < r.1)
            .map(|r| r.2);
        let parent = functions[imp.of as usize].name.clone();
        let f = &mut functions[i];
        let name = crate::route::implementation_in(&f.name, &parent)
            .unwrap_or(&f.name)
            .to_string();
        if let Some(imp) = &mut f.implementation {
            imp.name = name;
            imp.code = code;
        }
    }
}

/// Validates `bytes` as a counter segment and sums its stripes. A live
/// segment whose state is still STARTING is being filled in and may fail
/// validation for a moment; a reader retries it later.
pub fn read_snapshot(bytes: &[u8]) -> Result<Snapshot, SegmentError> {
    let h = read_header(bytes)?;
    let strings = &bytes[h.strings_off as usize..(h.strings_off + h.strings_len as u64) as usize];
    let exe = string("exe", strings, h.exe_off, h.exe_len)?;

    let mut module_samples = vec![0u64; h.module_count as usize];
    let mut samples = vec![0u64; h.func_count as usize];
    read_samples(bytes, &h, &mut samples, &mut module_samples);
    let mut modules = Vec::with_capacity(h.module_count as usize);
    let mut module_funcs = Vec::with_capacity(h.module_count as usize);
    for i in 0..h.module_count as u64 {
        // SAFETY: record `i < module_count <= module_cap` of the module
        // table, which read_header checked lies inside `bytes`; plain
        // integers.
        let m: ModuleRecord = unsafe {
            std::ptr::read_unaligned(
                bytes
                    .as_ptr()
                    .add((h.modules_off + i * size_of::<ModuleRecord>() as u64) as usize)
                    as *const ModuleRecord,
            )
        };
        let path = string("module path", strings, m.path_off, m.path_len)?;
        let end = m.first_func.checked_add(m.func_count);
        if end.is_none_or(|e| e > h.func_count) {
            return Err(SegmentError::BadReference("module function range"));
        }
        let refused = (1..REASON_SLOTS)
            .filter(|&r| m.refused[r] != 0)
            .map(|r| {
                Refusal::from_code(r as u32)
                    .map(|reason| (reason, m.refused[r]))
                    .ok_or(SegmentError::BadReference("refusal code"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let sampled_only = m.flags & module_flags::SAMPLED_ONLY != 0;
        let offers = m.flags & module_flags::IMPLEMENTATIONS != 0;
        module_funcs.push((m.first_func, m.func_count, sampled_only, offers));
        let on_demand = m.flags & module_flags::NAMED_ON_DEMAND != 0;
        let note = ModuleWhy::of_flags(m.flags)
            .and_then(ModuleWhy::text)
            .or(
                (m.func_count == 0 && refused.is_empty()).then_some(if on_demand {
                    "no sample landed in it (its functions are listed when one does)"
                } else {
                    "its file names no functions"
                }),
            );
        modules.push(ModuleStats {
            note,
            path,
            base: m.base,
            functions: m.func_count,
            patched: m.patched,
            refused,
            sampled_only,
            code_from_image: m.flags & module_flags::CODE_FROM_IMAGE != 0,
            samples: module_samples[i as usize],
        });
    }

    let mut calls = vec![0u64; h.func_count as usize];
    if !sum_calls(bytes, &h, &mut calls) {
        return Err(SegmentError::Busy);
    }

    let mut functions = Vec::with_capacity(h.func_count as usize);
    for i in 0..h.func_count as u64 {
        // SAFETY: record `i < func_count <= func_cap` of the function table,
        // which read_header checked lies inside `bytes`; plain integers.
        let f: FunctionRecord = unsafe {
            std::ptr::read_unaligned(
                bytes.as_ptr().add((h.funcs_off + i * 32) as usize) as *const FunctionRecord
            )
        };
        if f.module >= h.module_count {
            return Err(SegmentError::BadReference("function module"));
        }
        let (first, count, sampled_only, offers) = module_funcs[f.module as usize];
        if (i as u32) < first || i as u32 >= first + count {
            return Err(SegmentError::BadReference(
                "function outside its module's range",
            ));
        }
        if sampled_only != (f.status == STATUS_SAMPLED_ONLY) {
            return Err(SegmentError::BadReference("function status"));
        }
        let refused = match f.status {
            0 | STATUS_SAMPLED_ONLY => None,
            c => Some(Refusal::from_code(c).ok_or(SegmentError::BadReference("refusal code"))?),
        };
        let implementation = match offers {
            true if f.size < h.func_count && f.size as u64 != i => Some(Implementation {
                of: f.size,
                name: String::new(),
                address: f.vaddr,
                code: None,
            }),
            true => return Err(SegmentError::BadReference("implemented function")),
            false => None,
        };
        functions.push(FunctionStats {
            name: string("function name", strings, f.name_off, f.name_len)?,
            module: f.module,
            vaddr: f.vaddr,
            size: if offers { 0 } else { f.size },
            refused,
            instrumented: !sampled_only,
            calls: calls[i as usize],
            samples: samples[i as usize],
            counting_off: f.reserved & function_flags::COUNTING_OFF != 0,
            estimated: function_flags::estimate(f.reserved),
            trapped: f.reserved & function_flags::TRAPPED != 0,
            offered: f.reserved & function_flags::OFFERED != 0,
            active: f.reserved & function_flags::ACTIVE != 0,
            implementation,
            source: None,
        });
    }
    place_implementations(&mut functions, &modules);

    Ok(Snapshot {
        cost: read_cost(bytes, &h),
        pid: h.pid,
        ppid: h.ppid,
        exe,
        state: h.state,
        exit_status: h.exit_status,
        start_ns: h.start_ns,
        end_ns: h.end_ns,
        sample_period_ns: h.sample_period_ns,
        samples_total: h.samples_total,
        samples_lost: h.samples_lost,
        samples_unknown: h.samples_unknown,
        sampler: crate::sampling::Sampler::from_code(h.sampler)
            .unwrap_or(crate::sampling::Sampler::Off),
        sampler_why: crate::sampling::Why::from_code(h.sampler_why)
            .unwrap_or(crate::sampling::Why::Unknown),
        sampler_errno: h.sampler_errno,
        setup_ns: h.setup_ns,
        replaced_by_exec: false,
        // Threads' stripes ever needed and the shared one, not the sums.
        stripes: if h.version >= VERSION && keeps_sum_stripes(h.stripe_cap) {
            h.stripe_count.saturating_sub(SUM_STRIPES.len() as u32)
        } else {
            h.stripe_count
        },
        modules,
        functions,
        stacks: Stacks::default(),
        callers: Callers::default(),
        threads: Threads::default(),
        events: Events::default(),
        offsets: Offsets::default(),
        loop_counts: LoopCounts::default(),
        loops: Vec::new(),
    })
}

/// What the agent cost its process, as it measured it (see
/// [`crate::layout::cost`]); times in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentCost {
    /// The process's CPU time when this was measured.
    pub process_cpu_ns: u64,
    pub sampling_ns: u64,
    pub budget_ns: u64,
    /// Threads held still by the budget's switches, summed over them.
    pub held_ns: u64,
    /// Samples in rtprof's stubs and loop probes.
    pub in_stubs: u64,
    pub control_ns: u64,
}

impl AgentCost {
    /// What counting cost, as the sampler saw it: its samples in rtprof's
    /// own code, times the period.
    pub fn counting_ns(&self, period_ns: u64) -> u64 {
        self.in_stubs.saturating_mul(period_ns)
    }

    /// Everything after start-up: counting, sampling, the budget's thread
    /// and stops, attach's control thread.
    pub fn running_ns(&self, period_ns: u64) -> u64 {
        self.counting_ns(period_ns)
            .saturating_add(self.sampling_ns)
            .saturating_add(self.budget_ns)
            .saturating_add(self.held_ns)
            .saturating_add(self.control_ns)
    }
}

/// The agent's cost block, if the segment has one (its module records
/// start after it).
pub fn read_cost(bytes: &[u8], h: &Header) -> Option<AgentCost> {
    use crate::layout::cost;
    if h.modules_off < cost::END as u64 || bytes.len() < cost::END {
        return None;
    }
    let word = |i: usize| {
        let at = cost::AT + i * 8;
        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default())
    };
    Some(AgentCost {
        process_cpu_ns: word(cost::PROCESS_CPU_NS),
        sampling_ns: word(cost::SAMPLING_NS),
        budget_ns: word(cost::BUDGET_NS),
        held_ns: word(cost::HELD_NS),
        in_stubs: word(cost::IN_STUBS),
        control_ns: word(cost::CONTROL_NS),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::writer::{SegmentWriter, WriteError};
    use std::sync::atomic::Ordering;

    fn sample_segment() -> (Vec<u64>, Layout) {
        let layout = Layout::new(Capacities {
            modules: 3,
            functions: 5,
            strings: 256,
            stripes: 3,
        });
        let mut buf = vec![0u64; (layout.total_size / 8) as usize];
        let base = buf.as_mut_ptr() as *mut u8;
        // SAFETY: `buf` is zeroed, 8-aligned, `total_size` long, and
        // outlives `w` (both returned together).
        let mut w = unsafe { SegmentWriter::init(base, layout, 42, 1, 5) };
        w.set_exe(b"/bin/app").unwrap();
        w.add_module(b"/bin/app", 0x1000).unwrap();
        let f = w.add_function(b"main", 0x1100, 10).unwrap();
        let g = w.add_function(b"tiny", 0x1200, 1).unwrap();
        w.set_status(f, None);
        w.set_status(g, Some(Refusal::TooSmall));
        w.add_module(b"/lib/libx.so", 0x7000).unwrap();
        let h = w.add_function(b"helper", 0x300, 20).unwrap();
        w.set_status(h, None);
        let s1 = w.counters().append_stripe(100).unwrap();
        // SAFETY: slots below func_count of stripes handed out, inside
        // `buf`; no other thread uses it.
        unsafe {
            *w.counters().stripe_ptr(0).add(f as usize) = 3;
            *w.counters().stripe_ptr(s1).add(f as usize) = 4;
            *w.counters().stripe_ptr(s1).add(h as usize) = 9;
        }
        w.counters().function_samples(h).store(2, Ordering::Relaxed);
        let lc = w.add_sampled_module(b"/lib/libc.so.6", 0x9000).unwrap();
        let mc = w.add_function(b"memcpy", 0x40, 64).unwrap();
        w.set_status(mc, None); // ignored: not instrumented
        w.counters()
            .function_samples(mc)
            .store(5, Ordering::Relaxed);
        w.counters().module_samples(lc).store(7, Ordering::Relaxed);
        w.counters().samples_unknown().store(1, Ordering::Relaxed);
        w.counters().thread_samples(None).add(1 << 32 | 2, 6);
        w.counters().thread_samples(None).add(2 << 32, 1);
        w.counters().stripe_samples(s1).store(8, Ordering::Relaxed);
        w.counters().set_sampler(
            crate::sampling::Sampler::Timer,
            crate::sampling::Why::PerfRefused,
            13,
            1_000_000,
        );
        (buf, layout)
    }

    fn as_bytes(buf: &[u64]) -> &[u8] {
        // SAFETY: the same memory as `buf`, borrowed as long, as bytes.
        unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, buf.len() * 8) }
    }

    /// The snapshot of [`sample_segment`], for the side files' readers.
    pub(crate) fn sample_snapshot() -> Snapshot {
        read_snapshot(as_bytes(&sample_segment().0)).unwrap()
    }

    #[test]
    fn round_trip_sums_stripes() {
        let (buf, _) = sample_segment();
        let s = read_snapshot(as_bytes(&buf)).unwrap();
        assert_eq!(s.pid, 42);
        assert_eq!(s.exe, "/bin/app");
        assert_eq!(s.modules.len(), 3);
        assert_eq!(s.modules[0].functions, 2);
        assert_eq!(s.modules[0].patched, 1);
        assert_eq!(s.modules[0].refused, vec![(Refusal::TooSmall, 1)]);
        assert_eq!(s.modules[1].name(), "libx.so");
        let main = &s.functions[0];
        assert_eq!((main.name.as_str(), main.calls), ("main", 7));
        assert_eq!(s.functions[1].refused, Some(Refusal::TooSmall));
        assert_eq!(
            (
                s.functions[2].calls,
                s.functions[2].samples,
                s.functions[2].module
            ),
            (9, 2, 1)
        );
        assert!(s.functions[..3].iter().all(|f| f.instrumented));
        let libc = &s.modules[2];
        assert!(libc.sampled_only && !s.modules[0].sampled_only);
        assert_eq!((libc.functions, libc.patched, libc.samples), (1, 0, 7));
        assert!(libc.refused.is_empty());
        let memcpy = &s.functions[3];
        assert!(!memcpy.instrumented && memcpy.refused.is_none());
        assert_eq!((memcpy.samples, memcpy.calls), (5, 0));
        assert_eq!(s.samples_unknown, 1);
        assert_eq!(s.sampler, crate::sampling::Sampler::Timer);
        assert_eq!(s.sampler_why, crate::sampling::Why::PerfRefused);
        assert_eq!((s.sampler_errno, s.sample_period_ns), (13, 1_000_000));
    }

    /// Implementation rows: listed in an implementations module (one
    /// more only when another module came between two offers), their
    /// function and code found, their samples those of their code, and
    /// the active implementation marked.
    #[test]
    fn implementation_rows_name_their_function_and_code() {
        let layout = Layout::new(Capacities {
            modules: 4,
            functions: 8,
            strings: 256,
            stripes: 3,
        });
        let mut buf = vec![0u64; (layout.total_size / 8) as usize];
        // SAFETY: as in `sample_segment`.
        let mut w = unsafe { SegmentWriter::init(buf.as_mut_ptr() as *mut u8, layout, 7, 1, 5) };
        w.add_module(b"/bin/app", 0x1000).unwrap();
        let work = w.add_function(b"work", 0x100, 16).unwrap();
        let fast = w.add_function(b"work_fast", 0x200, 16).unwrap();
        w.set_status(work, None);
        w.set_status(fast, None);
        w.counters()
            .function_samples(fast)
            .store(6, Ordering::Relaxed);
        let row = w.add_implementation(work, b"fast", 0x1205).unwrap();
        let other = w.add_implementation(work, b"other", 0x1200).unwrap();
        assert_eq!(w.module_count(), 2, "one implementations module");
        w.add_module(b"/lib/x.so", 0x9000).unwrap();
        let third = w.add_implementation(work, b"far", 0x5000).unwrap();
        assert_eq!(w.module_count(), 4);
        // SAFETY: slot `row` of stripe 0, inside `buf`.
        unsafe { *w.counters().stripe_ptr(0).add(row as usize) = 4 };
        let s = read_snapshot(as_bytes(&buf)).unwrap();
        let (f, r) = (&s.functions[work as usize], &s.functions[row as usize]);
        assert!(f.offered && f.active && f.implementation.is_none());
        assert_eq!(r.name, "work [fast]");
        assert_eq!(
            r.implementation,
            Some(Implementation {
                of: work,
                name: "fast".into(),
                address: 0x1205,
                code: Some(fast),
            })
        );
        // Its samples are its own (the agent counts a sample in routed code
        // for the implementation routed to), not its code's.
        assert_eq!((r.calls, r.samples, r.size, r.active), (4, 0, 0, false));
        assert_eq!(s.functions[fast as usize].samples, 6);
        assert_eq!(
            s.functions[other as usize]
                .implementation
                .as_ref()
                .unwrap()
                .name,
            "other"
        );
        assert_eq!(
            s.functions[third as usize]
                .implementation
                .as_ref()
                .unwrap()
                .code,
            None
        );
        assert_eq!(s.modules[1].path, crate::layout::IMPLEMENTATIONS_MODULE);
        w.set_active(work, false);
        w.set_active(row, true);
        let s = read_snapshot(as_bytes(&buf)).unwrap();
        assert!(!s.functions[work as usize].active && s.functions[row as usize].active);
        // A row that names itself or no function is refused.
        let at = (layout.funcs_off + row as u64 * 32 + 24) as usize / 8;
        buf[at] = (buf[at] & !0xffff_ffff) | row as u64;
        assert!(read_snapshot(as_bytes(&buf)).is_err());
    }

    /// An offer after a module was named on demand (its functions
    /// recorded after the implementations module's rows) starts another
    /// implementations module: every module's range stays contiguous and
    /// the segment reads.
    #[test]
    fn an_offer_after_a_module_named_on_demand_keeps_ranges_contiguous() {
        let layout = Layout::new(Capacities {
            modules: 4,
            functions: 8,
            strings: 256,
            stripes: 3,
        });
        let mut buf = vec![0u64; (layout.total_size / 8) as usize];
        // SAFETY: as in `sample_segment`.
        let mut w = unsafe { SegmentWriter::init(buf.as_mut_ptr() as *mut u8, layout, 7, 1, 5) };
        w.add_module(b"/bin/app", 0x1000).unwrap();
        let f = w.add_function(b"f", 0x100, 16).unwrap();
        w.set_status(f, None);
        let libc = w.add_sampled_module(b"/lib/libc.so.6", 0x9000).unwrap();
        let a = w.add_implementation(f, b"a", 0x1200).unwrap();
        assert_eq!(
            w.name_module(libc, [(&b"memset"[..], 0x10, 8)].into_iter()),
            1
        );
        // A function for a module whose range is closed is refused.
        assert_eq!(w.add_function(b"g", 0x0, 1), Err(WriteError::NotLast));
        let b = w.add_implementation(f, b"b", 0x1300).unwrap();
        assert_eq!(w.module_count(), 4, "a second implementations module");
        let s = read_snapshot(as_bytes(&buf)).unwrap();
        for (row, name) in [(a, "a"), (b, "b")] {
            let imp = s.functions[row as usize].implementation.as_ref().unwrap();
            assert_eq!((imp.of, imp.name.as_str()), (f, name));
        }
        assert_eq!(s.functions[(b - 1) as usize].name, "memset");
    }

    /// A reader that knows more functions than the header it reads with
    /// (a newer snapshot's) finds them zero, not what its buffer held.
    #[test]
    fn slots_past_the_header_read_as_zero() {
        let (buf, _) = sample_segment();
        let bytes = as_bytes(&buf);
        let h = read_header(bytes).unwrap();
        let n = h.func_count as usize;
        let mut calls = vec![u64::MAX; n + 3];
        assert!(sum_calls(bytes, &h, &mut calls));
        assert_eq!(calls[0], 7, "main's calls");
        assert_eq!(calls[n..], [0, 0, 0]);
        let mut samples = vec![u64::MAX; n + 3];
        let mut modules = vec![u64::MAX; h.module_count as usize + 2];
        read_samples(bytes, &h, &mut samples, &mut modules);
        assert_eq!(samples[n..], [0, 0, 0]);
        assert_eq!(modules[h.module_count as usize..], [0, 0]);
        assert!(samples[..n].iter().all(|&s| s != u64::MAX));
    }

    #[test]
    fn truncation_at_every_length_is_rejected_not_crashing() {
        let (buf, layout) = sample_segment();
        let bytes = as_bytes(&buf);
        for len in (0..layout.total_size as usize).step_by(97) {
            assert!(read_snapshot(&bytes[..len]).is_err(), "len {len}");
        }
    }

    #[test]
    fn corrupted_bytes_never_panic() {
        let (buf, layout) = sample_segment();
        let meta = layout.metadata_len() as usize;
        // Deterministic xorshift so the test is reproducible.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..3000 {
            let mut m = buf.clone();
            // SAFETY: `m`'s own memory, as bytes, for as long as `m`.
            let bytes =
                unsafe { std::slice::from_raw_parts_mut(m.as_mut_ptr() as *mut u8, m.len() * 8) };
            for _ in 0..4 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let pos = (x as usize) % meta;
                bytes[pos] = (x >> 32) as u8;
            }
            let _ = read_snapshot(bytes);
        }
    }

    #[test]
    fn hostile_fields_are_reported() {
        let (buf, _) = sample_segment();
        let mut m = buf.clone();
        // SAFETY: `m`'s own memory, as bytes, for as long as `m`.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(m.as_mut_ptr() as *mut u8, m.len() * 8) };
        bytes[0] = b'X';
        assert_eq!(read_snapshot(bytes), Err(SegmentError::BadMagic));
        bytes[0] = b'R';
        // func_count beyond capacity
        let off = std::mem::offset_of!(Header, func_count);
        bytes[off..off + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert_eq!(
            read_snapshot(bytes),
            Err(SegmentError::BadCount("functions"))
        );
        bytes[off..off + 4].copy_from_slice(&3u32.to_le_bytes());
        // stripes region that wraps around
        let off = std::mem::offset_of!(Header, stripe_bytes);
        bytes[off..off + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            read_snapshot(bytes),
            Err(SegmentError::BadRegion(_))
        ));
    }

    /// Samples per thread and function are read from the segment's table;
    /// a hostile table size reads nothing, a region past the end is
    /// refused, and a version 3 segment (no such table) still reads.
    #[test]
    fn samples_per_thread_are_read_and_checked() {
        let (mut buf, layout) = sample_segment();
        {
            let bytes = as_bytes(&buf);
            let h = read_header(bytes).unwrap();
            let mut got = Vec::new();
            assert!(thread_function_samples(bytes, &h, |t, s, n| got.push((t, s, n))));
            got.sort();
            assert_eq!(got, [(1, 2, 6), (2, 0, 1)]);
            assert_eq!(stripe_samples(bytes, &h, 1), 8);
            assert_eq!(stripe_samples(bytes, &h, 99), 0);
        }
        // SAFETY: `buf`'s own memory, as bytes, for as long as `buf`.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut u8, buf.len() * 8) };
        let cap = layout.thread_samples_off as usize + std::mem::offset_of!(TableHead, cap);
        for bad in [100u32, 32, 1 << 30] {
            bytes[cap..cap + 4].copy_from_slice(&bad.to_le_bytes());
            let h = read_header(bytes).unwrap();
            assert!(!thread_function_samples(bytes, &h, |_, _, _| panic!(
                "read"
            )));
        }
        let off = std::mem::offset_of!(Header, thread_samples_off);
        bytes[off..off + 8].copy_from_slice(&(layout.total_size - 16).to_le_bytes());
        assert_eq!(
            read_header(bytes).err(),
            Some(SegmentError::BadRegion("thread samples"))
        );
        // Version 3: a shorter header; what follows it is not read as one.
        bytes[8..12].copy_from_slice(&VERSION_3.to_le_bytes());
        bytes[12..16].copy_from_slice(&HEADER_3_SIZE.to_le_bytes());
        let h = read_header(bytes).unwrap();
        assert_eq!(h.thread_samples_off, 0);
        assert!(!thread_function_samples(bytes, &h, |_, _, _| panic!(
            "read"
        )));
        assert_eq!(read_snapshot(bytes).unwrap().functions[0].calls, 7);
        bytes[12..16].copy_from_slice(&256u32.to_le_bytes());
        assert_eq!(
            read_header(bytes).err(),
            Some(SegmentError::BadHeaderSize(256))
        );
    }

    /// A stacks file names functions and modules by index: anything out of
    /// range, or not a stacks file, is refused whole.
    #[test]
    fn stack_files_are_checked_frame_by_frame() {
        let ok = Stacks::parse(
            "rtprof-stacks 1 2 3\n10 0 1 2147483648\n4 4294967295\n",
            2,
            1,
        )
        .unwrap();
        assert_eq!((ok.truncated, ok.dropped), (2, 3));
        assert_eq!(
            ok.stacks[0],
            Stack {
                frames: vec![Frame::Function(0), Frame::Function(1), Frame::Module(0)],
                samples: 10
            }
        );
        assert_eq!(ok.stacks[1].frames, [Frame::Unknown]);
        for bad in [
            "",
            "rtprof-stacks 2 0 0\n",
            "something else\n",
            "rtprof-stacks 1 0 0\n1 2\n",
            "rtprof-stacks 1 0 0\n1 2147483649\n",
            "rtprof-stacks 1 0 0\nx 0\n",
            "rtprof-stacks 1 0 0\n1 -1\n",
        ] {
            assert!(Stacks::parse(bad, 2, 1).is_err(), "{bad:?}");
        }
    }

    /// Return addresses are named by the function holding the call; a
    /// slot out of range refuses the file.
    #[test]
    fn caller_files_name_call_sites_by_function() {
        let (buf, _) = sample_segment();
        let s = read_snapshot(as_bytes(&buf)).unwrap();
        let main = s.functions.iter().position(|f| f.name == "main").unwrap();
        let helper = s.functions.iter().position(|f| f.name == "helper").unwrap();
        // main is at 0x1000 + 0x1100, 10 bytes: a call from inside it.
        let text = format!("rtprof-callers 1 4\n{helper} {} 7\n{helper} 5 2\n", 0x2105);
        let c = Callers::parse(&text, &s).unwrap();
        assert_eq!(c.dropped, 4);
        assert_eq!(c.edges[0].caller, Frame::Function(main as u32));
        assert_eq!((c.edges[0].callee, c.edges[0].calls), (helper as u32, 7));
        assert_eq!(c.edges[1].caller, Frame::Unknown);
        for bad in [
            "",
            "rtprof-callers 2 0\n",
            "rtprof-callers 1 0\n99 1 1\n",
            "rtprof-callers 1 0\n0 1\n",
        ] {
            assert!(Callers::parse(bad, &s).is_err(), "{bad:?}");
        }
    }

    /// Threads come with their names (hex in the file) and calls; a call
    /// line before any thread, a slot out of range or a bad name refuses
    /// the file.
    #[test]
    fn thread_files_give_each_thread_its_calls() {
        let (buf, _) = sample_segment();
        let s = read_snapshot(as_bytes(&buf)).unwrap();
        let text =
            "rtprof-threads 1 3\nd 6\nt 41 1 776f726b2d31 4\n0 5\ns 1 3\n1 2\nt 40 0  0\n1 9\n";
        let t = Threads::parse(text, &s).unwrap();
        assert_eq!((t.dropped, t.function_samples_dropped), (3, 6));
        assert_eq!(
            (
                t.threads[0].tid,
                t.threads[0].name.as_str(),
                t.threads[0].ended
            ),
            (41, "work-1", true)
        );
        assert_eq!(t.threads[0].calls, [(0, 5), (1, 2)]);
        assert_eq!(t.threads[0].function_samples, [(1, 3)]);
        assert!(t.threads[1].function_samples.is_empty());
        assert_eq!((t.threads[0].total(), t.threads[0].samples), (7, 4));
        assert_eq!(
            (t.threads[1].name.as_str(), t.threads[1].ended),
            ("", false)
        );
        for bad in [
            "",
            "rtprof-threads 2 0\n",
            "rtprof-threads 1 0\n0 1\n",
            "rtprof-threads 1 0\nt 1 0 61 0\n99 1\n",
            "rtprof-threads 1 0\nt 1 0 61 0\ns 99 1\n",
            "rtprof-threads 1 0\ns 0 1\n",
            "rtprof-threads 1 0\nt 1 0 61 0\ns 0 x\n",
            "rtprof-threads 1 0\nd x\n",
            "rtprof-threads 1 0\nt 1 2 61 0\n",
            "rtprof-threads 1 0\nt 1 0 6 0\n",
            "rtprof-threads 1 0\nt 1 0 zz 0\n",
            "rtprof-threads 1 0\nt 1 0 61\n",
            "rtprof-threads 1 0\nt 1 0 6161616161616161616161616161616161 0\n",
        ] {
            assert!(Threads::parse(bad, &s).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn event_files_give_each_event_its_outcome_and_samples() {
        let (buf, _) = sample_segment();
        let s = read_snapshot(as_bytes(&buf)).unwrap();
        let text = "rtprof-events 1 2\ne page-faults 0 0 1 0 5\nf 1 40\nm 0 3\nu 2\nt 77 45\n\
                    e cycles 2 2 1000003 0 0\ne bogus 1 0 1 0 0\n";
        let e = Events::parse(text, &s).unwrap();
        assert_eq!(e.threads_dropped, 2);
        let pf = &e.events[0];
        assert_eq!(
            (pf.name.as_str(), pf.status, pf.lost),
            ("page-faults", EventStatus::Ran, 5)
        );
        assert_eq!(
            (pf.functions.as_slice(), pf.modules.as_slice()),
            (&[(1, 40)][..], &[(0, 3)][..])
        );
        assert_eq!((pf.unknown, pf.samples(), pf.in_function(1)), (2, 45, 40));
        assert_eq!(pf.threads, [(77, 45)]);
        assert_eq!(
            (e.events[1].status, e.events[1].errno),
            (EventStatus::Unavailable, 2)
        );
        assert_eq!(e.events[1].estimate(2), 2_000_006);
        assert_eq!(e.events[2].status, EventStatus::Unknown);
        for bad in [
            "",
            "rtprof-events 2 0\n",
            "rtprof-events 1 0\nf 0 1\n",
            "rtprof-events 1 0\ne x 9 0 1 0 0\n",
            "rtprof-events 1 0\ne x 0 0 1 2 0\n",
            "rtprof-events 1 0\ne x 0 0 1 0\n",
            "rtprof-events 1 0\ne x 0 0 1 0 0\nf 99 1\n",
            "rtprof-events 1 0\ne x 0 0 1 0 0\nm 99 1\n",
            "rtprof-events 1 0\ne x 0 0 1 0 0\nf 0 -1\n",
            "rtprof-events 1 0\ne x 0 0 1 0 0\nt 99999999999 1\n",
            "rtprof-events 1 0\ne x 0 0 1 0 0\nq 1\n",
        ] {
            assert!(Events::parse(bad, &s).is_err(), "{bad:?}");
        }
    }
}
