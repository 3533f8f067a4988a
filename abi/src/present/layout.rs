//! Binary layout of the presentation segment (version 5).
//!
//! ```text
//! [PresentHeader][buffer 0][buffer 1]
//! buffer: [BufferHeader][strings][ProcEntry x procs][Row x rows][u32 x hash_cap]
//!         [Claim x claim_count]
//! ```
//!
//! Each region is found by its offset in the buffer header (readers
//! assume no order; the writer puts strings first so that their place is
//! known before any row is written).
//!
//! Rows of each process are contiguous (`ProcEntry::first_row`), then its
//! threads' rows (`ProcEntry::thread_rows`, from `rtprofd --thread-rows`);
//! after every process's come the global rows (same executable and function merged across
//! processes), indexed by an open-addressing hash of (executable, name).
//! Little-endian, fixed widths; readers check every offset and count.
//!
//! Version 2 added `BufferHeader::publish_ns` (the buffer header grew from
//! 64 to 128 bytes). Version 3 keeps process entries in pid order, so a
//! reader finds one process by binary search. Version 4 drops the row
//! checksum: the buffer's sequence number already keeps torn rows from
//! readers, and only the daemon can write the segment, so the checksum
//! guarded nothing while it cost every publish and every read a hash per
//! row. Version 5 gives the reserved words of process entries and rows a
//! meaning (thread rows): a reader of version 4 that took every row before
//! the global ones for a process's own would count a thread's twice.
//! Within version 5, the first reserved word of the buffer header came to
//! locate the claims ([`Claim`]): what a process's own counter segment
//! says its executable is, where that differs from the executable the
//! kernel says it runs (`ProcEntry::exe`, what rows are keyed by). Older
//! writers leave it zero (no claims); older readers ignore it.
//! `abi/c/rtprof_present.c` and
//! `abi/include/rtprof_present.h` are the C reader of the same layout:
//! change them together.

use std::mem::size_of;

pub const MAGIC: [u8; 8] = *b"RTPROFP\0";
pub const VERSION: u32 = 5;
/// A free slot of the hash index.
pub(super) const EMPTY: u32 = u32::MAX;

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
    /// [`PresentWriter::publish`](super::PresentWriter::publish) itself).
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
    /// Where the claims are, and how many ([`Claim`]); 0 and 0: none.
    pub claims_off: u32,
    pub claim_count: u32,
    pub reserved: [u64; 6],
}

/// A process's claim about itself: the executable its counter segment
/// names, shown as such and never a key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Claim {
    /// The index of the process's entry.
    pub proc_index: u32,
    pub exe_off: u32,
    pub exe_len: u32,
    pub reserved: u32,
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
    /// Rows of its threads right after its own `row_count` rows (only
    /// from `rtprofd --thread-rows`; readers that do not know them read
    /// past none of them).
    pub thread_rows: u64,
}

/// `Row::flags`: calls are counted (the function is instrumented).
pub const ROW_COUNTED: u32 = 1;
/// `Row::flags`: a global row (its `proc_index` names the first process
/// of its executable).
pub const ROW_GLOBAL: u32 = 2;
/// `Row::flags`: its calls are estimated (counted in bursts under an
/// overhead budget), not exact.
pub const ROW_ESTIMATED: u32 = 4;
/// `Row::flags`: the program adds calls to it through the C API (work
/// done on an accelerator).
pub const ROW_ACCELERATED: u32 = 8;
/// `Row::flags`: its counting is switched off now (in a global row: in
/// one of the processes at least).
pub const ROW_COUNTING_OFF: u32 = 16;
/// `Row::flags`: a thread's row (`rtprofd --thread-rows`), among its
/// process's thread rows: calls of one function by thread `Row::tid`.
pub const ROW_THREAD: u32 = 32;
/// `Row::flags`, with [`ROW_THREAD`]: the first row of a thread, named by
/// the thread's name, its calls the sum of its rows that follow.
pub const ROW_THREAD_HEAD: u32 = 64;
/// `Row::flags`, with [`ROW_ESTIMATED`]: too uncertain between bursts to
/// estimate; its calls are those counted, at least that many were made.
pub const ROW_AT_LEAST: u32 = 128;
/// `Row::flags`: what rtprof itself cost the process over the span
/// (`time_ns`: its agent's threads and signal handlers, the threads held
/// still by the overhead budget, and counting as sampled in its stubs,
/// which the functions' own rows count too); named `[rtprof]`, module
/// `rtprof`, no calls or samples of its own.
pub const ROW_AGENT: u32 = 256;
/// `Row::flags`: the program offered other implementations of the
/// function (their rows carry [`ROW_IMPLEMENTATION`]).
pub const ROW_OFFERED: u32 = 512;
/// `Row::flags`: an implementation offered for a function, named
/// `function [name]`: its calls are those routed to it, its samples those
/// of the code it runs.
pub const ROW_IMPLEMENTATION: u32 = 1024;
/// `Row::flags`, with [`ROW_OFFERED`] or [`ROW_IMPLEMENTATION`]: the
/// implementation that runs the function's calls now.
pub const ROW_ACTIVE: u32 = 2048;

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
    /// The thread of a thread row ([`ROW_THREAD`]); 0 otherwise.
    pub tid: u64,
}

// Every record is integers only, with no padding: the writer copies them
// out as bytes and the reader reads them from any bit pattern.
const _: () = assert!(size_of::<PresentHeader>() == 64);
const _: () = assert!(size_of::<BufferHeader>() == 128);
const _: () = assert!(size_of::<ProcEntry>() == 64);
const _: () = assert!(size_of::<Row>() == 64);
const _: () = assert!(size_of::<Claim>() == 16);

/// FNV-1a over executable, a zero byte, and function name.
pub fn key_hash(exe: &str, name: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in exe.bytes().chain([0]).chain(name.bytes()) {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    h
}

/// Total segment size for buffers of `buffer_len` bytes.
pub fn segment_bytes(buffer_len: u64) -> u64 {
    64 + 2 * buffer_len.next_multiple_of(64)
}

/// CLOCK_REALTIME in nanoseconds, the clock `publish_ns` is stamped with.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// What is wrong with a segment (or, `TooLarge`, with a table for it).
/// Shared by writer and reader, so neither depends on the other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PresentError {
    TooShort,
    BadMagic,
    UnsupportedVersion(u32),
    BadRegion(&'static str),
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
            PresentError::Busy => f.write_str("segment rewritten during every read attempt"),
            PresentError::TooLarge { need, have } => {
                write!(f, "table needs {need} bytes, buffers have {have}")
            }
            PresentError::NotPublished => f.write_str("nothing published yet"),
        }
    }
}

impl std::error::Error for PresentError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name moved between executable and function gives another key.
    #[test]
    fn keys_keep_executable_and_name_apart() {
        assert_ne!(key_hash("/bin/a", "bc"), key_hash("/bin/ab", "c"));
        assert_eq!(segment_bytes(100), 64 + 2 * 128);
    }
}
