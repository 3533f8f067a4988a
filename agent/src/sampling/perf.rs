//! Per-CPU `cpu-clock` sampling events on this process, user space only.
//!
//! One event per online CPU (`pid = 0`, `cpu = N`, inherited by threads
//! created later; `cpu = -1` cannot be mapped with inherit). Each gets a
//! ring buffer mapping; the descriptor is then closed, because the mapping
//! keeps the event alive: the program's descriptor table stays exactly its
//! own, and a program that closes every descriptor cannot disturb sampling.

use super::ring::{Ring, HEADER};
use super::stacks::STACK_BYTES;
use crate::error::Errno;
use perf_event::events::Software;
use perf_event::{Builder, SampleFlag};
use rtprof_abi::sampling::Why;
use std::os::fd::IntoRawFd;

/// More CPUs than this and the agent samples with per-thread timers
/// instead: descriptors and locked ring memory stay bounded per process.
pub const MAX_CPUS: usize = 256;
/// Bytes per sample record: the header, ip (u64), pid and tid (u32 each);
/// with stacks also the registers' ABI and three registers (u64 each), the
/// stack copy with its size before and its filled size after.
const fn record_bytes(stacks: bool) -> u64 {
    let plain = HEADER as u64 + 8 + 4 + 4;
    if stacks {
        plain + 8 + 3 * 8 + 8 + STACK_BYTES as u64 + 8
    } else {
        plain
    }
}
/// The user registers a sample with a stack carries: bp, sp, ip
/// (`perf_regs` numbering on x86-64).
const STACK_REGS: u64 = (1 << 6) | (1 << 7) | (1 << 8);
/// The drain thread wakes at least this often; rings hold twice as much.
pub const MAX_SLEEP_MS: u64 = 1000;
/// Ring data pages per CPU, at most (256 KiB).
const MAX_PAGES: u64 = 64;

/// A failure with the reason the report gives and its errno, if a system
/// call failed.
pub type Failure = (Why, Option<Errno>);

/// Data pages per ring for `hz` samples per second on one CPU: two drain
/// intervals' worth, a power of two.
pub fn ring_pages(hz: u32, stacks: bool) -> u64 {
    let bytes = hz as u64 * record_bytes(stacks) * 2 * MAX_SLEEP_MS / 1000;
    bytes.div_ceil(4096).next_power_of_two().clamp(2, MAX_PAGES)
}

/// How long the drain thread may sleep so no ring fills in between.
pub fn sleep_ms(hz: u32, stacks: bool) -> u64 {
    let capacity = ring_pages(hz, stacks) * 4096 / record_bytes(stacks);
    (capacity * 1000 / (2 * hz.max(1) as u64)).clamp(10, MAX_SLEEP_MS)
}

/// The CPUs the kernel reports online ("0-3,8").
fn online_cpus() -> Vec<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let mut ends = part.splitn(2, '-').map(|n| n.trim().parse::<usize>().ok());
        match (ends.next().flatten(), ends.next()) {
            (Some(a), None) => cpus.push(a),
            (Some(a), Some(Some(b))) if b >= a && b - a < 65536 => cpus.extend(a..=b),
            _ => {}
        }
    }
    if cpus.is_empty() {
        // SAFETY: sysconf takes a name constant and no pointer.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize;
        cpus.extend(0..n);
    }
    cpus
}

fn open_one(cpu: usize, period_ns: u64, stacks: bool) -> std::io::Result<i32> {
    let mut b = Builder::new(Software::CPU_CLOCK);
    b.observe_self()
        .one_cpu(cpu)
        .inherit(true)
        .inherit_thread(true)
        .sample_period(period_ns)
        .exclude_kernel(true)
        .exclude_hv(true)
        .enabled(true);
    if stacks {
        b.sample(SampleFlag::IP | SampleFlag::TID | SampleFlag::REGS_USER | SampleFlag::STACK_USER)
            .sample_regs_user(STACK_REGS)
            .sample_stack_user(STACK_BYTES);
    } else {
        b.sample(SampleFlag::IP | SampleFlag::TID);
    }
    Ok(b.build()?.into_raw_fd())
}

/// Opens and maps one event per online CPU. On failure nothing stays open.
pub fn open(hz: u32, stacks: bool) -> Result<Vec<Ring>, Failure> {
    let period_ns = 1_000_000_000 / hz.max(1) as u64;
    open_rings(ring_pages(hz, stacks), |cpu| {
        open_one(cpu, period_ns, stacks)
    })
}

/// Opens (with `open_on`, given a CPU) and maps one event per online CPU,
/// each with a ring of `pages` data pages. On failure nothing stays open.
pub fn open_rings(
    pages: u64,
    open_on: impl Fn(usize) -> std::io::Result<i32>,
) -> Result<Vec<Ring>, Failure> {
    let cpus = online_cpus();
    if cpus.len() > MAX_CPUS {
        return Err((Why::TooManyCpus, None));
    }
    let len = ((1 + pages) * 4096) as usize;
    let mut rings: Vec<Ring> = Vec::with_capacity(cpus.len());
    let fail = |rings: Vec<Ring>, f: Failure| {
        for r in rings {
            // SAFETY: each ring is a mapping of `map_len` bytes made below,
            // dropped here with the only handle to it.
            unsafe { libc::munmap(r.base() as *mut libc::c_void, r.map_len()) };
        }
        Err(f)
    };
    // Threads only, not child processes: a forked child opens its own.
    // Kernels before 5.13 lack inherit_thread (EINVAL); there every
    // descendant would write into our rings, so the timers serve instead.
    for &cpu in &cpus {
        let fd = match open_on(cpu) {
            Ok(fd) => fd,
            // Listed online but gone (hot-unplugged): nothing runs there.
            Err(e) if Errno::of(&e) == Errno(libc::ENODEV) && !rings.is_empty() => continue,
            Err(e) => return fail(rings, (Why::PerfRefused, Some(Errno::of(&e)))),
        };
        // SAFETY: a new shared mapping of the event's ring (no address
        // given: nothing existing is replaced); `fd` is the event just opened.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        let err = Errno::last();
        // SAFETY: `fd` is ours (from `into_raw_fd`) and closed only here;
        // the mapping keeps the event alive.
        unsafe { libc::close(fd) };
        if p == libc::MAP_FAILED {
            return fail(rings, (Why::PerfMapFailed, Some(err)));
        }
        // SAFETY: `p` is a page-aligned mapping of `len` bytes that is never
        // unmapped while a Ring refers to it (only `fail` unmaps, consuming
        // the rings).
        rings.push(unsafe { Ring::new(p as *mut u8, len) });
    }
    if rings.is_empty() {
        return Err((Why::PerfRefused, Some(Errno(libc::ENODEV))));
    }
    Ok(rings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_sizes_cover_two_drain_intervals() {
        assert_eq!(ring_pages(1000, false), 16);
        assert_eq!(sleep_ms(1000, false), MAX_SLEEP_MS);
        for (hz, stacks) in [1, 10, 100, 1000, 5000, 10_000]
            .into_iter()
            .map(|hz| (hz, false))
            // With stacks, rings are as large as they get: the drain
            // thread wakes often enough at the default rate.
            .chain([(1, true), (100, true), (1000, true)])
        {
            let capacity = ring_pages(hz, stacks) * 4096 / record_bytes(stacks);
            let per_sleep = hz as u64 * sleep_ms(hz, stacks) / 1000;
            assert!(capacity >= 2 * per_sleep, "{hz} Hz, stacks {stacks}");
        }
    }
}
