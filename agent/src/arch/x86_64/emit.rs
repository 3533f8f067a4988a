//! The one writer of generated code (stubs, loop probes): bytes put one
//! after another into a buffer of known length, branches aimed at labels.
//! A branch to a label not placed yet is aimed when it is, so no offset is
//! counted by hand, and every reach (rel8, rel32) is checked. Nothing is
//! allocated: stubs are written by the thousand at start-up.
//!
//! Failures (the buffer too short, a label out of a branch's reach, one
//! never placed, too many labels) are remembered, not panicked on, and
//! reported once by [`Emitter::finish`]: generated code is either whole or
//! not used.

/// Labels one piece of code may have.
const MAX_LABELS: usize = 24;
/// Branches that may wait for their label at once.
const MAX_PENDING: usize = 16;

/// A place in the code, placed once with [`Emitter::bind`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label(u8);

#[derive(Clone, Copy)]
enum Width {
    Rel8 = 1,
    Rel32 = 4,
}

pub struct Emitter<'a> {
    buf: &'a mut [u8],
    len: usize,
    /// Address the buffer's first byte runs at.
    at: u64,
    labels: [Option<usize>; MAX_LABELS],
    made: u8,
    /// Branch fields waiting for their label: (label, field offset, width).
    pending: [(Label, usize, Width); MAX_PENDING],
    waiting: usize,
    failed: bool,
}

impl<'a> Emitter<'a> {
    /// Writes into `buf`, whose first byte runs at `at`.
    pub fn new(buf: &'a mut [u8], at: u64) -> Emitter<'a> {
        Emitter {
            buf,
            len: 0,
            at,
            labels: [None; MAX_LABELS],
            made: 0,
            pending: [(Label(0), 0, Width::Rel8); MAX_PENDING],
            waiting: 0,
            failed: false,
        }
    }

    /// Appends `b` (past the buffer's end: nothing, and a failure).
    pub fn put(&mut self, b: &[u8]) {
        match self.buf.get_mut(self.len..self.len + b.len()) {
            Some(to) => {
                to.copy_from_slice(b);
                self.len += b.len();
            }
            None => self.failed = true,
        }
    }

    pub fn put_i32(&mut self, v: i32) {
        self.put(&v.to_le_bytes());
    }

    pub fn put_u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes());
    }

    pub fn put_u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes());
    }

    /// Bytes written so far.
    pub fn offset(&self) -> usize {
        self.len
    }

    /// The address of the next byte.
    pub fn here(&self) -> u64 {
        self.at + self.len as u64
    }

    /// The bytes written so far, to patch in place (a moved instruction's
    /// displacement).
    pub fn written_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }

    /// A new label, not placed yet.
    pub fn label(&mut self) -> Label {
        let l = Label(self.made);
        match (self.made as usize) < MAX_LABELS {
            true => self.made += 1,
            false => self.failed = true,
        }
        l
    }

    /// Places `l` here and aims the branches waiting for it.
    pub fn bind(&mut self, l: Label) {
        let Some(slot) = self.labels.get_mut(l.0 as usize) else {
            self.failed = true;
            return;
        };
        if slot.is_some() {
            self.failed = true;
        }
        *slot = Some(self.len);
        let mut i = 0;
        while i < self.waiting {
            let (label, field, width) = self.pending[i];
            if label == l {
                self.aim(field, width, self.len);
                self.waiting -= 1;
                self.pending[i] = self.pending[self.waiting];
            } else {
                i += 1;
            }
        }
    }

    /// Where `l` was placed, once it is.
    pub fn offset_of(&self, l: Label) -> Option<usize> {
        self.labels.get(l.0 as usize).copied().flatten()
    }

    /// Writes the displacement field at `field` so that it reaches offset
    /// `to` (counted from the field's end, as x86 does).
    fn aim(&mut self, field: usize, width: Width, to: usize) {
        let rel = to as i64 - (field + width as usize) as i64;
        let (bytes, fits) = match width {
            Width::Rel8 => (rel.to_le_bytes(), i8::try_from(rel).is_ok()),
            Width::Rel32 => (rel.to_le_bytes(), i32::try_from(rel).is_ok()),
        };
        // Little-endian: a value that fits is its low bytes.
        match (fits, self.buf.get_mut(field..field + width as usize)) {
            (true, Some(f)) => f.copy_from_slice(&bytes[..width as usize]),
            _ => self.failed = true,
        }
    }

    /// A displacement field of `width` aimed at `l`.
    fn field(&mut self, l: Label, width: Width) {
        let field = self.len;
        self.put(&[0; 4][..width as usize]);
        match self.offset_of(l) {
            Some(to) => self.aim(field, width, to),
            None if self.waiting < MAX_PENDING => {
                self.pending[self.waiting] = (l, field, width);
                self.waiting += 1;
            }
            None => self.failed = true,
        }
    }

    /// A rip-relative disp32 field aimed at `l`, ending an instruction
    /// (`call [rip+disp32]` to a word placed at `l`).
    pub fn rip_rel(&mut self, l: Label) {
        self.field(l, Width::Rel32);
    }

    /// `jmp rel32` to `l`.
    pub fn jmp(&mut self, l: Label) {
        self.put(&[0xe9]);
        self.field(l, Width::Rel32);
    }

    /// `jmp rel8` to `l`.
    pub fn jmp_short(&mut self, l: Label) {
        self.put(&[0xeb]);
        self.field(l, Width::Rel8);
    }

    /// `jcc rel32` (condition `cc`) to `l`.
    pub fn jcc(&mut self, cc: u8, l: Label) {
        self.put(&[0x0f, 0x80 | cc]);
        self.field(l, Width::Rel32);
    }

    /// `jnz rel8` to `l`.
    pub fn jnz_short(&mut self, l: Label) {
        self.put(&[0x75]);
        self.field(l, Width::Rel8);
    }

    /// `jrcxz rel8` to `l`.
    pub fn jrcxz(&mut self, l: Label) {
        self.put(&[0xe3]);
        self.field(l, Width::Rel8);
    }

    /// `jmp rel32` to the absolute address `to` (out of reach: a failure).
    pub fn jmp_to(&mut self, to: u64) {
        let rel = to as i64 - (self.here() + 5) as i64;
        self.put(&[0xe9]);
        match i32::try_from(rel) {
            Ok(r) => self.put_i32(r),
            Err(_) => {
                self.failed = true;
                self.put_i32(0);
            }
        }
    }

    /// Marks the code as not whole (a value it needs does not fit).
    pub fn fail(&mut self) {
        self.failed = true;
    }

    /// The bytes written, if the code is whole: nothing failed, every
    /// branch aimed.
    pub fn finish(self) -> Option<usize> {
        (!self.failed && self.waiting == 0).then_some(self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branches_reach_labels_placed_before_and_after() {
        let mut buf = [0u8; 16];
        let mut e = Emitter::new(&mut buf, 0x1000);
        let (top, end) = (e.label(), e.label());
        e.bind(top);
        e.put(&[0x90]);
        e.jrcxz(end); // at 1, field at 2, ends at 3
        e.jmp(top); // at 3, field at 4, ends at 8: -8
        e.bind(end);
        assert_eq!(e.here(), 0x1008);
        assert_eq!(e.finish(), Some(8));
        assert_eq!(buf[..8], [0x90, 0xe3, 5, 0xe9, 0xf8, 0xff, 0xff, 0xff]);
    }

    #[test]
    fn out_of_reach_unplaced_or_too_long_code_is_refused() {
        // A rel8 across 200 bytes.
        let mut buf = [0u8; 256];
        let mut e = Emitter::new(&mut buf, 0);
        let far = e.label();
        e.jmp_short(far);
        e.put(&[0x90; 200]);
        e.bind(far);
        assert_eq!(e.finish(), None);
        // A label never placed.
        let mut e = Emitter::new(&mut buf, 0);
        let never = e.label();
        e.jcc(0x4, never);
        assert_eq!(e.finish(), None);
        // Past the buffer's end: nothing written there.
        let mut small = [0u8; 4];
        let mut e = Emitter::new(&mut small, 0);
        e.put(&[1, 2, 3]);
        e.put(&[4, 5]);
        assert_eq!(e.finish(), None);
        assert_eq!(small, [1, 2, 3, 0]);
        // An absolute target beyond ±2 GiB.
        let mut e = Emitter::new(&mut buf, 0);
        e.jmp_to(1 << 40);
        assert_eq!(e.finish(), None);
    }

    #[test]
    fn a_label_placed_twice_fails() {
        let mut buf = [0u8; 4];
        let mut e = Emitter::new(&mut buf, 0);
        let l = e.label();
        e.bind(l);
        e.bind(l);
        assert_eq!(e.finish(), None);
    }
}
