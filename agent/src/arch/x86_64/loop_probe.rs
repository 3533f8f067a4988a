//! Loop probes: a stretch of one basic block of a loop (at its header, or
//! ending with a branch back to it) whose bytes a `jmp rel32` to a probe
//! takes over. The probe counts, runs the moved instructions, and sends
//! each way out of the block on: a branch back to a counted loop's header
//! is counted and goes to that header's probe past its count; every other
//! way goes to its original address.
//!
//! ```text
//! probe:  [count arrivals]               ; a header's window only
//! body:   <moved instructions>           ; rip-relative operands re-aimed
//!         jcc  taken                     ; the block's conditional branch
//!         <way on: fall through>
//! taken:  <way on: the branch's target>
//! way on: [count] ; jmp header's body    (a branch back)
//!         [count] ; jmp original         (any other way)
//! count:  lea  rsp, [rsp-128]            ; step over the red zone
//!         push rcx
//!         pushfq                         ; only if the flags are live
//!         mov  rcx, fs:[loops]           ; this thread's counters, or 0
//!         test rcx, rcx
//!         jnz  own
//!         mov  rcx, &shared ; lock inc qword [rcx]   ; per counter
//!         jmp  done
//! own:    inc  qword [rcx + number*8]    ; per counter: no atomic needed
//! done:   popfq
//!         pop  rcx
//!         lea  rsp, [rsp+128]
//! ```
//!
//! Unlike a function's entry, a loop's header may see live flags and any
//! live register: the count saves what it touches, and the flags too
//! unless the header's code sets them before it reads them.

use super::emit::{Emitter, Label};
use super::window::jcc_code;
use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register, RflagsBits,
};
use rtprof_abi::loops::LoopRefusal;

/// Bytes of a `jmp rel32`.
const JMP: usize = 5;
/// Bytes of a `jcc rel32`.
const JCC: usize = 6;
/// Bytes of a count without its counters, and per counter: the shared
/// path's `mov rcx, imm64; lock inc` and the own path's `inc [rcx+d32]`.
const COUNT: usize = 31;
const PER_COUNTER: usize = 21;
/// `pushfq` and `popfq`.
const FLAGS: usize = 2;
/// The SysV red zone below `rsp`.
const RED_ZONE: i32 = 128;
/// Longest window: a whole short block.
const MAX_WINDOW: u64 = 64;

/// Which of a range's instructions a window takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Span {
    /// The fewest from its start (through conditional branches: a header's
    /// short block and the blocks it runs on into).
    Head,
    /// The fewest up to its end, in one block.
    Tail,
    /// All of one block.
    Whole,
}

/// How a window ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Last {
    /// Before its block's branch, or with a block that runs on into the
    /// next: control goes on at the window's end.
    Falls,
    /// With a conditional branch at `from` (condition code `cc`).
    Cond { cc: u8, from: u64, target: u64 },
    /// With an unconditional direct jump at `from`.
    Jump { from: u64, target: u64 },
}

/// One instruction a window moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Piece {
    /// Moved as it is: its offset in the window, length, and the offset
    /// of its rip-relative disp32 in it (0 for none).
    Insn { off: u8, len: u8, disp: u8 },
    /// A conditional branch out of a header's short block, at `from`, in
    /// a window that goes on into the block after it.
    Exit { cc: u8, from: u64, target: u64 },
}

/// The bytes of one block (or of a header's short block and the block it
/// runs on into) that a probe takes over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoopWindow {
    /// First byte (where the jump goes) and past the last.
    pub at: u64,
    pub end: u64,
    pub last: Last,
    bytes: Vec<u8>,
    pieces: Vec<Piece>,
    /// Address of the last instruction taken.
    last_at: u64,
}

/// One counter a probe bumps: its number in a thread's array (reached
/// from the thread-local pointer), and its address in the shared array
/// (for a thread without one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeCounter {
    pub number: u32,
    pub shared: u64,
}

/// Where one way out of a probe goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Way {
    /// To its original address.
    To(u64),
    /// Counted at each of `counters`, then on to `to` (for a branch back,
    /// the header probe's body, past its count of arrivals).
    Counted {
        counters: Vec<ProbeCounter>,
        to: u64,
    },
}

impl LoopWindow {
    /// The bytes it takes, as the file has them.
    pub fn original(&self) -> &[u8] {
        &self.bytes
    }

    /// The ways out of the window, as (address of the instruction that
    /// takes it, where to): branches out of the middle first, then the
    /// last instruction's target and the address after the window.
    pub fn ways(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self
            .pieces
            .iter()
            .filter_map(|p| match *p {
                Piece::Exit { from, target, .. } => Some((from, target)),
                Piece::Insn { .. } => None,
            })
            .collect();
        match self.last {
            Last::Falls => v.push((self.last_at, self.end)),
            Last::Cond { from, target, .. } => v.extend([(from, target), (from, self.end)]),
            Last::Jump { from, target } => v.push((from, target)),
        }
        v
    }
}

/// The instructions of [lo, hi) in `code` (which starts at `code_start`),
/// with their constant offsets; `None` if they do not decode exactly.
fn decode_block(code: &[u8], code_start: u64, lo: u64, hi: u64) -> Option<Vec<Instruction>> {
    let from = usize::try_from(lo.checked_sub(code_start)?).ok()?;
    let to = usize::try_from(hi.checked_sub(code_start)?).ok()?;
    let mut d = Decoder::with_ip(64, code.get(from..to)?, lo, DecoderOptions::NONE);
    let mut out = Vec::new();
    while d.can_decode() {
        let i = d.decode();
        if i.is_invalid() {
            return None;
        }
        out.push(i);
    }
    (out.last()?.next_ip() == hi).then_some(out)
}

fn is_near(i: &Instruction) -> bool {
    i.op0_kind() == OpKind::NearBranch64
}

/// The window at the start (`head`) or end of [lo, hi): the fewest whole
/// instructions that hold a `jmp rel32`. A tail window is in one block; a
/// head window may run through conditional branches (the range is then a
/// header's short block and the blocks it runs on into, which nothing
/// else enters).
pub fn window(
    code: &[u8],
    code_start: u64,
    lo: u64,
    hi: u64,
    span: Span,
) -> Result<LoopWindow, LoopRefusal> {
    let head = span == Span::Head;
    let short = if head {
        LoopRefusal::ShortHeader
    } else {
        LoopRefusal::ShortLatch
    };
    let insns = decode_block(code, code_start, lo, hi).ok_or(LoopRefusal::Undecoded)?;
    let n = insns.len();
    // Which instructions the window takes: [first, past).
    let (first, past) = match span {
        Span::Head => {
            let mut k = 0;
            while k < n && insns[k].ip() < lo + JMP as u64 {
                k += 1;
            }
            (0, k)
        }
        Span::Tail => {
            let mut k = n;
            while k > 0 && hi - insns[k - 1].ip() < JMP as u64 {
                k -= 1;
            }
            if k == 0 {
                return Err(short);
            }
            (k - 1, n)
        }
        Span::Whole => (0, n),
    };
    let at = insns[first].ip();
    let end = if past == n { hi } else { insns[past].ip() };
    if end - at < JMP as u64 || end - at > MAX_WINDOW {
        return Err(short);
    }
    let mut pieces = Vec::new();
    let mut last = Last::Falls;
    for (k, i) in insns.iter().enumerate().take(past).skip(first) {
        let final_one = k == n - 1;
        let near = is_near(i);
        match i.flow_control() {
            FlowControl::Next => {
                let raw =
                    &code[(i.ip() - code_start) as usize..(i.next_ip() - code_start) as usize];
                let disp = if i.is_ip_rel_memory_operand() {
                    let mut d = Decoder::with_ip(64, raw, i.ip(), DecoderOptions::NONE);
                    let again = d.decode();
                    let c = d.get_constant_offsets(&again);
                    if c.displacement_size() != 4 {
                        return Err(LoopRefusal::Unmovable);
                    }
                    c.displacement_offset() as u8
                } else {
                    0
                };
                pieces.push(Piece::Insn {
                    off: (i.ip() - at) as u8,
                    len: i.len() as u8,
                    disp,
                });
            }
            FlowControl::ConditionalBranch if near && (final_one || head) => {
                let cc = jcc_code(i.condition_code()).ok_or(LoopRefusal::Unmovable)?;
                let (from, target) = (i.ip(), i.near_branch_target());
                if final_one {
                    last = Last::Cond { cc, from, target };
                } else {
                    pieces.push(Piece::Exit { cc, from, target });
                }
            }
            FlowControl::UnconditionalBranch if near && final_one => {
                last = Last::Jump {
                    from: i.ip(),
                    target: i.near_branch_target(),
                };
            }
            _ => return Err(LoopRefusal::Unmovable),
        }
    }
    let from = (at - code_start) as usize;
    Ok(LoopWindow {
        at,
        end,
        last,
        bytes: code[from..from + (end - at) as usize].to_vec(),
        pieces,
        last_at: insns[past - 1].ip(),
    })
}

/// Whether the block [lo, hi) only does arithmetic on registers and the
/// frame's locals, then jumps or runs on into the next block: once entered,
/// it surely leaves by its end (no call, no access through a pointer,
/// nothing that traps).
pub fn block_plain(code: &[u8], code_start: u64, lo: u64, hi: u64) -> bool {
    let Some(insns) = decode_block(code, code_start, lo, hi) else {
        return false;
    };
    // Its last instruction a direct jump, or it runs on into the next block.
    let before = match insns.split_last() {
        Some((last, before))
            if last.flow_control() == FlowControl::UnconditionalBranch && is_near(last) =>
        {
            before
        }
        Some(_) => &insns[..],
        None => return false,
    };
    before.iter().all(|i| {
        i.flow_control() == FlowControl::Next
            && (0..i.op_count()).all(|k| match i.op_kind(k) {
                OpKind::Register => true,
                // A local in the frame (`addl $1,-8(%rbp)` at -O0).
                OpKind::Memory => {
                    matches!(i.memory_base(), Register::RBP | Register::RSP)
                        && i.memory_index() == Register::None
                }
                k => is_immediate(k),
            })
            && !matches!(
                i.mnemonic(),
                Mnemonic::Div | Mnemonic::Idiv | Mnemonic::Push | Mnemonic::Pop
            )
    })
}

fn is_immediate(k: OpKind) -> bool {
    matches!(
        k,
        OpKind::Immediate8
            | OpKind::Immediate8_2nd
            | OpKind::Immediate16
            | OpKind::Immediate32
            | OpKind::Immediate64
            | OpKind::Immediate8to16
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32to64
    )
}

/// Whether the flags may be live at `at`, the first byte of block [at,
/// hi): true unless an instruction of the block sets every status flag
/// before any instruction reads one.
pub fn flags_live(code: &[u8], code_start: u64, at: u64, hi: u64) -> bool {
    const STATUS: u32 = RflagsBits::OF
        | RflagsBits::SF
        | RflagsBits::ZF
        | RflagsBits::AF
        | RflagsBits::CF
        | RflagsBits::PF;
    let Some(insns) = decode_block(code, code_start, at, hi) else {
        return true;
    };
    let mut set = 0;
    for i in &insns {
        if i.rflags_read() & !set & STATUS != 0 {
            return true;
        }
        set |= i.rflags_written() | i.rflags_cleared() | i.rflags_set() | i.rflags_undefined();
        if set & STATUS == STATUS {
            return false;
        }
    }
    true
}

fn count_len(counters: usize, flags: bool) -> usize {
    COUNT + counters * PER_COUNTER + flags as usize * FLAGS
}

fn way_len(w: &Way, flags: bool) -> usize {
    match w {
        Way::To(_) => JMP,
        Way::Counted { counters, .. } => count_len(counters.len(), flags) + JMP,
    }
}

/// Bytes of the probe for `w` (`head`: with a count of entries; `ways`
/// as [`LoopWindow::ways`]; `flags`: counts save the flags).
pub fn probe_len(w: &LoopWindow, head: bool, ways: &[Way], flags: bool) -> usize {
    let pieces: usize = w
        .pieces
        .iter()
        .map(|p| match p {
            Piece::Insn { len, .. } => *len as usize,
            Piece::Exit { .. } => JCC,
        })
        .sum();
    let jcc = matches!(w.last, Last::Cond { .. }) as usize * JCC;
    let ways: usize = ways.iter().map(|x| way_len(x, flags)).sum();
    head as usize * count_len(1, flags) + pieces + jcc + ways
}

/// A probe being written: the one emitter, and the thread pointer's
/// offset of the thread's loop counters pointer (from `fs`).
struct Out<'e, 'b> {
    e: &'e mut Emitter<'b>,
    tls: i32,
}

impl Out<'_, '_> {
    /// Counts one arrival in each of `counters`: in the thread's own
    /// counters, or atomically in the shared ones for a thread without.
    fn count(&mut self, counters: &[ProbeCounter], flags: bool) {
        let e = &mut *self.e;
        let (own, done) = (e.label(), e.label());
        e.put(&[0x48, 0x8d, 0x64, 0x24, (-RED_ZONE) as u8]); // lea rsp,[rsp-128]
        e.put(&[0x51]); // push rcx
        if flags {
            e.put(&[0x9c]); // pushfq
        }
        e.put(&[0x64, 0x48, 0x8b, 0x0c, 0x25]); // mov rcx, fs:[disp32]
        e.put_i32(self.tls);
        e.put(&[0x48, 0x85, 0xc9]); // test rcx, rcx
        e.jnz_short(own);
        for c in counters {
            e.put(&[0x48, 0xb9]); // mov rcx, imm64
            e.put_u64(c.shared);
            e.put(&[0xf0, 0x48, 0xff, 0x01]); // lock inc qword [rcx]
        }
        e.jmp_short(done);
        e.bind(own);
        for c in counters {
            e.put(&[0x48, 0xff, 0x81]); // inc qword [rcx+disp32]
            match i32::try_from(c.number as u64 * 8) {
                Ok(d) => e.put_i32(d),
                Err(_) => e.fail(),
            }
        }
        e.bind(done);
        if flags {
            e.put(&[0x9d]); // popfq
        }
        e.put(&[0x59]); // pop rcx
        e.put(&[0x48, 0x8d, 0xa4, 0x24]); // lea rsp,[rsp+128]
        e.put_i32(RED_ZONE);
    }

    fn way(&mut self, w: &Way, flags: bool) {
        match w {
            Way::To(to) => self.e.jmp_to(*to),
            Way::Counted { counters, to } => {
                self.count(counters, flags);
                self.e.jmp_to(*to)
            }
        }
    }
}

/// Writes the probe for `w` to run at `at` into `out` (at least
/// [`probe_len`] bytes), its counts reaching a thread's counters at `tls`
/// from `fs`; returns where its body starts (past the count of
/// arrivals), or `None` if a target is out of reach.
pub fn emit_probe(
    w: &LoopWindow,
    at: u64,
    head: Option<ProbeCounter>,
    ways: &[Way],
    flags: bool,
    tls: i32,
    out: &mut [u8],
) -> Option<u64> {
    let len = probe_len(w, head.is_some(), ways, flags);
    let mut e = Emitter::new(out.get_mut(..len)?, at);
    let mut o = Out { e: &mut e, tls };
    if let Some(c) = head {
        o.count(&[c], flags);
    }
    let body = o.e.here();
    // Branches out of the middle, to their ways placed after the end.
    let mut exits: Vec<Label> = Vec::new();
    for p in &w.pieces {
        match *p {
            Piece::Insn { off, len, disp } => {
                let start = o.e.offset();
                o.e.put(&w.bytes[off as usize..(off + len) as usize]);
                if disp != 0 {
                    let field = start + disp as usize;
                    let now = at + (start + len as usize) as u64;
                    let code = o.e.written_mut();
                    let old = i32::from_le_bytes(code.get(field..field + 4)?.try_into().ok()?);
                    // The operand's address, from where the instruction was.
                    let target = (w.at + off as u64 + len as u64).wrapping_add(old as i64 as u64);
                    let rel = i32::try_from(target as i64 - now as i64).ok()?;
                    code[field..field + 4].copy_from_slice(&rel.to_le_bytes());
                }
            }
            Piece::Exit { cc, .. } => {
                let l = o.e.label();
                o.e.jcc(cc, l);
                exits.push(l);
            }
        }
    }
    let (mid, last) = ways.split_at_checked(exits.len())?;
    match (w.last, last) {
        (Last::Cond { cc, .. }, [taken, fall]) => {
            // jcc over the fall-through way to the taken one.
            let l = o.e.label();
            o.e.jcc(cc, l);
            o.way(fall, flags);
            o.e.bind(l);
            o.way(taken, flags);
        }
        (Last::Falls | Last::Jump { .. }, [only]) => o.way(only, flags),
        _ => return None,
    }
    for (l, way) in exits.into_iter().zip(mid) {
        o.e.bind(l);
        o.way(way, flags);
    }
    (e.finish()? == len).then_some(body)
}

/// How far a probe's code before `ip` moved the stack pointer, for the
/// probe's bytes `code` from its first byte up to `ip` (negative: below
/// where the window's code has it). Its counts step over the red zone and
/// save registers; the moved code runs with the stack as it was.
pub fn sp_shift(code: &[u8], start: u64) -> i64 {
    let mut shift = 0i64;
    for i in Decoder::with_ip(64, code, start, DecoderOptions::NONE) {
        match i.mnemonic() {
            Mnemonic::Push | Mnemonic::Pushfq => shift -= 8,
            Mnemonic::Pop | Mnemonic::Popfq => shift += 8,
            Mnemonic::Lea
                if i.op0_register() == Register::RSP && i.memory_base() == Register::RSP =>
            {
                shift += i.memory_displacement64() as i64;
            }
            _ => {}
        }
    }
    shift
}

/// The `jmp rel32` that sends the window to its probe at `probe`, the
/// window's other bytes traps (nothing runs them).
pub fn window_patch(w: &LoopWindow, probe: u64) -> Option<Vec<u8>> {
    let rel = i32::try_from(probe as i64 - (w.at + JMP as u64) as i64).ok()?;
    let mut b = vec![0xcc; (w.end - w.at) as usize];
    b[0] = 0xe9;
    b[1..JMP].copy_from_slice(&rel.to_le_bytes());
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    // A loop: 0: mov eax,[rip+0x100] (6); 6: add ecx,eax (2);
    // 8: cmp ecx,edx (2); 10: jne 0 (2). One block of 12 bytes.
    const LOOP: [u8; 12] = [
        0x8b, 0x05, 0x00, 0x01, 0x00, 0x00, 0x01, 0xc1, 0x39, 0xd1, 0x75, 0xf4,
    ];

    #[test]
    fn head_and_tail_windows_take_the_fewest_whole_instructions() {
        let base = 0x40_0000;
        let head = window(&LOOP, base, base, base + 12, Span::Head).unwrap();
        assert_eq!(
            (head.at, head.end, head.last),
            (base, base + 6, Last::Falls)
        );
        assert_eq!(head.ways(), [(base, base + 6)]);
        let tail = window(&LOOP, base, base, base + 12, Span::Tail).unwrap();
        let jne = Last::Cond {
            cc: 5,
            from: base + 10,
            target: base,
        };
        assert_eq!((tail.at, tail.end, tail.last), (base + 6, base + 12, jne));
        assert_eq!(tail.ways(), [(base + 10, base), (base + 10, base + 12)]);
        // A 4-byte block (add ecx,eax; jne back) holds no jump.
        let short = [0x01, 0xc1, 0x75, 0xfc];
        let w = window(&short, base, base, base + 4, Span::Head);
        assert_eq!(w.unwrap_err(), LoopRefusal::ShortHeader);
        // add rcx,1; cmp ecx,edx; jne back: the head stops before the
        // branch, the tail takes the whole block (and so serves as both).
        let code = [0x48, 0x83, 0xc1, 0x01, 0x39, 0xd1, 0x75, 0xf8];
        let head = window(&code, base, base, base + 8, Span::Head).unwrap();
        assert_eq!(
            (head.at, head.end, head.last),
            (base, base + 6, Last::Falls)
        );
        let tail = window(&code, base, base, base + 8, Span::Tail).unwrap();
        assert_eq!((tail.at, tail.end), (base, base + 8));
        assert_eq!(
            tail.last,
            Last::Cond {
                cc: 5,
                from: base + 6,
                target: base
            }
        );
        // add ecx,eax; cmp; jne: 6 bytes, the head takes them whole.
        let code = [0x01, 0xc1, 0x39, 0xd1, 0x75, 0xfa];
        let whole = window(&code, base, base, base + 6, Span::Head).unwrap();
        assert_eq!((whole.at, whole.end), (base, base + 6));
        // A header's short block (cmp esi,ecx; je out) and the block it
        // runs on into (imul): the window goes through the branch out.
        let code = [
            0x39, 0xf1, 0x74, 0x10, 0x44, 0x69, 0xc0, 0x0d, 0x66, 0x19, 0x00,
        ];
        assert_eq!(
            window(&code, base, base, base + 4, Span::Head).unwrap_err(),
            LoopRefusal::ShortHeader
        );
        let run = window(&code, base, base, base + 11, Span::Head).unwrap();
        assert_eq!((run.at, run.end, run.last), (base, base + 11, Last::Falls));
        assert_eq!(run.ways(), [(base + 2, base + 0x14), (base + 4, base + 11)]);
        // Not through a branch in a window of one block.
        let w = window(&code, base, base, base + 11, Span::Whole);
        assert_eq!(w.unwrap_err(), LoopRefusal::Unmovable);
        // A whole block: mov; cmp; jb (8 bytes), where a head (6) and a
        // tail (5) would overlap.
        let code = [0x8b, 0x45, 0xf8, 0x3b, 0x45, 0xec, 0x72, 0xb8];
        let whole = window(&code, base, base, base + 8, Span::Whole).unwrap();
        assert_eq!((whole.at, whole.end), (base, base + 8));
        assert!(matches!(whole.last, Last::Cond { cc: 2, .. }));
        // A call cannot move.
        let call = [0xe8, 0, 0, 0, 0, 0x75, 0xf9];
        let w = window(&call, base, base, base + 7, Span::Head);
        assert_eq!(w.unwrap_err(), LoopRefusal::Unmovable);
    }

    /// Each instruction of `code` (at `ip`): its mnemonic, and its target
    /// (`@offset` within `code`), rip-relative address, immediate, `fs`
    /// operand, displacement or lock prefix.
    fn described(code: &[u8], ip: u64) -> Vec<String> {
        Decoder::with_ip(64, code, ip, DecoderOptions::NONE)
            .into_iter()
            .map(|i| {
                let m = format!("{:?}", i.mnemonic());
                if is_near(&i) {
                    let t = i.near_branch_target();
                    if (ip..ip + code.len() as u64).contains(&t) {
                        format!("{m} @{}", t - ip)
                    } else {
                        format!("{m} {t:#x}")
                    }
                } else if i.is_ip_rel_memory_operand() {
                    format!("{m} [{:#x}]", i.ip_rel_memory_address())
                } else if i.op1_kind() == OpKind::Immediate64 {
                    format!("{m} {:#x}", i.immediate64())
                } else if i.segment_prefix() == iced_x86::Register::FS {
                    format!("{m} fs")
                } else if i.has_lock_prefix() {
                    format!("{m} lock")
                } else if m == "Lea" || (m == "Inc" && i.op0_kind() == OpKind::Memory) {
                    format!("{m} {:+}", i.memory_displacement64() as i64)
                } else {
                    m
                }
            })
            .collect()
    }

    fn counter(number: u32, shared: u64) -> ProbeCounter {
        ProbeCounter { number, shared }
    }

    #[test]
    fn probes_count_and_send_each_way_on() {
        let base = 0x40_0000u64;
        let tls = -64;
        let w = window(&LOOP, base, base, base + 12, Span::Head).unwrap();
        let probe = base + 0x1000;
        let ways = [Way::To(base + 6)];
        let len = probe_len(&w, true, &ways, true);
        let mut out = vec![0u8; len];
        let head = Some(counter(3, 0x1122_3344_5566));
        let body = emit_probe(&w, probe, head, &ways, true, tls, &mut out).unwrap();
        assert_eq!(body, probe + 54);
        // Where the stack pointer is, along the probe: below the red zone
        // and two saved words inside the count, back where it was after.
        let shift = |upto: usize| sp_shift(&out[..upto], probe);
        assert_eq!(
            [
                shift(5),
                shift(6),
                shift(7),
                shift(44),
                shift(46),
                shift(54)
            ],
            [-128, -136, -144, -144, -128, 0]
        );
        assert_eq!(
            described(&out, probe),
            [
                "Lea -128",
                "Push",
                "Pushfq",
                "Mov fs",
                "Test",
                // A thread without counters of its own: the shared ones.
                "Jne @37",
                "Mov 0x112233445566",
                "Inc lock",
                "Jmp @44",
                "Inc +24",
                "Popfq",
                "Pop",
                "Lea +128",
                // The operand still reads the same address.
                "Mov [0x400106]",
                "Jmp 0x400006",
            ]
        );
        // A tail: the branch back counted and sent to the body, the way
        // out to the original code.
        let t = window(&LOOP, base, base, base + 12, Span::Tail).unwrap();
        let ways = [
            Way::Counted {
                counters: vec![counter(5, 0x7000)],
                to: body,
            },
            Way::To(base + 12),
        ];
        let len = probe_len(&t, false, &ways, false);
        let mut out = vec![0u8; len];
        let at = probe + 0x100;
        assert_eq!(
            emit_probe(&t, at, None, &ways, false, tls, &mut out),
            Some(at)
        );
        assert_eq!(
            described(&out, at),
            [
                "Add",
                "Cmp",
                "Jne @15",
                "Jmp 0x40000c",
                "Lea -128",
                "Push",
                "Mov fs",
                "Test",
                "Jne @51",
                "Mov 0x7000",
                "Inc lock",
                "Jmp @58",
                "Inc +40",
                "Pop",
                "Lea +128",
                &format!("Jmp {body:#x}"),
            ]
        );
        let patch = window_patch(&t, at).unwrap();
        assert_eq!(patch.len(), 6);
        assert_eq!(patch[0], 0xe9);
        assert_eq!(patch[5], 0xcc);
        // A branch out of the middle, counted twice: its way placed after
        // the last one.
        let code = [
            0x39, 0xf1, 0x74, 0x10, 0x44, 0x69, 0xc0, 0x0d, 0x66, 0x19, 0x00,
        ];
        let run = window(&code, base, base, base + 11, Span::Head).unwrap();
        let ways = [
            Way::Counted {
                counters: vec![counter(1, 0x8000), counter(2, 0x9000)],
                to: base + 0x14,
            },
            Way::To(base + 11),
        ];
        let len = probe_len(&run, false, &ways, false);
        let mut out = vec![0u8; len];
        assert_eq!(
            emit_probe(&run, at, None, &ways, false, tls, &mut out),
            Some(at)
        );
        assert_eq!(
            described(&out, at),
            [
                "Cmp",
                "Je @20",
                "Imul",
                "Jmp 0x40000b",
                "Lea -128",
                "Push",
                "Mov fs",
                "Test",
                "Jne @70",
                "Mov 0x8000",
                "Inc lock",
                "Mov 0x9000",
                "Inc lock",
                "Jmp @84",
                "Inc +8",
                "Inc +16",
                "Pop",
                "Lea +128",
                "Jmp 0x400014",
            ]
        );
    }

    #[test]
    fn only_register_arithmetic_and_a_jump_is_plain() {
        let base = 0x1000;
        // inc edx; jmp back
        assert!(block_plain(&[0xff, 0xc2, 0xeb, 0xf0], base, base, base + 4));
        // addl $1,-8(%rbp); jmp back: a local
        let local = [0x83, 0x45, 0xf8, 0x01, 0xeb, 0xf0];
        assert!(block_plain(&local, base, base, base + 6));
        // addl $1,(%rax); jmp back: through a pointer
        let ptr = [0x83, 0x00, 0x01, 0xeb, 0xf0];
        assert!(!block_plain(&ptr, base, base, base + 5));
        // inc edx; jne back: not a jump
        assert!(!block_plain(
            &[0xff, 0xc2, 0x75, 0xf0],
            base,
            base,
            base + 4
        ));
    }

    #[test]
    fn flags_are_live_unless_set_before_read() {
        let base = 0x1000;
        // add ecx,eax sets them all first.
        assert!(!flags_live(&LOOP, base, base + 6, base + 12));
        // adc reads CF first.
        let adc = [0x11, 0xc1, 0x39, 0xd1, 0x75, 0xfa];
        assert!(flags_live(&adc, base, base, base + 6));
        // inc leaves CF: a later jb reads it.
        let inc = [0xff, 0xc1, 0x72, 0xfc];
        assert!(flags_live(&inc, base, base, base + 4));
    }
}
