//! The side stacks of route stubs: one per thread, where a routed call
//! keeps what its caller must find again (the return address, the
//! call-clobbered registers, the vector state) while the implementation
//! runs on the program's stack, untouched. A thread's stack is reached by
//! the stub through two words of static TLS (`tls::route_offset`): the top
//! (where the next frame goes) and the limit (a frame must start below it).
//!
//! A thread gets its stack at its first routed call: the stub finds both
//! words 0 and calls [`rtprof_route_claim`], which saves every register
//! and takes a stack from a fixed pool (mapped once, reused after its
//! thread ends: a pthread key's destructor gives it back). A thread that
//! can have none (the pool is used up, no memory, a seccomp filter that
//! may forbid `mmap`) is marked (top 1, limit 0), and its routed calls run
//! the function's own code, as a call too deep for its stack does.

use super::tls;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Bytes of one thread's side stack (reserved, backed only as used).
pub const SIZE: usize = 1 << 20;
/// Side stacks at most, at once.
const STACKS: usize = 4096;
/// Bytes of a frame before its vector area (see `route::put_body`).
pub const HEADER: u32 = 256;
/// Top of a thread that can have no side stack (limit 0): every routed
/// call of it falls back.
const NONE: u64 = 1;

/// How far the vector registers reach, for a result kept across the
/// restore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    /// SSE only: xmm0-15, saved one by one.
    Xmm,
    /// AVX: ymm, saved with `xsave`.
    Ymm,
    /// AVX-512: zmm0-31 and the mask registers, saved with `xsave`.
    Zmm,
}

/// How this process's vector state is saved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vectors {
    /// The `xsave` components (0: xmm0-15 one by one, without `xsave`).
    pub mask: u64,
    /// Bytes of the save area (a multiple of 64).
    pub area: u32,
    pub width: Width,
    /// `xsavec` is there: components in their initial state (the upper
    /// halves after `vzeroupper`, AVX-512 in a program that uses none)
    /// are not written, nor read back (`xrstor` takes either form).
    pub compact: bool,
    /// `xgetbv 1` is there: which components are in use, per call.
    pub tiers: bool,
}

/// `xsave` components saved: SSE (xmm, MXCSR), AVX (ymm upper halves),
/// AVX-512 (mask registers, zmm upper halves, zmm16-31). Not x87 (its
/// stack is empty at a call, and a `long double` result lives there), not
/// PKRU, not AMX tiles (which a process must ask the kernel for).
const SAVED: u64 = 0b1110_0110;

impl Vectors {
    /// Vectors only by their 16 xmm registers (no AVX).
    pub const XMM: Vectors = Vectors {
        mask: 0,
        area: 256,
        width: Width::Xmm,
        compact: false,
        tiers: false,
    };

    /// This machine's, as the kernel enabled them (XCR0).
    pub fn of_this_cpu() -> Vectors {
        use std::arch::x86_64::__cpuid_count;
        let osxsave = __cpuid_count(1, 0).ecx & (1 << 27) != 0;
        if !osxsave {
            return Vectors::XMM;
        }
        let (lo, hi): (u32, u32);
        // SAFETY: `xgetbv` with ecx 0 reads XCR0; the OS enabled it
        // (OSXSAVE), and it touches nothing else.
        unsafe {
            std::arch::asm!("xgetbv", in("ecx") 0, out("eax") lo, out("edx") hi,
                options(nomem, nostack, preserves_flags))
        };
        let xcr0 = (hi as u64) << 32 | lo as u64;
        let mask = xcr0 & SAVED;
        if mask & 0b110 != 0b110 {
            return Vectors::XMM;
        }
        // The standard form: the legacy area and the header (576 bytes),
        // then each component at its offset.
        let mut end = 576;
        for c in 2..8 {
            if mask & (1 << c) != 0 {
                let r = __cpuid_count(0xd, c);
                end = end.max(r.ebx + r.eax);
            }
        }
        let width = if mask & 0b1110_0000 == 0b1110_0000 {
            Width::Zmm
        } else {
            Width::Ymm
        };
        Vectors {
            mask,
            area: end.next_multiple_of(64),
            width,
            compact: __cpuid_count(0xd, 1).eax & 2 != 0,
            tiers: __cpuid_count(0xd, 1).eax & 4 != 0,
        }
    }

    /// Bytes of one side stack frame.
    pub fn frame(&self) -> u32 {
        HEADER + self.area
    }
}

/// This process's vector saving and frame, set up once.
pub struct Setup {
    pub vectors: Vectors,
    pub frame: u32,
    /// The address route stubs call for a thread's first side stack.
    pub claim: u64,
}

static SETUP: OnceLock<Setup> = OnceLock::new();

/// Read by [`rtprof_route_claim`]: the `xsave` mask (0: none) and its
/// area's bytes (at least 576, for the header it clears).
static CLAIM_MASK: AtomicU64 = AtomicU64::new(0);
static CLAIM_AREA: AtomicU64 = AtomicU64::new(576);
/// The frame's bytes, for the limit a claim sets.
static FRAME: AtomicU64 = AtomicU64::new(0);
/// pthread key whose destructor gives a thread's side stack back.
static KEY: AtomicUsize = AtomicUsize::new(usize::MAX);
static STACK: [AtomicPtr<u8>; STACKS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; STACKS];
static IN_USE: [AtomicBool; STACKS] = [const { AtomicBool::new(false) }; STACKS];

/// The setup, made at the first route stub (not in a signal handler:
/// route stubs are written under the agent's lock).
pub fn setup() -> &'static Setup {
    SETUP.get_or_init(|| {
        let vectors = Vectors::of_this_cpu();
        let frame = vectors.frame();
        CLAIM_MASK.store(vectors.mask, Ordering::Relaxed);
        CLAIM_AREA.store(vectors.area.max(576) as u64, Ordering::Relaxed);
        FRAME.store(frame as u64, Ordering::Release);
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: `key` is ours to write; the destructor is an extern "C"
        // fn that lives as long as the library.
        if unsafe { libc::pthread_key_create(&mut key, Some(give_back)) } == 0 {
            KEY.store(key as usize, Ordering::Release);
        }
        Setup {
            vectors,
            frame,
            claim: rtprof_route_claim as *const () as u64,
        }
    })
}

/// Gives this thread a side stack, or marks it as having none: called by
/// [`rtprof_route_claim`], every register saved, when both its words are 0.
extern "C" fn claim() {
    let top = tls::route_offset();
    if tls::load(top) != 0 {
        return;
    }
    // Marked first: a routed call in a signal handler that interrupts
    // this one falls back rather than claim a second stack.
    tls::store(top, NONE);
    tls::store(top + 8, 0);
    let frame = FRAME.load(Ordering::Acquire);
    if frame == 0 || crate::lifecycle::sandbox::on() {
        return;
    }
    let Some(i) = (0..STACKS).find(|&i| {
        IN_USE[i]
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }) else {
        return;
    };
    let mut p = STACK[i].load(Ordering::Acquire);
    if p.is_null() {
        // SAFETY: a fresh private anonymous mapping, nothing replaced.
        let m = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if m == libc::MAP_FAILED {
            IN_USE[i].store(false, Ordering::Release);
            return;
        }
        p = m.cast();
        STACK[i].store(p, Ordering::Release);
    }
    let key = KEY.load(Ordering::Acquire);
    if key != usize::MAX {
        // SAFETY: a key we created; the value is the stack's index plus
        // one, read back by the destructor only.
        unsafe { libc::pthread_setspecific(key as libc::pthread_key_t, (i + 1) as *const _) };
    }
    let base = p as u64;
    tls::store(top + 8, base + SIZE as u64 - frame + 1);
    tls::store(top, base);
}

/// At a thread's end: its side stack goes back to the pool, and its later
/// routed calls (other destructors) run their functions' own code.
unsafe extern "C" fn give_back(v: *mut libc::c_void) {
    let top = tls::route_offset();
    tls::store(top, NONE);
    tls::store(top + 8, 0);
    if let Some(used) = (v as usize).checked_sub(1).and_then(|i| IN_USE.get(i)) {
        used.store(false, Ordering::Release);
    }
}

extern "C" {
    /// Saves every register but rax (the vector state with `xsave`, or
    /// xmm0-15), calls [`claim`] on a 64-byte aligned stack, restores them.
    fn rtprof_route_claim();
}

std::arch::global_asm!(
    ".pushsection .text.rtprof_route_claim,\"ax\",@progbits",
    ".p2align 4",
    ".globl rtprof_route_claim",
    ".hidden rtprof_route_claim",
    ".type rtprof_route_claim, @function",
    "rtprof_route_claim:",
    "push rbp",
    "mov rbp, rsp",
    "push rcx",
    "push rdx",
    "push rsi",
    "push rdi",
    "push r8",
    "push r9",
    "push r10",
    "push r11",
    "and rsp, -64",
    "sub rsp, qword ptr [rip + {area}]",
    "mov rax, qword ptr [rip + {mask}]",
    "test rax, rax",
    "jz 2f",
    // xrstor wants the header past XSTATE_BV clear; xsave writes only it.
    "xor ecx, ecx",
    "mov qword ptr [rsp + 512], rcx",
    "mov qword ptr [rsp + 520], rcx",
    "mov qword ptr [rsp + 528], rcx",
    "mov qword ptr [rsp + 536], rcx",
    "mov qword ptr [rsp + 544], rcx",
    "mov qword ptr [rsp + 552], rcx",
    "mov qword ptr [rsp + 560], rcx",
    "mov qword ptr [rsp + 568], rcx",
    "mov rdx, rax",
    "shr rdx, 32",
    "xsave64 [rsp]",
    "call {claim}",
    "mov rax, qword ptr [rip + {mask}]",
    "mov rdx, rax",
    "shr rdx, 32",
    "xrstor64 [rsp]",
    "jmp 3f",
    "2:",
    "movdqu [rsp], xmm0",
    "movdqu [rsp + 16], xmm1",
    "movdqu [rsp + 32], xmm2",
    "movdqu [rsp + 48], xmm3",
    "movdqu [rsp + 64], xmm4",
    "movdqu [rsp + 80], xmm5",
    "movdqu [rsp + 96], xmm6",
    "movdqu [rsp + 112], xmm7",
    "movdqu [rsp + 128], xmm8",
    "movdqu [rsp + 144], xmm9",
    "movdqu [rsp + 160], xmm10",
    "movdqu [rsp + 176], xmm11",
    "movdqu [rsp + 192], xmm12",
    "movdqu [rsp + 208], xmm13",
    "movdqu [rsp + 224], xmm14",
    "movdqu [rsp + 240], xmm15",
    "call {claim}",
    "movdqu xmm0, [rsp]",
    "movdqu xmm1, [rsp + 16]",
    "movdqu xmm2, [rsp + 32]",
    "movdqu xmm3, [rsp + 48]",
    "movdqu xmm4, [rsp + 64]",
    "movdqu xmm5, [rsp + 80]",
    "movdqu xmm6, [rsp + 96]",
    "movdqu xmm7, [rsp + 112]",
    "movdqu xmm8, [rsp + 128]",
    "movdqu xmm9, [rsp + 144]",
    "movdqu xmm10, [rsp + 160]",
    "movdqu xmm11, [rsp + 176]",
    "movdqu xmm12, [rsp + 192]",
    "movdqu xmm13, [rsp + 208]",
    "movdqu xmm14, [rsp + 224]",
    "movdqu xmm15, [rsp + 240]",
    "3:",
    "lea rsp, [rbp - 64]",
    "pop r11",
    "pop r10",
    "pop r9",
    "pop r8",
    "pop rdi",
    "pop rsi",
    "pop rdx",
    "pop rcx",
    "pop rbp",
    "ret",
    ".size rtprof_route_claim, . - rtprof_route_claim",
    ".popsection",
    area = sym CLAIM_AREA,
    mask = sym CLAIM_MASK,
    claim = sym claim,
);
