//! Choosing the window: the instructions at a function's entry that move
//! into the stub so that a `jmp rel32` can take their place; and the moved
//! code as a template (bytes plus fixups) that runs wherever the stub goes,
//! so that a cached plan is installed without decoding anything again.

use super::super::{EntryPlan, Redirect};
use iced_x86::{
    ConditionCode, ConstantOffsets, Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic,
    OpKind,
};
use rtprof_abi::Refusal;

/// Bytes of a `jmp rel32`.
pub const MIN_WINDOW: usize = 5;
/// Longest window: an instruction (at most 15 bytes) starting 4 bytes in.
pub const MAX_WINDOW: usize = 20;
/// Longest moved-code template: every moved instruction may grow (a call
/// becomes 24 bytes), plus the jump back.
pub const MAX_CODE: usize = 64;
/// At most one fixup per moved instruction, plus two for a return address
/// and one for the jump back.
pub const MAX_FIXUPS: usize = 8;
/// The function's first bytes up to the end of what is overwritten or
/// moved (with an `endbr64` in front and alignment fill behind).
pub const MAX_ORIGINAL: usize = 24;
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
/// Bytes of a `jmp rel8`: the entry of a short plan.
pub const SHORT_JUMP: usize = 2;
/// Most of the function's own branches into its entry bytes a plan sends
/// to the stub's moved code.
pub const MAX_REDIRECTS: usize = 4;

/// What a fixup writes into the template once the stub's address is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FixKind {
    /// `target - (the template's address in the stub + end)`: a rel32
    /// field whose instruction ends at `end`.
    Rel32 = 0,
    /// `target` as a sign-extended imm32 (it must lie below 2 GiB).
    Abs32 = 1,
    /// The low half of `target` as an imm32.
    AbsLo32 = 2,
    /// The high half of `target` as an imm32.
    AbsHi32 = 3,
}

impl FixKind {
    pub fn from_code(c: u8) -> Option<FixKind> {
        [
            FixKind::Rel32,
            FixKind::Abs32,
            FixKind::AbsLo32,
            FixKind::AbsHi32,
        ]
        .get(c as usize)
        .copied()
    }
}

/// A 4-byte field of the template at `at` that depends on where the stub
/// and the module are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fixup {
    pub at: u8,
    pub end: u8,
    pub kind: FixKind,
    /// The address it refers to, from the function's first byte (it is in
    /// the module, within reach of a rel32 from the entry).
    pub target: i32,
}

const NO_FIXUP: Fixup = Fixup {
    at: 0,
    end: 0,
    kind: FixKind::Rel32,
    target: 0,
};

impl Fixup {
    /// The absolute address referred to, for the function at `start`.
    pub fn target_from(&self, start: u64) -> u64 {
        start.wrapping_add(self.target as i64 as u64)
    }
}

/// How one function's entry is patched. Plain data of fixed size: plans for
/// tens of thousands of functions are made, cached and installed without
/// a heap allocation each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// First byte of the function.
    pub(super) start: u64,
    /// Where the jump is written: after an `endbr64`, which stays in place.
    pub(super) patch_at: u64,
    /// Bytes overwritten at `patch_at` (at least [`MIN_WINDOW`]).
    pub(super) window: usize,
    /// Address execution continues at after the moved instructions.
    pub(super) resume_at: u64,
    code: [u8; MAX_CODE],
    code_len: u8,
    fixups: [Fixup; MAX_FIXUPS],
    fix_len: u8,
    original: [u8; MAX_ORIGINAL],
    original_len: u8,
    /// The function's own branches into its entry bytes.
    redirects: [Redirect; MAX_REDIRECTS],
    redirect_len: u8,
    /// Each moved instruction's offset from `start` and its copy's offset
    /// in `code` (the first at `patch_at` and 0), where redirects may
    /// send a branch; kept in a cache entry too.
    moved_at: [(u8, u8); MIN_WINDOW],
    moved_len: u8,
    /// A short plan's trampoline: 5 bytes of alignment fill before the
    /// function, or of dead fill in it past the entry's moved bytes (offset
    /// from `start`; 0 for none) that the entry's `jmp rel8` reaches and
    /// that jumps on to the stub.
    tramp: i8,
}

/// [`Plan::tramp`] of a plan whose entry is a trap: never a trampoline's
/// offset (one that far is beyond a `jmp rel8`'s reach).
const TRAP_ENTRY: i8 = i8::MIN;

impl Plan {
    /// Where a short plan's trampoline goes (a `jmp rel32` to the stub).
    pub(in crate::arch) fn trampoline(&self) -> Option<u64> {
        (self.tramp != 0 && self.tramp != TRAP_ENTRY)
            .then(|| self.start.wrapping_add(self.tramp as i64 as u64))
    }

    /// The entry is an `int3`: the trap handler sends the thread on to
    /// the stub, which runs the first instruction and jumps back past it.
    pub(in crate::arch) fn is_trap(&self) -> bool {
        self.tramp == TRAP_ENTRY
    }

    /// The plan with a trap for its entry. Only for a plan made by
    /// [`plan_trap`] or read back from one: one byte overwritten, one
    /// instruction moved.
    pub(in crate::arch) fn with_trap(mut self) -> Option<Plan> {
        (self.window == 1 && self.moved_len == 1).then(|| {
            self.tramp = TRAP_ENTRY;
            self
        })
    }

    /// The trampoline's offset from `start` (0: none), for a cache entry.
    pub(in crate::arch) fn tramp_offset(&self) -> i8 {
        self.tramp
    }

    /// The function's own branches into its entry bytes, sent to the
    /// stub's moved code once the stub exists.
    pub(in crate::arch) fn redirects(&self) -> &[Redirect] {
        &self.redirects[..self.redirect_len as usize]
    }

    /// The plan with the branches whose rel32 fields are at `fields`
    /// (field, target) sent to the copies of the instructions they reach
    /// (the entry's: the first moved one); `None` if there are too many,
    /// one is not in the function's reach, or one reaches no moved
    /// instruction's first byte.
    pub(in crate::arch) fn with_redirects(self, fields: &[(u64, u64)]) -> Option<Plan> {
        let mut r = [Redirect::default(); MAX_REDIRECTS];
        for (k, &(f, t)) in fields.iter().enumerate() {
            let target = t.checked_sub(self.start)?;
            let code = if t == self.start || t == self.patch_at {
                0
            } else {
                let mut at = self.moved_at[..self.moved_len as usize].iter();
                at.find(|m| m.0 as u64 == target)?.1
            };
            *r.get_mut(k)? = Redirect {
                field: u32::try_from(f.checked_sub(self.start)?).ok()?,
                target: u8::try_from(target).ok()?,
                code,
            };
        }
        self.with_resolved_redirects(&r[..fields.len()])
    }

    /// Where each moved instruction is, from `start` and in the moved
    /// code.
    pub(in crate::arch) fn moved_at(&self) -> &[(u8, u8)] {
        &self.moved_at[..self.moved_len as usize]
    }

    /// The plan with `moved_at` (a cache entry's), checked: each in the
    /// original bytes and the moved code, in order.
    pub(in crate::arch) fn with_moved_at(mut self, moved_at: &[(u8, u8)]) -> Option<Plan> {
        let skip = (self.patch_at - self.start) as u8;
        let ok = moved_at.len() <= MIN_WINDOW
            && moved_at.first().is_none_or(|&m| m == (skip, 0))
            && moved_at
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1)
            && moved_at
                .iter()
                .all(|&(o, c)| o < self.original_len && c < self.code_len);
        if !ok {
            return None;
        }
        self.moved_at[..moved_at.len()].copy_from_slice(moved_at);
        self.moved_len = moved_at.len() as u8;
        Some(self)
    }

    /// The plan with `redirects` (a cache entry's), checked: never a
    /// field in the bytes the entry patch overwrites or moves, always a
    /// target among them and a copy inside the moved code.
    pub(in crate::arch) fn with_resolved_redirects(
        mut self,
        redirects: &[Redirect],
    ) -> Option<Plan> {
        if redirects.len() > MAX_REDIRECTS {
            return None;
        }
        let skip = (self.patch_at - self.start) as u8;
        for r in redirects {
            // To the entry (before or after its `endbr64`) the first moved
            // instruction's copy; elsewhere a moved instruction's own.
            let to_entry = r.code == 0 && (r.target == 0 || r.target == skip);
            if r.field < self.original_len as u32
                || !(to_entry || self.moved_at().contains(&(r.target, r.code)))
            {
                return None;
            }
        }
        self.redirects[..redirects.len()].copy_from_slice(redirects);
        self.redirect_len = redirects.len() as u8;
        Some(self)
    }

    /// The moved instructions as they run from a stub, ending with the
    /// jump back, before [`Plan::fixups`] are applied.
    pub(in crate::arch) fn code(&self) -> &[u8] {
        &self.code[..self.code_len as usize]
    }

    pub(in crate::arch) fn fixups(&self) -> &[Fixup] {
        &self.fixups[..self.fix_len as usize]
    }

    /// The bytes from `start` that the plan was made from and that patching
    /// overwrites or moves: memory must still hold them.
    pub(in crate::arch) fn original(&self) -> &[u8] {
        &self.original[..self.original_len as usize]
    }

    /// A plan from its parts (a cache entry's), checked for consistency:
    /// `None` if they cannot have come from [`plan_window`].
    pub(in crate::arch) fn from_parts(
        start: u64,
        skip: u8,
        window: u8,
        resume_off: u8,
        original: &[u8],
        code: &[u8],
        fixups: &[Fixup],
    ) -> Option<Plan> {
        let (skip, window, resume_off) = (skip as usize, window as usize, resume_off as usize);
        let ok = (skip == 0 || (skip == ENDBR64.len() && original.starts_with(&ENDBR64)))
            && (1..=MAX_WINDOW).contains(&window)
            && resume_off > skip
            && original.len() == resume_off.max(skip + window)
            && original.len() <= MAX_ORIGINAL
            && !code.is_empty()
            && code.len() <= MAX_CODE
            && fixups.len() <= MAX_FIXUPS
            && fixups.iter().all(|f| {
                f.at as usize + 4 <= code.len()
                    && f.end as usize <= code.len()
                    && (f.kind != FixKind::Rel32 || f.end >= f.at + 4)
            });
        if !ok {
            return None;
        }
        let mut p = Plan::empty(start, start + skip as u64);
        p.window = window;
        p.resume_at = start + resume_off as u64;
        p.code[..code.len()].copy_from_slice(code);
        p.code_len = code.len() as u8;
        p.fixups[..fixups.len()].copy_from_slice(fixups);
        p.fix_len = fixups.len() as u8;
        p.original[..original.len()].copy_from_slice(original);
        p.original_len = original.len() as u8;
        Some(p)
    }

    /// The same plan for the module loaded `delta` bytes further up.
    #[cfg(test)]
    pub(in crate::arch) fn moved_by(&self, delta: u64) -> Plan {
        let mut p = *self;
        p.start = p.start.wrapping_add(delta);
        p.patch_at = p.patch_at.wrapping_add(delta);
        p.resume_at = p.resume_at.wrapping_add(delta);
        p
    }

    fn empty(start: u64, patch_at: u64) -> Plan {
        Plan {
            start,
            patch_at,
            window: 0,
            resume_at: 0,
            code: [0; MAX_CODE],
            code_len: 0,
            fixups: [NO_FIXUP; MAX_FIXUPS],
            fix_len: 0,
            original: [0; MAX_ORIGINAL],
            original_len: 0,
            redirects: [Redirect::default(); MAX_REDIRECTS],
            redirect_len: 0,
            moved_at: [(0, 0); MIN_WINDOW],
            moved_len: 0,
            tramp: 0,
        }
    }

    /// The plan made short: its entry a `jmp rel8` to a trampoline at
    /// offset `tramp` from `start`, before the function or past the bytes
    /// its entry moves. Only for a plan made by [`plan_short`] or read
    /// back from one.
    pub(in crate::arch) fn with_trampoline(mut self, tramp: i8) -> Option<Plan> {
        // Past every byte the plan overwrites or resumes into.
        let moved_end = self.original_len as i64;
        let reach = tramp as i64 - (self.patch_at - self.start + SHORT_JUMP as u64) as i64;
        let ok = (tramp <= -5 || tramp as i64 >= moved_end)
            && i8::try_from(reach).is_ok()
            && (SHORT_JUMP..MIN_WINDOW).contains(&self.window);
        ok.then(|| {
            self.tramp = tramp;
            self
        })
    }

    fn emit(&mut self, bytes: &[u8]) -> Result<usize, Refusal> {
        let at = self.code_len as usize;
        let end = at + bytes.len();
        if end > MAX_CODE {
            return Err(Refusal::RelocationFailed);
        }
        self.code[at..end].copy_from_slice(bytes);
        self.code_len = end as u8;
        Ok(at)
    }

    fn fix(&mut self, at: usize, end: usize, kind: FixKind, target: u64) -> Result<(), Refusal> {
        let n = self.fix_len as usize;
        let target = i32::try_from(target.wrapping_sub(self.start) as i64)
            .map_err(|_| Refusal::RelocationFailed)?;
        if n == MAX_FIXUPS {
            return Err(Refusal::RelocationFailed);
        }
        self.fixups[n] = Fixup {
            at: at as u8,
            end: end as u8,
            kind,
            target,
        };
        self.fix_len += 1;
        Ok(())
    }

    /// A branch to `target`: `prefix` (jmp or jcc opcode) then a rel32.
    fn emit_branch(&mut self, prefix: &[u8], target: u64) -> Result<(), Refusal> {
        let at = self.emit(prefix)? + prefix.len();
        self.emit(&[0; 4])?;
        self.fix(at, at + 4, FixKind::Rel32, target)
    }

    /// Pushes `ret`, the return address a moved call would have pushed, so
    /// that the callee returns into the original function and unwinders
    /// see the frames they expect.
    fn emit_push(&mut self, ret: u64) -> Result<(), Refusal> {
        if ret < 0x8000_0000 {
            let at = self.emit(&[0x68, 0, 0, 0, 0])? + 1; // push imm32
            return self.fix(at, at + 4, FixKind::Abs32, ret);
        }
        // Relative to the stub, so a stub's bytes depend only on its
        // distance from the function (page images); no flag changes, and
        // rax is put back. Below `rsp` at a call nothing is live: the call
        // itself would write there.
        self.emit(&[0x48, 0x8d, 0x64, 0x24, 0xf8])?; // lea rsp,[rsp-8]
        self.emit(&[0x50])?; // push rax
        let at = self.emit(&[0x48, 0x8d, 0x05, 0, 0, 0, 0])? + 3; // lea rax,[rip+disp32]
        self.fix(at, at + 4, FixKind::Rel32, ret)?;
        self.emit(&[0x48, 0x89, 0x44, 0x24, 0x08])?; // mov [rsp+8],rax
        self.emit(&[0x58]).map(|_| ()) // pop rax
    }

    /// Appends moved instruction `ins` (its bytes `raw`, where its
    /// displacement and immediate are `off`).
    fn emit_moved(
        &mut self,
        ins: &Instruction,
        raw: &[u8],
        off: &ConstantOffsets,
    ) -> Result<(), Refusal> {
        // A rip-relative operand keeps its target: its disp32 is a fixup
        // (the instruction's length does not change).
        let rip_disp = |p: &mut Plan, at: usize| -> Result<(), Refusal> {
            if ins.is_ip_rel_memory_operand() {
                if off.displacement_size() != 4 {
                    return Err(Refusal::RelocationFailed);
                }
                let f = at + off.displacement_offset();
                p.fix(
                    f,
                    at + raw.len(),
                    FixKind::Rel32,
                    ins.ip_rel_memory_address(),
                )?;
            }
            Ok(())
        };
        match ins.flow_control() {
            FlowControl::Call => {
                self.emit_push(ins.next_ip())?;
                self.emit_branch(&[0xe9], ins.near_branch_target())
            }
            FlowControl::IndirectCall => {
                // `call r/m64` (FF /2) becomes `jmp r/m64` (FF /4) with the
                // same operand, after the return address is pushed.
                let op = raw
                    .iter()
                    .position(|&b| b == 0xff)
                    .filter(|&i| raw[..i].iter().all(|&b| is_prefix(b)))
                    .ok_or(Refusal::RelocationFailed)?;
                let modrm = *raw.get(op + 1).ok_or(Refusal::RelocationFailed)?;
                if (modrm >> 3) & 7 != 2 {
                    return Err(Refusal::RelocationFailed);
                }
                self.emit_push(ins.next_ip())?;
                let at = self.emit(raw)?;
                self.code[at + op + 1] = (modrm & !0x38) | (4 << 3);
                rip_disp(self, at)
            }
            FlowControl::UnconditionalBranch => self.emit_branch(&[0xe9], ins.near_branch_target()),
            FlowControl::ConditionalBranch => {
                // jcc only: loop and jrcxz have no rel32 form.
                let cc = jcc_code(ins.condition_code()).ok_or(Refusal::UnsupportedInstruction)?;
                self.emit_branch(&[0x0f, 0x80 | cc], ins.near_branch_target())
            }
            _ => {
                let at = self.emit(raw)?;
                rip_disp(self, at)
            }
        }
    }
}

/// Legacy prefixes and REX, which may precede an opcode.
fn is_prefix(b: u8) -> bool {
    matches!(
        b,
        0x66 | 0x67 | 0xf0 | 0xf2 | 0xf3 | 0x2e | 0x36 | 0x3e | 0x26 | 0x64 | 0x65
    ) || (0x40..=0x4f).contains(&b)
}

/// The low nibble of `jcc rel32` (0F 8x) for a condition.
pub(super) fn jcc_code(c: ConditionCode) -> Option<u8> {
    use ConditionCode as C;
    Some(match c {
        C::o => 0x0,
        C::no => 0x1,
        C::b => 0x2,
        C::ae => 0x3,
        C::e => 0x4,
        C::ne => 0x5,
        C::be => 0x6,
        C::a => 0x7,
        C::s => 0x8,
        C::ns => 0x9,
        C::p => 0xa,
        C::np => 0xb,
        C::l => 0xc,
        C::ge => 0xd,
        C::le => 0xe,
        C::g => 0xf,
        C::None => return None,
    })
}

/// Runs of alignment fill inside `code` (loaded at `start`) that nothing
/// runs into: each right after an instruction that does not go on to the
/// next (a return, a jump, a trap), as [first byte, past the last); none
/// if some bytes do not decode. Whether a branch lands in one is for the
/// caller to check.
pub fn dead_fill(code: &[u8], start: u64) -> Vec<(u64, u64)> {
    let mut d = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let mut ins = Instruction::default();
    let mut out = Vec::new();
    // The run being read, if the instruction before it ended the flow.
    let mut run: Option<(u64, u64)> = None;
    let mut after_end = false;
    while d.can_decode() {
        d.decode_out(&mut ins);
        if ins.is_invalid() {
            // Out of step with the code: nothing here is known to be fill.
            return Vec::new();
        }
        if is_padding(&ins) {
            if let Some(r) = run.as_mut() {
                r.1 = ins.next_ip();
            } else if after_end {
                run = Some((ins.ip(), ins.next_ip()));
            }
            continue;
        }
        out.extend(run.take());
        after_end = ends_flow(&ins);
    }
    out.extend(run);
    out
}

/// Whether `code` decodes to alignment fill only, to its last byte.
pub fn is_fill(code: &[u8]) -> bool {
    let mut d = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut ins = Instruction::default();
    while d.can_decode() {
        d.decode_out(&mut ins);
        if ins.is_invalid() || !is_padding(&ins) {
            return false;
        }
    }
    d.ip() == code.len() as u64
}

/// Whether bytes `lead..lead + len` of `code` lie inside fill: from some
/// start at most `lead` bytes before them, every instruction up to and
/// over their last byte is fill (the last may run on past them, within
/// `code`).
pub fn within_fill(code: &[u8], lead: usize, len: usize) -> bool {
    let end = (lead + len) as u64;
    if code.len() < lead + len {
        return false;
    }
    (0..=lead).any(|s| {
        let mut d = Decoder::with_ip(64, &code[s..], s as u64, DecoderOptions::NONE);
        let mut ins = Instruction::default();
        while d.ip() < end {
            if !d.can_decode() {
                return false;
            }
            d.decode_out(&mut ins);
            if ins.is_invalid() || !is_padding(&ins) {
                return false;
            }
        }
        true
    })
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
    // The moved instructions: at most one per byte of a minimal window.
    let mut moved = [Instruction::default(); MIN_WINDOW];
    let mut offsets = [ConstantOffsets::default(); MIN_WINDOW];
    let mut n = 0;
    let mut ins = Instruction::default();
    let mut ip = patch_at;
    let mut window = None;
    while ip < patch_at + MIN_WINDOW as u64 {
        if ip >= func_end {
            // Past the function's end only alignment fill may be overwritten,
            // and only if execution can never fall through into it.
            if n == 0 || !ends_flow(&moved[n - 1]) {
                return Err(Refusal::TooSmall);
            }
            while d.can_decode() && d.ip() < patch_at + MIN_WINDOW as u64 {
                d.decode_out(&mut ins);
                if ins.is_invalid() || !is_padding(&ins) {
                    return Err(Refusal::TooSmall);
                }
            }
            window = Some((MIN_WINDOW, func_end));
            break;
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
        moved[n] = ins;
        offsets[n] = d.get_constant_offsets(&ins);
        n += 1;
    }
    let (window, resume_at) = window.unwrap_or(((ip - patch_at) as usize, ip));
    assemble(
        code,
        start,
        patch_at,
        window,
        resume_at,
        &moved[..n],
        &offsets[..n],
    )
}

/// A plan from the instructions to move (`moved`, their constant offsets
/// `offsets`): checked, its original bytes kept, its code emitted.
fn assemble(
    code: &[u8],
    start: u64,
    patch_at: u64,
    window: usize,
    resume_at: u64,
    moved: &[Instruction],
    offsets: &[ConstantOffsets],
) -> Result<Plan, Refusal> {
    // A moved call pushes its original return address, which must be the
    // first byte after the window: the original code continues from there.
    if moved[..moved.len() - 1].iter().any(is_call) {
        return Err(Refusal::CallInWindow);
    }
    // A branch back into the moved bytes would bypass the entry.
    if moved.iter().any(|i| {
        i.op0_kind() == OpKind::NearBranch64 && (start..resume_at).contains(&i.near_branch_target())
    }) {
        return Err(Refusal::BranchIntoWindow);
    }

    let mut p = Plan::empty(start, patch_at);
    p.window = window;
    p.resume_at = resume_at;
    let original_end = (resume_at - start).max((patch_at - start) + window as u64) as usize;
    let original = code.get(..original_end).ok_or(Refusal::TooSmall)?;
    if original.len() > MAX_ORIGINAL || window > MAX_WINDOW {
        return Err(Refusal::RelocationFailed);
    }
    p.original[..original.len()].copy_from_slice(original);
    p.original_len = original.len() as u8;
    for (k, (m, o)) in moved.iter().zip(offsets).enumerate() {
        let at = (m.ip() - start) as usize;
        if let Some(slot) = p.moved_at.get_mut(k) {
            *slot = (at as u8, p.code_len);
            p.moved_len = k as u8 + 1;
        }
        p.emit_moved(m, &code[at..at + m.len()], o)?;
    }
    p.emit_branch(&[0xe9], resume_at)?;
    Ok(p)
}

/// The plan of a function whose first [`MIN_WINDOW`] bytes cannot all
/// move (a branch lands `limit` bytes in): the instructions before `limit`,
/// at least [`SHORT_JUMP`] bytes of them, move to the stub, and the entry
/// becomes a `jmp rel8` to 5 bytes of fill at offset `tramp` (before the
/// function, or dead fill in it past the moved bytes) that jump on to the
/// stub. Nothing executes the entry's bytes
/// after the short jump: the branch lands at or past their end.
pub fn plan_short(
    code: &[u8],
    start: u64,
    size: usize,
    limit: usize,
    tramp: i8,
) -> Result<Plan, Refusal> {
    let size = size.min(code.len());
    let skip = if code[..size].starts_with(&ENDBR64) {
        ENDBR64.len()
    } else {
        0
    };
    let patch_at = start + skip as u64;
    let end = start + limit.min(size) as u64;
    let mut d = Decoder::with_ip(64, &code[skip..size], patch_at, DecoderOptions::NONE);
    let mut moved = [Instruction::default(); SHORT_JUMP];
    let mut offsets = [ConstantOffsets::default(); SHORT_JUMP];
    let mut n = 0;
    let mut ins = Instruction::default();
    let mut ip = patch_at;
    while ip < patch_at + SHORT_JUMP as u64 {
        if !d.can_decode() {
            return Err(Refusal::BranchIntoWindow);
        }
        d.decode_out(&mut ins);
        if ins.is_invalid() {
            return Err(Refusal::DecodeError);
        }
        check_movable(&ins)?;
        ip = ins.next_ip();
        moved[n] = ins;
        offsets[n] = d.get_constant_offsets(&ins);
        n += 1;
    }
    // The branch must land at or past the moved instructions' end.
    if ip > end {
        return Err(Refusal::BranchIntoWindow);
    }
    let window = (ip - patch_at) as usize;
    assemble(
        code,
        start,
        patch_at,
        window,
        ip,
        &moved[..n],
        &offsets[..n],
    )?
    .with_trampoline(tramp)
    .ok_or(Refusal::BranchIntoWindow)
}

/// The plan of a function whose entry can take no jump (it is too short,
/// or a branch lands in its first bytes): its first instruction moves to
/// the stub and only its first byte becomes an `int3`. Nothing can land
/// inside one instruction, so no branch is in the way; the caller still
/// rules out the function's own branches to its entry.
pub fn plan_trap(code: &[u8], start: u64, size: usize) -> Result<Plan, Refusal> {
    let size = size.min(code.len());
    let skip = if code[..size].starts_with(&ENDBR64) {
        ENDBR64.len()
    } else {
        0
    };
    let patch_at = start + skip as u64;
    let mut d = Decoder::with_ip(64, &code[skip..size], patch_at, DecoderOptions::NONE);
    if !d.can_decode() {
        return Err(Refusal::TooSmall);
    }
    let ins = d.decode();
    if ins.is_invalid() {
        return Err(Refusal::DecodeError);
    }
    check_movable(&ins)?;
    let offsets = d.get_constant_offsets(&ins);
    assemble(code, start, patch_at, 1, ins.next_ip(), &[ins], &[offsets])?
        .with_trap()
        .ok_or(Refusal::TooSmall)
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

/// Generic code sees a plan through these (see `EntryPlan`).
impl EntryPlan for Plan {
    fn start(&self) -> u64 {
        self.start
    }
    fn patch_at(&self) -> u64 {
        self.patch_at
    }
    fn window(&self) -> usize {
        self.window
    }
    fn resume_at(&self) -> u64 {
        self.resume_at
    }
    fn original(&self) -> &[u8] {
        Plan::original(self)
    }
    fn redirects(&self) -> &[Redirect] {
        Plan::redirects(self)
    }
    fn with_redirects(self, fields: &[(u64, u64)]) -> Option<Plan> {
        Plan::with_redirects(self, fields)
    }
    fn trampoline(&self) -> Option<u64> {
        Plan::trampoline(self)
    }
    fn is_trap(&self) -> bool {
        Plan::is_trap(self)
    }
    fn position_independent(&self) -> bool {
        self.fixups().iter().all(|f| f.kind == FixKind::Rel32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trampoline's 5 bytes inside fill, as analysis places them: after
    /// a `ret`, in an 11-byte `nopw` and a 5-byte `nopl` (GCC's padding),
    /// starting inside the first; decoded from their own start they are
    /// not instructions of their own, so only `within_fill` accepts them.
    #[test]
    fn bytes_inside_multi_byte_fill_are_fill() {
        let mut code = vec![0xc3]; // ret
        code.extend([0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0]); // 11-byte nopw
        code.extend([0x0f, 0x1f, 0x44, 0x00, 0x00]); // 5-byte nopl
                                                     // At 9: the last 3 bytes of the nopw and 2 of the nopl.
        assert!(!is_fill(&code[9..14]));
        assert!(within_fill(&code, 9, 5));
        assert!(within_fill(&code[4..], 5, 5));
        // The ret is not fill: bytes that include it are not.
        assert!(!within_fill(&code, 0, 5));
        // Real code is not.
        let code = [0x48, 0x89, 0xf8, 0x48, 0x83, 0xc0, 0x01, 0xc3]; // mov; add; ret
        assert!(!(0..3).any(|at| within_fill(&code, at, 5)));
        // Too few bytes.
        assert!(!within_fill(&[0x90, 0x90], 0, 5));
    }

    #[test]
    fn dead_fill_follows_what_does_not_go_on() {
        // 0: nop (runs: at the entry); 1: ret; 2: nopl 5 bytes (dead);
        // 7: add eax,1; 10: nop (runs on from the add); 11: jmp +0;
        // 13: int3, nop (dead, to the end)
        let code = [
            0x90, 0xc3, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0x83, 0xc0, 0x01, 0x90, 0xeb, 0x00, 0xcc,
            0x90,
        ];
        assert_eq!(dead_fill(&code, 0x100), [(0x102, 0x107), (0x10d, 0x10f)]);
        assert!(dead_fill(&[0xc3], 0x100).is_empty());
        // Bytes that do not decode: nothing is known to be fill.
        assert!(dead_fill(&[0xc3, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0x06], 0x100).is_empty());
    }

    #[test]
    fn skips_endbr_and_takes_whole_instructions() {
        // endbr64; push rbp; mov rbp,rsp; sub rsp,0x10; ret
        let code = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0xc3,
        ];
        let p = plan_window(&code, 0x1000, code.len(), 0).unwrap();
        assert_eq!(p.patch_at, 0x1004);
        assert_eq!(p.window, 8);
        assert_eq!(p.code().len(), 8 + 5);
        assert_eq!(p.resume_at, 0x100c);
    }

    #[test]
    fn tiny_function_uses_padding_only_after_a_terminator() {
        // xor eax,eax; ret; then nop padding
        let code = [0x31, 0xc0, 0xc3, 0x90, 0x0f, 0x1f, 0x00, 0xcc];
        let p = plan_window(&code, 0x2000, 3, 5).unwrap();
        assert_eq!(p.window, 5);
        assert_eq!(p.code(), &[0x31, 0xc0, 0xc3, 0xe9, 0, 0, 0, 0]);
        assert_eq!(p.original(), &code[..5]);
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
        assert_eq!(plan_window(&code, 0x3000, 6, 0).unwrap().window, 5);
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
