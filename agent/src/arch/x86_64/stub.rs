//! The per-function stub: count the call, run the moved instructions, jump
//! back. The counting prologue is hand-encoded (it is the hot path, and its
//! layout is fixed); the moved instructions come from the plan's template
//! (see `window`), with its fixups applied for the stub's address.
//!
//! ```text
//! entry:   lea  rsp, [rsp-128]           ; step over the red zone
//!          push rcx                      ; the only register touched
//!          mov  rcx, fs:[tls]            ; this thread's stripe, or 0
//!          jrcxz shared
//!          add  rcx, [rip+link.first]    ; the module's counters in it
//!          inc  qword [rcx + local*8]    ; own stripe: no atomic needed
//! done:    pop  rcx
//!          lea  rsp, [rsp+128]
//! moved:   <moved instructions>          ; a call becomes lea; push rax;
//!          jmp  resume                   ;   lea rax,[rip+ret]; mov; pop; jmp
//! shared:  mov  rcx, [rip+link.shared]   ; thread without a stripe yet
//!          lock inc qword [rcx + local*8]
//!          jmp  done
//! ```
//!
//! The two link words ([`LinkWords`](super::super::LinkWords)) sit beside
//! the module's stubs and say where the module's counters are: nothing in
//! a stub depends on where the process put its counters, only on the
//! distance from the stub to the module and to the words and on the
//! thread-pointer offset of the stripe pointer (the same in every process
//! of an executable without thread-local storage of its own), so a
//! module's stubs placed at a fixed distance are the same bytes in every
//! such process (its page image). The offset stays an immediate: read from
//! a word too, it put a second load before the count's (0.5 ns a call
//! more). Stubs made without link words (a route's, libc's hooks') count
//! in an absolute slot and shared counter instead, padded to the same
//! lengths.
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

use super::super::{CounterRef, EntryPatch};
use super::emit::{Emitter, Label};
use super::window::{FixKind, Plan};
use rtprof_abi::Refusal;

/// Bytes of the counting prologue, up to the moved instructions: fixed,
/// since the counting switch jumps over it and a moved instruction's
/// relocation is computed before the stub is written (checked as each
/// stub is written).
pub const PROLOGUE_LEN: usize = 40;
/// Bytes of the shared-stripe path after the moved code.
pub(super) const SHARED_LEN: usize = 20;
/// The SysV red zone below `rsp`.
const RED_ZONE: i32 = 128;
/// Bytes of the exact-callers tail (see [`put_callers_tail`]).
const CALLERS_TAIL_LEN: usize = 189;

/// A stub's first two bytes with counting on (the start of its
/// `lea rsp, [rsp-128]`) or off (`jmp short` over the count, straight to
/// the moved instructions). Stubs start 16-byte aligned, so the two bytes
/// are switched with one atomic store while threads run through them:
/// every thread fetches the old instruction or the new one.
pub fn counting_switch(on: bool) -> [u8; 2] {
    if on {
        [0x48, 0x8d]
    } else {
        [0xeb, (PROLOGUE_LEN - 2) as u8]
    }
}

/// The bytes [`emit_stub`] produces for `plan` (`callers`: with a caller
/// hook).
pub fn stub_len(plan: &Plan, callers: bool) -> usize {
    PROLOGUE_LEN + plan.code().len() + SHARED_LEN + if callers { CALLERS_TAIL_LEN } else { 0 }
}

/// Writes the stub for `plan` to run at address `at` into the first
/// [`stub_len`] bytes of `out` (shorter: refused).
pub fn emit_stub(
    plan: &Plan,
    at: u64,
    counter: &CounterRef,
    out: &mut [u8],
) -> Result<(), Refusal> {
    let code = plan.code();
    let moved_at = at + PROLOGUE_LEN as u64;
    let mut moved = [0u8; super::window::MAX_CODE];
    let moved = &mut moved[..code.len()];
    moved.copy_from_slice(code);
    for f in plan.fixups() {
        let target = f.target_from(plan.start);
        let value = match f.kind {
            FixKind::Rel32 => {
                let rel = target as i64 - (moved_at + f.end as u64) as i64;
                i32::try_from(rel).map_err(|_| Refusal::RelocationFailed)? as u32
            }
            FixKind::Abs32 => u32::try_from(target)
                .ok()
                .filter(|v| *v < 0x8000_0000)
                .ok_or(Refusal::RelocationFailed)?,
            FixKind::AbsLo32 => target as u32,
            FixKind::AbsHi32 => (target >> 32) as u32,
        };
        moved[f.at as usize..f.at as usize + 4].copy_from_slice(&value.to_le_bytes());
    }

    let callers = counter.caller_hook != 0;
    let len = stub_len(plan, callers);
    put_counting_stub(at, counter, moved, len, out)
}

/// A stub's first eight bytes (`first`, as they are now) with its first
/// instruction sent to the route stub at `to` instead: `jmp rel32`, then
/// the same last three bytes, so a thread already past the first
/// instruction runs on unchanged. Stubs are 16-byte aligned: the eight
/// bytes are switched with one atomic store while threads run through
/// them. `None` if `to` is out of `jmp rel32` reach.
pub fn route_jump(stub: u64, first: [u8; 8], to: u64) -> Option<[u8; 8]> {
    let rel = i32::try_from(to as i64 - (stub as i64 + 5)).ok()?;
    let mut b = first;
    b[0] = 0xe9;
    b[1..5].copy_from_slice(&rel.to_le_bytes());
    Some(b)
}

/// Writes the counting prologue, `moved`, and the shared-stripe path
/// (and a callers tail if `counter` has a hook): `len` bytes at `at`.
pub(super) fn put_counting_stub(
    at: u64,
    counter: &CounterRef,
    moved: &[u8],
    len: usize,
    out: &mut [u8],
) -> Result<(), Refusal> {
    let callers = counter.caller_hook != 0;
    let out = out.get_mut(..len).ok_or(Refusal::NoMemoryInRange)?;
    let mut e = Emitter::new(out, at);
    let (done, moved_code, shared, tail) = (e.label(), e.label(), e.label(), e.label());
    let linked = counter.link != 0;
    let slot = if linked { counter.local } else { counter.slot };
    let slot_disp = i32::try_from(slot as u64 * 8).map_err(|_| Refusal::RelocationFailed)?;
    e.put(&[0x48, 0x8d, 0x64, 0x24, (-RED_ZONE) as u8]); // lea rsp,[rsp-128]
    e.put(&[0x51]); // push rcx
    e.put(&[0x64, 0x48, 0x8b, 0x0c, 0x25]); // mov rcx, fs:[disp32]
    e.put_i32(counter.tls_offset);
    e.jrcxz(shared); // across the moved code: refused if out of reach
    if linked {
        put_rip_load(&mut e, &[0x48, 0x03, 0x0d], counter.link + FIRST_WORD)?; // add rcx,[rip+d]
    } else {
        e.put(&NOP7); // the linked form's length
    }
    e.put(&[0x48, 0xff, 0x81]); // inc qword [rcx+disp32]
    e.put_i32(slot_disp);
    e.bind(done);
    e.put(&[0x59]); // pop rcx
    if callers {
        // The tail notes the caller, then comes back to the moved code.
        e.jmp(tail);
        e.put(&[0x0f, 0x1f, 0x00]); // nop (the lea's remaining bytes)
    } else {
        e.put(&[0x48, 0x8d, 0xa4, 0x24]); // lea rsp,[rsp+disp32]
        e.put_i32(RED_ZONE);
    }
    e.bind(moved_code);
    // The relocations above assumed the moved code here.
    if e.offset() != PROLOGUE_LEN {
        return Err(Refusal::RelocationFailed);
    }
    e.put(moved);
    e.bind(shared);
    if linked {
        put_rip_load(&mut e, &[0x48, 0x8b, 0x0d], counter.link + SHARED_WORD)?; // mov rcx,[rip+d]
        e.put(&[0xf0, 0x48, 0xff, 0x81]); // lock inc qword [rcx+disp32]
        e.put_i32(slot_disp);
    } else {
        e.put(&[0x48, 0xb9]); // mov rcx, imm64
        e.put_u64(counter.shared_counter);
        e.put(&[0xf0, 0x48, 0xff, 0x01]); // lock inc qword [rcx]
        e.put(&[0x90]); // the linked form's length
    }
    e.jmp(done);
    if callers {
        e.bind(tail);
        put_callers_tail(&mut e, counter, moved_code);
    }
    match e.finish() {
        Some(n) if n == len => Ok(()),
        _ => Err(Refusal::RelocationFailed),
    }
}

/// Offsets of the link words (see `LinkWords`).
const FIRST_WORD: u64 = 0;
const SHARED_WORD: u64 = 8;
/// A 7-byte `nop dword [rax+0]`.
const NOP7: [u8; 7] = [0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00];

/// `op` (a `rcx`, `[rip+disp32]` instruction's bytes before its
/// displacement) reading the word at `word`.
fn put_rip_load(e: &mut Emitter, op: &[u8], word: u64) -> Result<(), Refusal> {
    let rel = word as i64 - (e.here() + op.len() as u64 + 4) as i64;
    e.put(op);
    e.put_i32(i32::try_from(rel).map_err(|_| Refusal::RelocationFailed)?);
    Ok(())
}

/// The exact-callers tail, entered from `done` with `rsp` 128 bytes below
/// the entry's (the return address at `[rsp+128]`): saves every register a
/// function's arguments may be in (rdi, rsi, rdx, rcx, r8, r9, the vector
/// count in rax, xmm0-7) and the other caller-saved ones (r10, r11), aligns
/// the stack for the call (an entry reached by a jump need not be
/// aligned), calls the hook with the slot and the return address, restores
/// all, steps back over the red zone and goes on to the moved code.
/// Flags are undefined at a function's entry, as in the prologue.
fn put_callers_tail(e: &mut Emitter, counter: &CounterRef, moved_code: Label) {
    e.put(&[0x50, 0x51, 0x52, 0x56, 0x57]); // push rax, rcx, rdx, rsi, rdi
    e.put(&[0x41, 0x50, 0x41, 0x51, 0x41, 0x52, 0x41, 0x53]); // push r8-r11
    e.put(&[0x48, 0x89, 0xe0]); // mov rax, rsp (entry rsp - 200)
    e.put(&[0x48, 0x83, 0xe4, 0xf0]); // and rsp, -16
    e.put(&[0x48, 0x81, 0xec, 0x90, 0, 0, 0]); // sub rsp, 144
    e.put(&[0x48, 0x89, 0x84, 0x24, 0x80, 0, 0, 0]); // mov [rsp+128], rax
    for i in 0..8u8 {
        e.put(&[0xf3, 0x0f, 0x7f, 0x44 | i << 3, 0x24, 16 * i]); // movdqu [rsp+16i], xmm_i
    }
    e.put(&[0xbf]); // mov edi, slot
    e.put_u32(counter.slot);
    e.put(&[0x48, 0x8b, 0xb0]); // mov rsi, [rax+disp32]: the return address
    e.put_i32(RED_ZONE + 72);
    e.put(&[0x48, 0xb8]); // mov rax, imm64
    e.put_u64(counter.caller_hook);
    e.put(&[0xff, 0xd0]); // call rax
    for i in 0..8u8 {
        e.put(&[0xf3, 0x0f, 0x6f, 0x44 | i << 3, 0x24, 16 * i]); // movdqu xmm_i, [rsp+16i]
    }
    e.put(&[0x48, 0x8b, 0xa4, 0x24, 0x80, 0, 0, 0]); // mov rsp, [rsp+128]
    e.put(&[0x41, 0x5b, 0x41, 0x5a, 0x41, 0x59, 0x41, 0x58]); // pop r11-r8
    e.put(&[0x5f, 0x5e, 0x5a, 0x59, 0x58]); // pop rdi, rsi, rdx, rcx, rax
    e.put(&[0x48, 0x8d, 0xa4, 0x24]); // lea rsp,[rsp+disp32]
    e.put_i32(RED_ZONE);
    e.jmp(moved_code);
}

/// The bytes written at `plan.patch_at`: `jmp rel32` to the stub, then
/// nops to the end of the window.
pub fn entry_patch(plan: &Plan, stub: u64) -> Option<EntryPatch> {
    if plan.is_trap() {
        // `int3` over the first byte; the rest of the first instruction
        // stays, never run (the stub resumes past it).
        let mut bytes = [0xcc; 32];
        bytes[1..].fill(0);
        return Some(EntryPatch { bytes, len: 1 });
    }
    if let Some(t) = plan.trampoline() {
        // `jmp rel8` to the trampoline; the rest of the window is never
        // run (a branch lands past it), and traps if it ever were.
        let mut bytes = [0xcc; 32];
        bytes[0] = 0xeb;
        bytes[1] = i8::try_from(t as i64 - (plan.patch_at as i64 + 2)).ok()? as u8;
        return Some(EntryPatch {
            bytes,
            len: plan.window,
        });
    }
    let rel = stub as i64 - (plan.patch_at as i64 + 5);
    let rel = i32::try_from(rel).ok()?;
    let mut bytes = [0x90; 32];
    bytes[0] = 0xe9;
    bytes[1..5].copy_from_slice(&rel.to_le_bytes());
    Some(EntryPatch {
        bytes,
        len: plan.window,
    })
}

/// A short plan's trampoline: where it goes and its `jmp rel32` to `stub`.
pub fn trampoline(plan: &Plan, stub: u64) -> Option<(u64, [u8; 5])> {
    let t = plan.trampoline()?;
    let rel = i32::try_from(stub as i64 - (t as i64 + 5)).ok()?;
    let mut b = [0xe9; 5];
    b[1..].copy_from_slice(&rel.to_le_bytes());
    Some((t, b))
}

#[cfg(test)]
mod tests {
    use super::super::super::Redirect;
    use super::super::window::plan_window;
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};

    fn stub(plan: &Plan, at: u64, c: &CounterRef) -> Result<Vec<u8>, Refusal> {
        let callers = c.caller_hook != 0;
        let mut v = vec![0xcc; stub_len(plan, callers) + 3];
        emit_stub(plan, at, c, &mut v)?;
        assert!(
            v[stub_len(plan, callers)..].iter().all(|&b| b == 0xcc),
            "wrote past its end"
        );
        v.truncate(stub_len(plan, callers));
        assert!(
            emit_stub(plan, at, c, &mut [0; 8]).is_err(),
            "too short a buffer"
        );
        Ok(v)
    }

    fn decode_all(code: &[u8], ip: u64) -> Vec<Instruction> {
        let mut d = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
        let mut v = Vec::new();
        while d.can_decode() {
            v.push(d.decode());
        }
        v
    }

    /// Instructions in the counting prologue (either form): moved code
    /// follows them.
    const P: usize = 8;
    /// Offset of the prologue's `pop rcx`, where the shared path rejoins.
    const DONE_AT: usize = 31;

    const COUNTER: CounterRef = CounterRef {
        link: 0,
        local: 0,
        tls_offset: -64,
        slot: 3,
        shared_counter: 0x7f00_dead_0018,
        caller_hook: 0,
    };

    #[test]
    fn prologue_counts_and_shared_path_returns_to_moved_code() {
        // push rbp; mov rbp,rsp; pop rbp; ret
        let code = [0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3];
        let plan = plan_window(&code, 0x40_0000, code.len(), 0).unwrap();
        let at = 0x40_1000;
        let code = stub(&plan, at, &COUNTER).unwrap();
        let ins = decode_all(&code, at);
        // The red zone is stepped over before anything is pushed.
        assert_eq!(ins[0].mnemonic(), Mnemonic::Lea);
        assert_eq!(ins[0].op0_register(), Register::RSP);
        assert_eq!(ins[0].memory_base(), Register::RSP);
        assert_eq!(ins[0].memory_displacement64() as i64, -128);
        assert_eq!(ins[1].mnemonic(), Mnemonic::Push);
        assert_eq!(ins[2].memory_segment(), Register::FS);
        assert_eq!(ins[2].memory_displacement64() as i64, -64);
        assert_eq!(ins[3].mnemonic(), Mnemonic::Jrcxz);
        assert_eq!(ins[4].mnemonic(), Mnemonic::Nop);
        assert_eq!(ins[5].mnemonic(), Mnemonic::Inc);
        assert_eq!(
            (ins[5].memory_base(), ins[5].memory_displacement64()),
            (Register::RCX, 24)
        );
        assert_eq!(ins[6].mnemonic(), Mnemonic::Pop);
        assert_eq!(ins[6].ip(), at + DONE_AT as u64);
        assert_eq!(ins[7].mnemonic(), Mnemonic::Lea);
        assert_eq!(ins[7].memory_displacement64(), 128);
        assert_eq!(ins[8].ip(), at + PROLOGUE_LEN as u64);
        // moved: push rbp; mov rbp,rsp; pop rbp; then jmp back to 0x400005
        assert_eq!(ins[8].mnemonic(), Mnemonic::Push);
        assert_eq!(ins[9].mnemonic(), Mnemonic::Mov);
        assert_eq!(ins[10].mnemonic(), Mnemonic::Pop);
        assert_eq!(ins[11].mnemonic(), Mnemonic::Jmp);
        assert_eq!(ins[11].near_branch_target(), 0x40_0005);
        // shared path: counts atomically, then rejoins at `pop rcx` so the
        // stack is restored the same way.
        let shared = ins[3].near_branch_target();
        assert_eq!(shared, ins[12].ip());
        assert_eq!(ins[12].immediate64(), COUNTER.shared_counter);
        assert!(ins[13].has_lock_prefix());
        assert_eq!(ins[14].mnemonic(), Mnemonic::Nop);
        assert_eq!(ins[15].near_branch_target(), at + DONE_AT as u64);
        assert_eq!(ins.len(), 16);
    }

    /// A stub with link words reads where its counters are from them,
    /// relative to itself: the same function's stub at another address
    /// with its words at the same distance is the same bytes.
    #[test]
    fn linked_stubs_are_the_same_bytes_at_the_same_distance() {
        // push rbp; mov rbp,rsp; call +0x40; pop rbp; ret
        let code = [0x55, 0x48, 0x89, 0xe5, 0xe8, 0x40, 0, 0, 0, 0x5d, 0xc3];
        let linked = |orig: u64| {
            let plan = plan_window(&code, orig, code.len(), 0).unwrap();
            let at = orig - 0x4000_0000 + 0x40;
            let c = CounterRef {
                link: orig - 0x4000_0000 + 0x10_0000,
                local: 5,
                slot: 905,
                ..COUNTER
            };
            (stub(&plan, at, &c).unwrap(), at, c)
        };
        let (a, at, c) = linked(0x7f12_3456_0000);
        let (b, _, _) = linked(0x7f55_0000_0000);
        assert_eq!(a, b);
        let ins = decode_all(&a, at);
        assert_eq!(ins[2].memory_segment(), Register::FS);
        assert_eq!(ins[2].memory_displacement64() as i64, -64);
        assert_eq!(ins[3].mnemonic(), Mnemonic::Jrcxz);
        assert_eq!(ins[4].mnemonic(), Mnemonic::Add);
        assert_eq!(ins[4].ip_rel_memory_address(), c.link);
        assert_eq!(ins[5].mnemonic(), Mnemonic::Inc);
        assert_eq!(
            ins[5].memory_displacement64(),
            5 * 8,
            "the module's own slot"
        );
        assert_eq!(ins[6].ip(), at + DONE_AT as u64);
        assert_eq!(ins[8].ip(), at + PROLOGUE_LEN as u64);
        let shared = ins[3].near_branch_target();
        let s = ins.iter().position(|i| i.ip() == shared).unwrap();
        assert_eq!(ins[s].ip_rel_memory_address(), c.link + 8);
        assert!(ins[s + 1].has_lock_prefix());
        assert_eq!(ins[s + 1].memory_displacement64(), 5 * 8);
        assert_eq!(ins[s + 2].near_branch_target(), at + DONE_AT as u64);
    }

    /// With a caller hook, `done` jumps to a tail that saves the argument
    /// registers, calls the hook with the slot and the return address,
    /// restores them in reverse and goes on to the moved code.
    #[test]
    fn callers_tail_saves_calls_and_restores() {
        let code = [0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3];
        let plan = plan_window(&code, 0x40_0000, code.len(), 0).unwrap();
        let at = 0x40_1000;
        let hook = 0x7f12_3456_7890;
        let c = CounterRef {
            caller_hook: hook,
            ..COUNTER
        };
        let bytes = stub(&plan, at, &c).unwrap();
        assert_eq!(bytes.len(), stub_len(&plan, false) + CALLERS_TAIL_LEN);
        let ins = decode_all(&bytes, at);
        assert!(ins.iter().all(|i| i.mnemonic() != Mnemonic::INVALID));
        let jmp = ins
            .iter()
            .find(|i| i.ip() == at + DONE_AT as u64 + 1)
            .unwrap();
        assert_eq!(jmp.mnemonic(), Mnemonic::Jmp);
        let tail_at = at + stub_len(&plan, false) as u64;
        assert_eq!(jmp.near_branch_target(), tail_at);
        let tail: Vec<&Instruction> = ins.iter().filter(|i| i.ip() >= tail_at).collect();
        let count = |m| tail.iter().filter(|i| i.mnemonic() == m).count();
        assert_eq!((count(Mnemonic::Push), count(Mnemonic::Pop)), (9, 9));
        assert_eq!(count(Mnemonic::Movdqu), 16);
        let pushed: Vec<Register> = tail
            .iter()
            .filter(|i| i.mnemonic() == Mnemonic::Push)
            .map(|i| i.op0_register())
            .collect();
        let mut popped: Vec<Register> = tail
            .iter()
            .filter(|i| i.mnemonic() == Mnemonic::Pop)
            .map(|i| i.op0_register())
            .collect();
        popped.reverse();
        assert_eq!(pushed, popped);
        let call = tail
            .iter()
            .position(|i| i.mnemonic() == Mnemonic::Call)
            .unwrap();
        assert_eq!(tail[call - 1].immediate64(), hook);
        // The return address: 128 (red zone) + 72 (nine pushes) above rax.
        let ret = tail
            .iter()
            .find(|i| i.mnemonic() == Mnemonic::Mov && i.op0_register() == Register::RSI)
            .unwrap();
        assert_eq!(
            (ret.memory_base(), ret.memory_displacement64()),
            (Register::RAX, 200)
        );
        let last = tail.last().unwrap();
        assert_eq!(last.near_branch_target(), at + PROLOGUE_LEN as u64);
        assert_eq!(
            tail[tail.len() - 2].memory_displacement64(),
            128,
            "red zone stepped back"
        );
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
            // jmp qword [rip+0x100] (a tail call through the GOT)
            &[0xff, 0x25, 0x00, 0x01, 0x00, 0x00],
            // xor eax,eax; jmp -0x80 (a tail call backwards)
            &[0x31, 0xc0, 0xeb, 0x80, 0xc3],
            // sub rsp,8; js +0x40 (rel32 jcc)
            &[0x48, 0x83, 0xec, 0x08, 0x0f, 0x88, 0x40, 0, 0, 0, 0xc3],
        ];
        let orig = 0x5555_5555_0000u64;
        for &code in cases {
            let plan = plan_window(code, orig, code.len(), 0).unwrap();
            let want: Vec<_> = decode_all(&code[..plan.resume_at as usize - orig as usize], orig)
                .iter()
                .map(targets)
                .collect();
            for at in [orig + 0x7000_0000, orig - 0x7000_0000] {
                let code = stub(&plan, at, &COUNTER).unwrap();
                let ins = decode_all(&code, at);
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
        let ins = decode_all(&stub(&plan, at, &COUNTER).unwrap(), at);
        // lea rsp,[rsp-8]; push rax; lea rax,[rip+ret]; mov [rsp+8],rax;
        // pop rax; jmp target: no flag changed, rax put back.
        let m: Vec<Mnemonic> = ins[P..P + 6].iter().map(|i| i.mnemonic()).collect();
        use Mnemonic::*;
        assert_eq!(m, [Lea, Push, Lea, Mov, Pop, Jmp]);
        assert_eq!(ins[P + 2].ip_rel_memory_address(), orig + 5);
        assert_eq!(ins[P + 3].memory_displacement64(), 8);
        assert_eq!(ins[P + 5].near_branch_target(), orig + 5 + 0x100);

        // Low addresses (non-PIE) use push imm32.
        let plan = plan_window(&code, 0x40_1000, code.len(), 0).unwrap();
        let ins = decode_all(&stub(&plan, 0x50_0000, &COUNTER).unwrap(), 0x50_0000);
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
        let ins = decode_all(&stub(&plan, at, &COUNTER).unwrap(), at);
        let j = &ins[P + 5];
        assert_eq!(j.mnemonic(), Mnemonic::Jmp);
        assert_eq!(j.ip_rel_memory_address(), orig + 6 + 0x2000);
    }

    #[test]
    fn indirect_calls_become_jumps_after_the_return_address() {
        // notrack call rax, after 3 pushes: the call ends the window.
        let code = [0x55, 0x41, 0x54, 0x3e, 0xff, 0xd0, 0xc3];
        let orig = 0x40_2000;
        let plan = plan_window(&code, orig, code.len(), 0).unwrap();
        let ins = decode_all(&stub(&plan, 0x50_0000, &COUNTER).unwrap(), 0x50_0000);
        assert_eq!(ins[P + 1].mnemonic(), Mnemonic::Push);
        assert_eq!(ins[P + 2].mnemonic(), Mnemonic::Push);
        assert_eq!(ins[P + 2].immediate32to64() as u64, orig + 6);
        assert_eq!(ins[P + 3].mnemonic(), Mnemonic::Jmp);
        assert_eq!(ins[P + 3].op0_register(), Register::RAX);
        assert_eq!(ins[P + 4].near_branch_target(), plan.resume_at);
    }

    /// A branch of the function's own to a later moved instruction goes to
    /// that instruction's copy, past the count, and is kept in a cache
    /// entry; one to the middle of an instruction is refused.
    #[test]
    fn branches_to_a_moved_instruction_go_to_its_copy() {
        // push rbx; add eax,3; sub edi,1; jg rel32 (to the add); pop rbx; ret
        let code = [
            0x53, 0x83, 0xc0, 0x03, 0x83, 0xef, 0x01, 0x0f, 0x8f, 0xf4, 0xff, 0xff, 0xff, 0x5b,
            0xc3,
        ];
        let a = 0x40_1000u64;
        let p = plan_window(&code, a, code.len(), 0).unwrap();
        assert_eq!(p.resume_at, a + 7);
        let (second, copy) = p.moved_at()[1];
        assert_eq!((second, copy), (1, 1), "the add, right after the push");
        let mid = p.with_redirects(&[(a + 9, a + 1)]).unwrap();
        assert_eq!(
            mid.redirects(),
            &[Redirect {
                field: 9,
                target: 1,
                code: 1
            }]
        );
        assert!(p.with_redirects(&[(a + 9, a + 2)]).is_none());
        // A cache entry's redirect must name a moved instruction and its copy.
        for (target, code) in [(1, 2), (2, 1), (0, 1)] {
            let r = Redirect {
                field: 9,
                target,
                code,
            };
            assert!(p.with_resolved_redirects(&[r]).is_none(), "{r:?}");
        }
        let mut bytes = Vec::new();
        super::super::plan_bytes::encode(&mid, &mut bytes);
        assert_eq!(super::super::plan_bytes::decode(&bytes, a), Some(mid));
        // The copy the branch is sent to: the add, then the sub, then back.
        let at = 0x50_0000;
        let ins = decode_all(&stub(&mid, at, &COUNTER).unwrap(), at);
        let to = at + PROLOGUE_LEN as u64 + copy as u64;
        let k = ins.iter().position(|i| i.ip() == to).unwrap();
        assert_eq!(ins[k].mnemonic(), Mnemonic::Add);
        assert_eq!(ins[k + 1].mnemonic(), Mnemonic::Sub);
        assert_eq!(ins[k + 2].near_branch_target(), a + 7);
    }

    /// A plan taken apart (as a cache entry holds it) and put together for
    /// the module loaded elsewhere gives the stub a fresh plan would.
    #[test]
    fn a_plan_from_its_parts_moves_with_its_module() {
        // endbr64; mov rax,[rip+0x1234]; call +0x40 (window ends at the call)
        let code = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x8b, 0x05, 0x34, 0x12, 0, 0, 0xe8, 0x40, 0, 0, 0, 0xc3,
        ];
        let (a, b) = (0x5555_0000_1000u64, 0x7f00_0000_1000u64);
        let pa = plan_window(&code, a, code.len(), 0).unwrap();
        let pb = plan_window(&code, b, code.len(), 0).unwrap();
        let skip = (pa.patch_at - a) as u8;
        let resume = (pa.resume_at - a) as u8;
        let parts = Plan::from_parts(
            a,
            skip,
            pa.window as u8,
            resume,
            pa.original(),
            pa.code(),
            pa.fixups(),
        )
        .unwrap()
        .with_moved_at(pa.moved_at())
        .unwrap();
        assert_eq!(parts, pa);
        // Redirects come back as they went, never inside the entry's bytes,
        // always to a moved instruction's first byte.
        let with = pa.with_redirects(&[(a + 16, a)]).unwrap();
        assert_eq!(
            with.redirects(),
            &[Redirect {
                field: 16,
                target: 0,
                code: 0
            }]
        );
        assert!(pa.with_redirects(&[(a + 5, a)]).is_none());

        let mut bytes = Vec::new();
        super::super::plan_bytes::encode(&with, &mut bytes);
        assert_eq!(super::super::plan_bytes::decode(&bytes, a), Some(with));
        assert_eq!(parts.moved_by(b - a), pb);
        let at = b + 0x10_0000;
        assert_eq!(
            stub(&pa.moved_by(b - a), at, &COUNTER).unwrap(),
            stub(&pb, at, &COUNTER).unwrap()
        );
        // Inconsistent parts are refused.
        let bad_window = Plan::from_parts(a, skip, 0, resume, pa.original(), pa.code(), &[]);
        assert!(bad_window.is_none());
        let mut fix = pa.fixups().to_vec();
        fix[0].at = pa.code().len() as u8 - 2;
        let bad_fix = Plan::from_parts(
            a,
            skip,
            pa.window as u8,
            resume,
            pa.original(),
            pa.code(),
            &fix,
        );
        assert!(bad_fix.is_none());
        let bad_skip = Plan::from_parts(a, 4, pa.window as u8, resume, &[0; 16], pa.code(), &[]);
        assert!(bad_skip.is_none());
    }

    #[test]
    fn self_branch_in_window_is_refused() {
        // jmp . (infinite loop at entry), padded
        let code = [0xeb, 0xfe, 0x90, 0x90, 0x90, 0x90];
        assert_eq!(
            plan_window(&code, 0x1000, 2, 4).unwrap_err(),
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
        let n = plan.window;
        let s = stub(&plan, at, &COUNTER).unwrap();
        let moved = &s[PROLOGUE_LEN..PROLOGUE_LEN + n];
        assert_eq!(moved, &code[..n]);
        let back = &decode_all(&s[PROLOGUE_LEN + n..], at + (PROLOGUE_LEN + n) as u64)[0];
        assert_eq!(back.near_branch_target(), plan.resume_at);
        // mov rax,[rip+0x1234]; ret: the displacement must change.
        let code = [0x48, 0x8b, 0x05, 0x34, 0x12, 0x00, 0x00, 0xc3];
        let plan = plan_window(&code, 0x40_0000, code.len(), 0).unwrap();
        let s = stub(&plan, at, &COUNTER).unwrap();
        assert_ne!(&s[PROLOGUE_LEN..PROLOGUE_LEN + 7], &code[..7]);
    }

    /// Switched off, a stub jumps straight to its moved code; on again, it
    /// is byte for byte what was emitted.
    #[test]
    fn counting_switches_with_its_first_two_bytes() {
        let code = [0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3];
        let plan = plan_window(&code, 0x40_0000, code.len(), 0).unwrap();
        let at = 0x40_1000;
        let on = stub(&plan, at, &COUNTER).unwrap();
        assert_eq!(on[..2], counting_switch(true));
        let mut off = on.clone();
        off[..2].copy_from_slice(&counting_switch(false));
        let ins = decode_all(&off, at);
        assert_eq!(ins[0].mnemonic(), Mnemonic::Jmp);
        assert_eq!(ins[0].near_branch_target(), at + PROLOGUE_LEN as u64);
        assert_eq!(ins[0].len(), 2);
        assert_eq!(off[2..], on[2..]);
    }

    #[test]
    fn entry_patch_is_jmp_then_nops() {
        let code = [0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0xc3];
        let plan = plan_window(&code, 0x1000, code.len(), 0).unwrap();
        let b = entry_patch(&plan, 0x3000).unwrap();
        assert_eq!(b.as_slice().len(), plan.window);
        let ins = decode_all(b.as_slice(), 0x1000);
        assert_eq!(ins[0].near_branch_target(), 0x3000);
        assert!(ins[1..].iter().all(|i| i.mnemonic() == Mnemonic::Nop));
        assert!(entry_patch(&plan, 0x1_0000_0000_0000).is_none());
    }
}
