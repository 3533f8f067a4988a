//! Instruction-set specifics, behind one interface: [`InstructionSet`],
//! which a second architecture implements in a sibling folder (exporting
//! its own `Plan`, `FunctionScan` and `CounterRef` types). The rest of the
//! agent reaches them only through [`Native`], this build's implementation.

#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use self::x86_64::{
    CounterRef, FunctionScan, LoopSpan, LoopWindow, Plan, ProbeCounter, Way, X86_64 as Native,
};

use rtprof_abi::loops::LoopRefusal;
use rtprof_abi::Refusal;

/// Everything the agent needs to know about the machine's instructions and
/// ABI: choosing and encoding patches, the stubs and their live switch, the
/// loader hook's trampoline, the thread pointer, the signal context and the
/// unwind rule of a function's first byte.
pub trait InstructionSet {
    /// How far a patched entry's jump reaches, either way.
    const BRANCH_RANGE: u64;
    /// End of the user half of the address space.
    const USER_END: u64;
    /// A byte that traps if executed: the fill between stubs.
    const TRAP: u8;
    /// Alignment of a stub's first byte (its counting switch is one store).
    const STUB_ALIGN: u64;

    /// The patch plan of the function whose code (with `pad` bytes of fill
    /// after its `size` bytes) starts at `start`, or why there is none.
    fn plan_window(code: &[u8], start: u64, size: usize, pad: usize) -> Result<Plan, Refusal>;
    /// For a function whose first bytes cannot all move (a branch lands
    /// `limit` bytes in): a plan whose entry reaches the stub through a
    /// trampoline in the fill at offset `tramp` (negative) from `start`.
    fn plan_short(
        code: &[u8],
        start: u64,
        size: usize,
        limit: usize,
        tramp: i8,
    ) -> Result<Plan, Refusal>;
    /// For a function whose entry can take no jump: a plan whose entry
    /// is a trap ([`InstructionSet::TRAP`]) that the trap handler turns
    /// into a jump to the stub (`RTPROF_TRAPS=1`).
    fn plan_trap(code: &[u8], start: u64, size: usize) -> Result<Plan, Refusal>;
    /// A short plan's trampoline: its address and bytes, to reach `stub`.
    fn trampoline(plan: &Plan, stub: u64) -> Option<(u64, [u8; 5])>;
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
    fn scan_function(code: &[u8], ip: u64) -> FunctionScan;
    /// Targets of the function's jump tables (see the x86-64 module).
    fn jump_table_targets<'m>(
        scan: &FunctionScan,
        lo: u64,
        hi: u64,
        keep: &dyn Fn(u64) -> bool,
        read: &dyn Fn(u64, usize) -> Option<&'m [u8]>,
    ) -> Vec<u64>;

    /// Bytes of `plan`'s stub (`callers`: one that calls a caller hook).
    fn stub_len(plan: &Plan, callers: bool) -> usize;
    /// Writes `plan`'s stub, to run at `at`, into `out`.
    fn emit_stub(plan: &Plan, at: u64, counter: &CounterRef, out: &mut [u8])
        -> Result<(), Refusal>;
    /// The bytes written over the entry to send it to `stub`.
    fn entry_patch(plan: &Plan, stub: u64) -> Option<EntryPatch>;
    /// A stub's first two bytes with counting on or off.
    fn counting_switch(on: bool) -> [u8; 2];
    /// A plan in its cache-entry form, appended to `out`.
    fn encode_plan(plan: &Plan, out: &mut Vec<u8>);
    /// A plan from its cache-entry form, for the function at `start`.
    fn decode_plan(bytes: &[u8], start: u64) -> Option<Plan>;

    /// If `code` is a function that only returns (the loader's
    /// `_dl_debug_state`), the plan that sends it to a trampoline.
    fn return_only_plan(code: &[u8], at: u64) -> Option<Plan>;
    /// Where a stub at `stub` runs the moved code without counting: what a
    /// function's own branches back to its entry are sent to.
    fn uncounted_entry(stub: u64) -> u64;
    /// The bytes that make the branch whose displacement field is at
    /// `field` reach `to`, if it can.
    fn redirect(field: u64, to: u64) -> Option<[u8; 4]>;
    /// A trampoline that jumps to absolute address `target`: (bytes, length).
    fn absolute_jump(target: u64) -> ([u8; 16], usize);

    /// A function's instructions at `start`, each with where control goes
    /// after it (up to the first bytes that are no instruction).
    fn decode_flow(code: &[u8], start: u64) -> Vec<rtprof_shared::cfg::Insn>;
    /// The stretch of the block [lo, hi) of `code` (which starts at
    /// `code_start`) that a loop probe takes over (see `LoopSpan`), or why
    /// none fits.
    fn loop_window(
        code: &[u8],
        code_start: u64,
        lo: u64,
        hi: u64,
        span: LoopSpan,
    ) -> Result<LoopWindow, LoopRefusal>;
    /// Whether the block [lo, hi) only does register arithmetic and ends
    /// in a direct jump: entered, it surely reaches the jump's target.
    fn loop_block_plain(code: &[u8], code_start: u64, lo: u64, hi: u64) -> bool;
    /// Whether the flags may be live where the block [at, hi) starts.
    fn loop_flags_live(code: &[u8], code_start: u64, at: u64, hi: u64) -> bool;
    /// Bytes of a loop probe (`head`: counting entries; `ways` as
    /// `LoopWindow::ways`; `flags`: counts save the flags).
    fn probe_len(w: &LoopWindow, head: bool, ways: &[Way], flags: bool) -> usize;
    /// Writes a loop probe to run at `at` into `out`: the count of arrivals
    /// at `head`'s counter if any, the window's moved code, its ways on;
    /// counts go to the thread's own counters (see `loops_tls_offset`).
    /// Returns the address past the count of entries.
    fn emit_probe(
        w: &LoopWindow,
        at: u64,
        head: Option<ProbeCounter>,
        ways: &[Way],
        flags: bool,
        out: &mut [u8],
    ) -> Option<u64>;
    /// How far a loop probe's code moved the stack pointer by the time it
    /// reaches the end of `code` (its bytes from its first, at `start`).
    fn probe_sp_shift(code: &[u8], start: u64) -> i64;
    /// The bytes written over a loop window to send it to its probe.
    fn window_patch(w: &LoopWindow, probe: u64) -> Option<Vec<u8>>;

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
    /// As for [`InstructionSet::signal_pc`].
    unsafe fn set_signal_pc(uc: *mut libc::ucontext_t, pc: u64);
    /// The address of the trap instruction whose trap interrupted at `pc`.
    fn trap_site(pc: u64) -> u64;
    /// The interrupted stack pointer and frame pointer, there.
    ///
    /// # Safety
    /// As for [`InstructionSet::signal_pc`].
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
