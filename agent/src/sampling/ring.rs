//! Reading one perf ring buffer: the kernel appends records and advances
//! `data_head`; we consume them and advance `data_tail`. Acquire on the head
//! makes the records before it visible; release on the tail tells the
//! kernel the space may be overwritten only after we have read it.
//!
//! Where the cursors are in the header page, and how a record's header is
//! laid out, come from the kernel's own `perf_event.h` types.

use perf_event_open_sys::bindings::{self, perf_event_header, perf_event_mmap_page};
use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicU64, Ordering};

pub const PERF_RECORD_LOST: u32 = bindings::PERF_RECORD_LOST;
pub const PERF_RECORD_SAMPLE: u32 = bindings::PERF_RECORD_SAMPLE;

const DATA_HEAD: usize = offset_of!(perf_event_mmap_page, data_head);
const DATA_TAIL: usize = offset_of!(perf_event_mmap_page, data_tail);
const DATA_OFFSET: usize = offset_of!(perf_event_mmap_page, data_offset);
const DATA_SIZE: usize = offset_of!(perf_event_mmap_page, data_size);

/// Bytes of the header every record starts with.
pub const HEADER: usize = size_of::<perf_event_header>();
const HEADER_TYPE: usize = offset_of!(perf_event_header, type_);
const HEADER_SIZE: usize = offset_of!(perf_event_header, size);

/// Bodies longer than this are not ours to read (the longest we ask for
/// is a sample with a copy of the top of the user stack); they are
/// skipped whole.
const MAX_BODY: usize = 64 + super::stacks::STACK_BYTES as usize + 16;

/// A mapped ring: metadata page followed by a power-of-two data area.
pub struct Ring {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is shared memory that lives as long as the process;
// only the drain thread (or the exit path, under the drain lock) reads it,
// so moving the handle to another thread hands nothing over unsynchronised.
unsafe impl Send for Ring {}
// SAFETY: `&Ring` only reads through atomics and copies, and the one writer
// of `data_tail` is whoever holds the drain lock.
unsafe impl Sync for Ring {}

impl Ring {
    /// # Safety
    /// `base` must be a perf ring mapping (or an equivalent buffer) of
    /// `len` bytes (at least the header page), 8-byte aligned, that
    /// outlives the `Ring`.
    pub unsafe fn new(base: *mut u8, len: usize) -> Ring {
        Ring { base, len }
    }

    pub fn base(&self) -> *mut u8 {
        self.base
    }
    pub fn map_len(&self) -> usize {
        self.len
    }

    /// A `u64` field of the header page.
    fn word(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is a `u64` field's offset in `perf_event_mmap_page`,
        // so 8-aligned from the 8-aligned base and inside the first page of
        // the mapping (`new`'s contract); the kernel writes these words
        // concurrently, hence atomics.
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
        // The kernel's data area is whole pages: far more than one record
        // we copy out, which `read` relies on to stay inside it.
        if !size.is_power_of_two()
            || size < 2 * HEADER
            || off.checked_add(size).is_none_or(|e| e > self.len)
        {
            return 0;
        }
        // SAFETY: checked above: the data area [off, off + size) lies
        // inside the mapping.
        let data = unsafe { self.base.add(off) };
        let read = |at: u64, out: &mut [u8]| {
            let start = (at as usize) & (size - 1);
            let first = out.len().min(size - start);
            // SAFETY: `start + first <= size`, and `out` (a header, or the
            // body of a record no longer than the data area: checked) is no
            // longer than the data area, so the wrapped rest
            // `out.len() - first` fits at its start too; `out` is a local
            // buffer, never the ring.
            unsafe {
                std::ptr::copy_nonoverlapping(data.add(start), out.as_mut_ptr(), first);
                std::ptr::copy_nonoverlapping(data, out.as_mut_ptr().add(first), out.len() - first);
            }
        };
        let mut n = 0;
        // One buffer for every record of the walk: zeroed once, not per
        // record (a sample with a stack copy is over 8 KiB).
        let mut body = [0u8; MAX_BODY];
        while head.wrapping_sub(tail) >= HEADER as u64 {
            let mut hdr = [0u8; HEADER];
            read(tail, &mut hdr);
            let ty = field_u32(&hdr, HEADER_TYPE);
            let rec_len = field_u16(&hdr, HEADER_SIZE) as u64;
            if rec_len < HEADER as u64 || rec_len > head.wrapping_sub(tail) {
                // Corrupt or torn: drop what is there rather than loop.
                tail = head;
                break;
            }
            let body_len = rec_len as usize - HEADER;
            // A record is never longer than the data area (the kernel
            // writes whole records into it), which `read` relies on.
            if body_len <= MAX_BODY && rec_len as usize <= size {
                read(tail + HEADER as u64, &mut body[..body_len]);
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

/// The `N` bytes at `at` in a record, if it has them.
fn bytes_at<const N: usize>(record: &[u8], at: usize) -> Option<[u8; N]> {
    record.get(at..at + N)?.try_into().ok()
}

/// Reads a little-endian `u64` at `at` in a record body (0 if short).
pub fn field_u64(body: &[u8], at: usize) -> u64 {
    bytes_at(body, at).map_or(0, u64::from_le_bytes)
}

pub fn field_u32(body: &[u8], at: usize) -> u32 {
    bytes_at(body, at).map_or(0, u32::from_le_bytes)
}

fn field_u16(body: &[u8], at: usize) -> u16 {
    bytes_at(body, at).map_or(0, u16::from_le_bytes)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fake ring: one metadata page and `data` bytes of data area, which
    /// a test fills like the kernel would, through the kernel's types.
    pub(crate) struct FakeRing {
        pub mem: Vec<u64>,
        /// Where the data area starts.
        pub off: usize,
        pub data: usize,
        pub head: u64,
    }

    impl FakeRing {
        pub fn new(data: usize) -> FakeRing {
            FakeRing::at(4096, data, 0)
        }
        /// The data area at `off`, with `after` more bytes of mapping
        /// behind it (which the ring must not read).
        pub fn at(off: usize, data: usize, after: usize) -> FakeRing {
            let mut r = FakeRing {
                mem: vec![0; (off + data + after) / 8],
                off,
                data,
                head: 0,
            };
            let page = r.page();
            // SAFETY: `mem` is 8-aligned and longer than the page struct;
            // the fields are written in place, no reference is kept.
            unsafe {
                (*page).data_offset = off as u64;
                (*page).data_size = data as u64;
            }
            r
        }
        fn page(&mut self) -> *mut perf_event_mmap_page {
            assert!(self.mem.len() * 8 >= size_of::<perf_event_mmap_page>());
            self.mem.as_mut_ptr().cast()
        }
        fn bytes(&mut self) -> &mut [u8] {
            // SAFETY: the Vec's own buffer, as bytes: `u8` has no alignment
            // and every bit pattern is valid for both types.
            unsafe {
                std::slice::from_raw_parts_mut(self.mem.as_mut_ptr() as *mut u8, self.mem.len() * 8)
            }
        }
        /// Appends a record as the kernel does, wrapping at the end.
        pub fn push(&mut self, ty: u32, body: &[u8]) {
            let header = perf_event_header {
                type_: ty,
                misc: 0,
                size: (HEADER + body.len()) as u16,
            };
            // SAFETY: `perf_event_header` is `repr(C)` integers without
            // padding: all of its bytes are initialised.
            let header: [u8; HEADER] = unsafe { std::mem::transmute(header) };
            let rec: Vec<u8> = header.iter().chain(body).copied().collect();
            let (off, data, head) = (self.off, self.data, self.head);
            for (i, b) in rec.iter().enumerate() {
                let at = off + ((head as usize + i) % data);
                self.bytes()[at] = *b;
            }
            self.head += rec.len() as u64;
            let (page, h) = (self.page(), self.head);
            // SAFETY: as in `at`.
            unsafe { (*page).data_head = h };
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
        pub fn tail(&mut self) -> u64 {
            let page = self.page();
            // SAFETY: as in `at`; the ring wrote it on this thread.
            unsafe { (*page).data_tail }
        }
        pub fn ring(&mut self) -> Ring {
            let len = self.mem.len() * 8;
            // SAFETY: `mem` is 8-aligned, `len` bytes long, and every test
            // drops the ring before the FakeRing.
            unsafe { Ring::new(self.mem.as_mut_ptr() as *mut u8, len) }
        }
    }

    /// The numbers `include/uapi/linux/perf_event.h` fixes: the cursors
    /// start at 1 KiB into the header page ("align to 1k"), and a record
    /// header is `u32 type, u16 misc, u16 size`.
    #[test]
    fn layouts_are_the_kernel_abi() {
        assert_eq!(
            (DATA_HEAD, DATA_TAIL, DATA_OFFSET, DATA_SIZE),
            (1024, 1032, 1040, 1048)
        );
        assert_eq!((HEADER, HEADER_TYPE, HEADER_SIZE), (8, 0, 6));
        assert_eq!((PERF_RECORD_LOST, PERF_RECORD_SAMPLE), (2, 9));
    }

    /// The ring takes the data area from `data_offset`/`data_size`, not
    /// from where kernels before 4.1 put it (right after the first page,
    /// to the end of the mapping), and leaves the bytes behind it alone.
    #[test]
    fn reads_the_data_area_the_header_page_names() {
        let mut f = FakeRing::at(8192, 256, 512);
        let ring = f.ring();
        f.bytes()[4096..8192].fill(0xff);
        f.bytes()[8192 + 256..].fill(0xff);
        for round in 0..3u64 {
            for k in 0..7u64 {
                f.sample(round * 10 + k, 1, 2);
            }
            let mut ips = Vec::new();
            let n = ring.drain_while(|ty, body| {
                assert_eq!(ty, PERF_RECORD_SAMPLE);
                ips.push(field_u64(body, 0));
                true
            });
            assert_eq!(n, 7);
            assert_eq!(ips, (0..7).map(|k| round * 10 + k).collect::<Vec<_>>());
            assert_eq!(f.tail(), f.head);
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
        let at = f.off + 24 + HEADER_SIZE;
        f.bytes()[at] = 200;
        let mut seen = 0;
        ring.drain_while(|_, _| {
            seen += 1;
            true
        });
        assert_eq!(seen, 1);
        assert_eq!(f.tail(), h);
    }
}
