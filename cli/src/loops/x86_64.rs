//! The x86-64 side of loop finding: the branches of a function's code that
//! go back to an earlier instruction of it.

use iced_x86::{Decoder, DecoderOptions, FlowControl, OpKind};

/// Each branch of `code` (loaded at `vaddr`) whose target lies in the code
/// at or before it: (target, the address past the branch).
pub fn back_edges(code: &[u8], vaddr: u64) -> Vec<(u64, u64)> {
    let mut d = Decoder::with_ip(64, code, vaddr, DecoderOptions::NONE);
    let mut out = Vec::new();
    for i in &mut d {
        if i.is_invalid() {
            // Data or padding in the code: what follows is not read as code.
            break;
        }
        // Direct branches only (jmp, jcc, jrcxz, loop): an indirect one's
        // target is not in the code.
        let direct = matches!(
            i.flow_control(),
            FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
        ) && matches!(
            i.op0_kind(),
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
        );
        if direct {
            let target = i.near_branch_target();
            if (vaddr..=i.ip()).contains(&target) {
                out.push((target, i.next_ip()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branches_back_are_found_and_forward_ones_are_not() {
        // 0: xor eax,eax; 2: inc eax; 4: cmp eax,10; 7: jl 2 (back);
        // 9: je 13 (forward); 11: jmp 0 (back, to the first byte); 13: ret
        let code = [
            0x31, 0xc0, 0xff, 0xc0, 0x83, 0xf8, 0x0a, 0x7c, 0xf9, 0x74, 0x02, 0xeb, 0xf3, 0xc3,
        ];
        assert_eq!(
            back_edges(&code, 0x1000),
            [(0x1002, 0x1009), (0x1000, 0x100d)]
        );
        // A branch out of the function, below its start, is no loop.
        assert_eq!(back_edges(&[0xeb, 0xfc], 0x1000), []);
    }
}
