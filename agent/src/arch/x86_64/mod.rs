//! x86-64: decoding with iced-x86, stubs and patches encoded by hand.

mod emit;
mod loop_probe;
mod plan_bytes;
mod route;
mod scan;
mod side_stack;
mod stub;
mod tls;
mod window;

pub use loop_probe::{LoopWindow, ProbeCounter, Span as LoopSpan, Way};
pub use scan::FunctionScan;
pub use window::Plan;

use super::{CounterRef, EntryPatch, LoopProber, Planner, Routed, StubWriter, ThreadContext};
use rtprof_abi::loops::LoopRefusal;
use rtprof_abi::Refusal;

/// This build's instruction set.
pub struct X86_64;

impl Planner for X86_64 {
    type Plan = Plan;
    type Scan = FunctionScan;

    fn plan_window(code: &[u8], start: u64, size: usize, pad: usize) -> Result<Plan, Refusal> {
        window::plan_window(code, start, size, pad)
    }

    fn plan_short(
        code: &[u8],
        start: u64,
        size: usize,
        limit: usize,
        tramp: i8,
    ) -> Result<Plan, Refusal> {
        window::plan_short(code, start, size, limit, tramp)
    }

    fn plan_trap(code: &[u8], start: u64, size: usize) -> Result<Plan, Refusal> {
        window::plan_trap(code, start, size)
    }

    fn is_fill(code: &[u8]) -> bool {
        window::is_fill(code)
    }

    fn within_fill(code: &[u8], lead: usize, len: usize) -> bool {
        window::within_fill(code, lead, len)
    }

    fn dead_fill(code: &[u8], start: u64) -> Vec<(u64, u64)> {
        window::dead_fill(code, start)
    }

    fn sweep_targets(code: &[u8], ip: u64) -> Vec<u64> {
        scan::sweep_targets(code, ip)
    }

    fn scan_function(code: &[u8], ip: u64) -> FunctionScan {
        scan::scan_function(code, ip)
    }

    fn jump_table_targets<'m>(
        s: &FunctionScan,
        lo: u64,
        hi: u64,
        keep: &dyn Fn(u64) -> bool,
        read: &dyn Fn(u64, usize) -> Option<&'m [u8]>,
    ) -> Vec<u64> {
        scan::jump_table_targets(s, lo, hi, keep, read)
    }

    fn encode_plan(plan: &Plan, out: &mut Vec<u8>) {
        plan_bytes::encode(plan, out)
    }

    fn decode_plan(bytes: &[u8], start: u64) -> Option<Plan> {
        plan_bytes::decode(bytes, start)
    }

    /// `[endbr64;] ret` at the start of 16 aligned bytes: the 5 bytes from
    /// the `ret` on are the function's own and its fill, which nothing can
    /// reach (decoding them instead would cost every process the decoder's
    /// set-up, half a millisecond).
    fn return_only_plan(code: &[u8], at: u64) -> Option<Plan> {
        let skip = match code {
            [0xc3, ..] => 0,
            [0xf3, 0x0f, 0x1e, 0xfa, 0xc3, ..] => 4,
            _ => return None,
        };
        let window = window::MIN_WINDOW;
        let original = code.get(..skip as usize + window)?;
        Plan::from_parts(at, skip, window as u8, skip + 1, original, &[0xc3], &[])
            .filter(|_| at.is_multiple_of(16))
    }

    fn decode_flow(code: &[u8], start: u64) -> Vec<rtprof_shared::cfg::Insn> {
        rtprof_shared::cfg::x86_64::decode(code, start)
    }
}

impl StubWriter for X86_64 {
    /// Stubs must be reachable from the entry with a `jmp rel32`.
    const BRANCH_RANGE: u64 = 0x7FFF_0000;

    /// `int3`.
    const TRAP: u8 = 0xcc;

    const STUB_ALIGN: u64 = 16;

    fn trampoline(plan: &Plan, stub: u64) -> Option<(u64, [u8; 5])> {
        stub::trampoline(plan, stub)
    }

    fn stub_len(plan: &Plan, callers: bool) -> usize {
        stub::stub_len(plan, callers)
    }

    fn emit_stub(
        plan: &Plan,
        at: u64,
        counter: &CounterRef,
        out: &mut [u8],
    ) -> Result<(), Refusal> {
        stub::emit_stub(plan, at, counter, out)
    }

    fn entry_patch(plan: &Plan, to: u64) -> Option<EntryPatch> {
        stub::entry_patch(plan, to)
    }

    fn counting_switch(on: bool) -> [u8; 2] {
        stub::counting_switch(on)
    }

    /// The moved code, right after the counting prologue.
    fn uncounted_entry(stub: u64) -> u64 {
        stub + stub::PROLOGUE_LEN as u64
    }

    /// `target - end of field`, the field being the last four bytes of a
    /// `jmp`/`jcc rel32`.
    fn redirect(field: u64, to: u64) -> Option<[u8; 4]> {
        let rel = to.wrapping_sub(field + 4) as i64;
        i32::try_from(rel).ok().map(i32::to_le_bytes)
    }

    /// `jmp [rip+0]; dq target`.
    fn absolute_jump(target: u64) -> ([u8; 16], usize) {
        let mut b = [0u8; 16];
        b[..6].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
        b[6..14].copy_from_slice(&target.to_le_bytes());
        (b, 14)
    }

    const ROUTE_STUB_LEN: usize = route::ROUTE_STUB_LEN;

    fn emit_route_stub(
        at: u64,
        counter: &CounterRef,
        target: u64,
        routed: &Routed,
        out: &mut [u8],
    ) -> Result<(), Refusal> {
        route::emit_route_stub(at, counter, target, routed, out)
    }

    fn route_jump(stub: u64, first: [u8; 8], to: u64) -> Option<[u8; 8]> {
        stub::route_jump(stub, first, to)
    }
}

impl LoopProber for X86_64 {
    type Window = LoopWindow;
    type Span = LoopSpan;
    type Way = Way;
    type Counter = ProbeCounter;

    fn loop_window(
        code: &[u8],
        code_start: u64,
        lo: u64,
        hi: u64,
        span: LoopSpan,
    ) -> Result<LoopWindow, LoopRefusal> {
        loop_probe::window(code, code_start, lo, hi, span)
    }

    fn loop_block_plain(code: &[u8], code_start: u64, lo: u64, hi: u64) -> bool {
        loop_probe::block_plain(code, code_start, lo, hi)
    }

    fn loop_flags_live(code: &[u8], code_start: u64, at: u64, hi: u64) -> bool {
        loop_probe::flags_live(code, code_start, at, hi)
    }

    fn probe_len(w: &LoopWindow, head: bool, ways: &[Way], flags: bool) -> usize {
        loop_probe::probe_len(w, head, ways, flags)
    }

    fn emit_probe(
        w: &LoopWindow,
        at: u64,
        head: Option<ProbeCounter>,
        ways: &[Way],
        flags: bool,
        out: &mut [u8],
    ) -> Option<u64> {
        let tls = i32::try_from(tls::loops_offset()).ok()?;
        loop_probe::emit_probe(w, at, head, ways, flags, tls, out)
    }

    fn probe_sp_shift(code: &[u8], start: u64) -> i64 {
        loop_probe::sp_shift(code, start)
    }

    fn window_patch(w: &LoopWindow, probe: u64) -> Option<Vec<u8>> {
        loop_probe::window_patch(w, probe)
    }
}

impl ThreadContext for X86_64 {
    const USER_END: u64 = 0x7fff_ffff_f000;

    fn stripe_tls_offset() -> i64 {
        tls::offset()
    }

    fn loops_tls_offset() -> i64 {
        tls::loops_offset()
    }

    fn thread_word(offset: i64) -> u64 {
        tls::load(offset)
    }

    fn set_thread_word(offset: i64, value: u64) {
        tls::store(offset, value)
    }

    unsafe fn signal_pc(uc: *const libc::ucontext_t) -> u64 {
        // SAFETY: the caller passes the kernel's context (see the trait).
        (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] as u64
    }

    unsafe fn set_signal_pc(uc: *mut libc::ucontext_t, pc: u64) {
        // SAFETY: the caller passes the kernel's context (see the trait),
        // which the kernel restores the registers from on return.
        (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] = pc as i64;
    }

    /// `int3` reports the address after it.
    fn trap_site(pc: u64) -> u64 {
        pc.wrapping_sub(1)
    }

    unsafe fn signal_sp_bp(uc: *const libc::ucontext_t) -> (u64, u64) {
        // SAFETY: the caller passes the kernel's context (see the trait).
        let g = &(*uc).uc_mcontext.gregs;
        (
            g[libc::REG_RSP as usize] as u64,
            g[libc::REG_RBP as usize] as u64,
        )
    }

    fn stopped_pc_tp(tid: i32) -> Option<(u64, u64)> {
        // SAFETY: all-zero is a valid user_regs_struct, which the kernel fills.
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        // SAFETY: the caller holds `tid` stopped; the kernel writes `regs`.
        let r = unsafe {
            libc::ptrace(
                libc::PTRACE_GETREGS,
                tid,
                0,
                &mut regs as *mut libc::user_regs_struct,
            )
        };
        (r == 0).then_some((resume_pc(&regs), regs.fs_base))
    }

    /// CFA = rsp + 8 and only the return address saved.
    fn is_call_entry_frame(row: &gimli::UnwindTableRow<usize>) -> bool {
        use gimli::{CfaRule, X86_64 as R};
        matches!(row.cfa(), CfaRule::RegisterAndOffset { register, offset }
            if *register == R::RSP && *offset == 8)
            && row.registers().all(|(r, _)| *r == R::RA)
    }
}

/// The interface is implemented in full, checked when this module builds.
const _: fn() = || {
    fn implements<T: Planner + StubWriter + LoopProber + ThreadContext>() {}
    implements::<X86_64>();
};

/// Where a stopped thread resumes: its rip, or the `syscall` instruction
/// before it (2 bytes) when it was stopped in a system call the kernel
/// restarts on resume (an entry written over that instruction would be
/// run from the middle otherwise).
fn resume_pc(regs: &libc::user_regs_struct) -> u64 {
    const RESTARTS: [i64; 4] = [-512, -513, -514, -516];
    let restarts = (regs.orig_rax as i64) >= 0 && RESTARTS.contains(&(regs.rax as i64));
    if restarts {
        regs.rip.wrapping_sub(2)
    } else {
        regs.rip
    }
}

#[cfg(test)]
mod resume_tests {
    #[test]
    fn a_restarted_system_call_resumes_at_its_syscall_instruction() {
        // SAFETY: all-zero is a valid user_regs_struct.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        r.rip = 0x1002;
        r.orig_rax = 35;
        r.rax = (-516i64) as u64;
        assert_eq!(super::resume_pc(&r), 0x1000);
        r.rax = 0;
        assert_eq!(super::resume_pc(&r), 0x1002);
        r.orig_rax = u64::MAX;
        r.rax = (-512i64) as u64;
        assert_eq!(super::resume_pc(&r), 0x1002);
    }
}
