//! The per-function stub: count the call, run the moved instructions, jump
//! back. The counting prologue is hand-encoded (it is the hot path, and its
//! layout is fixed); the moved instructions are re-encoded by iced's block
//! encoder, which rewrites relative branches and rip-relative operands.
//!
//! ```text
//! entry:   lea  rsp, [rsp-128]           ; step over the red zone
//!          push rcx                      ; the only register touched
//!          mov  rcx, fs:[tls]            ; this thread's stripe, or 0
//!          jrcxz shared
//!          inc  qword [rcx + slot*8]     ; own stripe: no atomic needed
//! done:    pop  rcx
//!          lea  rsp, [rsp+128]
//! moved:   <moved instructions>          ; a call becomes push ret; jmp
//!          jmp  resume                   ; back into the function
//! shared:  mov  rcx, &stripe0[slot]      ; thread without a stripe yet
//!          lock inc qword [rcx]
//!          jmp  done
//! ```
//!
//! The 128 bytes below `rsp` (the SysV red zone) may hold live data where
//! an entry is reached by a jump rather than a call (a split-off part of a
//! function that the symbol table names like a function), so the stub
//! writes nothing there: it moves `rsp` past them first, with `lea`, which
//! leaves the flags alone. Only arithmetic flags change (the `inc`); the
//! SysV ABI leaves them undefined at a function's entry, and DF is
//! untouched. The increment is one `inc` on memory, not load/add/store: a
//! signal handler that calls the same function between a load and a store
//! would have its count overwritten.

use super::window::Plan;
use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, FlowControl, Instruction, InstructionBlock,
    MemoryOperand, OpKind, Register,
};
use rtprof_shared::Refusal;

/// Where the stub's counter lives.
#[derive(Clone, Copy, Debug)]
pub struct CounterRef {
    /// Offset from the thread pointer (fs base) of the per-thread stripe pointer.
    pub tls_offset: i32,
    /// Counter slot of the function within a stripe.
    pub slot: u32,
    /// Absolute address of the slot's counter in the shared stripe.
    pub shared_counter: u64,
}

/// Bytes of the counting prologue, up to the moved instructions.
const PROLOGUE_LEN: usize = 33;
/// Offset just past the `jrcxz` (its rel8 counts from there).
const JRCXZ_END: usize = 17;
/// Offset of `pop rcx`, where the shared path rejoins.
const DONE_AT: usize = 24;
/// Bytes of the shared-stripe path after the moved code.
const SHARED_LEN: usize = 19;
/// The SysV red zone below `rsp`.
const RED_ZONE: i32 = 128;

/// Upper bound on the bytes [`emit_stub`] produces for `plan`.
pub fn max_stub_len(plan: &Plan) -> usize {
    // A call expands to at most 4+7+8+14 bytes, a far jcc to 16; the final
    // jmp to at most 14.
    PROLOGUE_LEN + SHARED_LEN + plan.moved.len() * 40 + 16
}

/// The block encoder needs distinct addresses for every instruction, and
/// treats a branch or rip-relative operand that targets one of them as a
/// reference into the block, which it moves along. Nothing may follow the
/// moved code (a function taking its own address must still get the
/// original), so every instruction gets an address no code can have.
fn synthetic_ip(out: &[Instruction]) -> u64 {
    0xffff_f000_0000_0000 + out.len() as u64
}

fn push_return_address(out: &mut Vec<Instruction>, ret: u64) -> Result<(), Refusal> {
    let bad = |_| Refusal::RelocationFailed;
    let mut add = |mut i: Instruction| {
        i.set_ip(synthetic_ip(out));
        out.push(i);
    };
    if ret < 0x8000_0000 {
        add(Instruction::with1(Code::Pushq_imm32, ret as i32).map_err(bad)?);
    } else {
        add(Instruction::with2(
            Code::Lea_r64_m,
            Register::RSP,
            MemoryOperand::with_base_displ(Register::RSP, -8),
        )
        .map_err(bad)?);
        add(Instruction::with2(
            Code::Mov_rm32_imm32,
            MemoryOperand::with_base(Register::RSP),
            ret as u32,
        )
        .map_err(bad)?);
        add(Instruction::with2(
            Code::Mov_rm32_imm32,
            MemoryOperand::with_base_displ(Register::RSP, 4),
            (ret >> 32) as u32,
        )
        .map_err(bad)?);
    }
    Ok(())
}

/// The moved instructions as they must run from the stub: calls become
/// `push <original return address>; jmp <target>` so that the callee returns
/// into the original function and unwinders see the frames they expect.
fn moved_block(plan: &Plan) -> Result<Vec<Instruction>, Refusal> {
    let bad = |_| Refusal::RelocationFailed;
    let mut out = Vec::with_capacity(plan.moved.len() + 4);
    for ins in &plan.moved {
        match ins.flow_control() {
            FlowControl::Call => {
                push_return_address(&mut out, ins.next_ip())?;
                let mut j = Instruction::with_branch(Code::Jmp_rel32_64, ins.near_branch_target())
                    .map_err(bad)?;
                j.set_ip(synthetic_ip(&out));
                out.push(j);
            }
            FlowControl::IndirectCall => {
                push_return_address(&mut out, ins.next_ip())?;
                let mut j = *ins;
                j.set_code(Code::Jmp_rm64);
                j.set_ip(synthetic_ip(&out));
                out.push(j);
            }
            _ => {
                let mut i = *ins;
                i.set_ip(synthetic_ip(&out));
                out.push(i);
            }
        }
    }
    let mut back = Instruction::with_branch(Code::Jmp_rel32_64, plan.resume_at).map_err(bad)?;
    back.set_ip(synthetic_ip(&out));
    out.push(back);
    Ok(out)
}

/// Whether the moved instructions mean the same wherever they run: no
/// branch, call or rip-relative operand (then their bytes are copied as
/// they are, which is most functions and much faster than re-encoding).
fn position_independent(plan: &Plan) -> bool {
    plan.moved.iter().all(|i| {
        matches!(i.flow_control(), FlowControl::Next | FlowControl::Return)
            && !i.is_ip_rel_memory_operand()
    })
}

/// The moved code as it runs at `moved_at`, with the jump back.
fn moved_code(plan: &Plan, moved_at: u64) -> Result<Vec<u8>, Refusal> {
    if position_independent(plan) {
        let mut v = Vec::with_capacity(plan.raw.len() + 5);
        v.extend_from_slice(&plan.raw);
        let next = moved_at + v.len() as u64 + 5;
        let rel = i32::try_from(plan.resume_at as i64 - next as i64)
            .map_err(|_| Refusal::RelocationFailed)?;
        v.push(0xe9); // jmp resume
        v.extend_from_slice(&rel.to_le_bytes());
        return Ok(v);
    }
    let block = moved_block(plan)?;
    let enc = BlockEncoder::encode(
        64,
        InstructionBlock::new(&block, moved_at),
        BlockEncoderOptions::NONE,
    )
    .map_err(|_| Refusal::RelocationFailed)?;
    Ok(enc.code_buffer)
}

/// Encodes the stub for `plan` to run at address `at`.
pub fn emit_stub(plan: &Plan, at: u64, counter: &CounterRef) -> Result<Vec<u8>, Refusal> {
    let slot_disp =
        i32::try_from(counter.slot as u64 * 8).map_err(|_| Refusal::RelocationFailed)?;
    // A branch back into the moved bytes would bypass the entry.
    if plan.moved.iter().any(|i| {
        i.op0_kind() == OpKind::NearBranch64
            && (plan.start..plan.resume_at).contains(&i.near_branch_target())
    }) {
        return Err(Refusal::BranchIntoWindow);
    }
    let moved_at = at + PROLOGUE_LEN as u64;
    let moved = moved_code(plan, moved_at)?;
    let moved_len = moved.len();
    // jrcxz reaches `shared` with a rel8 across the moved code.
    let to_shared = PROLOGUE_LEN + moved_len - JRCXZ_END;
    if to_shared > 127 {
        return Err(Refusal::RelocationFailed);
    }

    let mut s = Vec::with_capacity(PROLOGUE_LEN + moved_len + SHARED_LEN);
    s.extend_from_slice(&[0x48, 0x8d, 0x64, 0x24, (-RED_ZONE) as u8]); // lea rsp,[rsp-128]
    s.push(0x51); // push rcx
    s.extend_from_slice(&[0x64, 0x48, 0x8b, 0x0c, 0x25]); // mov rcx, fs:[disp32]
    s.extend_from_slice(&counter.tls_offset.to_le_bytes());
    debug_assert_eq!(s.len() + 2, JRCXZ_END);
    s.extend_from_slice(&[0xe3, to_shared as u8]); // jrcxz shared
    s.extend_from_slice(&[0x48, 0xff, 0x81]); // inc qword [rcx+disp32]
    s.extend_from_slice(&slot_disp.to_le_bytes());
    debug_assert_eq!(s.len(), DONE_AT);
    s.push(0x59); // pop rcx
    s.extend_from_slice(&[0x48, 0x8d, 0xa4, 0x24]); // lea rsp,[rsp+disp32]
    s.extend_from_slice(&RED_ZONE.to_le_bytes());
    debug_assert_eq!(s.len(), PROLOGUE_LEN);
    s.extend_from_slice(&moved);
    s.extend_from_slice(&[0x48, 0xb9]); // mov rcx, imm64
    s.extend_from_slice(&counter.shared_counter.to_le_bytes());
    s.extend_from_slice(&[0xf0, 0x48, 0xff, 0x01]); // lock inc qword [rcx]
    let back = DONE_AT as i64 - (s.len() as i64 + 5);
    s.push(0xe9); // jmp done
    s.extend_from_slice(&(back as i32).to_le_bytes());
    Ok(s)
}

/// The bytes written at `plan.patch_at`: `jmp rel32` to the stub, then nops.
pub fn entry_patch(plan: &Plan, stub: u64) -> Option<Vec<u8>> {
    let rel = stub as i64 - (plan.patch_at as i64 + 5);
    let rel = i32::try_from(rel).ok()?;
    let mut b = Vec::with_capacity(plan.window);
    b.push(0xe9);
    b.extend_from_slice(&rel.to_le_bytes());
    b.resize(plan.window, 0x90);
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::super::window::plan_window;
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};

    fn decode_all(code: &[u8], ip: u64) -> Vec<Instruction> {
        let mut d = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
        let mut v = Vec::new();
        while d.can_decode() {
            v.push(d.decode());
        }
        v
    }

    /// Instructions in the counting prologue: moved code follows them.
    const P: usize = 7;

    const COUNTER: CounterRef = CounterRef {
        tls_offset: -64,
        slot: 3,
        shared_counter: 0x7f00_dead_0018,
    };

    #[test]
    fn prologue_counts_and_shared_path_returns_to_moved_code() {
        // push rbp; mov rbp,rsp; pop rbp; ret
        let code = [0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3];
        let plan = plan_window(&code, 0x40_0000, code.len(), 0).unwrap();
        let at = 0x40_1000;
        let stub = emit_stub(&plan, at, &COUNTER).unwrap();
        assert!(stub.len() <= max_stub_len(&plan));
        let ins = decode_all(&stub, at);
        // The red zone is stepped over before anything is pushed.
        assert_eq!(ins[0].mnemonic(), Mnemonic::Lea);
        assert_eq!(ins[0].op0_register(), Register::RSP);
        assert_eq!(ins[0].memory_base(), Register::RSP);
        assert_eq!(ins[0].memory_displacement64() as i64, -128);
        assert_eq!(ins[1].mnemonic(), Mnemonic::Push);
        assert_eq!(ins[2].memory_segment(), Register::FS);
        assert_eq!(ins[2].memory_displacement64() as i64, -64);
        assert_eq!(ins[3].mnemonic(), Mnemonic::Jrcxz);
        assert_eq!(ins[4].mnemonic(), Mnemonic::Inc);
        assert_eq!(
            (ins[4].memory_base(), ins[4].memory_displacement64()),
            (Register::RCX, 24)
        );
        assert_eq!(ins[5].mnemonic(), Mnemonic::Pop);
        assert_eq!(ins[5].ip(), at + DONE_AT as u64);
        assert_eq!(ins[6].mnemonic(), Mnemonic::Lea);
        assert_eq!(ins[6].memory_displacement64(), 128);
        assert_eq!(ins[7].ip(), at + PROLOGUE_LEN as u64);
        // moved: push rbp; mov rbp,rsp; pop rbp; then jmp back to 0x400005
        assert_eq!(ins[7].mnemonic(), Mnemonic::Push);
        assert_eq!(ins[8].mnemonic(), Mnemonic::Mov);
        assert_eq!(ins[9].mnemonic(), Mnemonic::Pop);
        assert_eq!(ins[10].mnemonic(), Mnemonic::Jmp);
        assert_eq!(ins[10].near_branch_target(), 0x40_0005);
        // shared path: counts atomically, then rejoins at `pop rcx` so the
        // stack is restored the same way.
        let shared = ins[3].near_branch_target();
        assert_eq!(shared, ins[11].ip());
        assert_eq!(ins[11].immediate64(), COUNTER.shared_counter);
        assert!(ins[12].has_lock_prefix());
        assert_eq!(ins[13].near_branch_target(), at + DONE_AT as u64);
        assert_eq!(ins.len(), 14);
    }

    /// An instruction's absolute branch target and rip-relative memory target.
    fn targets(i: &Instruction) -> (Option<u64>, Option<u64>) {
        (
            (i.op0_kind() == OpKind::NearBranch64).then(|| i.near_branch_target()),
            i.is_ip_rel_memory_operand()
                .then(|| i.ip_rel_memory_address()),
        )
    }

    /// Moves rip-relative loads, short jcc and calls far away and checks
    /// that every absolute branch and memory target is unchanged.
    #[test]
    fn relocation_preserves_absolute_targets() {
        let cases: &[&[u8]] = &[
            // mov rax,[rip+0x1234]; ret
            &[0x48, 0x8b, 0x05, 0x34, 0x12, 0x00, 0x00, 0xc3],
            // test edi,edi; je +0x20; ret
            &[0x85, 0xff, 0x74, 0x20, 0x90, 0xc3],
            // lea rdi,[rip-0x100]; ret
            &[0x48, 0x8d, 0x3d, 0x00, 0xff, 0xff, 0xff, 0xc3],
            // cmp byte [rip+0x10],0 ; jne +5
            &[0x80, 0x3d, 0x10, 0x00, 0x00, 0x00, 0x00, 0x75, 0x05, 0xc3],
            // push r15; lea rax,[rip-9] (the function's own address); ret
            &[0x41, 0x57, 0x48, 0x8d, 0x05, 0xf7, 0xff, 0xff, 0xff, 0xc3],
        ];
        let orig = 0x5555_5555_0000u64;
        for &code in cases {
            let plan = plan_window(code, orig, code.len(), 0).unwrap();
            let want: Vec<_> = plan.moved.iter().map(targets).collect();
            for at in [orig + 0x7000_0000, orig - 0x7000_0000] {
                let stub = emit_stub(&plan, at, &COUNTER).unwrap();
                let ins = decode_all(&stub, at);
                // Moved instructions follow the 5-instruction prologue; a
                // short jcc may have become near, but targets must match.
                let got: Vec<_> = ins[P..P + want.len()].iter().map(targets).collect();
                assert_eq!(got, want, "code {code:02x?} at {at:#x}");
                let back = &ins[P + want.len()];
                assert_eq!(back.near_branch_target(), plan.resume_at);
            }
        }
    }

    #[test]
    fn moved_call_pushes_the_original_return_address() {
        // call +0x100 (window is exactly the call); ret
        let code = [0xe8, 0x00, 0x01, 0x00, 0x00, 0xc3];
        let orig = 0x7f12_3456_0000u64;
        let plan = plan_window(&code, orig, code.len(), 0).unwrap();
        let at = orig + 0x1000_0000;
        let ins = decode_all(&emit_stub(&plan, at, &COUNTER).unwrap(), at);
        // lea rsp,[rsp-8]; mov dword [rsp],lo; mov dword [rsp+4],hi; jmp target
        assert_eq!(ins[P].mnemonic(), Mnemonic::Lea);
        let lo = ins[P + 1].immediate32() as u64;
        let hi = ins[P + 2].immediate32() as u64;
        assert_eq!(hi << 32 | lo, orig + 5);
        assert_eq!(ins[P + 3].mnemonic(), Mnemonic::Jmp);
        assert_eq!(ins[P + 3].near_branch_target(), orig + 5 + 0x100);

        // Low addresses (non-PIE) use push imm32.
        let plan = plan_window(&code, 0x40_1000, code.len(), 0).unwrap();
        let ins = decode_all(&emit_stub(&plan, 0x50_0000, &COUNTER).unwrap(), 0x50_0000);
        assert_eq!(ins[P].mnemonic(), Mnemonic::Push);
        assert_eq!(ins[P].immediate32to64() as u64, 0x40_1005);
        assert_eq!(ins[P + 1].near_branch_target(), 0x40_1105);
    }

    #[test]
    fn indirect_call_through_got_keeps_its_slot() {
        // call [rip+0x2000]  (6 bytes)
        let code = [0xff, 0x15, 0x00, 0x20, 0x00, 0x00, 0xc3];
        let orig = 0x7f00_0000_1000u64;
        let plan = plan_window(&code, orig, code.len(), 0).unwrap();
        let at = orig - 0x10_0000;
        let ins = decode_all(&emit_stub(&plan, at, &COUNTER).unwrap(), at);
        let j = &ins[P + 3];
        assert_eq!(j.mnemonic(), Mnemonic::Jmp);
        assert_eq!(j.ip_rel_memory_address(), orig + 6 + 0x2000);
    }

    #[test]
    fn self_branch_in_window_is_refused() {
        // jmp . (infinite loop at entry), padded
        let code = [0xeb, 0xfe, 0x90, 0x90, 0x90, 0x90];
        let plan = plan_window(&code, 0x1000, 2, 4).unwrap();
        assert_eq!(
            emit_stub(&plan, 0x2000, &COUNTER).unwrap_err(),
            Refusal::BranchIntoWindow
        );
    }

    /// A window of plain instructions is copied byte for byte; one with a
    /// rip-relative operand is re-encoded.
    #[test]
    fn plain_windows_are_copied_and_others_reencoded() {
        // push rbp; mov rbp,rsp; sub rsp,0x10; ret
        let code = [0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0xc3];
        let plan = plan_window(&code, 0x40_0000, code.len(), 0).unwrap();
        let at = 0x50_0000;
        let stub = emit_stub(&plan, at, &COUNTER).unwrap();
        let moved = &stub[PROLOGUE_LEN..PROLOGUE_LEN + plan.raw.len()];
        assert_eq!(moved, &code[..plan.raw.len()]);
        let back = &decode_all(
            &stub[PROLOGUE_LEN + plan.raw.len()..],
            at + (PROLOGUE_LEN + plan.raw.len()) as u64,
        )[0];
        assert_eq!(back.near_branch_target(), plan.resume_at);
        // mov rax,[rip+0x1234]; ret: the displacement must change.
        let code = [0x48, 0x8b, 0x05, 0x34, 0x12, 0x00, 0x00, 0xc3];
        let plan = plan_window(&code, 0x40_0000, code.len(), 0).unwrap();
        let stub = emit_stub(&plan, at, &COUNTER).unwrap();
        assert_ne!(&stub[PROLOGUE_LEN..PROLOGUE_LEN + 7], &code[..7]);
    }

    #[test]
    fn entry_patch_is_jmp_then_nops() {
        let code = [0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0xc3];
        let plan = plan_window(&code, 0x1000, code.len(), 0).unwrap();
        let b = entry_patch(&plan, 0x3000).unwrap();
        assert_eq!(b.len(), plan.window);
        let ins = decode_all(&b, 0x1000);
        assert_eq!(ins[0].near_branch_target(), 0x3000);
        assert!(ins[1..].iter().all(|i| i.mnemonic() == Mnemonic::Nop));
        assert!(entry_patch(&plan, 0x1_0000_0000_0000).is_none());
    }
}
