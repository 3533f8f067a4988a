//! Executable memory for stubs within jump range of a module, mapped only
//! into free address space (never over an existing mapping).

use crate::arch::{Native, StubWriter, ThreadContext};
use crate::discover::maps::Maps;
use crate::lifecycle::lock::Lock;

const PAGE: u64 = 4096;
/// A huge page.
const HUGE: u64 = 2 << 20;
/// Stay clear of the lowest pages (mmap_min_addr).
const LOWEST: u64 = 0x10_0000;
const USER_END: u64 = Native::USER_END;
const BRANCH_RANGE: u64 = Native::BRANCH_RANGE;

/// Candidate addresses for `size` bytes reachable from all of [lo, hi):
/// below the module, as close as possible; above it, as far as possible
/// (the heap grows up from the end of the executable).
fn candidates(lo: u64, hi: u64, size: u64, gaps: &[(u64, u64)]) -> Vec<u64> {
    let min = hi.saturating_sub(BRANCH_RANGE).max(LOWEST);
    let max_end = lo.saturating_add(BRANCH_RANGE).min(USER_END);
    let mut below = Vec::new();
    let mut above = Vec::new();
    for &(gs, ge) in gaps {
        let gs = gs.max(min).div_ceil(PAGE) * PAGE;
        let ge = ge.min(max_end) / PAGE * PAGE;
        if ge < gs + size {
            continue;
        }
        if ge <= lo {
            below.push(ge - size);
        } else if gs >= hi {
            above.push(ge - size);
        }
    }
    below.sort_by(|a, b| b.cmp(a));
    above.sort_by(|a, b| b.cmp(a));
    below.into_iter().chain(above).collect()
}

/// Free address space as last read from /proc/self/maps, less the areas
/// mapped here since: start-up maps an area for every module, and reading
/// the maps each time cost more than the mapping. Space taken meanwhile by
/// others only costs a refused `MAP_FIXED_NOREPLACE`; when no candidate
/// maps, the maps are read again.
static GAPS: Lock<Vec<(u64, u64)>> = Lock::new(Vec::new());

/// Removes [start, end) from `gaps`.
fn take(gaps: &mut Vec<(u64, u64)>, start: u64, end: u64) {
    let mut out = Vec::with_capacity(gaps.len() + 1);
    for &(gs, ge) in gaps.iter() {
        if ge <= start || gs >= end {
            out.push((gs, ge));
            continue;
        }
        if gs < start {
            out.push((gs, start));
        }
        if end < ge {
            out.push((end, ge));
        }
    }
    *gaps = out;
}

/// Maps `len` fresh read-write bytes at exactly `addr`, if nothing is
/// mapped there: whether it did.
fn map_fresh(addr: u64, len: u64) -> bool {
    // SAFETY: MAP_FIXED_NOREPLACE: the kernel maps fresh anonymous memory
    // at `addr` only if nothing is mapped there, so no existing memory
    // (the program's or ours) is touched.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return false;
    }
    // Kernels before 4.17 treat the flag as a hint: check the result.
    if p as u64 != addr {
        // SAFETY: `p` is the mapping of `len` bytes just made, referred to
        // nowhere else.
        unsafe { libc::munmap(p, len as usize) };
        return false;
    }
    true
}

/// A read-write anonymous mapping that later becomes read-execute: its
/// first `code_len` bytes; a linked area's last page stays read-write and
/// holds its module's link words (see `arch::LinkWords`).
pub struct StubArea {
    pub addr: u64,
    pub len: u64,
    pub code_len: u64,
    /// Its stubs, and its module's patched code, were mapped from a page
    /// image (see `patch::image`).
    pub from_image: bool,
}

/// In a forked child: a parent's thread that held the free space known
/// does not exist here.
pub fn forget_in_child() {
    GAPS.reset_in_child();
}

impl StubArea {
    /// Maps `size` bytes within jump range of [lo, hi), or `None`. A large
    /// area (a big program's stubs) is laid out in 2 MiB huge pages where
    /// the kernel allows them: its stubs are spread over thousands of hot
    /// functions, and one instruction-TLB entry then covers 2 MiB of them
    /// (cc1 compiling lvm.c: 0.5 ns less per call).
    pub fn near(lo: u64, hi: u64, size: u64) -> Option<StubArea> {
        let mut mine = Vec::new();
        let mut held = GAPS.lock();
        let gaps = match held.as_deref_mut() {
            Some(g) => g,
            // Held by this thread already (not done today): on its own.
            None => &mut mine,
        };
        if gaps.is_empty() {
            *gaps = Maps::current().gaps(LOWEST, USER_END);
        }
        let area = Self::near_in(lo, hi, size, gaps).or_else(|| {
            // Known free space ran out or was taken since: read it afresh.
            *gaps = Maps::current().gaps(LOWEST, USER_END);
            Self::near_in(lo, hi, size, gaps)
        })?;
        take(gaps, area.addr, area.addr + area.len);
        Some(area)
    }

    fn near_in(lo: u64, hi: u64, size: u64, gaps: &[(u64, u64)]) -> Option<StubArea> {
        if size >= HUGE / 2 {
            if let Some(a) = Self::map_first(lo, hi, size.div_ceil(HUGE) * HUGE, HUGE, gaps) {
                // SAFETY: our fresh mapping; the advice only changes how
                // it is backed.
                unsafe {
                    libc::madvise(
                        a.addr as *mut libc::c_void,
                        a.len as usize,
                        libc::MADV_HUGEPAGE,
                    )
                };
                return Some(a);
            }
        }
        Self::map_first(lo, hi, size.div_ceil(PAGE) * PAGE, PAGE, gaps)
    }

    /// Maps `len` bytes at the first candidate (aligned to `align`) that is
    /// free and within jump range.
    fn map_first(lo: u64, hi: u64, len: u64, align: u64, gaps: &[(u64, u64)]) -> Option<StubArea> {
        let in_range = |a: u64| {
            a >= hi.saturating_sub(BRANCH_RANGE) && a + len <= lo.saturating_add(BRANCH_RANGE)
        };
        for addr in candidates(lo, hi, len, gaps)
            .into_iter()
            .map(|a| a / align * align)
            .filter(|&a| in_range(a))
            .take(16)
        {
            if !map_fresh(addr, len) {
                continue;
            }
            return Some(StubArea {
                addr,
                len,
                code_len: len,
                from_image: false,
            });
        }
        None
    }

    /// As [`StubArea::near`], for `size` bytes of stubs and a page of
    /// link words after them.
    pub fn near_linked(lo: u64, hi: u64, size: u64) -> Option<StubArea> {
        let mut a = Self::near(lo, hi, size.div_ceil(PAGE) * PAGE + PAGE)?;
        a.code_len = a.len - PAGE;
        Some(a)
    }

    /// `code_len` bytes of stubs and a page of link words at exactly
    /// `addr`, if nothing is mapped there (never over a mapping).
    pub fn at(addr: u64, code_len: u64) -> Option<StubArea> {
        let len = code_len + PAGE;
        if !addr.is_multiple_of(PAGE)
            || !code_len.is_multiple_of(PAGE)
            || addr < LOWEST
            || addr + len > USER_END
        {
            return None;
        }
        if !map_fresh(addr, len) {
            return None;
        }
        if let Some(mut held) = GAPS.lock() {
            take(&mut held, addr, addr + len);
        }
        Some(StubArea {
            addr,
            len,
            code_len,
            from_image: false,
        })
    }

    /// Where the link words are (a linked area), or 0.
    pub fn link(&self) -> u64 {
        if self.code_len < self.len {
            self.addr + self.code_len
        } else {
            0
        }
    }

    /// Makes the stubs read+execute; writing them is over.
    pub fn seal(&self) -> bool {
        // SAFETY: the area is our own mapping; only the protection of its
        // stubs changes (nothing jumps into them before this).
        unsafe {
            libc::mprotect(
                self.addr as *mut libc::c_void,
                self.code_len as usize,
                libc::PROT_READ | libc::PROT_EXEC,
            ) == 0
        }
    }

    pub fn release(self) {
        // SAFETY: consumes the area, so our own mapping is unmapped once;
        // callers release it before any entry jumps into it, or once its
        // module (whose entries did) is unloaded.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len as usize) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_area_leaves_the_known_gaps() {
        let mut g = vec![(0x1000, 0x9000), (0x10000, 0x20000)];
        take(&mut g, 0x2000, 0x3000);
        take(&mut g, 0x10000, 0x20000);
        take(&mut g, 0x8000, 0x9000);
        assert_eq!(g, [(0x1000, 0x2000), (0x3000, 0x8000)]);
    }

    #[test]
    fn candidates_stay_in_range_and_prefer_below() {
        let lo = 0x5555_0000_0000;
        let hi = lo + 0x10_0000;
        let gaps = [(0x1000, lo - 0x1000), (hi, hi + 0x1_0000_0000)];
        let c = candidates(lo, hi, 0x2000, &gaps);
        assert_eq!(c[0], lo - 0x1000 - 0x2000);
        for a in &c {
            assert!(a + 0x2000 <= lo + BRANCH_RANGE && *a >= hi - BRANCH_RANGE);
        }
        assert!(c.iter().any(|&a| a >= hi));
    }

    #[test]
    fn maps_near_own_code() {
        let here = candidates_stay_in_range_and_prefer_below as *const () as u64;
        let a = StubArea::near(here, here + 1, 10_000).expect("area");
        assert!(a.addr.abs_diff(here) < BRANCH_RANGE);
        // SAFETY: the area is mapped read-write and ours.
        unsafe { *(a.addr as *mut u8) = 0xc3 };
        assert!(a.seal());
        // SAFETY: the area now holds `ret` and is executable: a function
        // that takes nothing and returns at once.
        let f: extern "C" fn() = unsafe { std::mem::transmute(a.addr as *const ()) };
        f();
        a.release();
    }
}
