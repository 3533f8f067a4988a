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
}

pub fn scan_function(code: &[u8], ip: u64) -> FunctionScan {
    let mut s = FunctionScan::default();
    let mut d = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    let mut ins = Instruction::default();
    while d.can_decode() {
        d.decode_out(&mut ins);
        if ins.is_invalid() {
            s.decode_error = true;
            break;
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
