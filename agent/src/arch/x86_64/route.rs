//! Route stubs: a routed call counted in the implementation's row, then
//! run by the implementation so that its caller finds every register as
//! the function's own code would have left it, but for the result.
//!
//! A caller may keep values in call-clobbered registers across a call
//! whose callee it knows leaves them alone (GCC's `-fipa-ra`), and an
//! implementation need not leave them alone. So the stub does not jump to
//! the implementation: it moves the caller's return address, the
//! call-clobbered registers and the vector state to the thread's side
//! stack (`side_stack`), calls the implementation with the stack as the
//! caller left it (stack arguments where they were: the stub's `call`
//! puts its return address in the slot the caller's was in), and on
//! return restores all but the registers a result may be in, then
//! returns to the caller. Call and return stay paired for the return
//! predictor and a shadow stack. A result register (rax, rdx, xmm0, xmm1,
//! whole vectors) is restored too when the function's own code never
//! writes it: its callers may keep a value there, and the result, if any,
//! is the value it came in with anyway.
//!
//! ```text
//! entry:  <counting prologue, as a function's stub>   ; its counting switch
//! moved:  jmp body                                    ; (no count from here)
//!         <shared-stripe path>
//! body:   lea rsp,[rsp-128]; push rax                 ; one scratch register
//!         mov rax, fs:[top]; cmp rax, fs:[limit]
//!         jae slow                                    ; no stack yet, or full
//! have:   add qword fs:[top], FRAME                   ; reserved, then written
//!         <rcx, rdx, rsi, rdi, r8-r11, rbx, rax, return address -> frame>
//!         <vector state in use -> frame>
//!         <rcx, rdx, rax back>; rbx = frame
//!         lea rsp,[rsp+8]                             ; pop the return address
//!         call [rip+target]
//!         push rax; mov rax, rbx
//!         <vectors back, result vectors kept; registers back but results>
//!         push [rax]                                  ; the caller's return
//!         mov fs:[top], rax                           ; read, then released
//!         mov rax,[rsp+8]; ret 8
//! pad:    landing pad: release, _Unwind_Resume
//! slow:   first call of the thread: claim a stack, to `have`;
//!         else (none to have, or too deep): the function's own code
//! ```
//!
//! What is saved is what may matter: the vector state only if the
//! implementation's code may write any (most integer code cannot), and
//! then only the components in use (`save_vectors`).
//!
//! A signal handler that makes a routed call between two instructions
//! finds the top past every frame in use and puts its own above them,
//! gone before it returns. Unwind entries registered with libgcc lead an
//! unwinder inside the implementation to the caller (the return address
//! and rbx found through rbx, which holds the frame), and an exception
//! through the call goes by a landing pad that releases the frame. A
//! `longjmp` out of the implementation leaves its frame, released when a
//! routed call further out returns (until then, the stack is that much
//! shorter: full, calls run the function's own code).

use super::super::{CounterRef, Routed};
use super::emit::Emitter;
use super::side_stack::{self, Vectors, Width, HEADER};
use super::stub::{put_counting_stub, PROLOGUE_LEN, SHARED_LEN};
use super::tls;
use iced_x86::{
    Decoder, DecoderOptions, FlowControl, InstructionInfoFactory, Mnemonic, OpAccess, OpKind,
    Register,
};
use rtprof_abi::Refusal;

/// Bytes of a route stub: the longest (AVX-512 with `xgetbv 1`, every
/// register restored, about 1,300) with room to spare, the rest `int3`.
pub const ROUTE_STUB_LEN: usize = 1536;

/// Where the body starts: past the counting prologue, its jump and the
/// shared-stripe path.
const HEAD: usize = PROLOGUE_LEN + 5 + SHARED_LEN;

// The frame: the caller's return address at 0, then these.
/// rcx, rdx, rsi, rdi, r8-r11 at 8, 16, ... 64.
const SAVED: [u8; 8] = [1, 2, 6, 7, 8, 9, 10, 11];
const RAX_AT: u8 = 72;
/// The implementation's rdx while the vector state is restored.
const RDX_RESULT_AT: u8 = 80;
const MXCSR_AT: u8 = 88;
/// The caller's rbx (rbx holds the frame while the implementation runs).
const RBX_AT: u8 = 96;
/// The vector state components in use at the call (`xgetbv 1`).
const IN_USE_AT: u8 = 104;
/// Result vectors while the others are restored (64 bytes each).
const V0_AT: i32 = 128;
const V1_AT: i32 = 192;
const RCX: u8 = 1;
const RDX: u8 = 2;
const RBX: u8 = 3;

/// The registers a result may be in that the function's code (with what
/// it calls) may write: those are not restored after the implementation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Results {
    pub rax: bool,
    pub rdx: bool,
    /// The whole of vector register 0, 1.
    pub v0: bool,
    pub v1: bool,
    /// v0 or v1 written as ymm or zmm: a result may be in their upper
    /// halves.
    pub wide: bool,
}

impl Results {
    /// Nothing known: every one may hold a result.
    pub const ALL: Results = Results {
        rax: true,
        rdx: true,
        v0: true,
        v1: true,
        wide: true,
    };
}

/// What the stub's body needs besides its addresses.
#[derive(Clone, Copy, Debug)]
pub struct Body {
    pub vectors: Vectors,
    pub frame: u32,
    /// `rtprof_route_claim`.
    pub claim: u64,
    /// `_Unwind_Resume`, which the landing pad calls.
    pub resume: u64,
    /// Offset from the thread pointer of the side stack's top (its limit
    /// follows).
    pub tls: i32,
    pub results: Results,
    /// What the implementation's code may change: saved and restored.
    pub clobbers: Clobbers,
    /// The function's own row: a call that runs its own code is counted
    /// there, not in the implementation's.
    pub own: CounterRef,
}

/// Writes, at `at`, the stub that counts a call routed to implementation
/// `target` (in `counter`'s slot, the implementation's row) and runs it
/// in place of `routed`'s function.
pub fn emit_route_stub(
    at: u64,
    counter: &CounterRef,
    target: u64,
    routed: &Routed,
    out: &mut [u8],
) -> Result<(), Refusal> {
    let s = side_stack::setup();
    let body = Body {
        vectors: s.vectors,
        frame: s.frame,
        claim: s.claim,
        resume: _Unwind_Resume as *const () as u64,
        tls: i32::try_from(tls::route_offset()).map_err(|_| Refusal::RelocationFailed)?,
        results: results(routed.start, routed.read),
        clobbers: clobbers(target, routed.read),
        own: routed.counter,
    };
    let fallback = routed.stub + PROLOGUE_LEN as u64;
    let layout = emit(at, counter, target, fallback, &body, out)?;
    // Kept for as long as the stub (route stubs are never unmapped).
    let personality = __gcc_personality_v0 as *const () as u64;
    let n = eh_frame(&layout, personality, 0).len();
    let table: &'static mut [u64] = Box::leak(vec![0u64; n.div_ceil(8)].into_boxed_slice());
    let bytes = eh_frame(&layout, personality, table.as_ptr() as u64);
    for (w, c) in table.iter_mut().zip(bytes.chunks(8)) {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        *w = u64::from_le_bytes(b);
    }
    // SAFETY: a complete `.eh_frame` list (CIE, FDEs, a zero terminator)
    // that lives as long as the process; libgcc's unwinder (the one the
    // agent and the program share) takes it under its own lock.
    unsafe { __register_frame(table.as_ptr().cast()) };
    Ok(())
}

extern "C" {
    // libgcc_s (the agent's Rust runtime links it): the unwinder the
    // program's exceptions, `backtrace()` and pthread cancellation use.
    fn __register_frame(begin: *const u8);
    fn _Unwind_Resume();
    fn __gcc_personality_v0();
}

/// The unwind entries of a route stub, as an `.eh_frame` list to live at
/// `base`: with them an unwinder inside the implementation goes on to the
/// caller (its return address and rbx in the frame rbx points at), and an
/// exception through the call goes by the landing pad, which releases
/// the frame (`__gcc_personality_v0`, a cleanup). Every pointer absolute.
pub fn eh_frame(l: &Layout, personality: u64, base: u64) -> Vec<u8> {
    let mut b: Vec<u8> = Vec::with_capacity(160);
    // An entry's length word, filled once it is written (8-byte aligned).
    let close = |b: &mut Vec<u8>, at: usize| {
        while !(b.len() - at).is_multiple_of(8) {
            b.push(0); // DW_CFA_nop
        }
        let n = (b.len() - at - 4) as u32;
        b[at..at + 4].copy_from_slice(&n.to_le_bytes());
    };
    // CIE: version 1, "zPLR", code 1, data -8, return address r16.
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(&[1, b'z', b'P', b'L', b'R', 0, 1, 0x78, 16, 11, 0x00]);
    b.extend_from_slice(&personality.to_le_bytes());
    b.extend_from_slice(&[0x00, 0x00]);
    close(&mut b, 0);
    let fde = |b: &mut Vec<u8>, from: u64, to: u64, lsda: u64, rules: &[u8]| {
        let at = b.len();
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&((at + 4) as u32).to_le_bytes()); // back to the CIE
        b.extend_from_slice(&from.to_le_bytes());
        b.extend_from_slice(&(to - from).to_le_bytes());
        b.push(8);
        b.extend_from_slice(&lsda.to_le_bytes());
        b.extend_from_slice(rules);
        close(b, at);
    };
    // At the call: CFA = rsp; the return address at [rbx]; rbx at
    // [rbx+96] (DW_CFA_expression, DW_OP_breg3).
    let at_call = [
        0x0c,
        7,
        0,
        0x10,
        16,
        2,
        0x73,
        0,
        0x10,
        3,
        3,
        0x73,
        RBX_AT | 0x80,
        0,
    ];
    // Its LSDA after the list: the FDEs are 48 and 40 bytes, the end 8.
    let lsda = base + b.len() as u64 + 48 + 40 + 8;
    fde(&mut b, l.call, l.back, lsda, &at_call);
    // In the landing pad: both pushed, CFA = rsp + 16.
    fde(
        &mut b,
        l.pad,
        l.pad_end,
        0,
        &[0x0c, 7, 16, 0x90, 1, 0x83, 2],
    );
    b.extend_from_slice(&[0; 8]);
    debug_assert_eq!(base + b.len() as u64, lsda);
    // LPStart omitted (the FDE's start, the call), no types, call sites
    // in udata4: the call, its landing pad, a cleanup.
    b.extend_from_slice(&[0xff, 0xff, 0x03, 13]);
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&((l.back - l.call) as u32).to_le_bytes());
    b.extend_from_slice(&((l.pad - l.call) as u32).to_le_bytes());
    b.push(0);
    b
}

/// The route stub with `body`; a call it cannot take goes to `fallback`.
pub fn emit(
    at: u64,
    counter: &CounterRef,
    target: u64,
    fallback: u64,
    body: &Body,
    out: &mut [u8],
) -> Result<Layout, Refusal> {
    let out = out
        .get_mut(..ROUTE_STUB_LEN)
        .ok_or(Refusal::NoMemoryInRange)?;
    out.fill(0xcc);
    // The moved code of a function's stub: a jump over the shared path.
    let mut jump = [0xe9, 0, 0, 0, 0];
    jump[1..].copy_from_slice(&(SHARED_LEN as i32).to_le_bytes());
    let counter = CounterRef {
        caller_hook: 0,
        ..*counter
    };
    let (head, rest) = out.split_at_mut(HEAD);
    put_counting_stub(at, &counter, &jump, HEAD, head)?;
    let mut e = Emitter::new(rest, at + HEAD as u64);
    let layout = put_body(&mut e, (at, &counter), target, fallback, body);
    e.finish().map(|_| layout).ok_or(Refusal::RelocationFailed)
}

/// `mov [rax+disp8], reg` (`op` 0x89) or `mov reg, [rax+disp8]` (0x8b).
fn frame_mov(op: u8, reg: u8, disp: u8) -> [u8; 4] {
    [0x48 | (reg >> 3) << 2, op, 0x40 | (reg & 7) << 3, disp]
}

/// `op` on the qword at `fs:[disp32]` (the 4-byte opcode and ModRM/SIB).
fn fs_op(e: &mut Emitter, op: [u8; 4], disp: i32) {
    e.put(&[0x64]);
    e.put(&op);
    e.put_i32(disp);
}

const MOV_RAX_FS: [u8; 4] = [0x48, 0x8b, 0x04, 0x25];
const CMP_RAX_FS: [u8; 4] = [0x48, 0x3b, 0x04, 0x25];
const ADD_FS_IMM: [u8; 4] = [0x48, 0x81, 0x04, 0x25];
/// `xsave64`, `xsavec64`, `xrstor64` on [rcx+disp32]: opcode, ModRM.
const XSAVE: [u8; 2] = [0xae, 0xa1];
const XSAVEC: [u8; 2] = [0xc7, 0xa1];
const XRSTOR: [u8; 2] = [0xae, 0xa9];
const MOV_FS_RAX: [u8; 4] = [0x48, 0x89, 0x04, 0x25];
const MOV_FS_RBX: [u8; 4] = [0x48, 0x89, 0x1c, 0x25];

/// Where the parts of a route stub its unwind entries describe are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The call of the implementation, and past it.
    pub call: u64,
    pub back: u64,
    /// The landing pad, and past its call of `_Unwind_Resume`.
    pub pad: u64,
    pub pad_end: u64,
}

fn put_body(
    e: &mut Emitter,
    (at, counter): (u64, &CounterRef),
    target: u64,
    fallback: u64,
    b: &Body,
) -> Layout {
    let (have, slow, fall) = (e.label(), e.label(), e.label());
    let (target_at, claim_at, resume_at) = (e.label(), e.label(), e.label());
    let (top, limit, frame) = (b.tls, b.tls + 8, b.frame as i32);
    let r = b.results;

    // rax to work with, saved below the red zone (a signal's frame goes
    // below it too).
    e.put(&[0x48, 0x8d, 0x64, 0x24, 0x80]); // lea rsp,[rsp-128]
    e.put(&[0x50]); // push rax
    fs_op(e, MOV_RAX_FS, top);
    fs_op(e, CMP_RAX_FS, limit);
    e.jcc(0x3, slow); // jae: no stack yet, or no room for a frame
    e.bind(have);
    // Reserved before it is written: a signal's routed call goes above.
    fs_op(e, ADD_FS_IMM, top);
    e.put_i32(frame);
    for (k, &reg) in SAVED.iter().enumerate() {
        e.put(&frame_mov(0x89, reg, 8 + 8 * k as u8));
    }
    e.put(&frame_mov(0x89, RBX, RBX_AT));
    e.put(&[0x59]); // pop rcx: the caller's rax
    e.put(&frame_mov(0x89, RCX, RAX_AT));
    e.put(&[0x48, 0x8d, 0xa4, 0x24]); // lea rsp,[rsp+128]
    e.put_i32(128);
    e.put(&[0x48, 0x8b, 0x0c, 0x24]); // mov rcx,[rsp]: the return address
    e.put(&[0x48, 0x89, 0x08]); // mov [rax],rcx
    let c = b.clobbers;
    if c.wide || c.hi16 {
        save_vectors(e, &b.vectors, c.hi16);
    } else {
        for i in (0..16u8).filter(|i| c.xmm & 1 << i != 0) {
            movdqu(e, 0x7f, i, HEADER as i32 + 16 * i as i32);
        }
    }
    // The arguments as they came (al: vector arguments of a varargs call);
    // rbx, which the implementation keeps, the frame: the way back, for
    // the stub and for an unwinder.
    e.put(&frame_mov(0x8b, RCX, 8));
    e.put(&frame_mov(0x8b, RDX, 16));
    e.put(&[0x48, 0x89, 0xc3]); // mov rbx,rax
    e.put(&frame_mov(0x8b, 0, RAX_AT));
    e.put(&[0x48, 0x8d, 0x64, 0x24, 0x08]); // lea rsp,[rsp+8]: its slot is ours
    let call = e.here();
    e.put(&[0xff, 0x15]); // call [rip+target]
    e.rip_rel(target_at);
    let back = e.here();

    // Back: rsp is the caller's; the implementation's rax goes where the
    // return address was.
    e.put(&[0x50]); // push rax
    e.put(&[0x48, 0x89, 0xd8]); // mov rax,rbx: the frame
    if r.rdx {
        e.put(&frame_mov(0x89, RDX, RDX_RESULT_AT));
    }
    if c.wide || c.hi16 {
        restore_vectors(e, &b.vectors, r, c.hi16);
    } else {
        let kept = |i: u8| i == 0 && r.v0 || i == 1 && r.v1;
        for i in (0..16u8).filter(|&i| c.xmm & 1 << i != 0 && !kept(i)) {
            movdqu(e, 0x6f, i, HEADER as i32 + 16 * i as i32);
        }
    }
    if !r.rax {
        e.put(&frame_mov(0x8b, RCX, RAX_AT));
        e.put(&[0x48, 0x89, 0x0c, 0x24]); // mov [rsp],rcx
    }
    for (k, &reg) in SAVED.iter().enumerate() {
        let from = match reg == RDX && r.rdx {
            true => RDX_RESULT_AT,
            false => 8 + 8 * k as u8,
        };
        e.put(&frame_mov(0x8b, reg, from));
    }
    e.put(&frame_mov(0x8b, RBX, RBX_AT));
    e.put(&[0xff, 0x30]); // push qword [rax]: the caller's return address
                          // Every read of the frame done: the top back to it (frames above it,
                          // left by a longjmp out of a routed call, are released too).
    fs_op(e, MOV_FS_RAX, top);
    e.put(&[0x48, 0x8b, 0x44, 0x24, 0x08]); // mov rax,[rsp+8]
    e.put(&[0xc2, 0x08, 0x00]); // ret 8

    // An exception through the implementation: the frame released, the
    // way on copied to the stack first, unwinding resumed.
    let pad = e.here();
    e.put(&[0x48, 0x89, 0xc7]); // mov rdi,rax: the exception
    e.put(&[0xff, 0x33]); // push qword [rbx]: the caller's return address
    e.put(&[0xff, 0x73, RBX_AT]); // push qword [rbx+96]: the caller's rbx
    fs_op(e, MOV_FS_RBX, top);
    e.put(&[0x48, 0x8b, 0x1c, 0x24]); // mov rbx,[rsp]
    e.put(&[0xff, 0x15]); // call [rip+_Unwind_Resume]
    e.rip_rel(resume_at);
    let pad_end = e.here();
    e.put(&[0xcc]);

    // rax: the top; the caller's rax at [rsp].
    e.bind(slow);
    e.put(&[0x48, 0x85, 0xc0]); // test rax,rax
    e.jcc(0x5, fall); // jnz: a stack, full, or none to have
    e.put(&[0xff, 0x15]); // call [rip+claim]: every register kept but rax
    e.rip_rel(claim_at);
    fs_op(e, MOV_RAX_FS, top);
    fs_op(e, CMP_RAX_FS, limit);
    e.jcc(0x2, have); // jb
    e.bind(fall);
    put_count_moved(e, at, counter, &b.own);
    e.put(&[0x58]); // pop rax
    e.put(&[0x48, 0x8d, 0xa4, 0x24]); // lea rsp,[rsp+128]
    e.put_i32(128);
    e.jmp_to(fallback); // the function's own code, which keeps all
    while !e.here().is_multiple_of(8) {
        e.put(&[0xcc]);
    }
    e.bind(target_at);
    e.put_u64(target);
    e.bind(claim_at);
    e.put_u64(b.claim);
    e.bind(resume_at);
    e.put_u64(b.resume);
    Layout {
        call,
        back,
        pad,
        pad_end,
    }
}

/// A call that runs the function's own code is counted in its row: the
/// count the prologue made in the implementation's row moves there, if
/// it made one (the stub's first byte is that of its counting `lea`, not
/// the counting switch's `jmp`). Only rcx is used, saved on the stack.
fn put_count_moved(e: &mut Emitter, at: u64, from: &CounterRef, to: &CounterRef) {
    let (uncounted, shared, moved) = (e.label(), e.label(), e.label());
    let slot = |c: &CounterRef| i32::try_from(c.slot as u64 * 8).unwrap_or(i32::MAX);
    if slot(from) == i32::MAX || slot(to) == i32::MAX {
        e.fail();
    }
    // cmp byte [rip+rel32], 0x48: the stub's first byte.
    e.put(&[0x80, 0x3d]);
    let rel = i32::try_from(at as i64 - (e.here() + 5) as i64).ok();
    if rel.is_none() {
        e.fail();
    }
    e.put_i32(rel.unwrap_or(0));
    e.put(&[0x48]);
    e.jcc(0x5, uncounted); // jne
    e.put(&[0x51]); // push rcx
    e.put(&[0x64, 0x48, 0x8b, 0x0c, 0x25]); // mov rcx, fs:[stripe]
    e.put_i32(from.tls_offset);
    e.jrcxz(shared);
    e.put(&[0x48, 0xff, 0x89]); // dec qword [rcx+disp32]
    e.put_i32(slot(from));
    e.put(&[0x48, 0xff, 0x81]); // inc qword [rcx+disp32]
    e.put_i32(slot(to));
    e.jmp_short(moved);
    e.bind(shared);
    e.put(&[0x48, 0xb9]); // mov rcx, imm64
    e.put_u64(from.shared_counter);
    e.put(&[0xf0, 0x48, 0xff, 0x09]); // lock dec qword [rcx]
    e.put(&[0x48, 0xb9]); // mov rcx, imm64
    e.put_u64(to.shared_counter);
    e.put(&[0xf0, 0x48, 0xff, 0x01]); // lock inc qword [rcx]
    e.bind(moved);
    e.put(&[0x59]); // pop rcx
    e.bind(uncounted);
}

/// `movdqu [rax+disp32], xmm_i` (`op` 0x7f) or the load (0x6f).
fn movdqu(e: &mut Emitter, op: u8, i: u8, disp: i32) {
    e.put(&[0xf3]);
    if i >= 8 {
        e.put(&[0x44]);
    }
    e.put(&[0x0f, op, 0x80 | (i & 7) << 3]);
    e.put_i32(disp);
}

/// `mov rcx,rax; mov eax,lo; mov edx,hi; <op> [rcx+256]; mov rax,rcx`
/// for `op`: `xsave64`, `xsavec64` or `xrstor64` (opcode and ModRM).
fn xsave_op(e: &mut Emitter, mask: u64, op: [u8; 2]) {
    e.put(&[0x48, 0x89, 0xc1]);
    e.put(&[0xb8]);
    e.put_u32(mask as u32);
    e.put(&[0xba]);
    e.put_u32((mask >> 32) as u32);
    e.put(&[0x48, 0x0f, op[0], op[1]]);
    e.put_i32(HEADER as i32);
    e.put(&[0x48, 0x89, 0xc8]);
}

/// `vmovdqu [rax+disp32], ymm_i` (`op` 0x7f) or the load (0x6f).
fn vmovdqu(e: &mut Emitter, op: u8, i: u8, disp: i32) {
    e.put(&[
        0xc5,
        if i < 8 { 0xfe } else { 0x7e },
        op,
        0x80 | (i & 7) << 3,
    ]);
    e.put_i32(disp);
}

/// Where zmm16-31 and k0-7 go in the frame when saved one by one.
const HI16_AT: i32 = HEADER as i32 + 512;
const MASKS_AT: i32 = HI16_AT + 1024;

/// `vmovdqu64 [rax+disp8*64], zmm(16+j)` (`op` 0x7f) or the load (0x6f).
fn zmm_hi(e: &mut Emitter, op: u8, j: u8) {
    let p0 = if j < 8 { 0xe1 } else { 0x61 };
    let disp = (HI16_AT / 64) as u8 + j;
    e.put(&[0x62, p0, 0xfe, 0x48, op, 0x40 | (j & 7) << 3, disp]);
}

/// `kmovq [rax+disp32], k` (`op` 0x91) or the load (0x90).
fn kmov(e: &mut Emitter, op: u8, k: u8) {
    e.put(&[0xc4, 0xe1, 0xf8, op, 0x80 | k << 3]);
    e.put_i32(MASKS_AT + 8 * k as i32);
}

/// Saves the vector state (rax the frame; rcx, rdx, r11 free). With
/// `xgetbv 1` it saves only the components in use: one in its initial
/// state holds no value of the caller's (only an instruction's write, or
/// a restore of one, puts it in use), so the implementation may leave
/// anything there. xmm0-15 one by one, or ymm0-15 when their upper halves
/// are in use, and zmm16-31 and k0-7 when in use (glibc's string
/// functions use them); the upper halves of zmm0-15 in use: `xsave`,
/// which costs a hundred nanoseconds and more. The way taken is noted for
/// the way back.
fn save_vectors(e: &mut Emitter, v: &Vectors, hi16: bool) {
    let area = HEADER as i32;
    if v.width == Width::Xmm {
        (0..16).for_each(|i| movdqu(e, 0x7f, i, area + 16 * i as i32));
        return;
    }
    let full_save = |e: &mut Emitter| match v.compact {
        true => xsave_op(e, v.mask, XSAVEC),
        false => xsave_op(e, v.mask, XSAVE),
    };
    if !v.tiers {
        full_save(e);
        return;
    }
    let (full, ymm, low_done, done) = (e.label(), e.label(), e.label(), e.label());
    e.put(&[0x49, 0x89, 0xc3]); // mov r11,rax
    e.put(&[0xb9, 1, 0, 0, 0]); // mov ecx,1
    e.put(&[0x0f, 0x01, 0xd0]); // xgetbv: edx:eax the components in use
    e.put(&[0x49, 0x93]); // xchg rax,r11
    e.put(&[0x44, 0x89, 0x58, IN_USE_AT]); // mov [rax+104],r11d
    e.put(&[0x41, 0xf6, 0xc3, 0x40]); // test r11b,0x40: zmm0-15 upper halves
    e.jcc(0x5, full);
    e.put(&[0x41, 0xf6, 0xc3, 0x04]); // test r11b,4: ymm0-15 upper halves
    e.jcc(0x5, ymm);
    (0..16).for_each(|i| movdqu(e, 0x7f, i, area + 16 * i as i32));
    e.jmp(low_done);
    e.bind(ymm);
    (0..16).for_each(|i| vmovdqu(e, 0x7f, i, area + 32 * i as i32));
    e.bind(low_done);
    if v.width == Width::Zmm && hi16 {
        let (no_hi16, no_masks) = (e.label(), e.label());
        e.put(&[0x41, 0xf6, 0xc3, 0x80]); // test r11b,0x80: zmm16-31
        e.jcc(0x4, no_hi16);
        (0..16).for_each(|j| zmm_hi(e, 0x7f, j));
        e.bind(no_hi16);
        e.put(&[0x41, 0xf6, 0xc3, 0x20]); // test r11b,0x20: k0-7
        e.jcc(0x4, no_masks);
        (0..8).for_each(|k| kmov(e, 0x91, k));
        e.bind(no_masks);
    }
    e.jmp(done);
    e.bind(full);
    full_save(e);
    e.bind(done);
}

/// A whole vector register `i` (0 or 1) to or from `[rax+at]` (`op` 0x7f
/// store, 0x6f load): `vmovdqu` ymm, `vmovdqu64` zmm.
fn wide(e: &mut Emitter, w: Width, op: u8, i: u8, at: i32) {
    match w {
        Width::Zmm => e.put(&[0x62, 0xf1, 0xfe, 0x48, op, 0x40 | i << 3, (at / 64) as u8]),
        _ => {
            e.put(&[0xc5, 0xfe, op, 0x80 | i << 3]);
            e.put_i32(at);
        }
    }
}

/// Restores the vector state as [`save_vectors`] saved it, but the
/// results (rax the frame; rcx free).
fn restore_vectors(e: &mut Emitter, v: &Vectors, r: Results, hi16: bool) {
    let area = HEADER as i32;
    let kept = |i: u8| i == 0 && r.v0 || i == 1 && r.v1;
    if v.width == Width::Xmm {
        for i in (0..16u8).filter(|&i| !kept(i)) {
            movdqu(e, 0x6f, i, area + 16 * i as i32);
        }
        return;
    }
    let (full, ymm, done) = (e.label(), e.label(), e.label());
    if v.tiers {
        e.put(&[0x8b, 0x48, IN_USE_AT]); // mov ecx,[rax+104]
        e.put(&[0xf6, 0xc1, 0x40]); // test cl,0x40
        e.jcc(0x5, full);
        if v.width == Width::Zmm && hi16 {
            let (no_hi16, no_masks) = (e.label(), e.label());
            e.put(&[0xf6, 0xc1, 0x80]); // test cl,0x80
            e.jcc(0x4, no_hi16);
            (0..16).for_each(|j| zmm_hi(e, 0x6f, j));
            e.bind(no_hi16);
            e.put(&[0xf6, 0xc1, 0x20]); // test cl,0x20
            e.jcc(0x4, no_masks);
            (0..8).for_each(|k| kmov(e, 0x90, k));
            e.bind(no_masks);
        }
        e.put(&[0xf6, 0xc1, 0x04]); // test cl,4
        e.jcc(0x5, ymm);
        for i in (0..16u8).filter(|&i| !kept(i)) {
            movdqu(e, 0x6f, i, area + 16 * i as i32);
        }
        // The upper halves were not in use: back to their initial state
        // (SSE code runs slower with them dirty), unless a result may be
        // in them.
        if !r.wide {
            e.put(&[0xc5, 0xf8, 0x77]); // vzeroupper
        }
        e.jmp(done);
        e.bind(ymm);
        for i in (0..16u8).filter(|&i| !kept(i)) {
            vmovdqu(e, 0x6f, i, area + 32 * i as i32);
        }
        e.jmp(done);
    }
    e.bind(full);
    let kept = [(r.v0, 0, V0_AT), (r.v1, 1, V1_AT)];
    for &(k, i, at) in &kept {
        if k {
            wide(e, v.width, 0x7f, i, at);
        }
    }
    // MXCSR as the implementation left it: its flags are results too.
    e.put(&[0x0f, 0xae, 0x58, MXCSR_AT]); // stmxcsr [rax+88]
    xsave_op(e, v.mask, XRSTOR);
    e.put(&[0x0f, 0xae, 0x50, MXCSR_AT]); // ldmxcsr [rax+88]
    for &(k, i, at) in &kept {
        if k {
            wide(e, v.width, 0x6f, i, at);
        }
    }
    e.bind(done);
}

/// Instructions looked at, at most, before the answer is "all results".
const BUDGET: usize = 50_000;

/// Visits every instruction the code at `start` may run (as it runs now,
/// with every function it calls or jumps to, through pointers it reads by
/// rip: a PLT's GOT slot) with the registers it writes, until `note`
/// says enough. Whether it saw all (not: an indirect branch it cannot
/// follow, bytes that are no instruction, too much code).
fn walk<'m>(
    start: u64,
    read: &dyn Fn(u64, usize) -> Option<&'m [u8]>,
    mut note: impl FnMut(&iced_x86::Instruction, &mut dyn Iterator<Item = Register>) -> bool,
) -> bool {
    let mut info = InstructionInfoFactory::new();
    let mut seen = std::collections::HashSet::new();
    let mut work = vec![start];
    let fetch = |ip: u64| (1..=15).rev().find_map(|n| read(ip, n));
    let pointer = |at: u64| Some(u64::from_le_bytes(read(at, 8)?.try_into().ok()?));
    while let Some(mut ip) = work.pop() {
        loop {
            if !seen.insert(ip) {
                break;
            }
            if seen.len() > BUDGET {
                return false;
            }
            let Some(bytes) = fetch(ip) else {
                return false;
            };
            let i = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE).decode();
            if i.is_invalid() {
                return false;
            }
            let mut written = info
                .info(&i)
                .used_registers()
                .iter()
                .filter(|u| {
                    matches!(
                        u.access(),
                        OpAccess::Write
                            | OpAccess::CondWrite
                            | OpAccess::ReadWrite
                            | OpAccess::ReadCondWrite
                    )
                })
                .map(|u| u.register());
            if note(&i, &mut written) {
                return true;
            }
            let direct = i.op0_kind() == OpKind::NearBranch64;
            let through = || {
                i.is_ip_rel_memory_operand()
                    .then(|| pointer(i.ip_rel_memory_address()))
                    .flatten()
            };
            match i.flow_control() {
                FlowControl::Next => {}
                FlowControl::Return | FlowControl::Exception => break,
                FlowControl::UnconditionalBranch if direct => {
                    work.push(i.near_branch_target());
                    break;
                }
                FlowControl::ConditionalBranch if direct => work.push(i.near_branch_target()),
                FlowControl::Call if direct => work.push(i.near_branch_target()),
                FlowControl::Call if i.mnemonic() == Mnemonic::Syscall => {}
                FlowControl::IndirectBranch | FlowControl::IndirectCall => match through() {
                    Some(t) => {
                        work.push(t);
                        if i.flow_control() == FlowControl::IndirectBranch {
                            break;
                        }
                    }
                    None => return false,
                },
                _ => return false,
            }
            ip = i.next_ip();
        }
    }
    true
}

/// Which result registers the code at `start` may write (see [`walk`]);
/// unsure: all.
pub fn results<'m>(start: u64, read: &dyn Fn(u64, usize) -> Option<&'m [u8]>) -> Results {
    let mut r = Results::default();
    let whole = walk(start, read, |i, written| {
        // vzeroupper leaves zeros in the upper halves, as the stub's does.
        let zeroing = matches!(i.mnemonic(), Mnemonic::Vzeroupper | Mnemonic::Vzeroall);
        for reg in written {
            match reg.full_register() {
                Register::RAX => r.rax = true,
                Register::RDX => r.rdx = true,
                Register::ZMM0 => r.v0 = true,
                Register::ZMM1 => r.v1 = true,
                _ => {}
            }
            r.wide |= !zeroing
                && matches!(
                    reg,
                    Register::YMM0 | Register::YMM1 | Register::ZMM0 | Register::ZMM1
                );
        }
        match i.mnemonic() {
            Mnemonic::Vzeroupper | Mnemonic::Vzeroall => (r.v0, r.v1) = (true, true),
            Mnemonic::Syscall => r.rax = true,
            _ => {}
        }
        r == Results::ALL
    });
    if whole {
        r
    } else {
        Results::ALL
    }
}

/// The vector state the code of an implementation may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clobbers {
    /// xmm0-15 written by SSE instructions only (which leave the upper
    /// halves alone): only these are saved, one by one.
    pub xmm: u16,
    /// A vector register written whole (a VEX or EVEX instruction clears
    /// the upper halves), or `vzeroupper`: the vector state in use is
    /// saved (`save_vectors`).
    pub wide: bool,
    /// zmm16-31 or a mask register.
    pub hi16: bool,
}

impl Clobbers {
    pub const ALL: Clobbers = Clobbers {
        xmm: 0xffff,
        wide: true,
        hi16: true,
    };
    pub const NONE: Clobbers = Clobbers {
        xmm: 0,
        wide: false,
        hi16: false,
    };
}

/// What vector state the code at `start` may change (see [`walk`]); unsure:
/// all. What it cannot change need not be saved: most integer code has no
/// vector state to save at all, and SSE code only the registers it writes.
/// (MXCSR stays as the implementation leaves it.)
pub fn clobbers<'m>(start: u64, read: &dyn Fn(u64, usize) -> Option<&'m [u8]>) -> Clobbers {
    let mut c = Clobbers::NONE;
    let whole = walk(start, read, |i, written| {
        let legacy = i.encoding() == iced_x86::EncodingKind::Legacy;
        for reg in written {
            let full = reg.full_register();
            if reg.is_k() || full.is_zmm() && full.number() >= 16 {
                (c.wide, c.hi16) = (true, true);
            } else if full.is_zmm() && legacy && reg.is_xmm() {
                c.xmm |= 1 << full.number();
            } else if full.is_zmm() {
                c.wide = true;
            }
        }
        use Mnemonic::*;
        match i.mnemonic() {
            Vzeroupper | Vzeroall | Fxrstor | Fxrstor64 => c.wide = true,
            Xrstor | Xrstor64 | Xrstors | Xrstors64 => c = Clobbers::ALL,
            _ => {}
        }
        c == Clobbers::ALL
    });
    if whole {
        c
    } else {
        Clobbers::ALL
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::Instruction;

    fn decode_all(code: &[u8], ip: u64) -> Vec<Instruction> {
        let mut d = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
        let mut v = Vec::new();
        while d.can_decode() {
            v.push(d.decode());
        }
        v
    }

    const COUNTER: CounterRef = CounterRef {
        link: 0,
        local: 0,
        tls_offset: -64,
        slot: 3,
        shared_counter: 0x7f00_dead_0018,
        caller_hook: 0,
    };

    fn body(vectors: Vectors, results: Results) -> Body {
        Body {
            vectors,
            frame: vectors.frame(),
            claim: 0x7f00_0000_c1a1,
            resume: 0x7f00_0000_2e5e,
            tls: -256,
            results,
            clobbers: Clobbers::ALL,
            own: CounterRef {
                slot: 1,
                shared_counter: 0x7f00_dead_0008,
                ..COUNTER
            },
        }
    }

    const ZMM: Vectors = Vectors {
        mask: 0xe7 & !1,
        area: 2688,
        width: Width::Zmm,
        compact: true,
        tiers: true,
    };
    const YMM: Vectors = Vectors {
        mask: 0b110,
        area: 832,
        width: Width::Ymm,
        compact: false,
        tiers: false,
    };

    /// The instructions of a route stub up to its two address words.
    fn stub(at: u64, fallback: u64, b: &Body) -> (Vec<u8>, Vec<Instruction>) {
        let mut out = vec![0u8; ROUTE_STUB_LEN + 8];
        emit(at, &COUNTER, 0x7f12_3456_7890, fallback, b, &mut out).unwrap();
        assert!(emit(at, &COUNTER, 1, fallback, b, &mut [0; 64]).is_err());
        out.truncate(ROUTE_STUB_LEN);
        let ins = decode_all(&out, at);
        let end = ins
            .iter()
            .position(|i| i.mnemonic() == Mnemonic::Jmp && i.near_branch_target() == fallback)
            .unwrap();
        (out, ins[..=end].to_vec())
    }

    /// It counts as a function's stub does (so the same counting switch
    /// skips to the same place), jumps past the shared path to the body,
    /// calls the implementation through its address word, returns with
    /// `ret 8`, and falls back to the function's own moved code.
    #[test]
    fn a_route_stub_counts_then_calls_the_implementation() {
        use super::super::stub::counting_switch;
        let (at, fallback) = (0x40_1000, 0x40_0000 + PROLOGUE_LEN as u64);
        for v in [Vectors::XMM, YMM, ZMM] {
            let (out, ins) = stub(at, fallback, &body(v, Results::ALL));
            assert!(ins.iter().all(|i| !i.is_invalid()), "{v:?}");
            assert_eq!(out[..2], counting_switch(true));
            assert_eq!(2 + counting_switch(false)[1] as usize, PROLOGUE_LEN);
            let moved = ins
                .iter()
                .find(|i| i.ip() == at + PROLOGUE_LEN as u64)
                .unwrap();
            assert_eq!(moved.near_branch_target(), at + HEAD as u64);
            assert_eq!(ins[3].mnemonic(), Mnemonic::Jrcxz);
            assert_eq!(ins[3].near_branch_target(), at + PROLOGUE_LEN as u64 + 5);
            let calls: Vec<&Instruction> = ins
                .iter()
                .filter(|i| i.mnemonic() == Mnemonic::Call)
                .collect();
            assert_eq!(
                calls.len(),
                3,
                "the implementation, _Unwind_Resume, the claim"
            );
            let word = |i: &Instruction| {
                let a = (i.ip_rel_memory_address() - at) as usize;
                u64::from_le_bytes(out[a..a + 8].try_into().unwrap())
            };
            assert_eq!(word(calls[0]), 0x7f12_3456_7890);
            assert_eq!(word(calls[1]), 0x7f00_0000_2e5e);
            assert_eq!(word(calls[2]), 0x7f00_0000_c1a1);
            let ret = ins.iter().find(|i| i.mnemonic() == Mnemonic::Ret).unwrap();
            assert_eq!(ret.immediate16(), 8);
            // The side stack's top goes up by a frame before the call and
            // down after it, through fs.
            let moves: Vec<(Mnemonic, Option<u64>, Register)> = ins
                .iter()
                .filter(|i| i.segment_prefix() == Register::FS && i.op0_kind() == OpKind::Memory)
                .map(|i| match i.mnemonic() {
                    Mnemonic::Add => (
                        Mnemonic::Add,
                        Some(i.immediate32to64() as u64),
                        Register::None,
                    ),
                    m => (m, None, i.op1_register()),
                })
                .collect();
            let f = v.frame() as u64;
            // Up by a frame; back to the frame (rax) after the call, or
            // to it (rbx) in the landing pad.
            let want = [
                (Mnemonic::Add, Some(f), Register::None),
                (Mnemonic::Mov, None, Register::RAX),
                (Mnemonic::Mov, None, Register::RBX),
            ];
            assert_eq!(moves, want);
            assert!(f.is_multiple_of(64) && out.len() >= HEAD);
        }
    }

    /// Every call-clobbered register stored in the frame before the call
    /// is loaded back after it, but the results; the vector state is
    /// saved with `xsave` where AVX is, else xmm0-15 one by one.
    #[test]
    fn registers_go_back_but_the_results() {
        let at = 0x40_1000;
        fn stores_loads(ins: &[Instruction]) -> (Vec<Register>, Vec<Register>, &[Instruction]) {
            let call = ins
                .iter()
                .position(|i| i.mnemonic() == Mnemonic::Call)
                .unwrap();
            let ret = ins
                .iter()
                .position(|i| i.mnemonic() == Mnemonic::Ret)
                .unwrap();
            // 64-bit moves to or from the frame (not the note of the
            // vector components in use).
            let from_frame = |i: &&Instruction, to: bool| {
                let reg = if to {
                    i.op1_register()
                } else {
                    i.op0_register()
                };
                i.mnemonic() == Mnemonic::Mov
                    && i.memory_base() == Register::RAX
                    && (i.op0_kind() == OpKind::Memory) == to
                    && reg.size() == 8
            };
            let stored: Vec<Register> = ins[..call]
                .iter()
                .filter(|i| from_frame(i, true))
                .map(|i| i.op1_register())
                .collect();
            let loaded: Vec<Register> = ins[call..ret]
                .iter()
                .filter(|i| from_frame(i, false))
                .map(|i| i.op0_register())
                .collect();
            (stored, loaded, &ins[call..ret])
        }
        use Register::*;
        let (_, ins) = stub(
            at,
            0x40_0000,
            &body(
                Vectors::XMM,
                Results {
                    rax: true,
                    rdx: false,
                    v0: true,
                    v1: false,
                    wide: false,
                },
            ),
        );
        let (stored, loaded, after) = stores_loads(&ins);
        assert_eq!(
            stored,
            [RCX, RDX, RSI, RDI, R8, R9, R10, R11, RBX, RCX, RCX]
        );
        assert_eq!(loaded, [RCX, RDX, RSI, RDI, R8, R9, R10, R11, RBX]);
        let xmm: Vec<Register> = after
            .iter()
            .filter(|i| i.mnemonic() == Mnemonic::Movdqu)
            .map(|i| i.op0_register())
            .collect();
        assert_eq!(xmm.len(), 15);
        assert!(!xmm.contains(&XMM0) && xmm.contains(&XMM1));

        // rdx a result: kept aside from the implementation, loaded from there.
        let r = Results {
            rax: false,
            rdx: true,
            v0: true,
            v1: true,
            wide: false,
        };
        for v in [YMM, ZMM] {
            let (_, ins) = stub(at, 0x40_0000, &body(v, r));
            let (_, loaded, after) = stores_loads(&ins);
            assert_eq!(
                loaded,
                [RCX, RCX, RDX, RSI, RDI, R8, R9, R10, R11, RBX],
                "rax too"
            );
            let rdx = after
                .iter()
                .find(|i| i.mnemonic() == Mnemonic::Mov && i.op0_register() == RDX)
                .unwrap();
            assert_eq!(rdx.memory_displacement64(), RDX_RESULT_AT as u64);
            let names: Vec<Mnemonic> = after.iter().map(|i| i.mnemonic()).collect();
            let x = names.iter().position(|m| *m == Mnemonic::Xrstor64).unwrap();
            // Around the xrstor, the results kept whole (zmm or ymm).
            let keep = match v.width {
                Width::Zmm => (Mnemonic::Vmovdqu64, [ZMM0, ZMM1]),
                _ => (Mnemonic::Vmovdqu, [YMM0, YMM1]),
            };
            let kept = |ins: &[Instruction]| {
                ins.iter()
                    .filter(|i| i.mnemonic() == keep.0)
                    .filter(|i| {
                        keep.1.contains(&i.op0_register()) || keep.1.contains(&i.op1_register())
                    })
                    .count()
            };
            assert_eq!(kept(&after[..x]), 2);
            assert_eq!(kept(&after[x..]), 2);
            assert!(names.contains(&Mnemonic::Stmxcsr) && names.contains(&Mnemonic::Ldmxcsr));
            let masks: Vec<u32> = after
                .iter()
                .filter(|i| i.mnemonic() == Mnemonic::Mov && i.op0_register() == EAX)
                .map(|i| i.immediate32())
                .collect();
            assert_eq!(masks, [v.mask as u32]);
            let save = match v.compact {
                true => Mnemonic::Xsavec64,
                false => Mnemonic::Xsave64,
            };
            assert!(ins.iter().any(|i| i.mnemonic() == save));
        }
    }

    /// The unwind entries: at the call, the caller's return address and
    /// rbx are found through rbx (the frame), with the landing pad in the
    /// LSDA; in the landing pad, on the stack; nowhere else.
    #[test]
    fn unwind_entries_lead_to_the_caller() {
        use gimli::{
            BaseAddresses, CfaRule, EhFrame, LittleEndian, Pointer, RegisterRule, UnwindContext,
            UnwindSection, X86_64 as R,
        };
        let l = Layout {
            call: 0x40_1100,
            back: 0x40_1106,
            pad: 0x40_1200,
            pad_end: 0x40_1214,
        };
        let base = 0x7000_0000u64;
        let personality = 0x7f00_1234_5678;
        let bytes = eh_frame(&l, personality, base);
        assert_eq!(eh_frame(&l, personality, 0).len(), bytes.len());
        let eh = EhFrame::new(&bytes, LittleEndian);
        let bases = BaseAddresses::default().set_eh_frame(base);
        let mut ctx = UnwindContext::new();
        let fde = eh
            .fde_for_address(&bases, l.back - 1, EhFrame::cie_from_offset)
            .unwrap();
        assert_eq!(fde.personality(), Some(Pointer::Direct(personality)));
        let Some(Pointer::Direct(lsda)) = fde.lsda() else {
            panic!("no LSDA")
        };
        let at = (lsda - base) as usize;
        let pad = ((l.pad - l.call) as u32).to_le_bytes();
        assert_eq!(
            bytes[at..],
            [0xff, 0xff, 3, 13, 0, 0, 0, 0, 6, 0, 0, 0, pad[0], pad[1], pad[2], pad[3], 0]
        );
        let row = fde
            .unwind_info_for_address(&eh, &bases, &mut ctx, l.back - 1)
            .unwrap();
        assert_eq!(
            *row.cfa(),
            CfaRule::RegisterAndOffset {
                register: R::RSP,
                offset: 0
            }
        );
        let through_rbx = |reg, disp: u8| match row.register(reg) {
            Some(RegisterRule::Expression(e)) => {
                let e = e.get(&eh).unwrap();
                assert_eq!(e.0.slice()[0], 0x73, "DW_OP_breg3");
                assert_eq!(e.0.slice()[1] & 0x7f, disp);
            }
            other => panic!("{other:?}"),
        };
        through_rbx(R::RA, 0);
        through_rbx(R::RBX, RBX_AT);

        let fde = eh
            .fde_for_address(&bases, l.pad_end - 1, EhFrame::cie_from_offset)
            .unwrap();
        assert_eq!(fde.lsda(), Some(Pointer::Direct(0)));
        let row = fde
            .unwind_info_for_address(&eh, &bases, &mut ctx, l.pad_end - 1)
            .unwrap();
        assert_eq!(
            *row.cfa(),
            CfaRule::RegisterAndOffset {
                register: R::RSP,
                offset: 16
            }
        );
        assert_eq!(row.register(R::RA), Some(RegisterRule::Offset(-8)));
        assert_eq!(row.register(R::RBX), Some(RegisterRule::Offset(-16)));
        for outside in [l.call - 1, l.back, l.pad - 1, l.pad_end] {
            assert!(eh
                .fde_for_address(&bases, outside, EhFrame::cie_from_offset)
                .is_err());
        }
    }

    /// What vector state an implementation's code may change.
    #[test]
    fn clobbers_are_the_vector_state_the_code_may_write() {
        let at = 0x1000u64;
        let c = |code: &[u8]| clobbers(at, &read_from(code, at));
        let none = Clobbers::NONE;
        let low = Clobbers {
            xmm: 1 << 3,
            ..Clobbers::NONE
        };
        assert_eq!(c(&[0x8d, 0x47, 0x01, 0xc3]), none, "lea eax,[rdi+1]; ret");
        assert_eq!(c(&[0x66, 0x0f, 0xef, 0xdb, 0xc3]), low, "pxor xmm3,xmm3");
        assert_eq!(c(&[0x0f, 0xae, 0x10, 0xc3]), none, "ldmxcsr [rax]");
        // vpxor xmm3,xmm3,xmm3 clears ymm3's upper half.
        let vex = c(&[0xc5, 0xe1, 0xef, 0xdb, 0xc3]);
        assert!(vex.wide && !vex.hi16, "{vex:?}");
        let zmm17 = [0x62, 0xa1, 0x75, 0x40, 0xef, 0xc9, 0xc3];
        for (code, what) in [
            (&zmm17[..], "vpxord zmm17"),
            (&[0xc5, 0xf4, 0x47, 0xc9, 0xc3][..], "kxorw k1"),
        ] {
            let got = c(code);
            assert!(got.wide && got.hi16 && got.xmm == 0, "{what}: {got:?}");
        }
        assert_eq!(c(&[0xff, 0xe0]), Clobbers::ALL, "jmp rax");
        // Through a call: call +1; ret; pxor xmm3,xmm3; ret
        let code = [0xe8, 1, 0, 0, 0, 0xc3, 0x66, 0x0f, 0xef, 0xdb, 0xc3];
        assert_eq!(c(&code), low);
        // Nothing to save: the stub has no vector code at all.
        let b = Body {
            clobbers: none,
            ..body(ZMM, Results::ALL)
        };
        let (_, ins) = stub(0x40_1000, 0x40_0000, &b);
        assert!(!ins.iter().any(|i| i.mnemonic() == Mnemonic::Xgetbv));
        assert!(!ins
            .iter()
            .any(|i| i.op0_register().is_xmm() || i.op1_register().is_xmm()));
    }

    /// Every vector width with every set of results fits.
    #[test]
    fn every_route_stub_fits() {
        for v in [Vectors::XMM, YMM, ZMM] {
            for k in 0..16 {
                let r = Results {
                    rax: k & 1 != 0,
                    rdx: k & 2 != 0,
                    v0: k & 4 != 0,
                    v1: k & 8 != 0,
                    wide: false,
                };
                let mut out = [0u8; ROUTE_STUB_LEN];
                emit(0x40_1000, &COUNTER, 1, 0x40_0000, &body(v, r), &mut out).unwrap();
            }
        }
    }

    fn read_from<'m>(code: &'m [u8], at: u64) -> impl Fn(u64, usize) -> Option<&'m [u8]> {
        move |a: u64, n: usize| {
            let o = a.checked_sub(at)? as usize;
            code.get(o..o.checked_add(n)?)
        }
    }

    /// What a function's code may write, followed through its calls,
    /// branches and pointers read through rip; all when unsure.
    #[test]
    fn results_are_the_registers_the_code_may_write() {
        let at = 0x1000u64;
        let r = |code: &[u8]| results(at, &read_from(code, at));
        // lea eax,[rdi+rsi]; ret
        assert_eq!(
            r(&[0x8d, 0x04, 0x37, 0xc3]),
            Results {
                rax: true,
                ..Results::default()
            }
        );
        // test edi,edi; je +3; xor edx,edx; ret; pxor xmm1,xmm1; ret
        let code = [
            0x85, 0xff, 0x74, 0x03, 0x31, 0xd2, 0xc3, 0x66, 0x0f, 0xef, 0xc9, 0xc3,
        ];
        assert_eq!(
            r(&code),
            Results {
                rdx: true,
                v1: true,
                ..Results::default()
            }
        );
        // call +1; ret; vzeroupper; ret: through the call
        assert_eq!(
            r(&[0xe8, 0x01, 0, 0, 0, 0xc3, 0xc5, 0xf8, 0x77, 0xc3]),
            Results {
                v0: true,
                v1: true,
                ..Results::default()
            }
        );
        // jmp rax; jmp rel32 out of the code; 0f 0b (ud2) ends a path
        assert_eq!(r(&[0xff, 0xe0]), Results::ALL);
        assert_eq!(r(&[0xe9, 0, 1, 0, 0]), Results::ALL);
        assert_eq!(r(&[0x0f, 0x0b]), Results::default());
        // jmp [rip+0]; dq at+14 -> mov edx,1; ret: through the pointer
        let mut code = vec![0xff, 0x25, 0, 0, 0, 0];
        code.extend_from_slice(&(at + 14).to_le_bytes());
        code.extend_from_slice(&[0xba, 1, 0, 0, 0, 0xc3]);
        assert_eq!(
            r(&code),
            Results {
                rdx: true,
                ..Results::default()
            }
        );
        // A loop: each instruction once. dec edi; jnz -4 (to itself); ret
        assert_eq!(r(&[0xff, 0xcf, 0x75, 0xfc, 0xc3]), Results::default());
        // syscall writes rax (and rcx, r11).
        assert_eq!(
            r(&[0x0f, 0x05, 0xc3]),
            Results {
                rax: true,
                ..Results::default()
            }
        );
    }

    /// Registers as the test's caller sets them and finds them: rax, rcx,
    /// rdx, rsi, rdi, r8-r11, then 16 vector registers (32 bytes each).
    #[repr(C)]
    struct State {
        gpr: [u64; 9],
        pad: u64,
        vec: [[u64; 4]; 16],
        /// zmm16's low quadword and k3 after the call (AVX-512 runs).
        extra: [u64; 2],
    }

    std::arch::global_asm!(
        ".pushsection .text.rtprof_test_route,\"ax\",@progbits",
        // (stub, state): loads every register from the state, calls the
        // stub with one stack argument (7), stores them back.
        "rtprof_test_drive_xmm:",
        "push rbx",
        "push rbp",
        "mov rbx, rdi",
        "mov rbp, rsi",
        ".irp i,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
        "movdqu xmm\\i, [rbp + 80 + 32*\\i]",
        ".endr",
        "call 5f",
        ".irp i,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
        "movdqu [rbp + 80 + 32*\\i], xmm\\i",
        ".endr",
        "jmp 6f",
        // The same with the upper halves in their initial state first,
        // or AVX-512 state in use.
        "rtprof_test_drive_clean:",
        "vzeroupper",
        "jmp rtprof_test_drive_xmm",
        // AVX-512: zmm16 and k3 all ones, kept across the call and
        // stored past the vectors; with the upper half of zmm2 in use too.
        "rtprof_test_drive_zmm_hi:",
        "vpternlogd zmm2, zmm2, zmm2, 0xff",
        "rtprof_test_drive_zmm:",
        "push rbx",
        "push rbp",
        "mov rbx, rdi",
        "mov rbp, rsi",
        "vpternlogd zmm16, zmm16, zmm16, 0xff",
        "kxnorq k3, k3, k3",
        ".irp i,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
        "vmovdqu ymm\\i, [rbp + 80 + 32*\\i]",
        ".endr",
        "call 5f",
        ".irp i,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
        "vmovdqu [rbp + 80 + 32*\\i], ymm\\i",
        ".endr",
        "vmovq [rbp + 592], xmm16",
        "kmovq [rbp + 600], k3",
        "jmp 6f",
        "rtprof_test_drive_ymm:",
        "push rbx",
        "push rbp",
        "mov rbx, rdi",
        "mov rbp, rsi",
        ".irp i,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
        "vmovdqu ymm\\i, [rbp + 80 + 32*\\i]",
        ".endr",
        "call 5f",
        ".irp i,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
        "vmovdqu [rbp + 80 + 32*\\i], ymm\\i",
        ".endr",
        "6:",
        "pop rbp",
        "pop rbx",
        "ret",
        // The call itself, general registers in and out.
        "5:",
        "mov rax, [rbp]",
        "mov rcx, [rbp + 8]",
        "mov rdx, [rbp + 16]",
        "mov rsi, [rbp + 24]",
        "mov rdi, [rbp + 32]",
        "mov r8, [rbp + 40]",
        "mov r9, [rbp + 48]",
        "mov r10, [rbp + 56]",
        "mov r11, [rbp + 64]",
        "push 7",
        "call rbx",
        "add rsp, 8",
        "mov [rbp], rax",
        "mov [rbp + 8], rcx",
        "mov [rbp + 16], rdx",
        "mov [rbp + 24], rsi",
        "mov [rbp + 32], rdi",
        "mov [rbp + 40], r8",
        "mov [rbp + 48], r9",
        "mov [rbp + 56], r10",
        "mov [rbp + 64], r11",
        "ret",
        // An implementation: rdi + its stack argument + al, every
        // call-clobbered register overwritten (vectors: all ones).
        "rtprof_test_clobber_xmm:",
        "movzx eax, al",
        "add rax, rdi",
        "add rax, [rsp + 8]",
        "mov rcx, -1",
        "mov rdx, -1",
        "mov rsi, -1",
        "mov rdi, -1",
        "mov r8, -1",
        "mov r9, -1",
        "mov r10, -1",
        "mov r11, -1",
        ".irp i,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
        "pcmpeqd xmm\\i, xmm\\i",
        ".endr",
        "ret",
        "rtprof_test_clobber_zmm:",
        ".irp i,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31",
        "vpxord zmm\\i, zmm\\i, zmm\\i",
        ".endr",
        "kxorq k3, k3, k3",
        "rtprof_test_clobber_ymm:",
        "movzx eax, al",
        "add rax, rdi",
        "add rax, [rsp + 8]",
        "mov rcx, -1",
        "mov rdx, -1",
        "mov rsi, -1",
        "mov rdi, -1",
        "mov r8, -1",
        "mov r9, -1",
        "mov r10, -1",
        "mov r11, -1",
        ".irp i,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
        "vpcmpeqd ymm\\i, ymm\\i, ymm\\i",
        ".endr",
        "ret",
        // A function's own code, where a call the stub cannot take goes.
        "rtprof_test_own:",
        "mov eax, 0xdead",
        "ret",
        ".popsection",
    );

    extern "C" {
        fn rtprof_test_drive_xmm(stub: u64, s: *mut State);
        fn rtprof_test_drive_ymm(stub: u64, s: *mut State);
        fn rtprof_test_drive_clean(stub: u64, s: *mut State);
        fn rtprof_test_drive_zmm(stub: u64, s: *mut State);
        fn rtprof_test_drive_zmm_hi(stub: u64, s: *mut State);
        fn rtprof_test_clobber_zmm();
        fn rtprof_test_clobber_xmm();
        fn rtprof_test_clobber_ymm();
        fn rtprof_test_own();
    }

    static OWN_CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    /// Executable memory for a stub, unmapped when dropped.
    struct Code(*mut u8);
    impl Code {
        fn at(&self) -> u64 {
            self.0 as u64
        }
    }
    impl Drop for Code {
        fn drop(&mut self) {
            // SAFETY: our own mapping, no longer run.
            unsafe { libc::munmap(self.0.cast(), 4096) };
        }
    }

    /// A route stub for the implementation at `target`, written for the
    /// page it will run in (the page is mapped first, then rewritten).
    /// Calls of the function's own code counted in `OWN_CALLS`.
    fn live_stub(
        target: u64,
        (vectors, clobbers): (Vectors, Clobbers),
        results: Results,
        count: &std::sync::atomic::AtomicU64,
    ) -> Code {
        let s = side_stack::setup();
        let b = Body {
            vectors,
            frame: s.frame.max(vectors.frame()),
            claim: s.claim,
            resume: _Unwind_Resume as *const () as u64,
            tls: tls::route_offset() as i32,
            results,
            clobbers,
            own: CounterRef {
                link: 0,
                local: 0,
                tls_offset: tls::offset() as i32,
                slot: 1,
                shared_counter: &OWN_CALLS as *const _ as u64,
                caller_hook: 0,
            },
        };
        let counter = CounterRef {
            link: 0,
            local: 0,
            tls_offset: tls::offset() as i32,
            slot: 0,
            shared_counter: count as *const _ as u64,
            caller_hook: 0,
        };
        // Written for an address in reach of the fallback (`jmp rel32`):
        // a page near it, found by asking for one there.
        let own = rtprof_test_own as *const () as u64;
        let mut out = vec![0u8; ROUTE_STUB_LEN];
        let page = (1..256u64)
            .find_map(|k| {
                let want = (own & !0xfff).wrapping_sub(k << 22);
                // SAFETY: a free page only (never one replaced).
                let p = unsafe {
                    libc::mmap(
                        want as *mut _,
                        4096,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                        -1,
                        0,
                    )
                };
                (p != libc::MAP_FAILED).then_some(p)
            })
            .expect("a free page near the test's code");
        let at = page as u64;
        emit(at, &counter, target, own, &b, &mut out).expect("own code in reach");
        // SAFETY: our page: written, then made executable.
        unsafe {
            std::ptr::copy_nonoverlapping(out.as_ptr(), page.cast(), out.len());
            assert_eq!(
                libc::mprotect(page, 4096, libc::PROT_READ | libc::PROT_EXEC),
                0
            );
        }
        Code(page.cast())
    }

    fn state() -> State {
        let mut s = State {
            gpr: [0; 9],
            pad: 0,
            vec: [[0; 4]; 16],
            extra: [0; 2],
        };
        for (i, g) in s.gpr.iter_mut().enumerate() {
            *g = 0x1000 + i as u64 * 0x111;
        }
        s.gpr[0] = 2; // al: vector arguments of a varargs call
        for (i, v) in s.vec.iter_mut().enumerate() {
            *v = [i as u64, 0x10 + i as u64, 0x20 + i as u64, 0x30 + i as u64];
        }
        s
    }

    /// Run through the stub, the implementation's result comes back and
    /// every other register is as the caller left it, vectors (ymm upper
    /// halves too) included; the call is counted; a thread whose side
    /// stack is none or full runs the function's own code.
    #[test]
    fn a_routed_call_changes_nothing_but_the_result() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let count = AtomicU64::new(0);
        let this = Vectors::of_this_cpu();
        let avx = is_x86_feature_detected!("avx2") && this.width != Width::Xmm;
        type Drive = unsafe extern "C" fn(u64, *mut State);
        // (vectors, driver, implementation, lanes compared)
        let mut runs: Vec<(
            (Vectors, Clobbers),
            Drive,
            unsafe extern "C" fn(),
            usize,
            bool,
        )> = vec![(
            (Vectors::XMM, Clobbers::ALL),
            rtprof_test_drive_xmm,
            rtprof_test_clobber_xmm,
            2,
            false,
        )];
        // An implementation with SSE instructions only: the xmm registers
        // it writes, one by one.
        let sse = Clobbers {
            xmm: 0xffff,
            ..Clobbers::NONE
        };
        runs.push((
            (this, sse),
            rtprof_test_drive_xmm,
            rtprof_test_clobber_xmm,
            2,
            false,
        ));
        let this = (this, Clobbers::ALL);
        if avx {
            runs.push((
                this,
                rtprof_test_drive_ymm,
                rtprof_test_clobber_ymm,
                4,
                false,
            ));
            // Only SSE in use: xmm0-15 saved; the upper halves the
            // implementation dirtied cleared again.
            runs.push((
                this,
                rtprof_test_drive_clean,
                rtprof_test_clobber_ymm,
                2,
                false,
            ));
        }
        let avx512 = avx && this.0.width == Width::Zmm && is_x86_feature_detected!("avx512f");
        if avx512 {
            // zmm16-31 and k0-7 in use, saved one by one; with the upper
            // halves of zmm0-15 in use too, by xsave.
            runs.push((
                this,
                rtprof_test_drive_zmm,
                rtprof_test_clobber_zmm,
                4,
                true,
            ));
            runs.push((
                this,
                rtprof_test_drive_zmm_hi,
                rtprof_test_clobber_zmm,
                4,
                true,
            ));
        }
        let results = Results {
            rax: true,
            rdx: false,
            v0: true,
            v1: false,
            wide: false,
        };
        for (k, &(v, drive_with, target, lanes, extra)) in runs.iter().enumerate() {
            // Nothing written by the function's own code: all restored.
            let code = live_stub(target as *const () as u64, v, Results::default(), &count);
            let mut s = state();
            // SAFETY: as below.
            unsafe { drive_with(code.at(), &mut s) };
            assert_eq!(s.gpr, state().gpr, "run {k}");
            for i in 0..16 {
                assert_eq!(
                    s.vec[i][..lanes],
                    state().vec[i][..lanes],
                    "run {k}: vector {i}"
                );
            }

            let code = live_stub(target as *const () as u64, v, results, &count);
            let drive = |s: &mut State| {
                // SAFETY: the stub runs the implementation (or the own
                // code), which keeps the callee-saved registers.
                unsafe { drive_with(code.at(), s) }
            };
            let before = count.load(Ordering::Relaxed);
            for round in 0..3 {
                let mut s = state();
                let want = state();
                drive(&mut s);
                assert_eq!(s.gpr[0], 2 + want.gpr[4] + 7, "{v:?} round {round}: rax");
                assert_eq!(s.gpr[1..], want.gpr[1..], "{v:?}: rdx and the rest kept");
                assert_eq!(s.vec[0][..2], [u64::MAX; 2], "{v:?}: xmm0 is a result");
                if extra {
                    assert_eq!(s.extra, [u64::MAX; 2], "run {k}: zmm16, k3");
                }
                for i in 1..16 {
                    assert_eq!(s.vec[i][..lanes], want.vec[i][..lanes], "{v:?}: vector {i}");
                }
            }
            assert_eq!(count.load(Ordering::Relaxed) - before, 3);
            // Balanced: the side stack's top is where it was.
            let top = tls::route_offset();
            let (t, l) = (tls::load(top), tls::load(top + 8));
            assert!(t > 1 && l > t, "{t:#x} {l:#x}");
            // None to have, or full: the function's own code, counted in
            // its own row, not the implementation's.
            let (ours, theirs) = (
                count.load(Ordering::Relaxed),
                OWN_CALLS.load(Ordering::Relaxed),
            );
            for (nt, nl) in [(1, 0), (l, l)] {
                tls::store(top, nt);
                tls::store(top + 8, nl);
                let mut s = state();
                drive(&mut s);
                assert_eq!(s.gpr[0], 0xdead);
                assert_eq!(tls::load(top), nt);
            }
            assert_eq!(count.load(Ordering::Relaxed), ours);
            assert_eq!(OWN_CALLS.load(Ordering::Relaxed), theirs + 2);
            tls::store(top, t);
            tls::store(top + 8, l);
        }
    }
}
