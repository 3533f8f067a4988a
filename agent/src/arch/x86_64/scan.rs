//! One linear decode of a function, collecting what the patcher must know:
//! where its direct branches go, and where its jump tables may send it.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, OpKind, Register};

#[derive(Default, Debug)]
pub struct FunctionScan {
    /// Targets of direct jmp/jcc/loop/jrcxz (not calls).
    pub branch_targets: Vec<u64>,
    /// The conditional ones among them (jcc/loop/jrcxz).
    pub cond_targets: Vec<u64>,
    /// Targets of direct calls.
    pub call_targets: Vec<u64>,
    /// Addresses loaded with `lea reg, [rip+X]`: candidate bases of
    /// position-independent jump tables (entries are i32 offsets from X).
    pub rel_table_bases: Vec<u64>,
    /// `jmp [X + reg*8]` displacements: absolute jump tables (u64 entries).
    pub abs_tables: Vec<u64>,
    /// The function contains an indirect jmp, so jump tables matter.
    pub has_indirect_jump: bool,
    /// Some bytes did not decode.
    pub decode_error: bool,
    /// Branches back to the function's first bytes (a loop whose head is
    /// the entry, a call to itself made a jump): (target, address of the
    /// rel32 field), the field `None` for a branch without one (a short
    /// one), which cannot be sent elsewhere.
    pub entry_branches: Vec<(u64, Option<u64>)>,
    /// Its last instruction can go on to the next byte (a conditional
    /// branch, a call, anything but a return, jump or trap): the fill after
    /// the function may run (glibc's `__memcpy_chk` falls through it into
    /// `__memcpy`).
    pub falls_through: bool,
}

/// How far from its first byte a branch within a function may land and
/// still be in the way of its entry patch.
const ENTRY_REACH: u64 = 24;

/// Every direct branch and call target in `code` (at `ip`), decoded from
/// its start, a byte that is no instruction skipped: code that no listed
/// function covers (`.cold` parts, stubs), read for what it jumps to.
pub fn sweep_targets(code: &[u8], ip: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < code.len() {
        let mut d = Decoder::with_ip(64, &code[at..], ip + at as u64, DecoderOptions::NONE);
        let ins = d.decode();
        if ins.is_invalid() {
            at += 1;
            continue;
        }
        if ins.op0_kind() == OpKind::NearBranch64 {
            out.push(ins.near_branch_target());
        }
        at += ins.len();
    }
    out
}

pub fn scan_function(code: &[u8], ip: u64) -> FunctionScan {
    let mut s = FunctionScan::default();
    let mut d = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    let mut ins = Instruction::default();
    s.falls_through = true;
    while d.can_decode() {
        d.decode_out(&mut ins);
        if ins.is_invalid() {
            s.decode_error = true;
            break;
        }
        s.falls_through = !matches!(
            ins.flow_control(),
            FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
        ) && !matches!(
            ins.mnemonic(),
            iced_x86::Mnemonic::Ud2 | iced_x86::Mnemonic::Hlt | iced_x86::Mnemonic::Int3
        );
        let near = ins.op0_kind() == OpKind::NearBranch64;
        if near
            && matches!(
                ins.flow_control(),
                FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
            )
            && (ip..ip + ENTRY_REACH).contains(&ins.near_branch_target())
        {
            s.entry_branches
                .push((ins.near_branch_target(), rel32_field(code, ip, &ins)));
        }
        match ins.flow_control() {
            FlowControl::UnconditionalBranch if ins.op0_kind() == OpKind::NearBranch64 => {
                s.branch_targets.push(ins.near_branch_target())
            }
            FlowControl::ConditionalBranch if ins.op0_kind() == OpKind::NearBranch64 => {
                s.branch_targets.push(ins.near_branch_target());
                s.cond_targets.push(ins.near_branch_target());
            }
            FlowControl::Call if ins.op0_kind() == OpKind::NearBranch64 => {
                s.call_targets.push(ins.near_branch_target())
            }
            FlowControl::IndirectBranch => {
                s.has_indirect_jump = true;
                if ins.op0_kind() == OpKind::Memory
                    && ins.memory_base() == Register::None
                    && ins.memory_index_scale() == 8
                {
                    s.abs_tables.push(ins.memory_displacement64());
                }
            }
            _ => {}
        }
        if ins.mnemonic() == iced_x86::Mnemonic::Lea && ins.is_ip_rel_memory_operand() {
            s.rel_table_bases.push(ins.ip_rel_memory_address());
        }
    }
    s
}

/// Where the rel32 of branch `ins` is, if it has one: its last four bytes,
/// when they are what reaches its target (`jmp rel32`, `jcc rel32`).
fn rel32_field(code: &[u8], ip: u64, ins: &Instruction) -> Option<u64> {
    if ins.len() < 5 {
        return None;
    }
    let end = (ins.next_ip() - ip) as usize;
    let rel = i32::from_le_bytes(code.get(end - 4..end)?.try_into().ok()?);
    (ins.next_ip().wrapping_add(rel as i64 as u64) == ins.near_branch_target())
        .then_some(ins.next_ip() - 4)
}

/// Jump-table targets of the function at `[lo, hi)`: reads candidate
/// tables through `read` (`None` for unreadable memory) and takes entries
/// while `keep` accepts their target (the caller's idea of where this
/// function's code may be: a switch can send control into a split-off
/// fragment). Heuristic, but wrong only in the safe direction: a target it
/// finds can only cause a refusal.
pub fn jump_table_targets<'m>(
    scan: &FunctionScan,
    lo: u64,
    hi: u64,
    keep: &dyn Fn(u64) -> bool,
    read: &dyn Fn(u64, usize) -> Option<&'m [u8]>,
) -> Vec<u64> {
    const MAX_ENTRIES: usize = 4096;
    let mut out = Vec::new();
    if !scan.has_indirect_jump {
        return out;
    }
    for &base in &scan.rel_table_bases {
        // A table inside the function's own code is not a table.
        if (lo..hi).contains(&base) {
            continue;
        }
        for i in 0..MAX_ENTRIES {
            let Some(b) = read(base + 4 * i as u64, 4) else {
                break;
            };
            let rel = i32::from_le_bytes(b[..4].try_into().unwrap()) as i64;
            let t = base.wrapping_add(rel as u64);
            if !keep(t) {
                break;
            }
            out.push(t);
        }
    }
    for &base in &scan.abs_tables {
        for i in 0..MAX_ENTRIES {
            let Some(b) = read(base + 8 * i as u64, 8) else {
                break;
            };
            let t = u64::from_le_bytes(b[..8].try_into().unwrap());
            if !keep(t) {
                break;
            }
            out.push(t);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_rel32_of_branches_back_to_the_entry() {
        // 0x1000: push rbx ; je 0x1000 (rel32) ; jmp 0x1001 (rel32) ; jne 0x1000 (short)
        let code = [
            0x53, // push rbx
            0x0f, 0x84, 0xf9, 0xff, 0xff, 0xff, // je 0x1000
            0xe9, 0xf5, 0xff, 0xff, 0xff, // jmp 0x1001
            0x75, 0xf2, // jne 0x1000
        ];
        let s = scan_function(&code, 0x1000);
        assert_eq!(
            s.entry_branches,
            vec![
                (0x1000, Some(0x1003)),
                (0x1001, Some(0x1008)),
                (0x1000, None)
            ]
        );
    }

    #[test]
    fn collects_branches_calls_and_tables() {
        // 0x1000: jne 0x1000 ; call 0x2000 ; lea rax,[rip+0x100] ; jmp rax ; jmp [0x5000+rcx*8]
        let code = [
            0x75, 0xfe, // jne .
            0xe8, 0xf9, 0x0f, 0x00, 0x00, // call 0x2000
            0x48, 0x8d, 0x05, 0x00, 0x01, 0x00, 0x00, // lea rax,[rip+0x100]
            0xff, 0xe0, // jmp rax
            0xff, 0x24, 0xcd, 0x00, 0x50, 0x00, 0x00, // jmp [rcx*8+0x5000]
        ];
        let s = scan_function(&code, 0x1000);
        assert_eq!(s.branch_targets, vec![0x1000]);
        assert_eq!(s.cond_targets, vec![0x1000]);
        assert_eq!(s.call_targets, vec![0x2000]);
        assert_eq!(s.rel_table_bases, vec![0x100e + 0x100]);
        assert_eq!(s.abs_tables, vec![0x5000]);
        assert!(s.has_indirect_jump);
        assert!(!s.decode_error);
        assert_eq!(
            s.entry_branches,
            vec![(0x1000, None)],
            "a short branch to the entry"
        );

        let table: Vec<u8> = [-0x10e_i32, -0x100, 0x7000]
            .iter()
            .flat_map(|v: &i32| v.to_le_bytes())
            .collect();
        let read = |a: u64, n: usize| {
            let off = a.checked_sub(0x110e)? as usize;
            table.get(off..off + n)
        };
        // Entries are kept while they point into the module's code, even
        // outside the function (a cold fragment of it).
        let t = jump_table_targets(
            &s,
            0x1000,
            0x1100,
            &|a| (0x1000..0x1100).contains(&a),
            &read,
        );
        assert_eq!(t, vec![0x1000, 0x100e]);
        let t = jump_table_targets(
            &s,
            0x1000,
            0x1100,
            &|a| (0x1000..0x9000).contains(&a),
            &read,
        );
        assert_eq!(t, vec![0x1000, 0x100e, 0x810e]);
    }
}
