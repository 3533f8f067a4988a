//! Choosing the window: the instructions at a function's entry that move
//! into the stub so that a `jmp rel32` can take their place.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind};
use rtprof_shared::Refusal;

/// Bytes of a `jmp rel32`.
pub const MIN_WINDOW: usize = 5;
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

#[derive(Debug, Clone)]
pub struct Plan {
    /// First byte of the function.
    pub start: u64,
    /// Where the jump is written: after an `endbr64`, which stays in place.
    pub patch_at: u64,
    /// Bytes overwritten at `patch_at` (at least [`MIN_WINDOW`]).
    pub window: usize,
    /// The instructions moved into the stub, decoded at their original addresses.
    pub moved: Vec<Instruction>,
    /// Address execution continues at after the moved instructions.
    pub resume_at: u64,
    /// The moved instructions' bytes, as in the file.
    pub raw: Vec<u8>,
}

impl Plan {
    /// Whether `t` lands inside the overwritten bytes, after their first one.
    pub fn strictly_inside(&self, t: u64) -> bool {
        t > self.patch_at && t < self.patch_at + self.window as u64
    }
}

fn is_padding(ins: &Instruction) -> bool {
    matches!(ins.mnemonic(), Mnemonic::Nop | Mnemonic::Int3)
}

fn ends_flow(ins: &Instruction) -> bool {
    matches!(
        ins.flow_control(),
        FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
    ) || matches!(ins.mnemonic(), Mnemonic::Ud2 | Mnemonic::Hlt)
}

/// Decides which instructions to move. `code` starts at the function's first
/// byte and holds its `size` bytes followed by `pad` bytes that no function
/// owns (alignment fill up to the next function).
pub fn plan_window(code: &[u8], start: u64, size: usize, pad: usize) -> Result<Plan, Refusal> {
    let size = size.min(code.len());
    let pad = pad.min(code.len() - size);
    let skip = if code[..size].starts_with(&ENDBR64) {
        ENDBR64.len()
    } else {
        0
    };
    let patch_at = start + skip as u64;
    let func_end = start + size as u64;
    let avail_end = func_end + pad as u64;
    if avail_end < patch_at + MIN_WINDOW as u64 {
        return Err(Refusal::TooSmall);
    }

    let mut d = Decoder::with_ip(64, &code[skip..size + pad], patch_at, DecoderOptions::NONE);
    let mut moved = Vec::new();
    let mut ins = Instruction::default();
    let mut ip = patch_at;
    while ip < patch_at + MIN_WINDOW as u64 {
        if ip >= func_end {
            // Past the function's end only alignment fill may be overwritten,
            // and only if execution can never fall through into it.
            if !moved.last().is_some_and(ends_flow) {
                return Err(Refusal::TooSmall);
            }
            while d.can_decode() && d.ip() < patch_at + MIN_WINDOW as u64 {
                d.decode_out(&mut ins);
                if ins.is_invalid() || !is_padding(&ins) {
                    return Err(Refusal::TooSmall);
                }
            }
            return Ok(Plan {
                start,
                patch_at,
                window: MIN_WINDOW,
                moved,
                resume_at: func_end,
                raw: code[skip..size].to_vec(),
            });
        }
        if !d.can_decode() {
            return Err(Refusal::DecodeError);
        }
        d.decode_out(&mut ins);
        if ins.is_invalid() || ins.next_ip() > func_end {
            return Err(Refusal::DecodeError);
        }
        check_movable(&ins)?;
        ip = ins.next_ip();
        moved.push(ins);
    }
    // A moved call pushes its original return address, which must be the
    // first byte after the window: the original code continues from there.
    let last = moved.len() - 1;
    if moved[..last].iter().any(is_call) {
        return Err(Refusal::CallInWindow);
    }
    Ok(Plan {
        start,
        patch_at,
        window: (ip - patch_at) as usize,
        moved,
        resume_at: ip,
        raw: code[skip..(ip - start) as usize].to_vec(),
    })
}

fn is_call(ins: &Instruction) -> bool {
    matches!(
        ins.flow_control(),
        FlowControl::Call | FlowControl::IndirectCall
    )
}

fn check_movable(ins: &Instruction) -> Result<(), Refusal> {
    match ins.flow_control() {
        FlowControl::Call if ins.op0_kind() != OpKind::NearBranch64 => {
            Err(Refusal::UnsupportedInstruction)
        }
        // `call [rsp+x]` would read a different slot once the return
        // address is pushed first; far calls do not occur in user code.
        FlowControl::IndirectCall
            if ins.op0_kind() == OpKind::Memory
                && (ins.memory_base() == iced_x86::Register::RSP
                    || ins.memory_index() == iced_x86::Register::RSP) =>
        {
            Err(Refusal::UnsupportedInstruction)
        }
        FlowControl::IndirectCall
            if ins.op0_kind() == OpKind::Register
                && ins.op0_register() == iced_x86::Register::RSP =>
        {
            Err(Refusal::UnsupportedInstruction)
        }
        FlowControl::XbeginXabortXend => Err(Refusal::UnsupportedInstruction),
        FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
            if ins.op0_kind() != OpKind::NearBranch64 =>
        {
            Err(Refusal::UnsupportedInstruction)
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_endbr_and_takes_whole_instructions() {
        // endbr64; push rbp; mov rbp,rsp; sub rsp,0x10; ret
        let code = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0xc3,
        ];
        let p = plan_window(&code, 0x1000, code.len(), 0).unwrap();
        assert_eq!(p.patch_at, 0x1004);
        assert_eq!(p.window, 8);
        assert_eq!(p.moved.len(), 3);
        assert_eq!(p.resume_at, 0x100c);
    }

    #[test]
    fn tiny_function_uses_padding_only_after_a_terminator() {
        // xor eax,eax; ret; then nop padding
        let code = [0x31, 0xc0, 0xc3, 0x90, 0x0f, 0x1f, 0x00, 0xcc];
        let p = plan_window(&code, 0x2000, 3, 5).unwrap();
        assert_eq!(p.window, 5);
        assert_eq!(p.moved.len(), 2);
        // no padding -> too small
        assert_eq!(
            plan_window(&code, 0x2000, 3, 0).unwrap_err(),
            Refusal::TooSmall
        );
        // padding that is code of something else -> too small
        let code2 = [0xc3, 0x55, 0x48, 0x89, 0xe5];
        assert_eq!(
            plan_window(&code2, 0x2000, 1, 4).unwrap_err(),
            Refusal::TooSmall
        );
        // function that falls through (no terminator) -> too small
        let code3 = [0x90, 0x90, 0x90, 0x90, 0x90, 0x90];
        assert_eq!(
            plan_window(&code3, 0x2000, 2, 4).unwrap_err(),
            Refusal::TooSmall
        );
    }

    #[test]
    fn call_must_be_last_in_window() {
        // call rel32; ret -> call is last (5 bytes)
        let code = [0xe8, 0, 0, 0, 0, 0xc3];
        assert_eq!(plan_window(&code, 0x3000, 6, 0).unwrap().moved.len(), 1);
        // call rax; nop; nop; nop -> call not last
        let code = [0xff, 0xd0, 0x90, 0x90, 0x90, 0xc3];
        assert_eq!(
            plan_window(&code, 0x3000, 6, 0).unwrap_err(),
            Refusal::CallInWindow
        );
        // call [rsp+8] is refused
        let code = [0xff, 0x54, 0x24, 0x08, 0x90, 0xc3];
        assert_eq!(
            plan_window(&code, 0x3000, 6, 0).unwrap_err(),
            Refusal::UnsupportedInstruction
        );
    }

    #[test]
    fn xbegin_is_refused() {
        let code = [0xc7, 0xf8, 0, 0, 0, 0, 0xc3];
        assert_eq!(
            plan_window(&code, 0x3000, 7, 0).unwrap_err(),
            Refusal::UnsupportedInstruction
        );
    }
}
