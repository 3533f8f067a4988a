//! One module's way from file to plan, the same at start-up and for a
//! library loaded later: the file the loader mapped -> cached decisions, or
//! its functions and their analysis (then cached) -> the per-process check
//! of the bytes in memory.

use crate::discover::fileimage::FileImage;
use crate::discover::maps::Maps;
use crate::discover::modules::Module;
use crate::discover::symbols;
use crate::error::PlanError;
use crate::log::vlog;
use crate::plan::analysis::{self, ModulePlan};
use crate::plan::cache::{self, Kind};
use rtprof_shared::debuginfo::{self, DebugFile};
use std::time::Instant;

/// The file the loader mapped for `m`, and its separate debug file if
/// one is installed (its identity then part of the file's).
fn open_with_debug(m: &Module, maps: &Maps) -> Result<(FileImage, Option<DebugFile>), PlanError> {
    let mut file = FileImage::open(m, maps)?;
    let debug = debuginfo::find(std::path::Path::new(&m.file), file.data());
    if let Some(d) = &debug {
        file.identity.debug = d.identity;
        vlog!("{}: names from {}", m.path, d.path.display());
    }
    Ok((file, debug))
}

/// Whether a module's patched code will be mapped from a page image,
/// whose place is then held for it: asked with the file's identity once
/// the file is known to be the one mapped.
pub type FromImage<'a> = &'a dyn Fn(&Module, &crate::discover::fileimage::Identity) -> bool;

/// The plan for instrumenting `m`, or why there is none (its file cannot
/// be read as the one mapped, or is no ELF file). Where `mapped` says its
/// code comes from a page image and the cache has its entry, only its
/// functions are read from the entry: no plan is decoded or checked.
pub fn plan_module(m: Module, maps: &Maps, mapped: FromImage) -> Result<ModulePlan, PlanError> {
    let t = Instant::now();
    let (file, debug) = open_with_debug(&m, maps)?;
    let traps = crate::options::traps::wanted() && crate::options::traps::allowed_in(&m.path);
    let kind = if traps {
        Kind::PlanWithTraps
    } else {
        Kind::Plan
    };
    // Loop probes are planned afresh (never cached) where a function's
    // loops are wanted, outside the C runtime.
    let loops =
        crate::options::loops::counts::wanted() && crate::options::traps::allowed_in(&m.path);
    let image = !traps && !loops && mapped(&m, &file.identity);
    let cached = cache::lookup_with(&m, &file.identity, kind, !image).and_then(|e| {
        let mut p = cache::plan_from(m.clone(), e, traps);
        if image {
            vlog!("{}: no plan read: its code comes from its image", m.path);
            p.mapped = true;
            return Some(p);
        }
        if loops
            && p.funcs
                .iter()
                .any(|c| crate::options::loops::counts::wanted_for(p.name_of(c)))
        {
            return None;
        }
        if analysis::check_live(&mut p, maps, &file) {
            return Some(p);
        }
        vlog!(
            "{}: cache entry holds a plan not made from this file's bytes; analysed afresh",
            m.path
        );
        None
    });
    let (plan, how) = match cached {
        Some(p) => (p, "cached"),
        None => {
            let list = symbols::list_functions(file.data(), debug.as_ref().map(|d| d.data()))?;
            let mut p = analysis::analyze(m, list, maps, &file, traps, loops);
            let entry = cache::encode(&p, &file.identity);
            cache::store(&p.module.path, &file.identity, kind, &entry);
            // Plans made from the file's bytes: this only finds changed memory.
            analysis::check_live(&mut p, maps, &file);
            (p, "analysed")
        }
    };
    let mut plan = plan;
    plan.identity = Some(file.identity);
    vlog!(
        "{}: {} in {:.1} ms",
        plan.module.path,
        how,
        t.elapsed().as_secs_f64() * 1e3
    );
    Ok(plan)
}

/// The functions of a module that is only sampled (names and ranges for
/// attributing samples), cached like plans. Empty if its file cannot be
/// read as the one mapped.
pub fn sampled_functions(m: &Module, maps: &Maps) -> Vec<symbols::FuncSym> {
    let Ok((file, debug)) = open_with_debug(m, maps) else {
        return Vec::new();
    };
    if let Some(e) = cache::lookup(m, &file.identity, Kind::Sampled) {
        return e
            .funcs
            .iter()
            .map(|c| symbols::FuncSym {
                name: c.name.of(&e.names).to_string(),
                vaddr: c.vaddr,
                size: c.size,
                unnamed: false,
                mid_function_cfi: false,
            })
            .collect();
    }
    let funcs = symbols::list_for_sampling(file.data(), debug.as_ref().map(|d| d.data()));
    let entry = cache::encode_sampled(&funcs, &file.identity);
    cache::store(&m.path, &file.identity, Kind::Sampled, &entry);
    funcs
}
