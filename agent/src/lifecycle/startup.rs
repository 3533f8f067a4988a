//! Start-up, before `main`: configuration -> modules -> their functions ->
//! analysis -> counter segment -> stubs -> entries patched; and the exit
//! handler that records how the process ended.
// Only the constructor calls into this module, and unit tests build none.
#![cfg_attr(test, allow(dead_code))]

use crate::config::Config;
use crate::count::segment::Segment;
use crate::discover::maps::Maps;
use crate::discover::modules::Module;
use crate::discover::symbols::FuncSym;
use crate::error::CountError;
use crate::log::{self, vlog};
use crate::patch::install::{self, StubMap};
use crate::plan::analysis::ModulePlan;
use crate::{
    agent,
    count::{records, threads},
    discover::modules,
    lifecycle::{fork, loader, sandbox, system},
    now_ns,
    plan::pipeline,
    Agent,
};
use rtprof_abi::layout::ModuleWhy;
use rtprof_abi::{Capacities, SegmentWriter};
use rtprof_shared::report;
use std::time::Instant;

/// In secure-execution mode (set-user-ID and the like) the environment
/// belongs to a less privileged user and must not steer the agent.
fn secure_mode() -> bool {
    // SAFETY: reads the auxiliary vector; no pointers.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// What /proc/self/status says about the process now: its threads, the
/// pid of a debugger (or other ptrace tracer) attached, if any, and
/// whether it runs under a seccomp filter.
pub(crate) struct Status {
    pub threads: Option<usize>,
    pub tracer: Option<u32>,
    pub seccomp: bool,
    /// The seccomp mode and filter count, as the kernel says them.
    pub filters: sandbox::Filters,
}

pub(crate) fn status() -> Status {
    let text = crate::discover::maps::read_proc("/proc/self/status");
    let field = |name: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))?
            .trim()
            .parse()
            .ok()
    };
    Status {
        threads: field("Threads:").map(|n| n as usize),
        tracer: field("TracerPid:").filter(|&p| p != 0).map(|p| p as u32),
        seccomp: field("Seccomp:").is_some_and(|m| m != 0),
        filters: sandbox::Filters::parse(&text),
    }
}

/// Whether this process is not to be profiled at all, asked before
/// anything else: the machine's kill switch, or `RTPROF_DISABLE` (never
/// read in a set-user-ID program, whose environment is not its own). No
/// system call beyond one the dynamic loader made itself (`access`), so
/// that a process under any seccomp filter runs as without the agent.
pub(crate) fn switched_off() -> bool {
    system::kill_switch_on() || !secure_mode() && crate::config::disabled_by_env()
}

/// Ends a process started to fill the cache, before its `main`, if
/// start-up did not (it ends it once the cache is filled): the program
/// was not started to run, and a daemon warmed by `rtprof system warm`
/// would otherwise start for real. Not in a set-user-ID program, whose
/// environment is not its own.
pub(crate) fn end_if_warming() {
    if !secure_mode() && crate::config::warming_by_env() {
        // SAFETY: ends the process; nothing of ours is pending.
        unsafe { libc::_exit(rtprof_shared::cachedir::WARM_NOT_DONE) };
    }
}

/// What start-up does with each loaded module.
pub(crate) enum Planned {
    Instrument(ModulePlan),
    /// Not instrumented; its functions are listed for sample attribution
    /// (`None`: when a sample first lands in it), with why (a `module_why`
    /// code).
    Sample(Module, Option<Vec<FuncSym>>, ModuleWhy),
}

impl Planned {
    pub(crate) fn module(&self) -> &Module {
        match self {
            Planned::Instrument(p) => &p.module,
            Planned::Sample(m, ..) => m,
        }
    }
    fn functions(&self) -> impl Iterator<Item = &str> {
        let (a, b) = match self {
            Planned::Instrument(p) => (Some(p.funcs.iter().map(|c| p.name_of(c))), None),
            Planned::Sample(_, f, _) => {
                (None, f.as_ref().map(|f| f.iter().map(|f| f.name.as_str())))
            }
        };
        a.into_iter().flatten().chain(b.into_iter().flatten())
    }
}

/// `images`: modules may be mapped from page images (start-up, not
/// attach, whose threads run through the code).
pub(crate) fn plan_modules(cfg: &Config, maps: &Maps, images: bool) -> Vec<Planned> {
    let mapped = |m: &modules::Module, id: &crate::discover::fileimage::Identity| {
        images && crate::patch::image::prepare(m, id)
    };
    let mut plans = Vec::new();
    for m in modules::loaded() {
        match modules::skip_reason(&m, &|n| cfg.selects(n)) {
            // Our own code and the vDSO: samples there count per module.
            Some(why @ (modules::Skip::Agent | modules::Skip::Vdso)) => {
                plans.push(Planned::Sample(m, Some(Vec::new()), why.why()));
                continue;
            }
            // Named on demand: most modules of most processes never see a
            // sample. (`rtprof cache warm` lists them now, for the cache.)
            Some(why) => {
                if why != modules::Skip::NotSelected {
                    vlog!("{}: not instrumented ({why:?})", m.path);
                }
                let funcs = cfg.warm_only.then(|| pipeline::sampled_functions(&m, maps));
                plans.push(Planned::Sample(m, funcs, why.why()));
                continue;
            }
            None if !cfg.instrument => {
                let funcs = cfg.warm_only.then(|| pipeline::sampled_functions(&m, maps));
                plans.push(Planned::Sample(m, funcs, ModuleWhy::None));
                continue;
            }
            None => {}
        }
        match pipeline::plan_module(m.clone(), maps, &mapped) {
            Ok(plan) => plans.push(Planned::Instrument(plan)),
            Err(e) => {
                vlog!("{}: {e}; left unpatched", m.path);
                plans.push(Planned::Sample(m, Some(Vec::new()), ModuleWhy::Unreadable));
            }
        }
    }
    plans
}

/// Module records kept for libraries loaded after start-up.
pub(crate) const SPARE_MODULES: u32 = 512;
/// Of those, kept for instrumented libraries only.
pub(crate) const INSTRUMENTED_RESERVE: u32 = 64;

/// Spare function slots and stripes of the smaller segment tried when the
/// full one cannot be mapped.
const SMALL_SPARE: u32 = 8192;
const SMALL_STRIPES: u32 = 67;

/// The spare function slots `caps` holds beyond start-up's functions.
fn spare_used(cfg: &Config, caps: Capacities) -> u32 {
    cfg.spare_functions.min(caps.functions)
}

/// The executable's path: the main module's, else what the kernel says.
pub(crate) fn exe_path(plans: &[Planned]) -> String {
    plans
        .iter()
        .find(|p| p.module().is_main)
        .map(|p| p.module().path.clone())
        .or_else(|| {
            std::fs::read_link("/proc/self/exe")
                .ok()
                .map(|p| p.to_string_lossy().into_owned())
        })
        .unwrap_or_default()
}

pub(crate) fn capacities(cfg: &Config, plans: &[Planned], exe: &str) -> Capacities {
    let funcs: usize = plans.iter().map(|p| p.functions().count()).sum();
    let names: usize = plans
        .iter()
        .map(|p| p.module().path.len() + 8 + p.functions().map(str::len).sum::<usize>())
        .sum();
    let spare = cfg.spare_functions as usize;
    Capacities {
        // Libraries loaded later: 64 kept for instrumented ones, the rest
        // also for those only sampled.
        modules: plans.len() as u32 + SPARE_MODULES,
        // Stubs address a counter as a 32-bit displacement (slot * 8).
        functions: (funcs + spare).min((i32::MAX / 8) as usize) as u32,
        strings: (names + exe.len() + spare * 48 + 4096).min(u32::MAX as usize) as u32,
        // The shared stripe, the two sums of ended threads, one per thread.
        stripes: cfg.max_threads + 3,
    }
}

/// Start-up, before `main`: configuration, checks, plans, the counter
/// segment, entries patched, then the agent published and its hooks,
/// handlers and sampler started. Any step that fails leaves the process
/// unprofiled (said with `RTPROF_VERBOSE`), never stopped.
pub(crate) fn start() {
    let mut ph = log::Phases::start();
    // First what /proc says, then (under a filter) the trial of every call
    // the agent makes, before any call of its own but the loader's.
    if !secure_mode() {
        log::set_verbose(crate::config::verbose_by_env());
    }
    let t0 = sandbox::cycles();
    let status = status();
    if status.seccomp && sandbox::answered_slowly(sandbox::cycles().wrapping_sub(t0)) {
        // Reading /proc took a supervisor's answers (openat, read, close):
        // so would every call of the agent's.
        vlog!("under a seccomp filter whose calls a supervisor answers; process left unprofiled");
        return;
    }
    if !sandbox_allows(&status) {
        return;
    }
    let Some(cfg) = configure() else { return };
    if !may_patch(&cfg, &status) {
        return;
    }
    // Before any thread of ours exists: a child this process makes
    // without our fork handlers can then tell it is one.
    crate::lifecycle::process_mark::mark_this_process();
    ph.mark("checks");
    let maps = Maps::current();
    // Single-threaded here: the cache's directories stay open for all the
    // modules' lookups, and are closed before the program runs.
    let plans = {
        let _open = crate::plan::cache::StartupDirs::open();
        plan_modules(&cfg, &maps, true)
    };
    ph.mark("plans");
    if cfg.warm_only {
        // `rtprof cache warm`: the entries are written; the program's own
        // code never runs.
        warm_images(&plans);
        // SAFETY: ends the process; nothing of ours is pending.
        unsafe { libc::_exit(0) };
    }
    let exe = exe_path(&plans);
    crate::count::register::set_socket(&cfg.daemon_socket);
    let Some((segment, mut writer)) = make_segment(&cfg, &plans, &exe) else {
        return;
    };
    ph.mark("segment");
    let Ok(tls_offset) = i32::try_from(threads::tls_offset()) else {
        vlog!("thread-local storage out of reach; process left unprofiled");
        return;
    };
    let _ = writer.set_exe(exe.as_bytes());
    // Records for every function first: slot = function index. A module
    // that does not fit ends the list.
    let recorded = record_all(&segment, &mut writer, &plans);
    ph.mark("records");
    // The main thread counts in a stripe of its own from the first patch on.
    if let Some(idx) = segment.new_stripe(threads::gettid()) {
        threads::set_stripe(segment.counters.stripe_ptr(idx));
    }
    let shared = segment.counters.stripe_ptr(0) as u64;
    let stubs = install_all(
        &cfg,
        &plans,
        &recorded,
        &maps,
        tls_offset,
        shared,
        &mut writer,
    );
    ph.mark("install");
    let known = known_modules(&plans, recorded);
    let modules: Vec<modules::Module> = plans.iter().map(Planned::module).cloned().collect();
    let stripe_bytes = segment.counters.layout().stripe_bytes;
    segment
        .counters
        .set_state(rtprof_abi::layout::state::RUNNING);
    let ld = plans
        .iter()
        .map(Planned::module)
        .find(|m| modules::skip_reason(m, &|_| true) == Some(modules::Skip::Loader))
        .cloned();
    crate::sampling::set_stacks(cfg.stacks && cfg.sample_hz != 0);
    crate::sampling::publish_map(&writer, &known.present(), stubs.ranges(), stubs.probes());
    ph.mark("addrmap");
    if !crate::set_agent(cfg, segment, tls_offset, stubs, known, writer) {
        return;
    }
    // Libraries loaded later are instrumented as they arrive.
    if !ld.is_some_and(|ld| loader::install_hook(&ld, &maps)) {
        vlog!("no hook into the dynamic loader: libraries loaded later stay unprofiled");
    }
    ph.mark("hook");
    if let Some(a) = agent() {
        if let Some(mut state) = a.state.lock() {
            state.routes.note_startup(&modules);
        }
        crate::options::routes::read_pending(a);
    }
    ph.mark("offers");
    threads::init_exit_key(true);
    fork::install_handlers(stripe_bytes);
    ph.mark("handlers");
    if let Some(a) = agent() {
        crate::sampling::start(a);
        crate::options::budget::start(a);
        ph.mark("sampler");
        // Set-up ends with the sampler running: a process that dies before
        // this shows 0 (it never fully started).
        a.segment
            .counters
            .set_setup_ns(ph.elapsed().as_nanos() as u64);
    }
    ph.log();
    // SAFETY: registers an extern "C" function that lives as long as the
    // library (never unloaded: it is preloaded); no argument.
    unsafe { on_exit(at_exit, std::ptr::null_mut()) };
}

/// The configuration this process runs with, or `None` if it is not to be
/// profiled (the machine's kill switch, `RTPROF_DISABLE`, a setuid
/// program that root's policy leaves alone).
fn configure() -> Option<Config> {
    let mut system = None;
    let mut cfg = if secure_mode() {
        // The environment belongs to a less privileged user: only root's
        // policy decides, and nothing of RTPROF_* is read.
        let sys = system.insert(system::SystemConfig::load());
        if !sys.profile_secure {
            return None;
        }
        Config::default()
    } else {
        Config::from_env()
    };
    if cfg.budget.is_none() {
        cfg.budget = system.unwrap_or_else(system::SystemConfig::load).budget;
    }
    log::set_verbose(cfg.verbose);
    if cfg.disabled {
        return None;
    }
    rtprof_shared::debuginfo::set_dirs(cfg.debug_dirs.clone());
    if let Some(template) = &cfg.report {
        check_report_path(template);
    }
    Some(cfg)
}

/// Whether this process's entries may be rewritten now (not traced, one
/// thread, no seccomp filter that forbids start-up's system calls); then
/// sets up what planning needs (the cache's places, the options' choices).
/// Whether a seccomp filter present from the start lets the agent act: it
/// is tried out in a child ([`sandbox::probe`]) before the agent makes any
/// call the dynamic loader did not make itself.
fn sandbox_allows(status: &Status) -> bool {
    sandbox::note_filters_at_start(status.filters);
    if !status.seccomp {
        return true;
    }
    use crate::lifecycle::sandbox::Verdict;
    match sandbox::probe() {
        Verdict::Everything => vlog!("under a seccomp filter that allows what the agent does"),
        Verdict::CountOnly => {
            sandbox::started_sandboxed();
            vlog!("under a seccomp filter: counted, not sampled, nothing written at exit");
        }
        Verdict::Nothing => {
            vlog!(
                "under a seccomp filter that forbids what start-up needs; process left unprofiled"
            );
            return false;
        }
        Verdict::Supervised => {
            vlog!(
                "under a seccomp filter whose calls a supervisor answers; process left unprofiled"
            );
            return false;
        }
    }
    true
}

fn may_patch(cfg: &Config, status: &Status) -> bool {
    // A debugger has already written breakpoints where entries would be
    // rewritten, places later ones after a function's prologue (inside a
    // rewritten entry) and steps through code it expects to find there:
    // the program is debugged exactly as without the agent.
    if let Some(pid) = status.tracer {
        vlog!("traced by pid {pid} (a debugger?) at start-up; process left unprofiled");
        return false;
    }
    // Five bytes written over code another thread may be running is
    // undefined: patch only while this is the process's only thread.
    let threads = status.threads;
    if threads != Some(1) {
        vlog!("{threads:?} threads already running at start-up; process left unprofiled");
        return false;
    }
    crate::plan::cache::configure(crate::plan::cache::places(
        cfg.cache.as_deref(),
        secure_mode(),
    ));
    crate::patch::image::configure(cfg);
    // A trap costs a thousand counted calls: no budget could pay for it.
    if cfg.traps && cfg.budget.is_some() {
        vlog!("no trap entries under an overhead budget");
    } else if cfg.traps && crate::options::traps::want() {
        vlog!("trap entries planned (RTPROF_TRAPS)");
    }
    if !cfg.loops.is_empty() {
        crate::options::loops::counts::select(&cfg.loops);
        vlog!(
            "loops counted in functions named {:?} (RTPROF_LOOPS)",
            cfg.loops
        );
    }
    true
}

/// The counter segment, sized for `plans`; under an address-space limit
/// (ulimit -v) a smaller one, with room for fewer threads and fewer
/// functions loaded later, rather than none at all.
fn make_segment(cfg: &Config, plans: &[Planned], exe: &str) -> Option<(Segment, SegmentWriter)> {
    let caps = capacities(cfg, plans, exe);
    // SAFETY: a system call without arguments.
    let (pid, ppid) = (std::process::id(), unsafe { libc::getppid() } as u32);
    let create = |caps| {
        Segment::create(caps, cfg.run_dir.as_deref(), pid, ppid, now_ns()).or_else(|e| {
            if cfg.run_dir.is_none() || matches!(e, CountError::Map(_)) {
                return Err(e);
            }
            vlog!("{e}; counting in anonymous memory instead");
            Segment::create(caps, None, pid, ppid, now_ns())
        })
    };
    let created = create(caps).or_else(|e| {
        let CountError::Map(_) = e else {
            return Err(e);
        };
        let spare = spare_used(cfg, caps);
        let small = Capacities {
            functions: caps.functions - spare + spare.min(SMALL_SPARE),
            stripes: caps.stripes.min(SMALL_STRIPES),
            ..caps
        };
        vlog!("{e}; trying a smaller counter segment");
        create(small)
    });
    created
        .map_err(|e| vlog!("{e}; process left unprofiled"))
        .ok()
}

/// Writes the stubs and rewrites the entries of every module planned for
/// instrumenting that has records, with its loop probes; returns the stub
/// map.
fn install_all(
    cfg: &Config,
    plans: &[Planned],
    recorded: &[Recorded],
    maps: &Maps,
    tls_offset: i32,
    shared: u64,
    writer: &mut SegmentWriter,
) -> StubMap {
    // Before any stub is written: stubs call its hook if it is on.
    crate::options::callers::start(cfg.callers);
    let mut stubs = match cfg.budget {
        Some(_) => StubMap::keeping_entries(),
        None => StubMap::default(),
    };
    if crate::options::traps::wanted() && !crate::options::traps::arm() {
        vlog!("cannot handle SIGTRAP: no trap entries");
    }
    for (p, (present, first)) in plans.iter().zip(recorded) {
        let (Planned::Instrument(p), Some(first)) = (p, *first) else {
            continue;
        };
        let t = Instant::now();
        // Modules present at start-up stay: their stub areas are kept for good.
        let counted = |name: &str| cfg.counts_from_start(name.as_bytes());
        let (outcomes, area) = install::install(p, first, tls_offset, shared, &mut stubs, &counted);
        if let (Some(a), Some(present)) = (&area, present) {
            if a.from_image {
                writer.mark_code_from_image(present.record);
            }
        }
        let patched = records::record_outcomes(writer, first, &outcomes);
        records::mark_traps(writer, first, p, &outcomes);
        crate::options::counting_requests::mark_off_from_start(writer, cfg, p, first, &outcomes);
        if !p.loops.is_empty() {
            // Kept for good, as the module's stub area.
            let (probes, _areas) = crate::options::loops::probes::install(p, first, maps);
            stubs.add_probes(probes);
        }
        vlog!(
            "{}: {} functions ({}), {} patched, {:.1} ms",
            p.module.path,
            p.funcs.len(),
            p.source,
            patched,
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    // This thread counts its loops in counters of its own.
    crate::options::loops::counts::attach_thread();
    stubs
}

/// `rtprof cache warm`: installs every planned module in this process,
/// which ends before `main`, so that each module's page image is written
/// where one can be (the counters its stubs are linked to never count).
fn warm_images(plans: &[Planned]) {
    let Ok(tls_offset) = i32::try_from(threads::tls_offset()) else {
        return;
    };
    let mut stubs = StubMap::default();
    let mut slot = 0u32;
    for p in plans {
        if let Planned::Instrument(p) = p {
            // The process ends next: its areas stay as they are (a stub
            // area is released only when asked).
            let _ = install::install(p, slot, tls_offset, 0, &mut stubs, &|_| true);
            slot = slot.saturating_add(p.funcs.len() as u32);
        }
    }
}

/// Each planned module's record (its place in the address table, its first
/// function slot): one per plan in order, until a module that did not fit
/// in the segment (it and those after it are left out).
pub(crate) type Recorded = (Option<crate::sampling::addrmap::Present>, Option<u32>);

/// Records every planned module's functions first, so that slot =
/// function index; a module that does not fit ends the list.
pub(crate) fn record_all(
    segment: &Segment,
    writer: &mut rtprof_abi::SegmentWriter,
    plans: &[Planned],
) -> Vec<Recorded> {
    let mut recorded = Vec::with_capacity(plans.len());
    for p in plans {
        let r = match p {
            Planned::Instrument(plan) => match records::record_module(segment, writer, plan) {
                Ok((present, first)) => (Some(present), first),
                Err(records::Full) => break,
            },
            Planned::Sample(m, funcs, why) => (
                records::record_sampled(segment, writer, m, funcs.as_deref(), *why),
                None,
            ),
        };
        recorded.push(r);
    }
    recorded
}

/// What the loader hook knows of the modules planned at start.
pub(crate) fn known_modules(plans: &[Planned], recorded: Vec<Recorded>) -> loader::Known {
    let recorded = recorded
        .into_iter()
        .map(Some)
        .chain(std::iter::repeat(None));
    loader::Known(
        plans
            .iter()
            .zip(recorded)
            .map(|(p, r)| loader::KnownModule {
                bias: p.module().bias,
                file: p.module().file.clone(),
                areas: Vec::new(),
                present: r.and_then(|r| r.0),
                on_demand: match p {
                    Planned::Sample(m, None, _) => Some(m.clone()),
                    _ => None,
                },
                span: p.module().span(),
            })
            .collect(),
    )
}

extern "C" {
    pub(crate) fn on_exit(
        f: extern "C" fn(libc::c_int, *mut libc::c_void),
        arg: *mut libc::c_void,
    ) -> libc::c_int;
}

/// Runs after the program's own exit handlers (registered before them).
pub(crate) extern "C" fn at_exit(status: libc::c_int, _: *mut libc::c_void) {
    finish(Some(status));
}

/// The pid whose image [`finish`] ended (0: none): an `_exit` from the
/// program's exit handlers, after ours, does not end it twice.
static FINISHED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// What the image leaves as it ends: the files `rtprof run` reads beside
/// the segment, the exit status (`None`: ended by `_exit`, without exit
/// handlers, so not `exited`), the `RTPROF_REPORT`. Allocates: only where
/// exit handlers could run.
pub(crate) fn finish(status: Option<libc::c_int>) {
    let _ = std::panic::catch_unwind(|| {
        let Some(a) = agent() else { return };
        if crate::options::attach::detached() {
            return;
        }
        // A child forked under a seccomp filter has no segment of its own:
        // nothing of it is recorded (and no system call made to find out).
        if crate::lifecycle::fork::uncounted_stripe().is_some() {
            return;
        }
        // A child made without fork handlers (clone, a raw system call)
        // still maps its parent's segment: its exit is not the parent's.
        if crate::lifecycle::process_mark::memory()
            == crate::lifecycle::process_mark::Memory::Copied
        {
            return;
        }
        // Under a seccomp filter (seen arriving, or one a raw system call
        // installed, found now before any call of ours): the counts stay in
        // the segment, for rtprofd or rtprof run to read; nothing is
        // written and no system call made.
        if sandbox::on() || sandbox::filter_arrived_unseen() {
            if let Some(status) = status {
                a.segment.counters.set_exit(status, now_ns());
            }
            return;
        }
        let pid = std::process::id();
        if a.segment.counters.pid() != pid {
            return;
        }
        if FINISHED.swap(pid, std::sync::atomic::Ordering::AcqRel) == pid {
            return;
        }
        crate::sampling::at_exit(a);
        if let Some(text) = crate::options::callers::text() {
            if let Err(e) = a.segment.write_beside("callers", text.as_bytes()) {
                vlog!("callers not written: {e}");
            }
        }
        if let Some(text) = crate::options::loops::counts::text() {
            if let Err(e) = a.segment.write_beside("loops", text.as_bytes()) {
                vlog!("loop counts not written: {e}");
            }
        }
        let threads = if crate::count::thread_rows::wanted(a) {
            crate::count::thread_rows::text(a)
        } else {
            String::new()
        };
        if let Err(e) = a.segment.write_beside("threads", threads.as_bytes()) {
            vlog!("per-thread counts not written: {e}");
        }
        let events = crate::options::events::text();
        if let Some(text) = &events {
            if let Err(e) = a.segment.write_beside("events", text.as_bytes()) {
                vlog!("events not written: {e}");
            }
        }
        let stacks = crate::sampling::stacks::text();
        if let Some(text) = &stacks {
            if let Err(e) = a.segment.write_beside("stacks", text.as_bytes()) {
                vlog!("call stacks not written: {e}");
            }
        }
        if let Some(text) = crate::sampling::offsets::text() {
            if let Err(e) = a.segment.write_beside("offsets", text.as_bytes()) {
                vlog!("sampled offsets not written: {e}");
            }
        }
        crate::options::budget::at_exit(a);
        crate::count::cost::note_process_cpu();
        if let Some(status) = status {
            a.segment.counters.set_exit(status, now_ns());
        }
        crate::options::attach::after_exit(a);
        if let Some(path) = &a.config.report {
            write_report(a, path, stacks.as_deref(), &threads, events.as_deref());
        }
    });
}

/// The functions a JSON report lists (`RTPROF_ALL_FUNCTIONS`).
fn listing(cfg: &Config) -> report::Listing {
    match cfg.all_functions {
        true => report::Listing::All,
        false => report::Listing::Used,
    }
}

/// `RTPROF_REPORT` with `%p` replaced by this process's pid.
fn report_path(template: &str) -> String {
    template.replace("%p", &std::process::id().to_string())
}

/// Whether the report can be written where asked: checked at start-up, when
/// stderr is still open to say so (a program may close it before exit). A
/// FIFO or device is only opened at exit (its reader may come later).
fn check_report_path(template: &str) {
    let path = report_path(template);
    if std::fs::metadata(&path).is_ok_and(|m| !m.is_file()) {
        return;
    }
    if let Err(e) = rtprof_shared::files::Destination::prepare(std::path::Path::new(&path)) {
        log::alert!("RTPROF_REPORT: cannot write a report there: {e}");
    }
}

/// Writes the report: beside its final name, then renamed over it (a
/// reader never finds a truncated report), private to this user (it names
/// the program's functions); a device or FIFO is written in place. A
/// failure is said on stderr, or through syslog where stderr cannot take
/// it.
fn write_report(a: &Agent, path: &str, stacks: Option<&str>, threads: &str, events: Option<&str>) {
    let mut snap = match rtprof_abi::read_snapshot(a.segment.bytes()) {
        Ok(s) => s,
        Err(e) => {
            log::alert!("cannot read own counters for the report: {e}");
            return;
        }
    };
    if let Some(st) = stacks {
        // The agent's own table, in the form it writes for rtprof run.
        snap.stacks = rtprof_abi::Stacks::parse(st, snap.functions.len(), snap.modules.len())
            .unwrap_or_default();
    }
    snap.threads = rtprof_abi::Threads::parse(threads, &snap).unwrap_or_default();
    if let Some(ev) = events {
        snap.events = rtprof_abi::reader::Events::parse(ev, &snap).unwrap_or_default();
    }
    let path = report_path(path);
    let text = if path.ends_with(".json") {
        report::json(std::slice::from_ref(&snap), listing(&a.config))
    } else {
        report::text(std::slice::from_ref(&snap), report::TextOptions::default())
    };
    let written = rtprof_shared::files::write_destination(
        std::path::Path::new(&path),
        text.as_bytes(),
        0o600,
    );
    let Err(e) = written else { return };
    // Said on the program's standard error (this thread ends the program,
    // its 2 is the program's). By now the program may have closed it (a
    // daemon) or left it on a pipe nobody reads or a full disk: then said
    // through syslog, where a failure at exit can still be seen.
    let msg = format!("cannot write report {path}: {e}");
    let line = format!("rtprof[{}]: {msg}\n", std::process::id());
    // SAFETY: signal sets on our stack, filled by sigemptyset/sigaddset
    // and pthread_sigmask/sigpending before use; write reads `line`'s own
    // bytes. SIGPIPE is blocked for this one write, so that a pipe nobody
    // reads fails it with EPIPE instead of killing the program as it
    // exits; the SIGPIPE it raised is taken back (unless one was already
    // pending) and the mask restored.
    let said = unsafe {
        let mut pipe: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        let mut pending: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut pipe);
        libc::sigaddset(&mut pipe, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &pipe, &mut old);
        libc::sigpending(&mut pending);
        let was_pending = libc::sigismember(&pending, libc::SIGPIPE) == 1;
        let n = libc::write(2, line.as_ptr().cast(), line.len());
        let broken = n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EPIPE);
        if broken && !was_pending {
            let now = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            libc::sigtimedwait(&pipe, std::ptr::null_mut(), &now);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        n == line.len() as isize
    };
    if !said {
        let msg = std::ffi::CString::new(msg.replace('\0', "")).unwrap_or_default();
        // SAFETY: a static ident (syslog keeps the pointer) and format,
        // `msg` NUL-terminated and alive for the call. The program's exit
        // handlers have run (ours was registered before theirs), so the
        // ident replaced here is not one the program still logs under.
        unsafe {
            libc::openlog(c"rtprof".as_ptr(), libc::LOG_PID, libc::LOG_USER);
            libc::syslog(
                libc::LOG_USER | libc::LOG_WARNING,
                c"%s".as_ptr(),
                msg.as_ptr(),
            );
            libc::closelog();
        }
    }
}
