//! Binary layout of the counter segment (ABI version 5).
//!
//! All fields are little-endian with fixed widths. The segment is laid out as:
//!
//! ```text
//! [Header][ModuleRecord × module_cap][FunctionRecord × func_cap][strings]
//! [samples: u64 × func_cap][stripe table: StripeSlot × stripe_cap]
//! [stripe 0 (shared, atomic)][stripe 1]...[stripe stripe_cap-1]   (page aligned)
//! [TableHead][stripe samples: u64 × stripe_cap]
//! [thread samples: (key u64, count u64) × TableHead::cap]        (page aligned)
//! ```
//!
//! A stripe is one `u64` call counter per function slot. Each thread counts
//! into its own stripe without atomics; threads without one use stripe 0 with
//! `lock inc`. A function's call count is the sum over the stripes that
//! count: the shared one, threads', and the ended threads' sum (see
//! [`stripe_state`]).
//!
//! Samples are counted per stripe (its thread's CPU time) and by (stripe,
//! function slot) in a hash table ([`crate::count_table`]) keyed
//! `stripe << 32 | slot`, so a reader knows each thread's time in each
//! function. A stripe given to a new thread has its counts zeroed first.
//! Version 3 (a header of 248 bytes) has neither.

use std::mem::size_of;

pub const MAGIC: [u8; 8] = *b"RTPROFC\0";
pub const VERSION: u32 = 5;
/// The version before folds that survive a kill (an ended thread's
/// stripe was added into stripe 0 in place), still read: same header.
pub const VERSION_4: u32 = 4;
/// The version before per-thread samples, still read.
pub const VERSION_3: u32 = 3;
/// Its header: [`Header`] without `thread_samples_off`.
pub const HEADER_3_SIZE: u32 = 248;
pub const PAGE: u64 = 4096;
/// Number of refusal-reason slots in a module record (index = reason code).
pub const REASON_SLOTS: usize = 16;

/// Process life-cycle state stored in [`Header::state`].
pub mod state {
    pub const STARTING: u32 = 0;
    pub const RUNNING: u32 = 1;
    pub const EXITED: u32 = 2;
    /// `rtprof detach` ended the profile: entries restored, counts final,
    /// the process runs on (`end_ns` is when).
    pub const DETACHED: u32 = 3;
}

/// Stripe life-cycle state stored in [`StripeSlot::state`].
///
/// Folding (version 5) survives the process being killed at any point: a
/// thread's end is one store (LIVE to ENDED), and a fold moves every ENDED
/// stripe at once into a new sum stripe, taking effect in one store to
/// `fold_seq`. A reader sums a stripe by [`stripe_state::counted`] against
/// the generation `fold_seq / 2` it read first, and reads again if
/// `fold_seq` moved meanwhile. In a slot, `tid` is the thread's id while
/// LIVE and a generation while FOLDING or SUM.
pub mod stripe_state {
    /// Zero, for a new thread to take.
    pub const FREE: u32 = 0;
    pub const LIVE: u32 = 1;
    /// Being handed to a thread (LIVE once its id is set); still zero.
    pub const CLAIMED: u32 = 2;
    /// Its thread ended: counted until a fold moves it into a sum.
    pub const ENDED: u32 = 3;
    /// Being folded into the sum of generation `tid`: counted until that
    /// generation is the segment's, then zeroed and FREE.
    pub const FOLDING: u32 = 4;
    /// The ended threads' counts as of generation `tid`: counted while
    /// that generation is the segment's.
    pub const SUM: u32 = 5;
    /// Kept for the next sum (stripes 1 and 2, see [`super::SUM_STRIPES`]),
    /// zero, never a thread's.
    pub const SPARE: u32 = 6;

    /// Whether a reader of generation `generation` sums a stripe whose slot
    /// holds (`state`, `tid`). Segments before version 5 count every stripe
    /// but FREE ones.
    pub fn counted(state: u32, tid: u32, generation: u64) -> bool {
        let g = generation as u32;
        match state {
            FREE | CLAIMED | SPARE => false,
            FOLDING => tid == g.wrapping_add(1),
            SUM => tid == g,
            _ => true,
        }
    }
}

/// The stripes a segment with room for at least one thread's keeps for the
/// sums of ended threads' counts: a fold writes the one that is not the
/// current sum.
pub const SUM_STRIPES: [u32; 2] = [1, 2];

/// Whether a segment of `stripe_cap` stripes keeps [`SUM_STRIPES`] (it
/// does when a thread can still have a stripe of its own).
pub fn keeps_sum_stripes(stripe_cap: u32) -> bool {
    stripe_cap >= 4
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Header {
    pub magic: [u8; 8],
    pub version: u32,
    pub header_size: u32,
    pub total_size: u64,
    pub pid: u32,
    pub ppid: u32,
    pub state: u32,
    /// Exit status passed to `exit()` when `state == EXITED`.
    pub exit_status: i32,
    /// CLOCK_REALTIME nanoseconds at agent start and at exit.
    pub start_ns: u64,
    pub end_ns: u64,
    /// Executable path, as an offset/length into the string table.
    pub exe_off: u32,
    pub exe_len: u32,
    pub modules_off: u64,
    pub module_cap: u32,
    pub module_count: u32,
    pub funcs_off: u64,
    pub func_cap: u32,
    pub func_count: u32,
    pub strings_off: u64,
    pub strings_cap: u32,
    pub strings_len: u32,
    pub samples_off: u64,
    pub stripe_table_off: u64,
    pub stripes_off: u64,
    pub stripe_bytes: u64,
    pub stripe_cap: u32,
    /// Stripes handed out so far (stripe 0, the shared one, always counts).
    pub stripe_count: u32,
    /// Sampling period in nanoseconds (0: no sampling).
    pub sample_period_ns: u64,
    /// Samples taken: attributed to a function, to a module, or unknown.
    pub samples_total: u64,
    /// Samples the kernel dropped (ring buffer full) or timer overruns.
    pub samples_lost: u64,
    /// Which sampler ran, a [`crate::sampling::Sampler`] code.
    pub sampler: u32,
    pub flags: u32,
    /// Nanoseconds the agent spent at start-up (reading ELF files, analysis, patching).
    pub setup_ns: u64,
    /// Twice the fold generation: moved by 2 when a fold takes effect
    /// (see [`stripe_state`]); readers retry until they see the same value
    /// before and after. Version 4: odd while a stripe was added into
    /// stripe 0.
    pub fold_seq: u64,
    /// Serialises folds within the process (0 free, 1 held).
    pub fold_lock: u32,
    /// 1: a fold was asked for while another ran; its holder folds again.
    pub fold_again: u32,
    /// Samples whose address lies in no known module.
    pub samples_unknown: u64,
    /// Why that sampler ran (or none did), a [`crate::sampling::Why`] code,
    /// and the errno that decided it, if any.
    pub sampler_why: u32,
    pub sampler_errno: u32,
    /// A request to switch counting, relayed by rtprofd: see [`control`].
    pub control_seq: u32,
    pub control_ack: u32,
    pub control_len: u32,
    /// What is asked ([`control::OFF`], [`control::ON`], [`control::ROUTE`]);
    /// a route's outcome once answered (a [`crate::route::RouteOutcome`]).
    pub control_kind: u32,
    /// Bumped after every change of a function's flags: a reader re-reads
    /// them only when it moved.
    pub flags_changes: u64,
    /// Where the per-thread samples are: a [`TableHead`], the samples of
    /// each stripe, then the table's entries (page aligned). 0: none.
    pub thread_samples_off: u64,
}

/// rtprofd relays a request to switch counting of the functions whose
/// names match a glob, or to route a function's calls to an implementation
/// the program offered, through the segment itself, one request at a time:
/// it writes the glob (or `function\0implementation`) at
/// [`control::PATTERN`] (the bytes between the header and the module
/// records), its length in `control_len`, the kind in `control_kind`, then
/// `control_seq` one past `control_ack`. The agent's drain (or budget)
/// thread sees `control_seq != control_ack`, does it, writes a route's
/// outcome into `control_kind`, and sets `control_ack` to `control_seq`.
/// A segment whose module records start before the end of the pattern
/// area takes no requests.
pub mod control {
    use super::Header;
    use std::mem::offset_of;
    pub const SEQ: usize = offset_of!(Header, control_seq);
    pub const ACK: usize = offset_of!(Header, control_ack);
    pub const LEN: usize = offset_of!(Header, control_len);
    pub const KIND: usize = offset_of!(Header, control_kind);
    /// Kinds of request: switch counting off, on; route calls.
    pub const OFF: u32 = 0;
    pub const ON: u32 = 1;
    pub const ROUTE: u32 = 2;
    /// A route request the agent has taken and is carrying out (see
    /// `crate::route`): never an answer, which replaces it before
    /// `control_ack` moves.
    pub const CLAIMED: u32 = 0x8000_0002;
    /// Where the glob is, and its longest.
    pub const PATTERN: usize = 256;
    pub const PATTERN_MAX: usize = 256;
}

/// What the agent costs its process, measured by the agent and kept
/// current while it runs: 8 words right after the switch requests'
/// pattern ([`cost::AT`]), present where the module records start at or
/// after [`cost::END`] (older writers put them right after the pattern).
/// Words are added to atomically (the process's CPU time only ever
/// raised), by any of the agent's threads and signal handlers; readers
/// take each as it is. A forked child's start from zero.
pub mod cost {
    use super::control;
    /// Byte offset of the block.
    pub const AT: usize = control::PATTERN + control::PATTERN_MAX;
    pub const END: usize = AT + WORDS * 8;
    pub const WORDS: usize = 8;
    // Word indices.
    /// The process's CPU time (every thread, the agent's too) when the
    /// block was last brought up to date, in ns.
    pub const PROCESS_CPU_NS: usize = 0;
    /// CPU time of the sampler: its drain thread, and its signal handlers
    /// (the timers'), in ns. The kernel's own work for a sample (the
    /// interrupt, the signal's delivery) is not in it.
    pub const SAMPLING_NS: usize = 1;
    /// CPU time of the overhead budget's thread, in ns.
    pub const BUDGET_NS: usize = 2;
    /// Time the program's threads were held still while the budget
    /// switched entries, summed over the threads held (those blocked
    /// anyway too: an upper bound), in ns.
    pub const HELD_NS: usize = 3;
    /// Samples that landed in rtprof's own code in the process (stubs,
    /// loop probes): what counting costs, as the sampler sees it (times
    /// the sampling period).
    pub const IN_STUBS: usize = 4;
    /// CPU time of the control thread of an agent loaded by `rtprof
    /// attach`, in ns.
    pub const CONTROL_NS: usize = 5;
}

/// Where [`ModuleWhy`] sits in [`ModuleRecord::flags`]: bits 8..16.
pub mod module_why {
    pub const SHIFT: u32 = 8;
    pub const MASK: u32 = 0xff << SHIFT;
}

crate::codes::abi_codes! {
/// Why a module is not instrumented, or lists no functions, so every
/// module in a report can say so.
pub enum ModuleWhy {
    /// Nothing to say (instrumented, or not selected).
    None = 0,
    /// rtprof's own code.
    OwnCode = 1,
    Vdso = 2,
    /// The dynamic loader, which runs before the agent and under it.
    Loader = 3,
    /// Its ELF file could not be read.
    Unreadable = 4,
    /// The loader writes into its code (DT_TEXTREL).
    TextRelocations = 5,
    /// No room in the counter segment for its function names.
    NoRoom = 6,
}
}

impl ModuleWhy {
    /// The reason as a report says it.
    pub fn text(self) -> Option<&'static str> {
        Some(match self {
            ModuleWhy::None => return None,
            ModuleWhy::OwnCode => "rtprof's own code",
            ModuleWhy::Vdso => "the kernel's vDSO",
            ModuleWhy::Loader => "the dynamic loader",
            ModuleWhy::Unreadable => "its ELF file could not be read",
            ModuleWhy::TextRelocations => "it has text relocations",
            ModuleWhy::NoRoom => "no room for its function names in the counter segment",
        })
    }

    /// The reason stored in a module record's flags.
    pub fn of_flags(flags: u32) -> Option<ModuleWhy> {
        ModuleWhy::from_code((flags & module_why::MASK) >> module_why::SHIFT)
    }
}

/// Bits of [`ModuleRecord::flags`].
pub mod module_flags {
    /// Not instrumented: its functions are listed so that samples can be
    /// attributed to them, and they have no call counts.
    pub const SAMPLED_ONLY: u32 = 1;
    /// A sampled-only module whose functions are listed when the first
    /// sample lands in it (until then it lists none).
    pub const NAMED_ON_DEMAND: u32 = 2;
    /// Implementations the program offered for its functions (module
    /// `[implementations]`, base 0), one row each, named `function
    /// [name]`: its `vaddr` is the implementation's address, its `size`
    /// the slot of the function it implements, its calls those routed to
    /// it. Listed as offers come, so rows of other modules may lie
    /// between two such modules.
    pub const IMPLEMENTATIONS: u32 = 4;
    /// Its patched code and stubs were mapped from a page image in the
    /// plan cache, not written in this process.
    pub const CODE_FROM_IMAGE: u32 = 8;
}

/// The path of a module of implementation rows.
pub const IMPLEMENTATIONS_MODULE: &str = "[implementations]";

/// Bits of [`FunctionRecord::reserved`].
pub mod function_flags {
    /// Patched, but its counting is switched off for now.
    pub const COUNTING_OFF: u32 = 1;
    /// Counted in bursts under an overhead budget: its calls are exact
    /// during the bursts and extrapolated between them.
    pub const ESTIMATED: u32 = 2;
    /// The program added calls to it through the C API
    /// (`rtprof_add_calls`): work done elsewhere, on an accelerator.
    pub const ACCELERATED: u32 = 4;
    /// Its entry is a trap (`RTPROF_TRAPS=1`): counted exactly, at the
    /// cost of a signal per call.
    pub const TRAPPED: u32 = 8;
    /// The program offered other implementations of it (rows of an
    /// [`super::module_flags::IMPLEMENTATIONS`] module).
    pub const OFFERED: u32 = 32;
    /// On an offered function or an implementation row: the one that runs
    /// the function's calls now.
    pub const ACTIVE: u32 = 64;
    /// Bits 16..32 of an estimated function's flags: the bound on the
    /// estimate's error, in hundredths of a percent of its calls, or
    /// [`AT_LEAST`].
    pub const BOUND_SHIFT: u32 = 16;
    /// The bound of a function whose calls between bursts could not be
    /// estimated within a useful bound: its calls are those counted, at
    /// least that many were made.
    pub const AT_LEAST: u16 = u16::MAX;

    /// An estimated function's bound (or [`AT_LEAST`]), from its flags;
    /// `None` if its calls are not estimated.
    pub fn estimate(flags: u32) -> Option<u16> {
        (flags & ESTIMATED != 0).then_some((flags >> BOUND_SHIFT) as u16)
    }
}

/// [`FunctionRecord::status`] of a function in a `SAMPLED_ONLY` module.
pub const STATUS_SAMPLED_ONLY: u32 = 255;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ModuleRecord {
    pub path_off: u32,
    pub path_len: u32,
    /// Load bias: runtime address = base + ELF virtual address.
    pub base: u64,
    pub first_func: u32,
    pub func_count: u32,
    pub patched: u32,
    pub flags: u32,
    /// Refused functions per reason code (index 0 unused).
    pub refused: [u32; REASON_SLOTS],
    /// Samples in the module's code but in none of its listed functions.
    pub samples: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FunctionRecord {
    pub name_off: u32,
    pub name_len: u32,
    pub module: u32,
    /// 0 when patched, otherwise a [`crate::Refusal`] code, or
    /// [`STATUS_SAMPLED_ONLY`].
    pub status: u32,
    /// ELF virtual address of the function's first byte.
    pub vaddr: u64,
    pub size: u32,
    /// [`function_flags`] bits.
    pub reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct StripeSlot {
    pub state: u32,
    pub tid: u32,
}

/// The head of a count table in the segment (see [`crate::count_table`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TableHead {
    /// Unused (0).
    pub reserved: u32,
    /// Entries in use.
    pub len: u32,
    /// Bit `b`: entries `b * cap / 64 ..` were written to (the rest are
    /// zero, and may have no memory behind them).
    pub dirty: u64,
    /// Counts left out (the table full).
    pub dropped: u64,
    /// Entries: a power of two, at least 64.
    pub cap: u32,
    pub pad: u32,
}

/// Entries of the per-thread sample table: 256 KiB of address space, whose
/// pages get memory as samples reach them.
pub const THREAD_SAMPLE_ENTRIES: u32 = 1 << 14;

const _: () = assert!(size_of::<Header>() == 256);
const _: () = assert!(size_of::<TableHead>() == 32);
const _: () = assert!(control::PATTERN >= size_of::<Header>());
const _: () = assert!(cost::AT.is_multiple_of(64));
const _: () = assert!(size_of::<ModuleRecord>() == 104);
const _: () = assert!(size_of::<FunctionRecord>() == 32);
const _: () = assert!(size_of::<StripeSlot>() == 8);

/// Sizes chosen by the writer; everything else follows from them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacities {
    pub modules: u32,
    pub functions: u32,
    pub strings: u32,
    pub stripes: u32,
}

/// Byte offsets of every region, computed from [`Capacities`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub caps: Capacities,
    pub modules_off: u64,
    pub funcs_off: u64,
    pub strings_off: u64,
    pub samples_off: u64,
    pub stripe_table_off: u64,
    pub stripes_off: u64,
    pub stripe_bytes: u64,
    /// [`TableHead`], then a `u64` per stripe: samples of its thread.
    pub thread_samples_off: u64,
    /// The table's entries, 16 bytes each.
    pub thread_entries_off: u64,
    pub total_size: u64,
}

/// Where a per-thread sample table's entries start, after its head at
/// `off` and the samples of `stripes` stripes.
pub fn thread_entries_off(off: u64, stripes: u32) -> u64 {
    align_up(
        off + size_of::<TableHead>() as u64 + stripes as u64 * 8,
        PAGE,
    )
}

pub fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

impl Layout {
    pub fn new(caps: Capacities) -> Layout {
        // The header, then rtprofd's switch requests (`control`), then
        // what the agent costs (`cost`).
        let modules_off = align_up(cost::END as u64, 64);
        let funcs_off = align_up(
            modules_off + caps.modules as u64 * size_of::<ModuleRecord>() as u64,
            64,
        );
        let strings_off = funcs_off + caps.functions as u64 * size_of::<FunctionRecord>() as u64;
        let samples_off = align_up(strings_off + caps.strings as u64, 64);
        let stripe_table_off = align_up(samples_off + caps.functions as u64 * 8, 64);
        let stripes_off = align_up(
            stripe_table_off + caps.stripes as u64 * size_of::<StripeSlot>() as u64,
            PAGE,
        );
        // Page-sized stripes: threads never share a cache line or a page.
        let stripe_bytes = align_up((caps.functions as u64 * 8).max(8), PAGE);
        let thread_samples_off = stripes_off + stripe_bytes * caps.stripes as u64;
        let thread_entries_off = thread_entries_off(thread_samples_off, caps.stripes);
        let total_size = thread_entries_off + THREAD_SAMPLE_ENTRIES as u64 * 16;
        Layout {
            caps,
            modules_off,
            funcs_off,
            strings_off,
            samples_off,
            stripe_table_off,
            stripes_off,
            stripe_bytes,
            thread_samples_off,
            thread_entries_off,
            total_size,
        }
    }

    /// Byte offset of stripe `i`.
    pub fn stripe_off(&self, i: u32) -> u64 {
        self.stripes_off + self.stripe_bytes * i as u64
    }

    /// The part of the segment that is not stripes: header, tables, strings.
    pub fn metadata_len(&self) -> u64 {
        self.stripes_off
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_do_not_overlap_and_are_aligned() {
        let l = Layout::new(Capacities {
            modules: 3,
            functions: 1001,
            strings: 777,
            stripes: 5,
        });
        assert!(l.modules_off >= size_of::<Header>() as u64);
        assert!(l.modules_off >= cost::END as u64);
        assert!(l.funcs_off >= l.modules_off + 3 * 104);
        assert!(l.strings_off >= l.funcs_off + 1001 * 32);
        assert!(l.samples_off >= l.strings_off + 777);
        assert_eq!(l.samples_off % 8, 0);
        assert!(l.stripe_table_off >= l.samples_off + 1001 * 8);
        assert_eq!(l.stripes_off % PAGE, 0);
        assert_eq!(l.stripe_bytes % PAGE, 0);
        assert!(l.stripe_bytes >= 1001 * 8);
        assert_eq!(l.thread_samples_off, l.stripe_off(5));
        assert_eq!(l.thread_entries_off % PAGE, 0);
        assert!(l.thread_entries_off >= l.thread_samples_off + 32 + 5 * 8);
        assert_eq!(
            l.total_size,
            l.thread_entries_off + THREAD_SAMPLE_ENTRIES as u64 * 16
        );
    }
}
