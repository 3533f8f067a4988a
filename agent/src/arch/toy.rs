//! A second instruction set, in tests only: a toy machine whose
//! instructions are 4 bytes (an opcode, then a 24-bit operand). It plans
//! and writes stubs through the same traits as x86-64 ([`Planner`],
//! [`StubWriter`], [`EntryPlan`]) and runs them in a small interpreter:
//! what the generic code needs of an instruction set fits behind them
//! without any x86 type.
//!
//! Instructions: `NOP`, `ADD imm` (acc += imm), `JMP rel` and `JZ rel`
//! (relative to the next instruction), `RET`, `CNT on slot` (a stub's
//! count: counters[slot] += 1 when on), `TRAP`.

use super::{CounterRef, EntryPatch, EntryPlan, Planner, Redirect, Routed, StubWriter};
use rtprof_abi::Refusal;

const NOP: u8 = 0x01;
const ADD: u8 = 0x02;
const JMP: u8 = 0x10;
const JZ: u8 = 0x11;
const RET: u8 = 0x20;
const CNT: u8 = 0x30;
const TRAP: u8 = 0xff;
const INSN: usize = 4;

fn insn(op: u8, operand: i32) -> [u8; 4] {
    let b = operand.to_le_bytes();
    [op, b[0], b[1], b[2]]
}

/// An instruction's signed 24-bit operand.
fn operand(i: &[u8]) -> i32 {
    i32::from_le_bytes([i[1], i[2], i[3], 0]) << 8 >> 8
}

pub struct Toy;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToyPlan {
    start: u64,
    first: [u8; 4],
}

impl EntryPlan for ToyPlan {
    fn start(&self) -> u64 {
        self.start
    }
    fn patch_at(&self) -> u64 {
        self.start
    }
    fn window(&self) -> usize {
        INSN
    }
    fn resume_at(&self) -> u64 {
        self.start + INSN as u64
    }
    fn original(&self) -> &[u8] {
        &self.first
    }
    fn redirects(&self) -> &[Redirect] {
        &[]
    }
    fn with_redirects(self, fields: &[(u64, u64)]) -> Option<ToyPlan> {
        fields.is_empty().then_some(self)
    }
    fn trampoline(&self) -> Option<u64> {
        None
    }
    fn is_trap(&self) -> bool {
        false
    }
    fn position_independent(&self) -> bool {
        true
    }
}

#[derive(Default)]
pub struct ToyScan {
    branch_targets: Vec<u64>,
}

fn branches(code: &[u8], ip: u64) -> Vec<u64> {
    code.chunks_exact(INSN)
        .enumerate()
        .filter(|(_, i)| matches!(i[0], JMP | JZ))
        .map(|(k, i)| (ip + ((k + 1) * INSN) as u64).wrapping_add(operand(i) as i64 as u64))
        .collect()
}

impl Planner for Toy {
    type Plan = ToyPlan;
    type Scan = ToyScan;

    fn plan_window(code: &[u8], start: u64, size: usize, _pad: usize) -> Result<ToyPlan, Refusal> {
        let first = code
            .get(..INSN)
            .filter(|_| size >= INSN)
            .ok_or(Refusal::TooSmall)?;
        match first[0] {
            // A branch's target is relative to where it runs.
            JMP | JZ => Err(Refusal::UnsupportedInstruction),
            NOP | ADD | RET => Ok(ToyPlan {
                start,
                first: first.try_into().unwrap(),
            }),
            _ => Err(Refusal::DecodeError),
        }
    }
    fn plan_short(_: &[u8], _: u64, _: usize, _: usize, _: i8) -> Result<ToyPlan, Refusal> {
        Err(Refusal::TooSmall)
    }
    fn plan_trap(_: &[u8], _: u64, _: usize) -> Result<ToyPlan, Refusal> {
        Err(Refusal::TooSmall)
    }
    fn is_fill(code: &[u8]) -> bool {
        code.len().is_multiple_of(INSN) && code.chunks_exact(INSN).all(|i| i == insn(NOP, 0))
    }
    fn within_fill(code: &[u8], lead: usize, len: usize) -> bool {
        let from = lead / INSN * INSN;
        code.get(from..lead + len)
            .is_some_and(|c| Self::is_fill(&c[..c.len() / INSN * INSN]))
    }
    fn dead_fill(_: &[u8], _: u64) -> Vec<(u64, u64)> {
        Vec::new()
    }
    fn sweep_targets(code: &[u8], ip: u64) -> Vec<u64> {
        branches(code, ip)
    }
    fn scan_function(code: &[u8], ip: u64) -> ToyScan {
        ToyScan {
            branch_targets: branches(code, ip),
        }
    }
    fn jump_table_targets<'m>(
        _: &ToyScan,
        _: u64,
        _: u64,
        _: &dyn Fn(u64) -> bool,
        _: &dyn Fn(u64, usize) -> Option<&'m [u8]>,
    ) -> Vec<u64> {
        Vec::new()
    }
    fn encode_plan(plan: &ToyPlan, out: &mut Vec<u8>) {
        out.extend_from_slice(&plan.first);
    }
    fn decode_plan(bytes: &[u8], start: u64) -> Option<ToyPlan> {
        Some(ToyPlan {
            start,
            first: bytes.get(..INSN)?.try_into().ok()?,
        })
    }
    fn return_only_plan(code: &[u8], at: u64) -> Option<ToyPlan> {
        (code.get(..INSN)? == insn(RET, 0)).then(|| ToyPlan {
            start: at,
            first: insn(RET, 0),
        })
    }
    fn decode_flow(_: &[u8], _: u64) -> Vec<rtprof_shared::cfg::Insn> {
        Vec::new()
    }
}

/// A stub: `CNT on slot`, the moved instruction, `JMP` back.
const STUB_LEN: usize = 3 * INSN;

impl StubWriter for Toy {
    /// A 24-bit displacement.
    const BRANCH_RANGE: u64 = 1 << 23;
    const TRAP: u8 = TRAP;
    const STUB_ALIGN: u64 = INSN as u64;

    fn stub_len(_: &ToyPlan, _: bool) -> usize {
        STUB_LEN
    }
    fn emit_stub(plan: &ToyPlan, at: u64, c: &CounterRef, out: &mut [u8]) -> Result<(), Refusal> {
        let out = out.get_mut(..STUB_LEN).ok_or(Refusal::NoMemoryInRange)?;
        let slot = i32::try_from(c.slot)
            .ok()
            .filter(|s| *s < 1 << 16)
            .ok_or(Refusal::NoCounterSpace)?;
        let back = jump(at + 2 * INSN as u64, plan.resume_at()).ok_or(Refusal::RelocationFailed)?;
        out[..INSN].copy_from_slice(&insn(CNT, 1 | slot << 8));
        out[INSN..2 * INSN].copy_from_slice(&plan.first);
        out[2 * INSN..].copy_from_slice(&back);
        Ok(())
    }
    fn entry_patch(plan: &ToyPlan, stub: u64) -> Option<EntryPatch> {
        let mut bytes = [0; 32];
        bytes[..INSN].copy_from_slice(&jump(plan.start, stub)?);
        Some(EntryPatch { bytes, len: INSN })
    }
    fn counting_switch(on: bool) -> [u8; 2] {
        [CNT, on as u8]
    }
    fn trampoline(_: &ToyPlan, _: u64) -> Option<(u64, [u8; 5])> {
        None
    }
    fn uncounted_entry(stub: u64) -> u64 {
        stub + INSN as u64
    }
    fn redirect(_: u64, _: u64) -> Option<[u8; 4]> {
        None
    }
    fn absolute_jump(_: u64) -> ([u8; 16], usize) {
        ([TRAP; 16], 0)
    }
    /// `CNT on slot`, `JMP target`.
    const ROUTE_STUB_LEN: usize = 2 * INSN;
    fn emit_route_stub(
        at: u64,
        c: &CounterRef,
        target: u64,
        _: &Routed,
        out: &mut [u8],
    ) -> Result<(), Refusal> {
        let out = out.get_mut(..2 * INSN).ok_or(Refusal::NoMemoryInRange)?;
        let slot = i32::try_from(c.slot)
            .ok()
            .filter(|s| *s < 1 << 16)
            .ok_or(Refusal::NoCounterSpace)?;
        out[..INSN].copy_from_slice(&insn(CNT, 1 | slot << 8));
        out[INSN..]
            .copy_from_slice(&jump(at + INSN as u64, target).ok_or(Refusal::RelocationFailed)?);
        Ok(())
    }
    fn route_jump(stub: u64, first: [u8; 8], to: u64) -> Option<[u8; 8]> {
        let mut b = first;
        b[..INSN].copy_from_slice(&jump(stub, to)?);
        Some(b)
    }
}

/// `JMP` at `from` to `to`, if in reach.
fn jump(from: u64, to: u64) -> Option<[u8; 4]> {
    let rel = to as i64 - (from + INSN as u64) as i64;
    (rel.unsigned_abs() < Toy::BRANCH_RANGE).then(|| insn(JMP, rel as i32))
}

#[cfg(test)]
mod tests {
    use super::super::stub_and_entry;
    use super::*;

    /// Memory of the toy machine: a function at 0x1000, stubs at 0x2000.
    struct Machine {
        mem: Vec<u8>,
        counters: [u64; 4],
    }

    const BASE: u64 = 0x1000;

    impl Machine {
        fn new(function: &[[u8; 4]]) -> Machine {
            let mut mem = vec![TRAP; 0x2000];
            for (k, i) in function.iter().enumerate() {
                mem[k * INSN..(k + 1) * INSN].copy_from_slice(i);
            }
            Machine {
                mem,
                counters: [0; 4],
            }
        }
        fn at(&mut self, addr: u64, len: usize) -> &mut [u8] {
            let o = (addr - BASE) as usize;
            &mut self.mem[o..o + len]
        }
        /// Runs from `pc` to a `RET`; returns the accumulator.
        fn call(&mut self, mut pc: u64) -> i32 {
            let mut acc = 0;
            for _ in 0..1000 {
                let i: [u8; 4] = self.at(pc, INSN).try_into().unwrap();
                let next = pc + INSN as u64;
                pc = match i[0] {
                    NOP => next,
                    ADD => {
                        acc += operand(&i);
                        next
                    }
                    JMP => next.wrapping_add(operand(&i) as i64 as u64),
                    JZ if acc == 0 => next.wrapping_add(operand(&i) as i64 as u64),
                    JZ => next,
                    CNT => {
                        if i[1] & 1 == 1 {
                            self.counters[u16::from_le_bytes([i[2], i[3]]) as usize] += 1;
                        }
                        next
                    }
                    RET => return acc,
                    op => panic!("trap at {pc:#x}: {op:#x}"),
                }
            }
            panic!("runs for ever");
        }
    }

    fn counter(slot: u32) -> CounterRef {
        CounterRef {
            link: 0,
            local: 0,
            tls_offset: 0,
            slot,
            shared_counter: 0,
            caller_hook: 0,
        }
    }

    /// Planned, its stub written and its entry patched through the
    /// generic path: the function computes what it did, each call counted
    /// once, and not while its counting is switched off.
    #[test]
    fn a_patched_function_counts_each_call_and_computes_as_before() {
        let f = [insn(ADD, 5), insn(ADD, 7), insn(RET, 0)];
        let mut m = Machine::new(&f);
        assert_eq!(m.call(BASE), 12);
        let code = m.at(BASE, 12).to_vec();
        let plan = Toy::plan_window(&code, BASE, 12, 0).unwrap();
        let stub = 0x2000;
        let mut out = [0u8; STUB_LEN];
        let entry = stub_and_entry::<Toy>(&plan, stub, &counter(2), &mut out).unwrap();
        m.at(stub, STUB_LEN).copy_from_slice(&out);
        m.at(plan.patch_at(), plan.window())
            .copy_from_slice(entry.as_slice());
        for _ in 0..3 {
            assert_eq!(m.call(BASE), 12);
        }
        assert_eq!(m.counters, [0, 0, 3, 0]);
        m.at(stub, 2).copy_from_slice(&Toy::counting_switch(false));
        assert_eq!(m.call(BASE), 12);
        assert_eq!(m.counters[2], 3);
        // The uncounted entry runs the moved instruction on.
        assert_eq!(m.call(Toy::uncounted_entry(stub)), 12);
        // Its plan survives the cache's form.
        let mut bytes = Vec::new();
        Toy::encode_plan(&plan, &mut bytes);
        assert_eq!(Toy::decode_plan(&bytes, BASE), Some(plan));
    }

    /// A patched function's calls routed to another implementation
    /// through the generic route stub and route jump, counted in the
    /// implementation's slot, and back.
    #[test]
    fn routed_calls_run_the_implementation_and_count_in_its_slot() {
        let f = [insn(ADD, 5), insn(ADD, 7), insn(RET, 0)];
        let mut m = Machine::new(&f);
        // The implementation, at 0x1800: computes the same another way.
        let fast = 0x1800;
        m.at(fast, 8)
            .copy_from_slice(&[insn(ADD, 12), insn(RET, 0)].concat());
        let code = m.at(BASE, 12).to_vec();
        let plan = Toy::plan_window(&code, BASE, 12, 0).unwrap();
        let (stub, route) = (0x2000, 0x2100);
        let mut out = [0u8; STUB_LEN];
        let entry = stub_and_entry::<Toy>(&plan, stub, &counter(1), &mut out).unwrap();
        m.at(stub, STUB_LEN).copy_from_slice(&out);
        m.at(plan.patch_at(), plan.window())
            .copy_from_slice(entry.as_slice());
        let mut r = [0u8; Toy::ROUTE_STUB_LEN];
        let read = |_: u64, _: usize| None;
        let routed = Routed {
            start: BASE,
            stub,
            counter: counter(1),
            read: &read,
        };
        Toy::emit_route_stub(route, &counter(3), fast, &routed, &mut r).unwrap();
        m.at(route, r.len()).copy_from_slice(&r);
        let own: [u8; 8] = m.at(stub, 8).try_into().unwrap();
        let jump = Toy::route_jump(stub, own, route).unwrap();
        m.at(stub, 8).copy_from_slice(&jump);
        for _ in 0..2 {
            assert_eq!(m.call(BASE), 12);
        }
        assert_eq!(m.counters, [0, 0, 0, 2]);
        m.at(stub, 8).copy_from_slice(&own);
        assert_eq!(m.call(BASE), 12);
        assert_eq!(m.counters, [0, 1, 0, 2]);
    }

    #[test]
    fn what_cannot_move_or_reach_is_refused() {
        // A branch first: its target would move with it.
        let f = [insn(JZ, 4), insn(ADD, 1), insn(RET, 0)].concat();
        assert_eq!(
            Toy::plan_window(&f, BASE, f.len(), 0),
            Err(Refusal::UnsupportedInstruction)
        );
        assert_eq!(Toy::scan_function(&f, BASE).branch_targets, [BASE + 8]);
        assert_eq!(
            Toy::plan_window(&f[..2], BASE, 2, 0),
            Err(Refusal::TooSmall)
        );
        // A stub beyond a jump's reach.
        let g = [insn(ADD, 1), insn(RET, 0)].concat();
        let plan = Toy::plan_window(&g, BASE, g.len(), 0).unwrap();
        let mut out = [0u8; STUB_LEN];
        assert_eq!(
            stub_and_entry::<Toy>(&plan, BASE + (1 << 24), &counter(0), &mut out).err(),
            Some(Refusal::RelocationFailed)
        );
        assert!(Toy::is_fill(&[insn(NOP, 0), insn(NOP, 0)].concat()));
        assert!(!Toy::is_fill(&g));
    }
}
