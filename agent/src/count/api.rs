//! The agent's C API (declared in `abi/include/rtprof.h`): a program
//! adds calls and time to one of its functions, by name or by address, as
//! when a kernel runs on an accelerator instead of in software; and
//! switches counting of functions on and off while it runs.

use crate::agent;
use rtprof_abi::SegmentWriter;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::Ordering;

/// Adds to function `slot`: calls to the shared stripe, time as samples.
fn add(slot: u32, calls: u64, time_ns: u64) -> i32 {
    let Some(a) = agent() else { return -1 };
    let w = &a.segment.counters;
    w.add_calls(slot, calls);
    // Time counts in samples of the configured period (1 ms by default).
    let hz = if a.config.sample_hz == 0 {
        1000
    } else {
        a.config.sample_hz
    };
    let period = 1_000_000_000 / hz as u64;
    let samples = (time_ns + period / 2) / period;
    if samples > 0 {
        // Without a sampler the header's period is 0, and the time would
        // read as none: it gets the period the time was counted in.
        w.set_period_if_unset(period);
        w.function_samples(slot)
            .fetch_add(samples, Ordering::Relaxed);
        w.samples_total().fetch_add(samples, Ordering::Relaxed);
    }
    0
}

/// The first function slot `pred` accepts, marked as one the program adds
/// calls to (readers show it as accelerated). Records are read under the
/// agent's state lock: a library being loaded may be adding to them.
fn find(pred: impl Fn(&SegmentWriter, u32) -> bool) -> Option<u32> {
    let mut state = agent()?.state.lock()?;
    let w = &mut state.writer;
    let slot = (0..w.func_count()).find(|&slot| pred(w, slot))?;
    w.set_accelerated(slot);
    Some(slot)
}

/// # Safety
/// `function` must be a NUL-terminated string (or null).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn rtprof_add_calls(
    function: *const c_char,
    calls: u64,
    time_ns: u64,
) -> i32 {
    if function.is_null() {
        return -1;
    }
    let name = CStr::from_ptr(function).to_bytes();
    std::panic::catch_unwind(|| find(|w, slot| w.function_name(slot) == name))
        .ok()
        .flatten()
        .map_or(-1, |slot| add(slot, calls, time_ns))
}

/// # Safety
/// Any address may be passed; only the agent's own tables are read.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn rtprof_add_calls_at(
    address: *const c_void,
    calls: u64,
    time_ns: u64,
) -> i32 {
    let addr = address as u64;
    std::panic::catch_unwind(|| {
        find(|w, slot| {
            let f = w.function(slot);
            let start = w.module(f.module).base.wrapping_add(f.vaddr);
            addr >= start && addr < start.wrapping_add(f.size as u64)
        })
    })
    .ok()
    .flatten()
    .map_or(-1, |slot| add(slot, calls, time_ns))
}

/// # Safety
/// `pattern` must be a NUL-terminated string (or null).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn rtprof_set_counting(pattern: *const c_char, on: i32) -> i32 {
    if pattern.is_null() {
        return -1;
    }
    let glob = CStr::from_ptr(pattern).to_bytes();
    std::panic::catch_unwind(|| {
        let a = agent()?;
        crate::options::counting_requests::set_by_name(a, glob, on != 0).ok()
    })
    .ok()
    .flatten()
    .map_or(-1, |n| n.min(i32::MAX as usize) as i32)
}
