//! Instruction-set specifics, behind four small interfaces: [`Planner`]
//! (a function's entry plan), [`StubWriter`] (its stub and entry patch),
//! [`LoopProber`] (exact loop counts' probes) and [`ThreadContext`] (the
//! thread pointer, signal contexts, stopped threads). Plans are opaque to
//! the rest of the agent: it asks them what [`EntryPlan`] says. A second
//! architecture implements these in a sibling folder; `toy` (in tests)
//! shows that one can. The rest of the agent reaches them only through
//! [`Native`], this build's implementation, and the types below.

#[cfg(test)]
mod toy;
#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use self::x86_64::{
    FunctionScan, LoopSpan, LoopWindow, Plan, ProbeCounter, Way, X86_64 as Native,
};

use rtprof_abi::loops::LoopRefusal;
use rtprof_abi::Refusal;

/// Choosing patches: a function's entry plan (a window of instructions
/// moved to its stub, a short entry through a trampoline, a trap entry),
/// the fill around functions, branch targets, plans in their cache form.
pub trait Planner {
    /// A function's entry plan.
    type Plan: EntryPlan;
    /// What one decode of a function finds.
    type Scan: Default;

    /// The patch plan of the function whose code (with `pad` bytes of fill
    /// after its `size` bytes) starts at `start`, or why there is none.
    fn plan_window(code: &[u8], start: u64, size: usize, pad: usize)
        -> Result<Self::Plan, Refusal>;

    /// For a function whose first bytes cannot all move (a branch lands
    /// `limit` bytes in): a plan whose entry reaches the stub through a
    /// trampoline in the fill at offset `tramp` (negative) from `start`.
    fn plan_short(
        code: &[u8],
        start: u64,
        size: usize,
        limit: usize,
        tramp: i8,
    ) -> Result<Self::Plan, Refusal>;

    /// For a function whose entry can take no jump: a plan whose entry
    /// is a trap ([`StubWriter::TRAP`]) that the trap handler turns
    /// into a jump to the stub (`RTPROF_TRAPS=1`).
    fn plan_trap(code: &[u8], start: u64, size: usize) -> Result<Self::Plan, Refusal>;

    /// Whether `code` is alignment fill only (nothing that does anything).
    fn is_fill(code: &[u8]) -> bool;

    /// Whether the `len` bytes at `lead` in `code` lie inside alignment
    /// fill: decoded from some instruction start at most `lead` bytes
    /// before them, only fill up to and over them (a trampoline's 5 bytes
    /// may begin or end inside a multi-byte fill instruction).
    fn within_fill(code: &[u8], lead: usize, len: usize) -> bool;

    /// Runs of alignment fill in a function's `code` (at `start`) that
    /// nothing runs into (each after a return, jump or trap), as [first
    /// byte, past the last): where a short entry's trampoline may go when
    /// no branch lands there.
    fn dead_fill(code: &[u8], start: u64) -> Vec<(u64, u64)>;

    /// Every direct branch and call target in code no listed function
    /// covers, bytes that are no instruction skipped.
    fn sweep_targets(code: &[u8], ip: u64) -> Vec<u64>;

    /// One decode of a function: its branch targets and jump-table clues.
    fn scan_function(code: &[u8], ip: u64) -> Self::Scan;

    /// Targets of the function's jump tables (see the x86-64 module).
    fn jump_table_targets<'m>(
        scan: &Self::Scan,
        lo: u64,
        hi: u64,
        keep: &dyn Fn(u64) -> bool,
        read: &dyn Fn(u64, usize) -> Option<&'m [u8]>,
    ) -> Vec<u64>;

    /// A plan in its cache-entry form, appended to `out`.
    fn encode_plan(plan: &Self::Plan, out: &mut Vec<u8>);

    /// A plan from its cache-entry form, for the function at `start`.
    fn decode_plan(bytes: &[u8], start: u64) -> Option<Self::Plan>;

    /// If `code` is a function that only returns (the loader's
    /// `_dl_debug_state`), the plan that sends it to a trampoline.
    fn return_only_plan(code: &[u8], at: u64) -> Option<Self::Plan>;

    /// A function's instructions at `start`, each with where control goes
    /// after it (up to the first bytes that are no instruction).
    fn decode_flow(code: &[u8], start: u64) -> Vec<rtprof_shared::cfg::Insn>;
}

/// Writing code: a plan's stub and entry patch, trampolines, the counting
/// switch, branches sent elsewhere.
pub trait StubWriter: Planner {
    /// How far a patched entry's jump reaches, either way.
    const BRANCH_RANGE: u64;

    /// A byte that traps if executed: the fill between stubs.
    const TRAP: u8;

    /// Alignment of a stub's first byte (its counting switch is one store).
    const STUB_ALIGN: u64;

    /// Bytes of `plan`'s stub (`callers`: one that calls a caller hook).
    fn stub_len(plan: &Self::Plan, callers: bool) -> usize;

    /// Writes `plan`'s stub, to run at `at`, into `out`.
    fn emit_stub(
        plan: &Self::Plan,
        at: u64,
        counter: &CounterRef,
        out: &mut [u8],
    ) -> Result<(), Refusal>;

    /// The bytes written over the entry to send it to `stub`.
    fn entry_patch(plan: &Self::Plan, stub: u64) -> Option<EntryPatch>;

    /// A stub's first two bytes with counting on or off.
    fn counting_switch(on: bool) -> [u8; 2];

    /// A short plan's trampoline: its address and bytes, to reach `stub`.
    fn trampoline(plan: &Self::Plan, stub: u64) -> Option<(u64, [u8; 5])>;

    /// Where a stub at `stub` runs the moved code without counting: what a
    /// function's own branches back to its entry are sent to.
    fn uncounted_entry(stub: u64) -> u64;

    /// The bytes that make the branch whose displacement field is at
    /// `field` reach `to`, if it can.
    fn redirect(field: u64, to: u64) -> Option<[u8; 4]>;

    /// A trampoline that jumps to absolute address `target`: (bytes, length).
    fn absolute_jump(target: u64) -> ([u8; 16], usize);

    /// Bytes of a route stub.
    const ROUTE_STUB_LEN: usize;

    /// Writes the stub, to run at `at`, that counts a call in `counter`'s
    /// slot and runs `target` (an implementation the program offered) in
    /// place of `routed`'s function: its caller sees nothing changed but
    /// the result (see the instruction set's module for how).
    fn emit_route_stub(
        at: u64,
        counter: &CounterRef,
        target: u64,
        routed: &Routed,
        out: &mut [u8],
    ) -> Result<(), Refusal>;

    /// A stub's first eight bytes (`first`, as they are) sending its calls
    /// to the route stub at `to` instead, switched with one aligned store
    /// while threads run through it; `None` if out of reach.
    fn route_jump(stub: u64, first: [u8; 8], to: u64) -> Option<[u8; 8]>;
}

/// Exact loop counts: where a probe takes over a loop's block, and the
/// probe's code.
pub trait LoopProber {
    /// The stretch of a block a probe takes over.
    type Window;
    /// Which end of a block a window is taken from.
    type Span: Copy;
    /// Where a probe's way out goes, and what it counts on the way.
    type Way;
    /// A loop counter a probe bumps.
    type Counter: Copy;

    /// The stretch of the block [lo, hi) of `code` (which starts at
    /// `code_start`) that a loop probe takes over (see `Self::Span`), or why
    /// none fits.
    fn loop_window(
        code: &[u8],
        code_start: u64,
        lo: u64,
        hi: u64,
        span: Self::Span,
    ) -> Result<Self::Window, LoopRefusal>;

    /// Whether the block [lo, hi) only does register arithmetic and ends
    /// in a direct jump: entered, it surely reaches the jump's target.
    fn loop_block_plain(code: &[u8], code_start: u64, lo: u64, hi: u64) -> bool;

    /// Whether the flags may be live where the block [at, hi) starts.
    fn loop_flags_live(code: &[u8], code_start: u64, at: u64, hi: u64) -> bool;

    /// Bytes of a loop probe (`head`: counting entries; `ways` as
    /// `Self::Window::ways`; `flags`: counts save the flags).
    fn probe_len(w: &Self::Window, head: bool, ways: &[Self::Way], flags: bool) -> usize;

    /// Writes a loop probe to run at `at` into `out`: the count of arrivals
    /// at `head`'s counter if any, the window's moved code, its ways on;
    /// counts go to the thread's own counters (see `loops_tls_offset`).
    /// Returns the address past the count of entries.
    fn emit_probe(
        w: &Self::Window,
        at: u64,
        head: Option<Self::Counter>,
        ways: &[Self::Way],
        flags: bool,
        out: &mut [u8],
    ) -> Option<u64>;

    /// How far a loop probe's code moved the stack pointer by the time it
    /// reaches the end of `code` (its bytes from its first, at `start`).
    fn probe_sp_shift(code: &[u8], start: u64) -> i64;

    /// The bytes written over a loop window to send it to its probe.
    fn window_patch(w: &Self::Window, probe: u64) -> Option<Vec<u8>>;
}

/// The running thread: its thread pointer's words, a signal handler's
/// context, a stopped thread's registers, the unwind rule of an entry.
pub trait ThreadContext {
    /// End of the user half of the address space.
    const USER_END: u64;

    /// Offset from the thread pointer of the per-thread stripe pointer.
    fn stripe_tls_offset() -> i64;

    /// Offset from the thread pointer of the per-thread loop counters
    /// pointer.
    fn loops_tls_offset() -> i64;

    /// This thread's word at `offset` from the thread pointer.
    fn thread_word(offset: i64) -> u64;

    /// Sets this thread's word at `offset` from the thread pointer.
    fn set_thread_word(offset: i64, value: u64);

    /// The interrupted instruction's address in a signal handler's context.
    ///
    /// # Safety
    /// `uc` is the `ucontext_t` the kernel passed to an SA_SIGINFO handler.
    unsafe fn signal_pc(uc: *const libc::ucontext_t) -> u64;

    /// Makes the interrupted thread resume at `pc` when the handler
    /// returns.
    ///
    /// # Safety
    /// As for [`ThreadContext::signal_pc`].
    unsafe fn set_signal_pc(uc: *mut libc::ucontext_t, pc: u64);

    /// The address of the trap instruction whose trap interrupted at `pc`.
    fn trap_site(pc: u64) -> u64;

    /// The interrupted stack pointer and frame pointer, there.
    ///
    /// # Safety
    /// As for [`ThreadContext::signal_pc`].
    unsafe fn signal_sp_bp(uc: *const libc::ucontext_t) -> (u64, u64);

    /// The program counter thread `tid` resumes at (the caller holds it in
    /// a ptrace stop; a system call to be restarted counts from its
    /// instruction), and its thread pointer (the base its thread-local
    /// storage offsets count from). One system call, no allocation.
    fn stopped_pc_tp(tid: i32) -> Option<(u64, u64)>;

    /// Whether an unwind row describes a frame as a call leaves it (the
    /// canonical frame is the stack pointer plus a return address, and
    /// nothing else is saved): true at a real function's first byte.
    fn is_call_entry_frame(row: &gimli::UnwindTableRow<usize>) -> bool;
}

/// What generic code may ask of a plan, whatever the instruction set.
pub trait EntryPlan: Sized {
    /// First byte of the function.
    fn start(&self) -> u64;
    /// Where the entry patch is written (past an instruction that stays).
    fn patch_at(&self) -> u64;
    /// Bytes overwritten at `patch_at`.
    fn window(&self) -> usize;
    /// Where execution continues after the moved instructions.
    fn resume_at(&self) -> u64;
    /// The function's first bytes as they were.
    fn original(&self) -> &[u8];
    /// The function's own branches into its entry's bytes.
    fn redirects(&self) -> &[Redirect];
    /// The plan with those branches, given as (field, target) addresses,
    /// if each can be sent to its copy in the stub.
    fn with_redirects(self, fields: &[(u64, u64)]) -> Option<Self>;
    /// Where a short plan's trampoline goes, if it has one.
    fn trampoline(&self) -> Option<u64>;
    /// Whether the entry is a trap the trap handler turns into a jump.
    fn is_trap(&self) -> bool;
    /// Whether its stub's bytes depend only on the distance from the stub
    /// to the function (no moved instruction holds an absolute address).
    fn position_independent(&self) -> bool;
}

/// One of the function's own branches into its entry bytes (a loop whose
/// head is the entry, or a jump to a later instruction of those moved),
/// sent to that instruction's copy in the stub, past the count (a loop is
/// not a call).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Redirect {
    /// Offset from `start` of the branch's rel32 field.
    pub field: u32,
    /// Offset from `start` of where it branches to now.
    pub target: u8,
    /// Offset in the moved code of the copy it is sent to.
    pub code: u8,
}

/// Where the stub's counter lives.
#[derive(Clone, Copy, Debug, Default)]
pub struct CounterRef {
    /// Offset from the thread pointer (fs base) of the per-thread stripe pointer.
    pub tls_offset: i32,
    /// Counter slot of the function within a stripe.
    pub slot: u32,
    /// Absolute address of the slot's counter in the shared stripe.
    pub shared_counter: u64,
    /// With exact callers on (`RTPROF_CALLERS=1`): the address of an
    /// `extern "C" fn(slot: u32, return_address: u64)` the stub calls after
    /// counting; 0 for none.
    pub caller_hook: u64,
    /// The module's link words ([`LinkWords`]), 0 for none: a stub that
    /// has them reaches its counters through them, relative to its own
    /// address, so its bytes are the same in every process that places
    /// the module's stubs at the same distance from it (a page image).
    pub link: u64,
    /// The function's counter slot within its module (with `link`).
    pub local: u32,
}

/// The words a module's stubs read their counters' places from, kept
/// beside them (see [`CounterRef::link`]): what differs between
/// processes, in one place that is not code.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkWords {
    /// Byte offset in a stripe of the module's first counter.
    pub first_counter: u64,
    /// Address of the module's first counter in the shared stripe.
    pub shared_first: u64,
}

/// Writes `plan`'s stub to run at `at` into `out` and returns the entry
/// patch that reaches it: what every function's instrumenting does, for
/// any instruction set.
pub fn stub_and_entry<I: StubWriter>(
    plan: &I::Plan,
    at: u64,
    counter: &CounterRef,
    out: &mut [u8],
) -> Result<EntryPatch, Refusal> {
    I::emit_stub(plan, at, counter, out)?;
    I::entry_patch(plan, at).ok_or(Refusal::NoMemoryInRange)
}

/// The function a route stub stands in for.
pub struct Routed<'m> {
    /// Its first byte: its code as it runs now (entry patch included),
    /// which says what its callers may expect of a call.
    pub start: u64,
    /// Its own stub: a call the route stub cannot take runs its own code
    /// from there ([`StubWriter::uncounted_entry`]), counted in its own
    /// row (`counter`).
    pub stub: u64,
    pub counter: CounterRef,
    /// `len` bytes of the process's memory at an address, if readable.
    pub read: &'m dyn Fn(u64, usize) -> Option<&'m [u8]>,
}

/// What is written over a function's entry.
#[derive(Clone, Copy, Debug)]
pub struct EntryPatch {
    pub bytes: [u8; 32],
    pub len: usize,
}

impl EntryPatch {
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}
