//! Sampling: where the CPU time goes. Every sample's instruction pointer is
//! attributed to a function (or a module, or "unknown") and counted in the
//! counter segment next to the call counts.
//!
//! Two samplers: per-thread CPU-time timers with a signal handler (the
//! default: they expire at the scheduler's tick, which runs anyway, so a
//! sample costs a signal and no interrupt of its own), or per-CPU perf
//! `cpu-clock` events drained by one agent thread (when a timer cannot
//! be armed, or asked for: each sample is a timer interrupt of its own,
//! which on a virtual machine costs tens of microseconds).
//! `RTPROF_SAMPLE_HZ` sets the rate (default 1000 per second of CPU
//! time), `RTPROF_SAMPLER` forces a choice. The header records which ran
//! and why. Modules only sampled are named on demand with either: the
//! timer's samples that land in one not named yet wait in `held`.

pub mod addrmap;
pub mod count_table;
mod held;
pub mod offsets;
pub(crate) mod perf;
pub mod ring;
pub(crate) mod stacks;
pub(crate) mod timer;

use crate::config::SamplerChoice;
use crate::error::Errno;
use crate::lifecycle::worker::{Next, Worker};
use crate::log::vlog;
use crate::Agent;
use ring::{field_u32, field_u64, Ring, PERF_RECORD_LOST, PERF_RECORD_SAMPLE};
use rtprof_abi::sampling::{Sampler, Why};
use rtprof_abi::SegmentWriter;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// The perf rings of this process (leaked: they live as long as it does;
/// a forked child forgets its parent's, which it does not map).
static RINGS: AtomicPtr<Vec<Ring>> = AtomicPtr::new(std::ptr::null_mut());
/// Held while rings are drained (drain thread, or the exit path).
static DRAINING: AtomicBool = AtomicBool::new(false);
/// Set while a drain names modules on demand, which waits for the agent's
/// lock: an ending thread does not wait for such a drain.
static NAMING: AtomicBool = AtomicBool::new(false);

/// Whether [`drain`] waits for a drain under way.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    No,
    Yes,
    /// Unless that drain waits for the agent's lock (an ending thread: the
    /// lock's holder may wait for threads to stop).
    UnlessNaming,
}
/// The sampler this process runs, a [`Sampler`] code.
static KIND: AtomicU32 = AtomicU32::new(0);

/// The sampler that runs (stored as its code, for signal handlers).
fn kind() -> Sampler {
    Sampler::from_code(KIND.load(Ordering::Acquire)).unwrap_or(Sampler::Off)
}
static PID: AtomicU32 = AtomicU32::new(0);
/// The thread that drains perf rings, and names the modules timer samples
/// are held for.
static DRAINER: Worker = Worker::new(c"rtprof-drain", rtprof_abi::layout::cost::SAMPLING_NS);
/// Timer samples in modules not named yet are held for the drain thread
/// (it runs); otherwise every module is named before the timers start.
static HOLDING: AtomicBool = AtomicBool::new(false);

/// Wakes the drain thread: a timer sample is held (async-signal-safe).
fn wake_drainer() {
    DRAINER.wake();
}

fn period_ns(hz: u32) -> u64 {
    1_000_000_000 / hz.max(1) as u64
}

fn record(a: &Agent, s: Sampler, why: Why, errno: Option<Errno>) {
    let errno = errno.map_or(0, |e| e.0.max(0) as u32);
    KIND.store(s.code(), Ordering::Release);
    // Timer samples are attributed where they land, in a signal handler:
    // without a drain thread to name modules for them, every module is
    // named before the first one.
    if s == Sampler::Timer && !HOLDING.load(Ordering::Acquire) {
        crate::lifecycle::loader::name_all_on_demand(a);
    }
    // A sampler that stopped keeps its period: its samples still count.
    let period = if s == Sampler::Off && why != Why::SignalTaken {
        0
    } else {
        period_ns(a.config.sample_hz)
    };
    a.segment.counters.set_sampler(s, why, errno, period);
    vlog!(
        "sampler: {}",
        rtprof_abi::sampling::Described {
            sampler: s,
            why,
            errno
        }
    );
}

/// Chooses and starts a sampler. Runs after the address table is published.
pub fn start(a: &'static Agent) {
    PID.store(std::process::id(), Ordering::Relaxed);
    if crate::lifecycle::sandbox::on() {
        return record(a, Sampler::Off, Why::Sandboxed, None);
    }
    // Only `rtprof run` reads where samples landed (a machine's other
    // processes would each fill a 256 KiB table for nothing).
    offsets::set_wanted(a.segment.has_run_dir());
    choose(a, Why::Default);
    crate::options::events::start(a, drains());
}

/// Whether a drain thread runs for the sampler (perf's, or the timers'
/// namer), which can drain event rings too.
fn drains() -> bool {
    kind() == Sampler::Perf || kind() == Sampler::Timer && HOLDING.load(Ordering::Acquire)
}

/// perf events, else CPU-time timers, as configured; `default_why` is what
/// the report says when the first choice works.
fn choose(a: &'static Agent, default_why: Why) {
    let hz = a.config.sample_hz;
    let choice = a.config.sampler;
    if hz == 0 || choice == SamplerChoice::Off {
        return record(a, Sampler::Off, Why::SwitchedOff, None);
    }
    let asked = if choice == SamplerChoice::Auto {
        default_why
    } else {
        Why::Requested
    };
    let mut fell_back = None;
    if choice != SamplerChoice::Perf {
        match start_timer(a) {
            Ok(()) => return record(a, Sampler::Timer, asked, None),
            Err((why, e)) if choice == SamplerChoice::Timer => {
                return record(a, Sampler::Off, why, e)
            }
            Err(f) => fell_back = Some(f),
        }
    }
    match start_perf(a) {
        Ok(()) => {
            let (why, e) = fell_back.unwrap_or((asked, None));
            record(a, Sampler::Perf, why, e)
        }
        Err((why, e)) => record(a, Sampler::Off, why, e),
    }
}

fn drain_now(wait: bool) -> Next {
    let Some(a) = crate::agent() else {
        return Next::Idle;
    };
    crate::options::counting_requests::serve_control(a);
    match drain(a, if wait { Wait::Yes } else { Wait::No }, true) {
        0 => Next::Idle,
        _ => Next::Busy,
    }
}

/// Whether modules only sampled may wait for their first sample to have
/// their functions listed: samples pass through the drain thread, which
/// lists them before attributing it.
pub fn names_on_demand() -> bool {
    kind() != Sampler::Timer || HOLDING.load(Ordering::Acquire)
}

fn start_drainer(a: &Agent) -> Result<(), Errno> {
    // Timer samples wake it when they need it: it may sleep long.
    let sleep_ms = if RINGS.load(Ordering::Acquire).is_null() && timer::active() {
        perf::MAX_SLEEP_MS
    } else {
        perf::sleep_ms(a.config.sample_hz, a.config.stacks)
    };
    DRAINER.wake_on_requests(a.segment.counters.control_words());
    DRAINER.start(sleep_ms, void_stripe(a), drain_now)
}

fn start_perf(a: &'static Agent) -> Result<(), perf::Failure> {
    // The drain thread first: started before the events exist, it does not
    // inherit them, and its own CPU time is not sampled as the program's.
    start_drainer(a).map_err(|e| (Why::NoDrainThread, Some(e)))?;
    // Samples with stacks need rings 30 times larger: where the locked
    // memory they take is refused, samples without stacks still serve.
    let with_stacks = perf::open(a.config.sample_hz, a.config.stacks);
    let rings = match with_stacks {
        Err((Why::PerfMapFailed, e)) if a.config.stacks => {
            vlog!(
                "no room for rings with stacks ({}); sampling without stacks",
                e.map_or_else(String::new, |e| e.to_string())
            );
            perf::open(a.config.sample_hz, false)
        }
        r => r,
    };
    let rings = match rings {
        Ok(r) => r,
        Err(f) => {
            DRAINER.stop();
            return Err(f);
        }
    };
    RINGS.store(Box::into_raw(Box::new(rings)), Ordering::Release);
    Ok(())
}

/// Private memory the drain thread counts into, so that its own calls of
/// instrumented library functions never show in the program's counts.
pub(crate) fn void_stripe(a: &Agent) -> usize {
    static VOID: AtomicU64 = AtomicU64::new(0);
    let have = VOID.load(Ordering::Acquire);
    if have != 0 {
        return have as usize;
    }
    let len = a.segment.counters.layout().stripe_bytes as usize;
    // SAFETY: a fresh private anonymous mapping, kept for the process's
    // life.
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
        return 0;
    }
    VOID.store(p as u64, Ordering::Release);
    p as usize
}

/// The program's last thread has ended (see `threads`).
pub fn program_threads_gone() {
    DRAINER.program_gone();
}

/// Before this process image ends without exit handlers (`_exit`, exec):
/// the samples still in the rings. Not in a vfork child (another pid
/// sharing our memory).
pub fn image_ending() {
    use crate::lifecycle::process_mark::{memory, Memory};
    // Never started, or a copy that is not ours: nothing, without a call.
    if PID.load(Ordering::Relaxed) == 0 || memory() == Memory::Copied {
        return;
    }
    // Nothing to drain (the timers' samples are counted as they come): no
    // check either, so an exec costs no reading of /proc.
    if RINGS.load(Ordering::Acquire).is_null() && !held::any() && !crate::options::events::active()
    {
        return;
    }
    // A filter that arrived unseen (a raw system call) forbids what we
    // cannot know: no drain, no call of ours.
    if crate::lifecycle::sandbox::filter_arrived_unseen() {
        return;
    }
    if in_own_process() {
        if let Some(a) = crate::agent() {
            // Perhaps from a signal handler: nothing is named (no heap),
            // and a drain naming modules (waiting for the agent's lock,
            // which the interrupted code may hold) is not waited for.
            drain(a, Wait::UnlessNaming, false);
        }
    }
}

/// The program is about to install a seccomp filter (see
/// `lifecycle::sandbox`): no more samples, and no system call of the
/// sampler's after this (the drain thread joined, timers deleted, rings
/// unmapped, which ends their events: the descriptors were closed).
pub fn stop_for_sandbox() {
    HOLDING.store(false, Ordering::Release);
    DRAINER.stop();
    if timer::active() {
        timer::stop_all();
    }
    while DRAINING
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::thread::yield_now();
    }
    // Samples held for names count for their modules (nothing is named
    // from here on, and nothing is written at exit under a filter).
    if let Some(a) = crate::agent() {
        held::settle(a, None);
    }
    let rings = RINGS.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if !rings.is_null() {
        // SAFETY: the Box start_perf leaked, taken back once (RINGS is null
        // from now on, and no drain holds the lock): nobody reads the rings.
        let rings = unsafe { Box::from_raw(rings) };
        for r in rings.iter() {
            // SAFETY: each ring is a mapping of `map_len` bytes that only
            // drains (excluded above) read.
            unsafe { libc::munmap(r.base() as *mut libc::c_void, r.map_len()) };
        }
    }
    DRAINING.store(false, Ordering::Release);
    if let Some(a) = crate::agent() {
        record(a, Sampler::Off, Why::Sandboxed, None);
    }
}

/// Whether this is the process the agent started in (or its fork child
/// once the fork handlers ran), not a vfork child sharing its memory nor
/// a `clone()` child that copied it.
pub fn in_own_process() -> bool {
    use crate::lifecycle::process_mark::{memory, Memory};
    // The agent never started here: no process of its own (and no call to
    // find out, as with the agent switched off nothing may be called).
    if PID.load(Ordering::Relaxed) == 0 {
        return false;
    }
    match memory() {
        Memory::Copied => false,
        // Once a filter may exist, no `getpid`: a vfork child (the only
        // other task sharing this memory) finds the agent's threads and
        // sampler already stopped, so nothing it does here matters.
        Memory::Own if crate::lifecycle::sandbox::on() => true,
        _ => PID.load(Ordering::Relaxed) == std::process::id(),
    }
}

/// Stops the drain thread (a process must be single-threaded to enter a
/// user namespace); returns whether to [`resume_drain`] afterwards.
pub fn pause_drain() -> bool {
    DRAINER.stop()
}

pub fn resume_drain() {
    if let Some(a) = crate::agent() {
        if let Err(e) = start_drainer(a) {
            vlog!("drain thread not restarted: {e}");
            // No one to name modules for the timers from now on: all of
            // them now, and the samples held so far.
            if HOLDING.swap(false, Ordering::AcqRel) {
                crate::lifecycle::loader::name_all_on_demand(a);
                drain(a, Wait::Yes, true);
            }
        }
    }
}

/// Reads every ring once; returns the records read. `wait` says whether
/// to wait for a drain in progress (the exit path wants the last samples)
/// or skip if there is one. With `name`, a module named on demand is
/// named when a sample lands in it (which allocates); without, such
/// samples count for the module.
pub fn drain(a: &Agent, wait: Wait, name: bool) -> usize {
    let rings = RINGS.load(Ordering::Acquire);
    if rings.is_null() && !held::any() && !crate::options::events::active() {
        return 0;
    }
    while DRAINING
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        if wait == Wait::No || wait == Wait::UnlessNaming && NAMING.load(Ordering::Acquire) {
            return 0;
        }
        std::thread::yield_now();
    }
    let namer = |records: &[u32]| {
        NAMING.store(true, Ordering::Release);
        crate::lifecycle::loader::name_on_demand(a, records);
        NAMING.store(false, Ordering::Release);
    };
    let mut n = held::settle(a, name.then_some(&namer as Namer));
    let pid = PID.load(Ordering::Relaxed);
    // Again under the lock: a seccomp filter's arrival takes the rings
    // away (`stop_for_sandbox`), holding the lock, while we waited for it.
    let rings = RINGS.load(Ordering::Acquire);
    if !rings.is_null() {
        // SAFETY: the rings are leaked at start and freed only by
        // `stop_for_sandbox`, under the drain lock we hold (read above,
        // under it).
        let rings = unsafe { &*rings };
        let lost = a.segment.counters.samples_lost();
        n += drain_rings(rings, pid, lost, name.then_some(&namer as Namer));
    }
    // Events, under either sampler; none under a filter.
    if !crate::lifecycle::sandbox::on() {
        n += crate::options::events::drain(pid);
    }
    DRAINING.store(false, Ordering::Release);
    n
}

/// The drain itself: samples of this process are attributed, lost-record
/// notices counted. A sample in a module named on demand stops the drain
/// of its ring until `name` has listed the functions of that module and of
/// every other one the samples still waiting land in (then they are
/// attributed to functions). Allocation-free but for `name` (a unit test
/// holds it to that).
fn drain_rings(rings: &[Ring], pid: u32, lost: &AtomicU64, name: Option<Namer>) -> usize {
    // Naming rounds in one drain, at most: a module that stays unnamed
    // (it cannot be) must not stop the drain for ever.
    const MAX_ROUNDS: usize = 16;
    let mut rounds = 0;
    let mut n = 0;
    for r in rings {
        loop {
            let mut unnamed = None;
            let may_name = name.is_some() && rounds < MAX_ROUNDS;
            n += r.drain_while(|ty, body| {
                match ty {
                    // Body: ip (u64), pid (u32), tid (u32), then with
                    // stacks the user registers and stack (`user_stack`).
                    PERF_RECORD_SAMPLE if field_u32(body, 8) == pid => {
                        let ip = field_u64(body, 0);
                        let counted = if may_name {
                            addrmap::count_unless_unnamed(ip, 1)
                        } else {
                            addrmap::count(ip, 1)
                        };
                        let slot = match counted {
                            // Read again once its module is named: its
                            // stack is counted then.
                            addrmap::Counted::Held(record) => {
                                unnamed = Some(record);
                                return false;
                            }
                            addrmap::Counted::Function(slot) => Some(slot),
                            addrmap::Counted::Elsewhere => None,
                        };
                        // Counted now (not held for naming): its thread's too.
                        if let Some(a) = crate::agent() {
                            crate::count::thread_rows::sampled(a, field_u32(body, 12), slot, 1);
                        }
                        if let Some((sp, bp, stack)) = user_stack(body) {
                            stacks::record(ip, sp, bp, stack);
                        }
                    }
                    // Body: id (u64), lost (u64).
                    PERF_RECORD_LOST => {
                        lost.fetch_add(field_u64(body, 8), Ordering::Relaxed);
                    }
                    _ => {}
                }
                true
            });
            let (Some(first), Some(name)) = (unnamed, name) else {
                break;
            };
            rounds += 1;
            name(pending_unnamed(rings, pid, first).as_slice());
        }
    }
    n
}

/// The sampled thread's stack pointer, frame pointer and the copy of its
/// stack from a sample's body, if it has them: after ip, pid and tid come
/// the registers' ABI (u64; 0: none), the registers asked for (bp, sp, ip
/// in `perf_regs` order), the copy's size (u64), the copy, and the bytes
/// of it the kernel filled (u64).
fn user_stack(body: &[u8]) -> Option<(u64, u64, &[u8])> {
    if body.len() <= 16 || field_u64(body, 16) == 0 {
        return None;
    }
    let (bp, sp) = (field_u64(body, 24), field_u64(body, 32));
    let size = usize::try_from(field_u64(body, 48)).ok()?;
    let data = body.get(56..56usize.checked_add(size)?)?;
    let filled = usize::try_from(field_u64(body, 56 + size)).ok()?;
    Some((sp, bp, data.get(..filled.min(size))?))
}

/// Lists the functions of the module records it is given.
type Namer<'a> = &'a dyn Fn(&[u32]);

/// Modules named on demand that samples waiting in `rings` land in, up to
/// a few, `first` among them: named together, the table is rebuilt once.
fn pending_unnamed(rings: &[Ring], pid: u32, first: u32) -> Few {
    let mut found = Few::default();
    found.add(first);
    for r in rings {
        r.peek(|ty, body| {
            if ty == PERF_RECORD_SAMPLE && field_u32(body, 8) == pid {
                if let Some(m) = addrmap::named_on_demand_at(field_u64(body, 0)) {
                    found.add(m);
                }
            }
        });
    }
    found
}

/// A small set of module records, without the heap.
#[derive(Default)]
pub(super) struct Few {
    items: [u32; 16],
    len: usize,
}

impl Few {
    /// Adds `v`; whether it is in the set (false: the set is full).
    pub(super) fn add(&mut self, v: u32) -> bool {
        if self.as_slice().contains(&v) {
            return true;
        }
        if self.len == self.items.len() {
            return false;
        }
        self.items[self.len] = v;
        self.len += 1;
        true
    }
    pub(super) fn as_slice(&self) -> &[u32] {
        &self.items[..self.len]
    }
}

fn start_timer(a: &Agent) -> Result<(), perf::Failure> {
    if STACKS.load(Ordering::Relaxed) {
        // Handlers unwind in place, up to the main thread's stack end.
        stacks::note_thread_stack();
    }
    timer::install(period_ns(a.config.sample_hz))?;
    if let Err(e) = timer::arm_or_wait() {
        // Inert again: no thread armed later, SIGPROF the program's.
        timer::stop_all();
        return Err((Why::TimerFailed, Some(e)));
    }
    hold_for_names(a);
    Ok(())
}

/// With the timers running: a drain thread to name modules on demand for
/// them, if one can start (else `record` names every module now).
fn hold_for_names(a: &Agent) {
    match start_drainer(a) {
        Ok(()) => HOLDING.store(true, Ordering::Release),
        Err(e) => {
            HOLDING.store(false, Ordering::Release);
            vlog!("no drain thread ({e}): every module named now");
        }
    }
}

/// Loaded late (`rtprof attach`): perf events reach only threads created
/// after they are opened, so each thread there is now gets a CPU-time
/// timer instead. Returns how many.
pub fn start_attached(a: &'static Agent, tids: &[i32]) -> usize {
    PID.store(std::process::id(), Ordering::Relaxed);
    offsets::start_attached();
    let hz = a.config.sample_hz;
    if hz == 0 || a.config.sampler == SamplerChoice::Off {
        record(a, Sampler::Off, Why::SwitchedOff, None);
        return 0;
    }
    if let Err((why, e)) = timer::install(period_ns(hz)) {
        record(a, Sampler::Off, why, e);
        return 0;
    }
    let mut armed = 0;
    let mut failed = None;
    for &tid in tids {
        match timer::arm_thread(tid) {
            Ok(()) => armed += 1,
            Err(e) => failed = Some(e),
        }
    }
    match (armed, failed) {
        (0, Some(e)) => {
            timer::stop_all();
            record(a, Sampler::Off, Why::TimerFailed, Some(e));
        }
        _ => record(a, Sampler::Timer, Why::Default, None),
    }
    armed
}

/// Detached: no more samples (the handler stays, inert: a signal still
/// queued must not meet SIGPROF's default action, which ends the process).
pub fn stop_attached() {
    timer::stop_all();
    offsets::set_wanted(false);
}

/// A new thread of the program: with the timer sampler, it gets a timer.
/// (perf events reach it by inheritance.)
pub fn thread_started() {
    if timer::active() {
        if STACKS.load(Ordering::Relaxed) {
            stacks::note_thread_stack();
        }
        if let Err(e) = timer::arm_or_wait() {
            vlog!("thread left unsampled: {e}");
        }
    }
}

/// The program installed its own SIGPROF handler: timer sampling stopped.
fn timer_taken_over() {
    if let Some(a) = crate::agent() {
        record(a, Sampler::Off, Why::SignalTaken, None);
    }
}

/// The last samples, before the exit report is written.
pub fn at_exit(a: &Agent) {
    // The image ends: no sample after this last drain. What follows is
    // the agent's own exit work (files beside the segment, the report),
    // and a timer sample taken in it would have its stack recorded but
    // its count held, for a drain that never comes (the timers sample
    // system calls too: seen as `unlink` samples in the stacks only).
    if timer::active() {
        timer::stop_all();
    }
    drain(a, Wait::Yes, true);
}

/// In a forked child, from the fork handler (allocation-free): the parent's
/// rings are not mapped here, its drain thread and timers do not exist.
/// (The sampler's other parts are forgotten in `fork::CHILD_FORGETS`.)
pub fn forget_parent_in_child() {
    RINGS.store(std::ptr::null_mut(), Ordering::Relaxed);
    DRAINER.forget_in_child();
    DRAINING.store(false, Ordering::Relaxed);
    NAMING.store(false, Ordering::Relaxed);
}

/// In a forked child: the timer samples held are the parent's.
pub fn held_forget_in_child() {
    held::forget_in_child();
}

/// In a forked child, once `fork()` has returned (where allocating and
/// starting threads is safe again): the parent's sampler, started afresh.
pub fn restart_in_child() {
    let Some(a) = crate::agent() else { return };
    PID.store(std::process::id(), Ordering::Relaxed);
    if crate::lifecycle::sandbox::on() {
        return;
    }
    match kind() {
        // Off by configuration, or the program took SIGPROF over.
        Sampler::Off => {}
        Sampler::Perf => choose(a, Why::Default),
        Sampler::Timer => match timer::arm_or_wait() {
            Ok(()) => {
                if HOLDING.load(Ordering::Acquire) {
                    hold_for_names(a);
                }
                record(a, Sampler::Timer, Why::Default, None)
            }
            Err(e) => record(a, Sampler::Off, Why::TimerFailed, Some(e)),
        },
    }
    crate::options::events::restart_in_child(a, drains());
}

/// Rebuilds and publishes the address table (start-up, and whenever
/// libraries come or go), from the records in `w`.
/// `probes` are loop probes: (start, end, function slot, offset in it).
pub fn publish_map(
    w: &SegmentWriter,
    present: &[addrmap::Present],
    stubs: &[(u64, u64, u32)],
    probes: &[(u64, u64, u32, u32)],
) {
    addrmap::publish(addrmap::AddrMap::build(w, present, stubs, probes));
    if STACKS.load(Ordering::Relaxed) {
        // The unwinder follows the same modules (the vDSO has no file).
        // Not the agent itself: the program's stacks do not run through
        // it, and its unwind tables are large to load at every start.
        let files = present
            .iter()
            .filter(|p| p.record < w.module_count() && !p.exec.is_empty())
            .filter(|p| {
                rtprof_abi::layout::ModuleWhy::of_flags(w.module(p.record).flags)
                    != Some(rtprof_abi::layout::ModuleWhy::OwnCode)
            })
            .map(|p| stacks::ModuleFile {
                path: String::from_utf8_lossy(w.module_path(p.record)).into_owned(),
                bias: w.module(p.record).base,
                exec: p.exec.clone(),
            })
            .filter(|m| m.path.starts_with('/'))
            .collect();
        stacks::modules_changed(files);
    }
}

/// Whether samples carry stacks (set before the first table is published).
static STACKS: AtomicBool = AtomicBool::new(false);

/// Says whether samples will carry stacks: start-up, before the address
/// table is first published.
pub fn set_stacks(on: bool) {
    STACKS.store(on, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::addrmap::tests::{fixture, present};
    use super::ring::tests::FakeRing;
    use super::*;
    use crate::test_alloc::allocs;

    /// Samples in a module named on demand wait in their ring until the
    /// module is named (with every other one samples wait for, in one
    /// call), then count for its functions; a module that cannot be named
    /// does not stop the drain for ever.
    /// Tests that publish the process-wide address table take turns.
    static TABLE: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn samples_wait_for_their_module_to_be_named() {
        let _turn = TABLE.lock().unwrap_or_else(|e| e.into_inner());
        let (_buf, mut w) = fixture();
        let c = *w.counters();
        let lib = w.add_sampled_module(b"/lib/libx.so", 0x50000).unwrap();
        w.set_named_on_demand(lib, true);
        let lib2 = w.add_sampled_module(b"/lib/liby.so", 0x60000).unwrap();
        w.set_named_on_demand(lib2, true);
        let mut present = present();
        present.push(addrmap::Present {
            record: lib,
            exec: vec![(0x50000, 0x51000)],
        });
        present.push(addrmap::Present {
            record: lib2,
            exec: vec![(0x60000, 0x61000)],
        });
        addrmap::publish(addrmap::AddrMap::build(&w, &present, &[], &[]));
        let w = std::cell::RefCell::new(w);
        let mut f = FakeRing::new(4096);
        let rings = vec![f.ring()];
        for ip in [0x10110, 0x50010, 0x10110, 0x50010, 0x60020] {
            f.sample(ip, 1, 1);
        }
        let calls = std::cell::RefCell::new(Vec::new());
        let name = |records: &[u32]| {
            calls.borrow_mut().push(records.to_vec());
            let mut w = w.borrow_mut();
            for &r in records {
                if r == lib {
                    w.name_module(r, [(&b"x_fn"[..], 0x10, 0x100)].into_iter());
                }
                // liby cannot be named: it stays without functions.
                w.set_named_on_demand(r, false);
            }
            addrmap::publish(addrmap::AddrMap::build(&w, &present, &[], &[]));
        };
        let lost = AtomicU64::new(0);
        assert_eq!(drain_rings(&rings, 1, &lost, Some(&name)), 5);
        assert_eq!(*calls.borrow(), vec![vec![lib, lib2]], "one call for both");
        let mut w = w.into_inner();
        let x_fn = w.func_count() - 1;
        assert_eq!(c.function_samples(x_fn).load(Ordering::Relaxed), 2);
        assert_eq!(c.module_samples(lib2).load(Ordering::Relaxed), 1);
        assert_eq!(c.function_samples(0).load(Ordering::Relaxed), 2);
        assert_eq!(f.tail(), f.head, "all read");

        // A name that never lists anything (the flag stays): the drain
        // still ends, counting for the module.
        let lib3 = w.add_sampled_module(b"/lib/libz.so", 0x70000).unwrap();
        w.set_named_on_demand(lib3, true);
        present.push(addrmap::Present {
            record: lib3,
            exec: vec![(0x70000, 0x71000)],
        });
        addrmap::publish(addrmap::AddrMap::build(&w, &present, &[], &[]));
        f.sample(0x70010, 1, 1);
        let stuck = |_: &[u32]| {};
        assert_eq!(drain_rings(&rings, 1, &lost, Some(&stuck)), 1);
        assert_eq!(c.module_samples(lib3).load(Ordering::Relaxed), 1);
        addrmap::clear_for_test();
    }

    #[test]
    fn drain_and_attribution_do_not_allocate_per_sample() {
        let _turn = TABLE.lock().unwrap_or_else(|e| e.into_inner());
        let (_buf, w) = fixture();
        addrmap::publish(addrmap::AddrMap::build(&w, &present(), &[], &[]));
        let mut f = FakeRing::new(4096);
        let rings = vec![f.ring()];
        let lost = AtomicU64::new(0);
        let (mut sampled, mut during) = (0, 0);
        for round in 0..50u64 {
            for k in 0..100u64 {
                // Alternate f, g, a foreign process, the module, nowhere.
                let ip = [0x10110, 0x10204, 0x10110, 0x10800, 0x42][(k % 5) as usize];
                let pid = if k % 5 == 2 { 999 } else { 1 };
                f.sample(ip + round % 4, pid, 5);
                sampled += (pid == 1) as u64;
            }
            f.lost(3);
            let before = allocs();
            assert_eq!(drain_rings(&rings, 1, &lost, None), 101);
            during += allocs() - before;
        }
        assert_eq!(during, 0, "allocations while draining");
        assert_eq!(
            w.counters().samples_total().load(Ordering::Relaxed),
            sampled
        );
        assert_eq!(
            w.counters().function_samples(0).load(Ordering::Relaxed),
            1000
        );
        assert_eq!(
            w.counters().function_samples(1).load(Ordering::Relaxed),
            1000
        );
        assert_eq!(w.counters().module_samples(0).load(Ordering::Relaxed), 1000);
        assert_eq!(w.counters().samples_unknown().load(Ordering::Relaxed), 1000);
        assert_eq!(lost.load(Ordering::Relaxed), 150);
        // The table points into the fixture, freed with this test.
        addrmap::clear_for_test();
    }
}
