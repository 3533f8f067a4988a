//! Exact loop counts (`RTPROF_LOOPS=globs`): for each loop of the functions
//! named, four counters (arrivals at its header's probe, branches back sent
//! past that count, branches back that reached it, times it left from its
//! top). Like calls, they are counted per thread: each thread has its own
//! array, reached from a thread-local pointer, that its probes bump
//! without an atomic; a thread without one (its array not yet given, or
//! already folded at its end) bumps the shared array atomically. Every
//! array has room for every loop, in address space only: a page gets
//! memory when a probe first bumps a counter in it, so libraries loaded
//! later (`dlopen`) get probes and counters like those present at
//! start-up. At exit, the list of every loop with its counts (or why it
//! has none) is written beside the counter segment.

use crate::arch::{Native, ThreadContext};
use rtprof_abi::loops::LoopRefusal;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Loops counted at most.
const LOOPS: usize = 1 << 16;
const PER_LOOP: usize = 4;

static GLOBS: OnceLock<Vec<String>> = OnceLock::new();
/// The shared array (LOOPS * PER_LOOP counters).
static SHARED: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());
static CLAIMED: AtomicU32 = AtomicU32::new(0);
/// pthread key whose destructor folds a thread's array at its end.
static EXIT_KEY: AtomicUsize = AtomicUsize::new(usize::MAX);

/// A loop of a named function: (slot, header's offset in it, its
/// counters' index or why none).
type Site = (u32, u32, Result<u32, LoopRefusal>);
/// Loops noted at most (counted or not).
const SITES: usize = 1 << 17;
/// Every loop of a named function, in the order noted: two words each,
/// `slot << 32 | offset` and its counters' index, or [`REFUSED`] with the
/// reason's code. Written by one thread at a time (start-up, or the
/// loader's hook under the agent's lock), each loop before the count is
/// raised past it: read at exit without a lock (a forked child may exit
/// while a thread not in it held one).
static SITE_WORDS: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());
static SITE_COUNT: AtomicUsize = AtomicUsize::new(0);
const REFUSED: u64 = 1 << 63;

/// Threads with an array of their own at once, at most; others count in
/// the shared array.
const ARRAYS: usize = 4096;
/// Per-thread arrays, mapped as threads need them and never unmapped; an
/// array whose thread ended is folded and given to the next thread. No
/// lock: a thread claims a free one with a compare-and-swap.
static ARRAY: [AtomicPtr<AtomicU64>; ARRAYS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; ARRAYS];
static IN_USE: [AtomicBool; ARRAYS] = [const { AtomicBool::new(false) }; ARRAYS];

/// Sets the function name globs whose loops are counted (start-up).
pub fn select(globs: &[String]) {
    let _ = GLOBS.set(globs.to_vec());
    // The shared array now, while the process has one thread: loops are
    // claimed later from any thread (a library loaded by `dlopen`).
    if wanted() && SHARED.load(Ordering::Acquire).is_null() {
        SHARED.store(map(LOOPS * PER_LOOP), Ordering::Release);
    }
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is ours to write; the destructor is an extern "C" fn
    // that lives as long as the library.
    if unsafe { libc::pthread_key_create(&mut key, Some(on_thread_exit)) } == 0 {
        EXIT_KEY.store(key as usize, Ordering::Release);
    }
}

/// Whether any function's loops are to be counted.
pub fn wanted() -> bool {
    GLOBS.get().is_some_and(|g| !g.is_empty())
}

/// Whether the loops of the function named `name` are to be counted.
pub fn wanted_for(name: &str) -> bool {
    GLOBS.get().is_some_and(|g| {
        g.iter()
            .any(|p| rtprof_shared::glob_match(p.as_bytes(), name.as_bytes()))
    })
}

/// `counters` zero words of address space, whose pages get memory when
/// first written.
fn map(counters: usize) -> *mut AtomicU64 {
    let len = (counters * 8).max(1);
    // SAFETY: an anonymous private mapping, ours alone.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        p.cast()
    }
}

/// The shared array, if it could be mapped (at [`select`]).
fn shared() -> Option<&'static [AtomicU64]> {
    let t = SHARED.load(Ordering::Acquire);
    // SAFETY: mapped once, zeroed, LOOPS * PER_LOOP atomics, never unmapped.
    (!t.is_null()).then(|| unsafe { std::slice::from_raw_parts(t, LOOPS * PER_LOOP) })
}

/// One loop's counters: its index, where each lies in a thread's array
/// (counter number), and its address in the shared array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counters {
    pub index: u32,
    pub arrivals: Counter,
    pub back: Counter,
    pub back_through: Counter,
    pub top_exits: Counter,
}

/// One counter: its number in a thread's array, and its address in the
/// shared array (what a probe bumps).
pub type Counter = crate::arch::ProbeCounter;

/// The counters of one more loop.
pub fn claim() -> Result<Counters, LoopRefusal> {
    let t = shared().ok_or(LoopRefusal::NoMemory)?;
    let i = CLAIMED
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            ((n as usize) < LOOPS).then_some(n + 1)
        })
        .map_err(|_| LoopRefusal::TooMany)?;
    let at = |k: usize| {
        let n = i as usize * PER_LOOP + k;
        Counter {
            number: n as u32,
            shared: t[n].as_ptr() as u64,
        }
    };
    Ok(Counters {
        index: i,
        arrivals: at(0),
        back: at(1),
        back_through: at(2),
        top_exits: at(3),
    })
}

/// Counters in use in each array (each has room for every loop's).
fn per_thread() -> usize {
    CLAIMED.load(Ordering::Acquire) as usize * PER_LOOP
}

/// Gives the calling thread an array of its own (the main thread once
/// the probes are in, each new thread as it starts).
pub fn attach_thread() {
    if !wanted() || Native::thread_word(Native::loops_tls_offset()) != 0 {
        return;
    }
    let Some(i) = (0..ARRAYS).find(|&i| {
        IN_USE[i]
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }) else {
        return;
    };
    let mut p = ARRAY[i].load(Ordering::Acquire);
    if p.is_null() {
        p = map(LOOPS * PER_LOOP);
        if p.is_null() {
            IN_USE[i].store(false, Ordering::Release);
            return;
        }
        ARRAY[i].store(p, Ordering::Release);
    }
    Native::set_thread_word(Native::loops_tls_offset(), p as u64);
    let key = EXIT_KEY.load(Ordering::Acquire);
    if key != usize::MAX {
        // SAFETY: a key we created; the value is the array, read back by
        // the destructor only.
        unsafe { libc::pthread_setspecific(key as libc::pthread_key_t, p.cast()) };
    }
}

/// At a thread's end: later probes of the thread (other destructors) go
/// to the shared array; its own array's counts are added there, and the
/// array is cleared for the next thread.
unsafe extern "C" fn on_thread_exit(p: *mut libc::c_void) {
    Native::set_thread_word(Native::loops_tls_offset(), 0);
    let (Some(t), n) = (shared(), per_thread()) else {
        return;
    };
    let p: *mut AtomicU64 = p.cast();
    // SAFETY: `p` is this thread's array of LOOPS * PER_LOOP >= `n`
    // counters (never unmapped), which no probe bumps any more: the
    // thread pointer is cleared.
    let mine = unsafe { std::slice::from_raw_parts(p, n) };
    // Counters never bumped are not written: their pages stay unbacked.
    // Added to the shared array first: a report read meanwhile sees a
    // count twice rather than not at all.
    for (s, m) in t.iter().zip(mine) {
        let v = m.load(Ordering::Relaxed);
        if v != 0 {
            s.fetch_add(v, Ordering::Relaxed);
            m.fetch_sub(v, Ordering::Relaxed);
        }
    }
    if let Some(i) = (0..ARRAYS).find(|&i| ARRAY[i].load(Ordering::Acquire) == p) {
        IN_USE[i].store(false, Ordering::Release);
    }
}

/// Records the loops of one function (slot), each with its header's
/// offset and its counters' index or why none. One caller at a time
/// (start-up, or the loader's hook under the agent's lock).
pub fn note(slot: u32, loops: impl IntoIterator<Item = (u32, Result<u32, LoopRefusal>)>) {
    let mut words = SITE_WORDS.load(Ordering::Acquire);
    if words.is_null() {
        words = map(SITES * 2);
        if words.is_null() {
            return;
        }
        SITE_WORDS.store(words, Ordering::Release);
    }
    // SAFETY: mapped once, SITES * 2 words, never unmapped.
    let words = unsafe { std::slice::from_raw_parts(words, SITES * 2) };
    let mut n = SITE_COUNT.load(Ordering::Relaxed);
    for (off, o) in loops {
        if n == SITES {
            break;
        }
        let what = match o {
            Ok(i) => i as u64,
            Err(why) => REFUSED | why as u64,
        };
        words[2 * n].store((slot as u64) << 32 | off as u64, Ordering::Relaxed);
        words[2 * n + 1].store(what, Ordering::Relaxed);
        n += 1;
        // Readers see a loop only once it is written.
        SITE_COUNT.store(n, Ordering::Release);
    }
}

/// The loops noted so far.
fn sites() -> impl Iterator<Item = Site> {
    let n = SITE_COUNT.load(Ordering::Acquire);
    let words = SITE_WORDS.load(Ordering::Acquire);
    let words: &[AtomicU64] = if words.is_null() {
        &[]
    } else {
        // SAFETY: as in `note`; the first `n` loops are written.
        unsafe { std::slice::from_raw_parts(words, n * 2) }
    };
    words.chunks(2).map(|w| {
        let (at, what) = (w[0].load(Ordering::Relaxed), w[1].load(Ordering::Relaxed));
        let o = match what & REFUSED {
            0 => Ok(what as u32),
            _ => Err(LoopRefusal::ALL
                .into_iter()
                .find(|&r| r as u64 == what & !REFUSED)
                .unwrap_or(LoopRefusal::Undecoded)),
        };
        ((at >> 32) as u32, at as u32, o)
    })
}

/// Counter `i` summed over the shared array and every thread's.
fn total(shared: &[AtomicU64], i: usize) -> u64 {
    let mut v = shared[i].load(Ordering::Relaxed);
    for a in &ARRAY {
        let p = a.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: every array holds `per_thread()` counters, more than
            // `i`, and is never unmapped.
            v = v.wrapping_add(unsafe { &*p.add(i) }.load(Ordering::Relaxed));
        }
    }
    v
}

/// The loops noted, as text: `rtprof-loops 1`, then `<slot> <header
/// offset> <entries> <back> <top exits>` or `<slot> <header offset> -
/// <reason>` per loop; `None` if no function's loops were wanted.
pub fn text() -> Option<String> {
    use std::fmt::Write as _;
    if !wanted() {
        return None;
    }
    let t = shared();
    let mut out = String::from("rtprof-loops 1\n");
    for (slot, off, o) in sites() {
        let _ = match (o, t) {
            (Ok(i), Some(t)) => {
                let c = i as usize * PER_LOOP;
                let [arrivals, back, through, top] = [0, 1, 2, 3].map(|k| total(t, c + k));
                // Branches back through the header's probe arrived there too.
                let entries = arrivals.saturating_sub(through);
                let back = back.saturating_add(through);
                writeln!(out, "{slot} {off} {entries} {back} {top}")
            }
            (Err(why), _) => writeln!(out, "{slot} {off} - {}", why.name()),
            (Ok(_), None) => writeln!(out, "{slot} {off} - {}", LoopRefusal::NoMemory.name()),
        };
    }
    Some(out)
}

/// In a forked child (one thread, allocation-free): the parent's loops
/// ran in the parent; the child's counts start from zero, in the forking
/// thread's array (the others' threads do not exist here).
pub fn forget_in_child() {
    if SHARED.load(Ordering::Acquire).is_null() {
        return;
    }
    let n = per_thread();
    let zero = |p: *mut AtomicU64| {
        // SAFETY: an array of at least `n` counters, mapped for good.
        for c in unsafe { std::slice::from_raw_parts(p, n) } {
            // Pages never written stay unbacked.
            if c.load(Ordering::Relaxed) != 0 {
                c.store(0, Ordering::Relaxed);
            }
        }
    };
    zero(SHARED.load(Ordering::Acquire));
    let mine = Native::thread_word(Native::loops_tls_offset()) as *mut AtomicU64;
    for (a, used) in ARRAY.iter().zip(&IN_USE) {
        let p = a.load(Ordering::Acquire);
        if !p.is_null() {
            zero(p);
        }
        used.store(!p.is_null() && p == mine, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_claimed_counted_per_thread_and_listed() {
        select(&["hot*".to_string()]);
        assert!(wanted() && wanted_for("hot_loop") && !wanted_for("cold"));
        let c = claim().unwrap();
        assert_eq!(c.back.number, c.arrivals.number + 1);
        assert_eq!(c.top_exits.shared, c.arrivals.shared + 24);
        note(7, [(16, Ok(c.index)), (48, Err(LoopRefusal::ShortLatch))]);
        // 3 entries, 20 branches back past the count and 10 through it,
        // 2 leavings from the top: some in the shared array, some in a
        // thread's own, which is folded in at its end.
        let bump = |at: u64, n: u64| {
            // SAFETY: a counter of an array of ours.
            unsafe { (*(at as *const AtomicU64)).fetch_add(n, Ordering::Relaxed) };
        };
        bump(c.arrivals.shared, 5);
        bump(c.back.shared, 20);
        std::thread::spawn(move || {
            attach_thread();
            let mine = Native::thread_word(Native::loops_tls_offset());
            assert_ne!(mine, 0);
            for (k, n) in [(c.arrivals, 8), (c.back_through, 10), (c.top_exits, 2)] {
                bump(mine + k.number as u64 * 8, n);
            }
            let t = text().unwrap();
            assert!(t.contains("7 16 3 30 2\n"), "{t}");
        })
        .join()
        .unwrap();
        let t = text().unwrap();
        assert!(t.starts_with("rtprof-loops 1\n"), "{t}");
        assert!(t.contains("7 16 3 30 2\n"), "{t}");
        assert!(t.contains("7 48 - short_latch\n"), "{t}");
        forget_in_child();
        assert!(text().unwrap().contains("7 16 0 0 0\n"));
    }
}
