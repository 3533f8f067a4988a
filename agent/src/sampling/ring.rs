//! Reading one perf ring buffer: the kernel appends records and advances
//! `data_head`; we consume them and advance `data_tail`. Acquire on the head
//! makes the records before it visible; release on the tail tells the
//! kernel the space may be overwritten only after we have read it.

use std::sync::atomic::{AtomicU64, Ordering};

pub const PERF_RECORD_LOST: u32 = 2;
pub const PERF_RECORD_SAMPLE: u32 = 9;

// Offsets in `struct perf_event_mmap_page` (stable kernel ABI).
const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;
const DATA_OFFSET: usize = 1040;
const DATA_SIZE: usize = 1048;

/// Bodies longer than this are not ours to read (we ask for short records);
/// they are skipped whole.
const MAX_BODY: usize = 56;

/// A mapped ring: metadata page followed by a power-of-two data area.
pub struct Ring {
    base: *mut u8,
    len: usize,
}

// Only the drain thread (or the exit path, under the drain lock) reads it.
unsafe impl Send for Ring {}
unsafe impl Sync for Ring {}

impl Ring {
    /// # Safety
    /// `base` must be a perf ring mapping (or an equivalent buffer) of
    /// `len` bytes that outlives the `Ring`.
    pub unsafe fn new(base: *mut u8, len: usize) -> Ring {
        Ring { base, len }
    }

    pub fn base(&self) -> *mut u8 {
        self.base
    }
    pub fn map_len(&self) -> usize {
        self.len
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    /// Hands every complete record to `on(type, body)` and frees its space,
    /// until `on` returns `false`: that record stays in the ring, to be
    /// read again. Returns the number of records read. Never allocates.
    pub fn drain_while(&self, on: impl FnMut(u32, &[u8]) -> bool) -> usize {
        self.walk(true, on)
    }

    /// Hands every complete record to `on` and leaves them all in the ring.
    pub fn peek(&self, mut on: impl FnMut(u32, &[u8])) {
        self.walk(false, |ty, body| {
            on(ty, body);
            true
        });
    }

    /// Reads records until `on` returns `false`; with `consume`, frees the
    /// space of those read.
    fn walk(&self, consume: bool, mut on: impl FnMut(u32, &[u8]) -> bool) -> usize {
        let head = self.word(DATA_HEAD).load(Ordering::Acquire);
        let mut tail = self.word(DATA_TAIL).load(Ordering::Relaxed);
        let off = self.word(DATA_OFFSET).load(Ordering::Relaxed) as usize;
        let size = self.word(DATA_SIZE).load(Ordering::Relaxed) as usize;
        // Kernels before 4.1 leave offset/size zero: data follows the first page.
        let (off, size) = if size == 0 {
            (4096, self.len.saturating_sub(4096))
        } else {
            (off, size)
        };
        if !size.is_power_of_two() || off.checked_add(size).is_none_or(|e| e > self.len) {
            return 0;
        }
        let data = unsafe { self.base.add(off) };
        let read = |at: u64, out: &mut [u8]| {
            let start = (at as usize) & (size - 1);
            let first = out.len().min(size - start);
            unsafe {
                std::ptr::copy_nonoverlapping(data.add(start), out.as_mut_ptr(), first);
                std::ptr::copy_nonoverlapping(data, out.as_mut_ptr().add(first), out.len() - first);
            }
        };
        let mut n = 0;
        while head.wrapping_sub(tail) >= 8 {
            let mut hdr = [0u8; 8];
            read(tail, &mut hdr);
            let ty = u32::from_le_bytes(hdr[0..4].try_into().unwrap());
            let rec_len = u16::from_le_bytes(hdr[6..8].try_into().unwrap()) as u64;
            if rec_len < 8 || rec_len > head.wrapping_sub(tail) {
                // Corrupt or torn: drop what is there rather than loop.
                tail = head;
                break;
            }
            let body_len = rec_len as usize - 8;
            if body_len <= MAX_BODY {
                let mut body = [0u8; MAX_BODY];
                read(tail + 8, &mut body[..body_len]);
                if !on(ty, &body[..body_len]) {
                    break;
                }
            }
            tail += rec_len;
            n += 1;
        }
        if consume {
            self.word(DATA_TAIL).store(tail, Ordering::Release);
        }
        n
    }
}

/// Reads a little-endian `u64` at `at` in a record body (0 if short).
pub fn field_u64(body: &[u8], at: usize) -> u64 {
    body.get(at..at + 8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()))
}

pub fn field_u32(body: &[u8], at: usize) -> u32 {
    body.get(at..at + 4)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fake ring: one metadata page and `data` bytes of data area, which
    /// a test fills like the kernel would.
    pub(crate) struct FakeRing {
        pub mem: Vec<u64>,
        pub data: usize,
        pub head: u64,
    }

    impl FakeRing {
        pub fn new(data: usize) -> FakeRing {
            let mut r = FakeRing {
                mem: vec![0; (4096 + data) / 8],
                data,
                head: 0,
            };
            r.set(DATA_OFFSET, 4096);
            r.set(DATA_SIZE, data as u64);
            r
        }
        fn set(&mut self, off: usize, v: u64) {
            self.mem[off / 8] = v;
        }
        fn bytes(&mut self) -> &mut [u8] {
            unsafe {
                std::slice::from_raw_parts_mut(self.mem.as_mut_ptr() as *mut u8, self.mem.len() * 8)
            }
        }
        /// Appends a record as the kernel does, wrapping at the end.
        pub fn push(&mut self, ty: u32, body: &[u8]) {
            let mut rec = Vec::new();
            rec.extend_from_slice(&ty.to_le_bytes());
            rec.extend_from_slice(&0u16.to_le_bytes());
            rec.extend_from_slice(&((body.len() + 8) as u16).to_le_bytes());
            rec.extend_from_slice(body);
            let (data, head) = (self.data, self.head);
            for (i, b) in rec.iter().enumerate() {
                let at = 4096 + ((head as usize + i) % data);
                self.bytes()[at] = *b;
            }
            self.head += rec.len() as u64;
            let h = self.head;
            self.set(DATA_HEAD, h);
        }
        pub fn sample(&mut self, ip: u64, pid: u32, tid: u32) {
            let mut b = ip.to_le_bytes().to_vec();
            b.extend_from_slice(&pid.to_le_bytes());
            b.extend_from_slice(&tid.to_le_bytes());
            self.push(PERF_RECORD_SAMPLE, &b);
        }
        pub fn lost(&mut self, n: u64) {
            let mut b = 7u64.to_le_bytes().to_vec();
            b.extend_from_slice(&n.to_le_bytes());
            self.push(PERF_RECORD_LOST, &b);
        }
        pub fn tail(&self) -> u64 {
            self.mem[DATA_TAIL / 8]
        }
        pub fn ring(&mut self) -> Ring {
            let len = self.mem.len() * 8;
            unsafe { Ring::new(self.mem.as_mut_ptr() as *mut u8, len) }
        }
    }

    #[test]
    fn reads_wrapped_records_and_advances_tail() {
        let mut f = FakeRing::new(256);
        let ring = f.ring();
        let mut ips = Vec::new();
        // 24-byte records in a 256-byte ring wrap mid-record repeatedly.
        for round in 0..5u64 {
            for k in 0..7u64 {
                f.sample(round * 100 + k, 1, 2);
            }
            let n = ring.drain_while(|ty, body| {
                assert_eq!(ty, PERF_RECORD_SAMPLE);
                ips.push(field_u64(body, 0));
                assert_eq!((field_u32(body, 8), field_u32(body, 12)), (1, 2));
                true
            });
            assert_eq!(n, 7);
            assert_eq!(f.tail(), f.head);
        }
        let want: Vec<u64> = (0..5u64)
            .flat_map(|r| (0..7).map(move |k| r * 100 + k))
            .collect();
        assert_eq!(ips, want);
    }

    #[test]
    fn corrupt_length_drops_the_rest() {
        let mut f = FakeRing::new(256);
        let ring = f.ring();
        f.push(PERF_RECORD_SAMPLE, &[0; 16]);
        // A header claiming more bytes than were written.
        f.push(PERF_RECORD_SAMPLE, &[]);
        let h = f.head;
        f.bytes()[4096 + 24 + 6] = 200;
        let mut seen = 0;
        ring.drain_while(|_, _| {
            seen += 1;
            true
        });
        assert_eq!(seen, 1);
        assert_eq!(f.tail(), h);
    }
}
