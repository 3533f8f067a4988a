//! Loaded late, into a running process (`rtprof attach`): the constructor
//! found the process traced (rtprof holds its threads) and did nothing;
//! rtprof then calls [`rtprof_attach`] in one held thread. That call only
//! hands the request to a thread of ours and returns, so the program is
//! held for as short a time as possible. The thread (the control thread,
//! started by the first call, which follows a `dlopen` that allocates
//! anyway) stays while attached: [`rtprof_detach`] then neither
//! allocates nor takes a lock, so it is safe wherever rtprof stopped the
//! thread it calls it in, even in a signal handler that interrupted
//! `malloc`. It ends after a detach (a later attach starts it again, as
//! the first did) and once it is the process's last thread. The thread instruments the selected modules
//! while the program's threads run, writing the entries with them held
//! still by the stopper (a thread part-way through an entry's original
//! instructions leaves that entry for a later try), and answers in a
//! status file. [`rtprof_detach`] puts every entry back the same way and
//! leaves the agent inert: its stubs stay mapped (a thread may still be
//! running through one), its counts stay readable.
//!
//! Each thread there is at attach gets a counter stripe of its own and a
//! CPU-time timer for samples (perf events would reach only threads
//! created later); libraries loaded while attached are instrumented
//! through the loader hook, itself written with the threads held. The
//! live segment is a memfd (rtprofd maps it); rtprof reads a copy left in
//! its directory at detach or exit. Attaching again after a detach maps a
//! fresh segment at the same address and writes the kept entries again.
//!
//! Threads created and children forked while attached pass through the
//! agent's `pthread_create` and `fork` (`libc_hooks`: libc's entries are
//! rewritten with the others).
//!
//! Not yet done here: a budget, exact callers and call stacks; another
//! `--modules` on a later attach.
// Only the exported entry points reach this, and unit tests export none.
#![cfg_attr(test, allow(dead_code))]

use crate::config::Config;
use crate::count::segment::Segment;
use crate::count::stripes::Stripes;
use crate::discover::maps::Maps;
use crate::error::Errno;
use crate::error::PatchError;
use crate::lifecycle::lock::Lock;
use crate::lifecycle::startup::{self, Planned};
use crate::lifecycle::worker::{Next, Worker};
use crate::log::vlog;
use crate::patch::install::{self, StubMap};
use crate::patch::stopworld::{Held as StopHeld, Stopper};
use crate::patch::switch::{self, EntrySwitch};
use crate::{
    agent,
    count::{records, threads},
    discover::modules,
    lifecycle::loader,
    now_ns, Agent,
};
use rtprof_abi::Refusal;
use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Where the agent stands: loaded and idle, attaching, attached, detached.
static PHASE: AtomicU8 = AtomicU8::new(IDLE);
const IDLE: u8 = 0;
const ATTACHING: u8 = 1;
const ATTACHED: u8 = 2;
const DETACHING: u8 = 3;
const DETACHED: u8 = 4;

/// rtprof's directory for this attach: where the segment is copied when
/// the profile ends (detach, or the process's exit).
static RUN_DIR: Lock<Option<String>> = Lock::new(None);

/// Leaves a copy of the segment where rtprof reads it.
fn copy_for_rtprof(a: &Agent) {
    let dir = RUN_DIR.lock().and_then(|d| d.clone());
    if let Some(dir) = dir {
        if let Err(e) = a.segment.copy_into_dir(&dir) {
            vlog!("counts not copied for rtprof: {e}");
            return;
        }
        let threads = crate::count::thread_rows::text(a);
        crate::count::thread_rows::stop_attached();
        if let Err(e) = Segment::write_beside_copy(&dir, "threads", threads.as_bytes()) {
            vlog!("per-thread counts not written: {e}");
        }
        if let Some(text) = crate::sampling::offsets::text() {
            if let Err(e) = Segment::write_beside_copy(&dir, "offsets", text.as_bytes()) {
                vlog!("sampled offsets not written: {e}");
            }
        }
    }
}

/// At the process's exit while attached: rtprof reads the copy.
pub(crate) fn after_exit(a: &Agent) {
    if PHASE.load(Ordering::Acquire) == ATTACHED {
        copy_for_rtprof(a);
    }
}

/// Tries at writing the entries a stopped thread was part-way through.
const WRITE_TRIES: usize = 5;
/// rtprof lets the program's threads go just after our entry point
/// returns; until then none can be stopped by us.
const UNTRACED_WITHIN: Duration = Duration::from_secs(3);

/// The thread that attaches and detaches on request.
static CONTROL: Worker = Worker::new(c"rtprof-control", rtprof_abi::layout::cost::CONTROL_NS);
/// An idle control thread wakes this often (a request wakes it at once),
/// to end once it is the process's last thread.
const CONTROL_IDLE_MS: u64 = 1000;

/// A request from an entry point to the control thread: the text is
/// written only by the entry point that moved [`PHASE`] to ATTACHING or
/// DETACHING (one at a time), and read by the control thread only after
/// `kind` says it is there.
struct Request {
    kind: AtomicU8,
    len: AtomicUsize,
    text: UnsafeCell<[u8; MAX_REQUEST]>,
}

// SAFETY: `text` is handed over through `kind` (see above).
unsafe impl Sync for Request {}

const MAX_REQUEST: usize = 8192;
const NO_REQUEST: u8 = 0;
const ATTACH: u8 = 1;
const DETACH: u8 = 2;

static REQUEST: Request = Request {
    kind: AtomicU8::new(NO_REQUEST),
    len: AtomicUsize::new(0),
    text: UnsafeCell::new([0; MAX_REQUEST]),
};

/// Hands `text` to the control thread (started if it is not running:
/// only that allocates). False if it is too long or no thread runs.
fn post(kind: u8, text: &CStr) -> bool {
    let bytes = text.to_bytes();
    // (No control thread starts under a seccomp filter: `Worker::start`.)
    if bytes.len() > MAX_REQUEST || CONTROL.start(CONTROL_IDLE_MS, 0, serve).is_err() {
        return false;
    }
    // SAFETY: the caller won PHASE, so no other writer; the control thread
    // reads only after the Release store of `kind` below.
    unsafe { (&mut *REQUEST.text.get())[..bytes.len()].copy_from_slice(bytes) };
    REQUEST.len.store(bytes.len(), Ordering::Relaxed);
    REQUEST.kind.store(kind, Ordering::Release);
    CONTROL.wake();
    true
}

/// The control thread's tick: serves a request if one was posted.
fn serve(_gone: bool) -> Next {
    // rtprofd's requests (switches, routes), seen within a tick.
    if let Some(a) = crate::agent() {
        crate::options::counting_requests::serve_control(a);
    }
    let kind = REQUEST.kind.swap(NO_REQUEST, Ordering::Acquire);
    if kind == NO_REQUEST {
        // The program's threads have all ended (its main thread called
        // pthread_exit, say): glibc ends the process once this one has.
        if only_thread() {
            CONTROL.program_gone();
        }
        return Next::Idle;
    }
    let len = REQUEST.len.load(Ordering::Relaxed).min(MAX_REQUEST);
    // SAFETY: posted before `kind` (Acquire above); no other request can be
    // posted until PHASE leaves ATTACHING or DETACHING, which this serving does.
    let text = String::from_utf8_lossy(unsafe { &(&*REQUEST.text.get())[..len] }).into_owned();
    // The program runs on meanwhile: the files read here stay out of its table.
    if !crate::lifecycle::private_files::is_private() {
        crate::lifecycle::private_files::enter();
    }
    match kind {
        ATTACH => attach_thread(&text),
        _ => detach_thread(&text),
    }
    // Detached: no thread of the agent's stays (the next attach starts one).
    if PHASE.load(Ordering::Acquire) == DETACHED {
        CONTROL.program_gone();
    }
    Next::Idle
}

/// Whether the calling thread is the process's only one still running (a
/// main thread that called pthread_exit stays listed, a zombie). Not if
/// the list cannot be read: ending the thread would leave a later request
/// unserved.
fn only_thread() -> bool {
    let others = program_threads();
    !others.is_empty() && others.into_iter().all(zombie)
}

/// Whether task `tid` of this process has ended (state Z or X).
fn zombie(tid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).is_ok_and(|st| {
        st.rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|c| c == 'Z' || c == 'X')
    })
}

/// Starts attaching: `spec` is `RTPROF_*=value` lines (the environment
/// the agent would have had). Returns 0 when the control thread has the
/// request, 1 if the agent is not idle (already attached or attaching), 2
/// if the thread could not start.
///
/// # Safety
/// `spec` is a NUL-terminated string.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn rtprof_attach(spec: *const libc::c_char) -> libc::c_int {
    if spec.is_null() {
        return 2;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let spec = unsafe { CStr::from_ptr(spec) };
    // Idle and never started (a preloaded agent that started is
    // profiling already), or detached: attach (again).
    let was = match PHASE.compare_exchange(IDLE, ATTACHING, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) if agent().is_some() => {
            PHASE.store(IDLE, Ordering::Release);
            return 1;
        }
        Ok(was) => was,
        Err(DETACHED) => {
            match PHASE.compare_exchange(DETACHED, ATTACHING, Ordering::AcqRel, Ordering::Acquire) {
                Ok(was) => was,
                Err(_) => return 1,
            }
        }
        Err(_) => return 1,
    };
    if post(ATTACH, spec) {
        0
    } else {
        PHASE.store(was, Ordering::Release);
        2
    }
}

/// Starts detaching: every patched entry gets its own bytes back, and
/// `status` (a path) gets "ok" or "error: why". Returns 0 when the
/// control thread has the request, 1 if the agent is not attached (or
/// the request could not be handed over).
///
/// # Safety
/// `status` is a NUL-terminated string.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn rtprof_detach(status: *const libc::c_char) -> libc::c_int {
    if status.is_null() {
        return 1;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let status = unsafe { CStr::from_ptr(status) };
    if PHASE
        .compare_exchange(ATTACHED, DETACHING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return 1;
    }
    if post(DETACH, status) {
        0
    } else {
        PHASE.store(ATTACHED, Ordering::Release);
        1
    }
}

/// Puts every entry back, then answers in `status`.
fn detach_thread(status: &str) {
    let r = std::panic::catch_unwind(detach_all).unwrap_or(Err("internal error".into()));
    PHASE.store(
        if r.is_ok() { DETACHED } else { ATTACHED },
        Ordering::Release,
    );
    answer(status, r);
}

/// The program's last thread has ended: the control thread ends too.
pub(crate) fn program_threads_gone() {
    CONTROL.program_gone();
}

/// Stops the control thread (a process entering a user namespace must be
/// single-threaded); returns whether one ran. It starts again with the
/// next request.
pub(crate) fn pause() -> bool {
    CONTROL.stop()
}

/// In a forked child: the parent's control thread does not exist here.
pub(crate) fn forget_in_child() {
    RUN_DIR.reset_in_child();
    CONTROL.forget_in_child();
}

/// Whether a library loaded now may be instrumented: not once a detach
/// has begun (its entries would outlive the detach).
pub(crate) fn may_instrument_new() -> bool {
    !matches!(PHASE.load(Ordering::Acquire), DETACHING | DETACHED)
}

/// Whether the agent was loaded by `rtprof attach` (it may have detached
/// since).
pub(crate) fn loaded_by_attach() -> bool {
    PHASE.load(Ordering::Acquire) != IDLE
}

/// Whether `rtprof detach` has ended this agent's profile: the exit
/// handler leaves the counter segment as it is.
pub(crate) fn detached() -> bool {
    PHASE.load(Ordering::Acquire) == DETACHED
}

fn parse_spec(spec: &str) -> HashMap<String, String> {
    spec.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Writes the answer where rtprof waits for it, whole (a rename).
fn answer(path: &str, r: Result<String, String>) {
    if path.is_empty() {
        return;
    }
    let text = match r {
        Ok(m) => format!("{m}\n"),
        Err(e) => format!("error: {e}\n"),
    };
    if let Err(e) =
        rtprof_shared::files::write_destination(std::path::Path::new(path), text.as_bytes(), 0o600)
    {
        // rtprof waits for this file: say why it will not come.
        crate::log::emit(format_args!("cannot answer rtprof in {path}: {e}"));
    }
}

fn attach_thread(spec: &str) {
    let vars = parse_spec(spec);
    let status = vars
        .get("RTPROF_ATTACH_STATUS")
        .cloned()
        .unwrap_or_default();
    let mut cfg = Config::from_lookup(|k| vars.get(k).map(Into::into));
    // Not supported late yet (see the module's comment): exact counting
    // of the selected modules, and samples without call stacks.
    cfg.stacks = false;
    cfg.budget = None;
    cfg.warm_only = false;
    cfg.callers = false;
    cfg.report = None;
    crate::log::set_verbose(cfg.verbose);
    let r = std::panic::catch_unwind(move || match agent() {
        Some(a) => reattach(a, cfg.run_dir.as_deref()).map(|msg| {
            if (&cfg.modules, cfg.all_modules) == (&a.config.modules, a.config.all_modules) {
                msg
            } else {
                format!("{msg} (the modules of the first attach: another --modules needs a new process)")
            }
        }),
        None => late_start(cfg),
    })
    .unwrap_or_else(|_| Err("internal error while attaching".into()));
    PHASE.store(
        if r.is_ok() { ATTACHED } else { DETACHED },
        Ordering::Release,
    );
    answer(&status, r);
}

/// A stopper, once rtprof has let the program's threads go.
fn stopper() -> Result<Stopper, String> {
    let held = |e| format!("cannot hold the program's threads: {e}");
    let mut s = Stopper::new().map_err(held)?;
    let started = Instant::now();
    loop {
        // A stop with nothing to do tells whether the threads can be held.
        match s.run(|_| ()) {
            Ok(()) => return Ok(s),
            // rtprof lets the threads go one by one: until the last, a
            // seize fails (EPERM) even with the leader free.
            Err(PatchError::Traced | PatchError::NotPermitted(Errno(libc::EPERM)))
                if started.elapsed() < UNTRACED_WITHIN =>
            {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => return Err(held(e)),
        }
    }
}

/// How long the program's threads were held to write entries.
#[derive(Default)]
struct Held {
    /// Threads given a stripe of their own.
    stripes: usize,
    stops: u32,
    total: Duration,
    longest: Duration,
}

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "threads held {:.2} ms in {} stop(s), longest {:.2} ms",
            self.total.as_secs_f64() * 1e3,
            self.stops,
            self.longest.as_secs_f64() * 1e3
        )?;
        if self.stripes > 0 {
            write!(f, "; {} thread(s) given a stripe", self.stripes)?;
        }
        Ok(())
    }
}

/// Writes `entries` in their `counted` state with the program's threads
/// held, again for those a thread was part-way through; returns which
/// were written (in `entries`' order), and how long the threads were held.
/// With `stripes` (the segment, the stripe pointer's thread-local
/// offset), every held thread is given a counter stripe of its own in the
/// first stop: the agent came too late for their `pthread_create`, and the
/// shared stripe's `lock inc` would make threads calling the same
/// functions contend.
fn write_live(
    entries: &[EntrySwitch],
    counted: bool,
    stripes: Option<(&Segment, i32)>,
) -> Result<(Vec<bool>, Held), String> {
    // Sorted by address, as the writer wants them.
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_unstable_by_key(|&i| entries[i].at);
    let mut todo: Vec<EntrySwitch> = order.iter().map(|&i| entries[i]).collect();
    let mut todo_idx = order;
    let mut written = vec![false; entries.len()];
    let mem = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/mem")
        .map_err(|e| format!("/proc/self/mem: {e}"))?;
    // Registering for core serialisation waits ~10 ms: not while held.
    switch::prepare();
    let mut stopper = stopper()?;
    let mut held = Held::default();
    let mut ready: Vec<(i32, Option<u32>)> = match stripes {
        Some((segment, _)) => threads_now()
            .into_iter()
            .map(|tid| (tid, segment.new_stripe(tid as u32)))
            .collect(),
        None => Vec::new(),
    };
    for attempt in 0..WRITE_TRIES {
        let give = stripes.filter(|_| attempt == 0);
        if todo.is_empty() && give.is_none() {
            break;
        }
        let mut done = vec![false; todo.len()];
        let t = Instant::now();
        let ran = stopper.run_held(|h| {
            if let Some((segment, offset)) = give {
                held.stripes = give_stripes(segment, offset, h, &mut ready);
            }
            switch::write_entries_stopped(&mem, &todo, counted, h.pcs, &mut done)
        });
        if let Err(e) = ran {
            let e = format!("cannot hold the program's threads: {e}");
            if attempt == 0 {
                return Err(e);
            }
            // Entries are written already: what was is kept (and said),
            // the rest stays as it is.
            vlog!("{e}; {} entries left as they were", todo.len());
            break;
        }
        // Includes making and reaping the helper: what the program feels.
        let took = t.elapsed();
        held.stops += 1;
        held.total += took;
        held.longest = held.longest.max(took);
        let mut k = 0;
        todo.retain(|_| {
            k += 1;
            !done[k - 1]
        });
        for (i, d) in todo_idx.iter().zip(&done) {
            written[*i] |= *d;
        }
        let mut k = 0;
        todo_idx.retain(|_| {
            k += 1;
            !done[k - 1]
        });
        std::thread::sleep(Duration::from_millis(1));
    }
    // Threads that ended before the stop: their stripes were never used.
    if let Some((segment, _)) = stripes {
        for idx in ready.iter().filter_map(|r| r.1) {
            segment.counters.release_unused_stripe(idx);
        }
    }
    Ok((written, held))
}

/// The program's threads (all but the calling one, which is ours).
fn program_threads() -> Vec<i32> {
    let me = threads::gettid() as i32;
    threads_now().into_iter().filter(|&t| t != me).collect()
}

/// The threads of this process, as listed now.
fn threads_now() -> Vec<i32> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Points each held thread's stripe word (its thread-local storage, at
/// `offset` from its thread pointer) at a fresh stripe; returns how many.
/// Runs with the threads held: no allocation, no lock.
/// `ready` holds stripes taken beforehand for the threads listed then
/// (backing a stripe with memory takes a while: not while held).
fn give_stripes(
    segment: &Segment,
    offset: i32,
    h: &StopHeld<'_>,
    ready: &mut [(i32, Option<u32>)],
) -> usize {
    let mut n = 0;
    for (&tid, &tp) in h.tids.iter().zip(h.tps) {
        if tp == 0 {
            continue;
        }
        let taken = ready
            .iter_mut()
            .find(|r| r.0 == tid)
            .and_then(|r| r.1.take());
        // Held threads: no fold (it allocates; a held thread may hold
        // malloc's lock).
        let idx = taken.or_else(|| segment.new_stripe_unfolded(tid as u32));
        let word = tp.wrapping_add_signed(offset as i64) as *mut u64;
        // Without a stripe of its own: the shared one (null), never what
        // its word held before (a stripe of an earlier attach, perhaps
        // another thread's now).
        let p = idx.map_or(std::ptr::null_mut(), |i| segment.counters.stripe_ptr(i));
        // SAFETY: the thread's own static TLS slot for our stripe pointer
        // (every thread has the agent's static TLS block, set up by the
        // loader at dlopen); the thread is held, and only stubs read it.
        unsafe { std::ptr::write_volatile(word, p as u64) };
        n += usize::from(idx.is_some());
    }
    n
}

/// Start-up's steps for a running process: the same plans, records and
/// stubs, entries written live; no loader hook, no sampler.
fn late_start(cfg: Config) -> Result<String, String> {
    let t = Instant::now();
    rtprof_shared::debuginfo::set_dirs(cfg.debug_dirs.clone());
    crate::plan::cache::configure(crate::plan::cache::places(cfg.cache.as_deref(), false));
    let maps = Maps::current();
    let plans = startup::plan_modules(&cfg, &maps, false);
    let exe = startup::exe_path(&plans);
    let caps = startup::capacities(&cfg, &plans, &exe);
    crate::count::register::set_socket(&cfg.daemon_socket);
    // SAFETY: a system call without arguments.
    let (pid, ppid) = (std::process::id(), unsafe { libc::getppid() } as u32);
    // A memfd, as a preloaded agent without rtprof has: rtprofd can map
    // it. rtprof gets a copy when the profile ends.
    let (segment, mut writer) = Segment::create(caps, None, pid, ppid, now_ns())
        .map_err(|e| format!("no counter segment: {e}"))?;
    if let Some(mut d) = RUN_DIR.lock() {
        d.clone_from(&cfg.run_dir);
    }
    let tls_offset = i32::try_from(threads::tls_offset())
        .map_err(|_| "thread-local storage out of reach".to_string())?;
    crate::count::thread_rows::start_attached();
    let _ = writer.set_exe(exe.as_bytes());
    let recorded = startup::record_all(&segment, &mut writer, &plans);
    let shared = segment.counters.stripe_ptr(0) as u64;
    crate::options::callers::start(false);
    let mut stubs = StubMap::keeping_entries();
    let mut installed = Vec::new();
    for (p, (_, first)) in plans.iter().zip(&recorded) {
        let (Planned::Instrument(p), Some(first)) = (p, *first) else {
            continue;
        };
        let counted = |name: &str| cfg.counts_from_start(name.as_bytes());
        // The stub areas stay for good: a thread may run through a stub
        // even after detach.
        let (outcomes, _area) =
            install::install_stubs_only(p, first, tls_offset, shared, &mut stubs, &counted);
        installed.push((p, first, outcomes));
    }
    // Threads the program creates while attached: through our
    // pthread_create, its entry written with the others.
    for (name, e) in crate::lifecycle::libc_hooks::prepare(&mut stubs, tls_offset, shared) {
        vlog!("libc's {name} not hooked: {e}");
    }
    // Thread ends and forks are followed before any entry (libc's
    // pthread_create and fork among them) can reach the agent.
    threads::init_exit_key(false);
    crate::lifecycle::fork::install_handlers(segment.counters.layout().stripe_bytes);
    // Stubs are complete and executable: now the entries, live.
    let (written, held) = write_live(stubs.entries(), true, Some((&segment, tls_offset)))?;
    let failed: Vec<u32> = stubs
        .entries()
        .iter()
        .zip(&written)
        .filter(|(_, w)| !**w)
        .map(|(e, _)| e.slot)
        .collect();
    let mut patched = 0;
    for (p, first, mut outcomes) in installed {
        for &slot in &failed {
            if let Some(o) = slot
                .checked_sub(first)
                .and_then(|k| outcomes.get_mut(k as usize))
            {
                *o = Some(Refusal::WriteFailed);
            }
        }
        patched += records::record_outcomes(&mut writer, first, &outcomes);
        crate::options::counting_requests::mark_off_from_start(
            &mut writer,
            &cfg,
            p,
            first,
            &outcomes,
        );
    }
    let known = startup::known_modules(&plans, recorded);
    segment
        .counters
        .set_state(rtprof_abi::layout::state::RUNNING);
    crate::sampling::set_stacks(false);
    crate::sampling::publish_map(&writer, &known.present(), stubs.ranges(), stubs.probes());
    let modules = plans
        .iter()
        .filter(|p| matches!(p, Planned::Instrument(_)))
        .count();
    if !crate::set_agent(cfg, segment, tls_offset, stubs, known, writer) {
        return Err("the agent is already running in this process".into());
    }
    // Libraries loaded from now on are instrumented as they arrive, as
    // under a preloaded agent; the hook's own entry is written live.
    let ld = plans
        .iter()
        .map(Planned::module)
        .find(|m| modules::skip_reason(m, &|_| true) == Some(modules::Skip::Loader))
        .cloned();
    let hooked = ld.is_some_and(|ld| {
        loader::install_hook_with(&ld, &maps, &|_, plan, at, entry| {
            EntrySwitch::new(plan, u32::MAX, at, entry)
                .and_then(|e| write_live(&[e], true, None).ok())
                .is_some_and(|(w, _)| w[0])
        })
    });
    if !hooked {
        vlog!("no hook into the dynamic loader: libraries loaded later stay unprofiled");
    }
    let mut sampled = 0;
    if let Some(a) = agent() {
        sampled = crate::sampling::start_attached(a, &program_threads());
        a.segment
            .counters
            .set_setup_ns(t.elapsed().as_nanos() as u64);
    }
    // SAFETY: registers an extern "C" function that lives as long as the
    // library, which is never unloaded (nothing calls dlclose on it).
    unsafe { startup::on_exit(startup::at_exit, std::ptr::null_mut()) };
    let msg = format!(
        "{patched} functions patched in {modules} module(s), {sampled} thread(s) sampled, {:.1} ms; {held}",
        t.elapsed().as_secs_f64() * 1e3
    );
    vlog!("attached: {msg}");
    Ok(msg)
}

/// Attached before and detached since: the same stubs, a fresh segment
/// (zero counts, in the new run directory), the entries written again.
/// The configuration of the first attach stays (its modules).
fn reattach(a: &'static Agent, run_dir: Option<&str>) -> Result<String, String> {
    let t = Instant::now();
    a.segment
        .reopen_for_attach(None, now_ns())
        .map_err(|e| format!("no counter segment: {e}"))?;
    if let Some(mut d) = RUN_DIR.lock() {
        *d = run_dir.map(str::to_string);
    }
    crate::count::thread_rows::start_attached();
    let state = a.state.lock().ok_or("the agent's state is unavailable")?;
    let entries = state.stubs.entries().to_vec();
    drop(state);
    let (written, held) = write_live(&entries, true, Some((&a.segment, a.tls_offset)))?;
    let patched = written.iter().filter(|w| **w).count();
    let sampled = crate::sampling::start_attached(a, &program_threads());
    let msg = format!(
        "{patched} functions patched again, {sampled} thread(s) sampled, {:.1} ms; {held}",
        t.elapsed().as_secs_f64() * 1e3
    );
    vlog!("attached again: {msg}");
    Ok(msg)
}

/// Every kept entry back to its own bytes, with the threads held.
fn detach_all() -> Result<String, String> {
    let a = agent().ok_or("the agent is not running")?;
    crate::sampling::stop_attached();
    let state = a.state.lock().ok_or("the agent's state is unavailable")?;
    let entries = state.stubs.entries().to_vec();
    drop(state);
    let (written, held) = write_live(&entries, false, None)?;
    let restored = written.iter().filter(|w| **w).count();
    if restored != entries.len() {
        return Err(format!(
            "{} of {} entries could not be restored",
            entries.len() - restored,
            entries.len()
        ));
    }
    a.segment.counters.set_detached(now_ns());
    copy_for_rtprof(a);
    vlog!("detached: {restored} entries restored; {held}");
    Ok(format!("{restored} entries restored; {held}"))
}
