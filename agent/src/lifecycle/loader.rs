//! Libraries loaded after start-up (dlopen). The dynamic loader announces
//! every change to its module list by calling `_dl_debug_state` (the hook
//! debuggers break on, `_r_debug.r_brk`), with `r_state == RT_CONSISTENT`
//! once a new library is mapped and before its initialisers run. At that
//! moment no thread can be running the new code, so patching it there is as
//! safe as patching at start-up. The agent points that empty function (a
//! `ret`) at its own handler at start-up, while still single-threaded.
//!
//! A library that is unloaded keeps its records and counts in the segment;
//! its stubs are unmapped.

use crate::arch::{EntryPlan, Native, Planner, StubWriter};
use crate::discover::maps::Maps;
use crate::discover::modules::{self, Module};
use crate::lifecycle::locked::Locked;
use crate::log::vlog;
use crate::patch::install::{self, write_entries, StubMap};
use crate::patch::stubmem::StubArea;
use crate::plan::analysis;
use crate::sampling::addrmap::Present;
use crate::{agent, count::records, discover::symbols, plan::pipeline, Agent};
use rtprof_abi::layout::ModuleWhy;
use rtprof_abi::SegmentWriter;
use std::sync::atomic::{AtomicPtr, Ordering};

#[repr(C)]
struct RDebug {
    r_version: i32,
    r_map: *mut libc::c_void,
    r_brk: usize,
    r_state: i32,
    r_ldbase: usize,
}
const RT_CONSISTENT: i32 = 0;

extern "C" {
    /// The loader's `struct r_debug` (link.h).
    static mut _r_debug: RDebug;
}

static R_DEBUG: AtomicPtr<RDebug> = AtomicPtr::new(std::ptr::null_mut());

/// A module seen so far.
pub struct KnownModule {
    pub bias: u64,
    pub file: String,
    /// Stub and loop probe areas of an instrumented module loaded later
    /// (those of modules present at start-up stay for good).
    pub areas: Vec<StubArea>,
    /// Its record, for sample attribution (none if the segment was full).
    pub present: Option<Present>,
    /// A sampled-only module whose functions are listed when a sample
    /// first lands in it.
    pub on_demand: Option<Module>,
    /// Its address range.
    pub span: (u64, u64),
}

/// Modules seen so far.
pub struct Known(pub Vec<KnownModule>);

impl Known {
    /// The modules samples can be attributed to.
    pub fn present(&self) -> Vec<Present> {
        self.0.iter().filter_map(|k| k.present.clone()).collect()
    }
}

/// How the hook's entry is written: at start-up directly; in a running
/// process (attach) with the threads held.
pub type HookWriter<'a> =
    &'a dyn Fn(&Module, &crate::arch::Plan, u64, &crate::arch::EntryPatch) -> bool;

/// Points `_dl_debug_state` at [`on_loader_event`]. Start-up only.
pub fn install_hook(ld: &Module, maps: &Maps) -> bool {
    install_hook_with(ld, maps, &|ld, plan, _, entry| {
        write_entries(ld, &[(plan.patch_at(), entry.as_slice())])[0]
    })
}

/// As [`install_hook`], the entry written by `write`.
pub fn install_hook_with(ld: &Module, maps: &Maps, write: HookWriter<'_>) -> bool {
    // Only the address is taken; the loader defines the symbol, bound
    // when this library is loaded.
    let rd = std::ptr::addr_of_mut!(_r_debug);
    if rd.is_null() {
        return false;
    }
    // SAFETY: the loader's own `_r_debug`, non-null (checked), mapped for
    // the process's life.
    let brk = unsafe { (*rd).r_brk } as u64;
    if brk == 0 || !ld.contains(brk) || !maps.readable(brk, 32) {
        return false;
    }
    // SAFETY: 32 bytes the memory map says are readable, in the loader,
    // which is never unloaded.
    let code = unsafe { std::slice::from_raw_parts(brk as *const u8, 32) };
    // Only a function that does nothing but return is redirected.
    let Some(plan) = Native::return_only_plan(code, brk) else {
        return false;
    };
    let (lo, hi) = ld.span();
    let Some(area) = StubArea::near(lo, hi, 16) else {
        return false;
    };
    // The trampoline jumps to the handler, which returns to the loader's
    // caller.
    let (tramp, len) = Native::absolute_jump(on_loader_event as *const () as u64);
    // SAFETY: the area is freshly mapped, writable and at least a page.
    unsafe { std::ptr::copy_nonoverlapping(tramp.as_ptr(), area.addr as *mut u8, len) };
    let Some(entry) = Native::entry_patch(&plan, area.addr) else {
        area.release();
        return false;
    };
    if !area.seal() || !write(ld, &plan, area.addr, &entry) {
        return false;
    }
    R_DEBUG.store(rd, Ordering::Release);
    true
}

extern "C" fn on_loader_event() {
    let rd = R_DEBUG.load(Ordering::Acquire);
    // SAFETY: the loader's `_r_debug` (published before the hook was
    // installed); the loader writes `r_state` before calling us.
    if rd.is_null() || unsafe { std::ptr::read_volatile(&(*rd).r_state) } != RT_CONSISTENT {
        return;
    }
    let Some(a) = agent() else { return };
    // Instrumenting takes system calls a seccomp filter may forbid.
    if crate::lifecycle::sandbox::on() {
        return;
    }
    let Some(mut state) = a.state.lock() else {
        return;
    };
    // A panic leaves the new module unpatched; the guard lets go.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let Locked {
            stubs,
            known,
            writer,
            routes,
            ..
        } = &mut *state;
        update(a, known, stubs, writer, routes);
    }));
}

fn update(
    a: &Agent,
    known: &mut Known,
    stubs: &mut StubMap,
    w: &mut SegmentWriter,
    routes: &mut crate::options::routes::Routes,
) {
    let now = modules::loaded();
    let before = known.0.len();
    // Unloaded: their stubs go; their records and counts stay.
    known.0.retain_mut(|k| {
        let present = now.iter().any(|m| m.bias == k.bias && m.file == k.file);
        if !present {
            routes.forget_unloaded(w, k.span.0, k.span.1);
            for area in std::mem::take(&mut k.areas) {
                stubs.remove(area.addr, area.addr + area.len);
                crate::options::traps::remove_stubs_in(area.addr, area.addr + area.len);
                area.release();
            }
            vlog!("{}: unloaded", k.file);
        }
        present
    });
    let mut changed = known.0.len() != before;
    // One read of the memory map for all the modules of this event: their
    // mappings do not change while we plan them.
    let mut maps: Option<Maps> = None;
    for m in now {
        if known.0.iter().any(|k| k.bias == m.bias && k.file == m.file) {
            continue;
        }
        let (bias, file, span) = (m.bias, m.file.clone(), m.span());
        routes.note_module(&m);
        let (areas, present, on_demand) =
            add_module(a, m, maps.get_or_insert_with(Maps::current), stubs, w);
        known.0.push(KnownModule {
            bias,
            file,
            areas,
            present,
            on_demand,
            span,
        });
        changed = true;
    }
    if changed {
        crate::sampling::publish_map(w, &known.present(), stubs.ranges(), stubs.probes());
    }
}

/// Records a newly loaded module: instrumented if selected, otherwise with
/// its symbols for sample attribution only (while enough spare slots are
/// left for instrumented modules).
/// Whether a library that is only sampled may still take a module record:
/// the last ones are kept for libraries to instrument (a sampled-only one
/// beyond that leaves its samples to `[unknown]`).
fn room_for_sampled(w: &SegmentWriter) -> bool {
    w.counters().layout().caps.modules - w.module_count()
        > crate::lifecycle::startup::INSTRUMENTED_RESERVE
}

/// Records a library that is only sampled, with `funcs` named if half the
/// spare counter slots stay free for instrumented ones.
fn add_sampled(
    a: &Agent,
    w: &mut SegmentWriter,
    m: &Module,
    funcs: &[symbols::FuncSym],
    why: ModuleWhy,
) -> Added {
    if !room_for_sampled(w) {
        return (Vec::new(), None, None);
    }
    let left = w.counters().layout().caps.functions - w.func_count();
    let fits = (funcs.len() as u32).saturating_add(a.config.spare_functions / 2) <= left;
    let (funcs, why) = match fits {
        true => (funcs, why),
        false => (&[][..], ModuleWhy::NoRoom),
    };
    (
        Vec::new(),
        records::record_sampled(&a.segment, w, m, Some(funcs), why),
        None,
    )
}

/// What recording a new module leaves: its stub and loop probe areas, its
/// place for samples, and the module itself if it is named on demand.
type Added = (Vec<StubArea>, Option<Present>, Option<Module>);

/// Records a newly loaded module: instrumented if selected, otherwise with
/// its symbols for sample attribution only (listed when a sample lands
/// there, if samples pass through the drain thread).
fn add_module(
    a: &Agent,
    m: Module,
    maps: &Maps,
    stubs: &mut StubMap,
    w: &mut SegmentWriter,
) -> Added {
    let skip = modules::skip_reason(&m, &|n| a.config.selects(n));
    // Detached (rtprof detach): nothing new is patched; a later attach
    // leaves it so too (its code may be running by then).
    let detached = !crate::options::attach::may_instrument_new();
    if !a.config.instrument || skip.is_some() || detached {
        if !room_for_sampled(w) {
            return (Vec::new(), None, None);
        }
        let why = skip.map_or(ModuleWhy::None, modules::Skip::why);
        if crate::sampling::names_on_demand() {
            let present = records::record_sampled(&a.segment, w, &m, None, why);
            return (Vec::new(), present, Some(m));
        }
        let funcs = pipeline::sampled_functions(&m, maps);
        return add_sampled(a, w, &m, &funcs, why);
    }
    let plan = match pipeline::plan_module(m.clone(), maps, &crate::patch::image::prepare) {
        Ok(p) => p,
        Err(e) => {
            vlog!("{}: {e}; left unpatched", m.path);
            return add_sampled(a, w, &m, &[], ModuleWhy::Unreadable);
        }
    };
    // Not relocated yet: the loader would write text relocations over the
    // patched entries afterwards.
    if plan.text_relocations {
        vlog!("{}: has text relocations; left unpatched", m.path);
        let funcs: Vec<symbols::FuncSym> = plan
            .funcs
            .iter()
            .map(|c| symbols::FuncSym {
                name: plan.name_of(c).to_string(),
                vaddr: c.vaddr,
                size: c.size,
                unnamed: false,
                mid_function_cfi: false,
            })
            .collect();
        return add_sampled(a, w, &m, &funcs, ModuleWhy::TextRelocations);
    }
    // A full segment leaves the module out entirely.
    let (areas, present) = instrument(a, plan, maps, stubs, w).unwrap_or_default();
    (areas, present, None)
}

/// Lists the functions of the modules recorded as `records` that are named
/// on demand: a sample has landed in each (drain thread or exit path, which
/// may allocate). Republishes the address table once. Afterwards they are
/// named for good, whatever happened.
pub fn name_on_demand(a: &Agent, records: &[u32]) {
    // Held by this thread already (never expected): named another time.
    let Some(mut state) = a.state.lock() else {
        return;
    };
    let Locked {
        known,
        writer: w,
        stubs,
        ..
    } = &mut *state;
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut maps = None;
        for k in &mut known.0 {
            let Some(record) = k.present.as_ref().map(|p| p.record) else {
                continue;
            };
            if !records.contains(&record) {
                continue;
            }
            let Some(m) = k.on_demand.take() else {
                continue;
            };
            let funcs = pipeline::sampled_functions(&m, maps.get_or_insert_with(Maps::current));
            // As for a library loaded later: half the spare slots stay
            // for libraries to instrument.
            let left = w.counters().layout().caps.functions - w.func_count();
            let fits = (funcs.len() as u32).saturating_add(a.config.spare_functions / 2) <= left;
            records::name_sampled(&a.segment, w, record, &m.path, &funcs, fits);
        }
    }));
    for &r in records {
        w.set_named_on_demand(r, false);
    }
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        crate::sampling::publish_map(w, &known.present(), stubs.ranges(), stubs.probes());
    }));
}

/// Lists the functions of every module still named on demand (a sampler
/// without a drain thread attributes samples where they land). Start-up
/// only.
pub fn name_all_on_demand(a: &Agent) {
    let records: Vec<u32> = {
        let Some(state) = a.state.lock() else {
            return;
        };
        state
            .known
            .0
            .iter()
            .filter(|k| k.on_demand.is_some())
            .filter_map(|k| k.present.as_ref().map(|p| p.record))
            .collect()
    };
    if !records.is_empty() {
        name_on_demand(a, &records);
    }
}

/// Analyses and patches one newly loaded, selected module (with the probes
/// of its loops `RTPROF_LOOPS` names).
fn instrument(
    a: &Agent,
    plan: analysis::ModulePlan,
    maps: &Maps,
    stubs: &mut StubMap,
    w: &mut SegmentWriter,
) -> Result<(Vec<StubArea>, Option<Present>), records::Full> {
    let (present, first) = records::record_module(&a.segment, w, &plan)?;
    let Some(first) = first else {
        return Ok((Vec::new(), Some(present)));
    };
    let shared = a.segment.counters.stripe_ptr(0) as u64;
    let counted = |name: &str| a.config.counts_from_start(name.as_bytes());
    let (outcomes, area) = install::install(&plan, first, a.tls_offset, shared, stubs, &counted);
    if area.as_ref().is_some_and(|a| a.from_image) {
        w.mark_code_from_image(present.record);
    }
    let patched = records::record_outcomes(w, first, &outcomes);
    records::mark_traps(w, first, &plan, &outcomes);
    crate::options::counting_requests::mark_off_from_start(w, &a.config, &plan, first, &outcomes);
    let mut areas: Vec<StubArea> = area.into_iter().collect();
    if !plan.loops.is_empty() {
        let (probes, probe_areas) = crate::options::loops::probes::install(&plan, first, maps);
        stubs.add_probes(probes);
        areas.extend(probe_areas);
    }
    vlog!(
        "{}: loaded; {} functions ({}), {} patched",
        plan.module.path,
        plan.funcs.len(),
        plan.source,
        patched
    );
    Ok((areas, Some(present)))
}
