//! The x86-64 side of loop finding: a function's instructions, each with
//! where control goes after it.

use super::{Flow, Insn};
use iced_x86::{Decoder, DecoderOptions, FlowControl, Mnemonic, OpKind};

/// The instructions of `code`, loaded at `vaddr`, up to its end or the
/// first bytes that are no instruction (data in the code).
pub fn decode(code: &[u8], vaddr: u64) -> Vec<Insn> {
    let mut d = Decoder::with_ip(64, code, vaddr, DecoderOptions::NONE);
    let mut out = Vec::new();
    for i in &mut d {
        if i.is_invalid() {
            break;
        }
        let near = matches!(
            i.op0_kind(),
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
        );
        let flow = match i.flow_control() {
            FlowControl::ConditionalBranch if near => Flow::Branch(i.near_branch_target()),
            FlowControl::UnconditionalBranch if near => Flow::Jump(i.near_branch_target()),
            FlowControl::UnconditionalBranch | FlowControl::IndirectBranch => Flow::Indirect,
            FlowControl::Return | FlowControl::Exception => Flow::Stop,
            FlowControl::Interrupt if i.mnemonic() == Mnemonic::Int3 => Flow::Stop,
            _ => Flow::Next,
        };
        out.push(Insn {
            addr: i.ip(),
            end: i.next_ip(),
            flow,
            filler: matches!(i.mnemonic(), Mnemonic::Nop | Mnemonic::Int3),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_instruction_says_where_control_goes() {
        // 0: xor eax,eax; 2: jl 0 (back); 4: jmp rax; 6: jmp 0; 8: ret;
        // 9: nop; 10: ud2; 12: (bad)
        let code = [
            0x31, 0xc0, 0x7c, 0xfc, 0xff, 0xe0, 0xeb, 0xf8, 0xc3, 0x90, 0x0f, 0x0b, 0x06,
        ];
        let got: Vec<(u64, u64, Flow, bool)> = decode(&code, 0x1000)
            .into_iter()
            .map(|i| (i.addr, i.end, i.flow, i.filler))
            .collect();
        assert_eq!(
            got,
            [
                (0x1000, 0x1002, Flow::Next, false),
                (0x1002, 0x1004, Flow::Branch(0x1000), false),
                (0x1004, 0x1006, Flow::Indirect, false),
                (0x1006, 0x1008, Flow::Jump(0x1000), false),
                (0x1008, 0x1009, Flow::Stop, false),
                (0x1009, 0x100a, Flow::Next, true),
                (0x100a, 0x100c, Flow::Stop, false),
            ]
        );
    }
}
