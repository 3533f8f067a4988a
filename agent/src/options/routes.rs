//! Implementations a program offers for its functions (`rtprof_offer`, or
//! the `RTPROF_OFFER` macro's ELF section `rtprof_offers`, read at
//! start-up and after each `dlopen`), and a function's calls routed to one
//! of them while the program's threads run (rtprofd's route requests).
//!
//! An offer gets a row in the counter segment (`function [name]`) and a
//! route stub near the function's own stub, which counts the call in the
//! row's slot and jumps to the implementation. Routing rewrites the first
//! eight bytes of the function's stub, with one aligned store, into a jump
//! to that route stub, or back to its own count and code (`original`): a
//! thread already past them finishes where it was going, every later call
//! goes the new way, and no thread is stopped. The function's own row
//! counts the calls its own code ran, each implementation's row those
//! routed to it.
//!
//! A route lives in the process's memory, so a fork child keeps it; an
//! exec starts a new agent without any. Before `dlclose` of a library
//! holding a routed function or implementation, the function goes back to
//! `original` and the library's offers are forgotten.

use crate::arch::{CounterRef, Native, StubWriter};
use crate::discover::maps::Maps;
use crate::lifecycle::interpose::Real;
use crate::lifecycle::locked::Locked;
use crate::log::vlog;
use crate::patch::install::StubMap;
use crate::patch::stubmem::StubArea;
use crate::patch::switch::{set_counting, store_stub_word, stub_word};
use crate::Agent;
use rtprof_abi::layout::{function_flags, module_flags};
use rtprof_abi::route::{RouteOutcome, ORIGINAL};
use rtprof_abi::SegmentWriter;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};

/// Longest implementation name.
const MAX_NAME: usize = 64;
/// Most offers a section may make (a larger one is read up to this).
const MAX_SECTION_OFFERS: usize = 256;
/// The section the `RTPROF_OFFER` macro writes.
const SECTION: &[u8] = b"rtprof_offers";

/// Why an offer was refused: the negated code `rtprof_offer` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OfferRefusal {
    /// No agent runs, or an argument is null.
    Inactive = 1,
    /// No patched function of that name.
    NotPatched = 2,
    /// The implementation's address is in no executable mapping.
    NotExecutable = 3,
    /// The name is empty, `original`, longer than 64 bytes, or offered
    /// already for that function with another address.
    BadName = 4,
    /// No room in the counter segment, or no memory for a route stub in
    /// reach of the function's stub.
    NoRoom = 5,
}

/// One implementation offered for a function.
struct Offer {
    /// The function's slot and its stub.
    of: u32,
    stub: u64,
    /// The stub's first eight bytes as written, counting on.
    own: [u8; 8],
    /// The implementation's row.
    row: u32,
    name: Box<[u8]>,
    target: u64,
    route_stub: u64,
}

/// Every offer and route of the process (under the loader lock).
#[derive(Default)]
pub struct Routes {
    offers: Vec<Offer>,
    /// Functions routed now: (slot, index of the offer in `offers`).
    routed: Vec<(u32, usize)>,
    /// Modules whose offers section was read: (bias, file).
    read: Vec<(u64, String)>,
}

/// Whether any offer was made: `dlclose` looks no further otherwise.
static ANY: AtomicBool = AtomicBool::new(false);

impl Routes {
    fn routed_to(&self, slot: u32) -> Option<usize> {
        self.routed.iter().find(|r| r.0 == slot).map(|r| r.1)
    }

    /// The stubs a counting switch of `chosen` (sorted slots) writes,
    /// given those of their own stubs in `stubs`: a routed function's own
    /// stub starts with the route's jump, so its route stubs are switched
    /// instead; every route stub follows its function's counting.
    pub fn counting_stubs(&self, chosen: &[u32], stubs: &mut Vec<u64>) {
        if self.offers.is_empty() {
            return;
        }
        stubs.retain(|s| !self.routed.iter().any(|&(_, i)| self.offers[i].stub == *s));
        stubs.extend(
            self.offers
                .iter()
                .filter(|o| chosen.binary_search(&o.of).is_ok())
                .map(|o| o.route_stub),
        );
        stubs.sort_unstable();
        stubs.dedup();
    }
}

/// The patched function named `name` (not an implementation row) and its
/// stub.
fn function(w: &SegmentWriter, stubs: &StubMap, name: &[u8]) -> Option<(u32, u64)> {
    let slot = (0..w.func_count()).find(|&slot| {
        let f = w.function(slot);
        f.status == 0
            && w.module(f.module).flags & module_flags::IMPLEMENTATIONS == 0
            && w.function_name(slot) == name
    })?;
    let stub = stubs.ranges().iter().find(|r| r.2 == slot)?.0;
    Some((slot, stub))
}

fn valid_name(name: &[u8]) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME && name != ORIGINAL.as_bytes()
}

/// Offers `target` as implementation `name` of `function`; returns its
/// row's slot.
pub fn offer(a: &Agent, function: &[u8], target: u64, name: &[u8]) -> Result<u32, OfferRefusal> {
    if !valid_name(name) {
        return Err(OfferRefusal::BadName);
    }
    if !Maps::current().executable(target) {
        return Err(OfferRefusal::NotExecutable);
    }
    let mut state = a.state.lock().ok_or(OfferRefusal::Inactive)?;
    offer_locked(a, &mut state, function, target, name)
}

fn offer_locked(
    a: &Agent,
    state: &mut Locked,
    function_name: &[u8],
    target: u64,
    name: &[u8],
) -> Result<u32, OfferRefusal> {
    let Locked {
        stubs,
        writer,
        routes,
        ..
    } = state;
    let (of, stub) = function(writer, stubs, function_name).ok_or(OfferRefusal::NotPatched)?;
    if let Some(o) = routes
        .offers
        .iter()
        .find(|o| o.of == of && *o.name == *name)
    {
        return if o.target == target {
            Ok(o.row)
        } else {
            Err(OfferRefusal::BadName)
        };
    }
    let own = match routes.offers.iter().find(|o| o.of == of) {
        Some(o) => o.own,
        None => {
            // Not routed yet: the stub's own bytes, its count on.
            let mut own = stub_word(stub);
            own[..2].copy_from_slice(&Native::counting_switch(true));
            own
        }
    };
    let area = StubArea::near(stub, stub + 16, Native::ROUTE_STUB_LEN as u64)
        .ok_or(OfferRefusal::NoRoom)?;
    let row = match writer.add_implementation(of, name, target) {
        Ok(row) => row,
        Err(_) => {
            area.release();
            return Err(OfferRefusal::NoRoom);
        }
    };
    let counter = CounterRef {
        tls_offset: a.tls_offset,
        slot: row,
        shared_counter: a.segment.counters.stripe_ptr(0) as u64 + row as u64 * 8,
        caller_hook: 0,
    };
    // SAFETY: the area is freshly mapped, writable, and at least a page.
    let out = unsafe { std::slice::from_raw_parts_mut(area.addr as *mut u8, area.len as usize) };
    if Native::emit_route_stub(area.addr, &counter, target, out).is_err() || !area.seal() {
        area.release();
        return Err(OfferRefusal::NoRoom);
    }
    if writer.function(of).reserved & function_flags::COUNTING_OFF != 0 {
        let _ = set_counting(&[area.addr], false);
    }
    routes.offers.push(Offer {
        of,
        stub,
        own,
        row,
        name: name.into(),
        target,
        route_stub: area.addr,
    });
    ANY.store(true, Ordering::Release);
    vlog!(
        "{} offered as {} at {target:#x}",
        String::from_utf8_lossy(function_name),
        String::from_utf8_lossy(name)
    );
    Ok(row)
}

/// Routes the calls of `function` to its implementation `name`
/// (`original`: its own code).
pub fn route(a: &Agent, function_name: &[u8], name: &[u8]) -> RouteOutcome {
    if crate::options::attach::loaded_by_attach() {
        return RouteOutcome::Attached;
    }
    let Some(mut state) = a.state.lock() else {
        return RouteOutcome::Failed;
    };
    let Locked {
        stubs,
        writer,
        routes,
        budget,
        ..
    } = &mut *state;
    let Some((of, _)) = function(writer, stubs, function_name) else {
        return RouteOutcome::NotPatched;
    };
    if budget.is_some() {
        return RouteOutcome::Budget;
    }
    let wanted = if name == ORIGINAL.as_bytes() {
        None
    } else {
        match routes
            .offers
            .iter()
            .position(|o| o.of == of && *o.name == *name)
        {
            Some(i) => Some(i),
            None => return RouteOutcome::NotOffered,
        }
    };
    set_route(routes, writer, of, wanted)
}

/// Sends the calls of function `of` to offer `wanted` (`None`: its own
/// code), and says so in the segment.
fn set_route(
    routes: &mut Routes,
    w: &mut SegmentWriter,
    of: u32,
    wanted: Option<usize>,
) -> RouteOutcome {
    if routes.routed_to(of) == wanted {
        return RouteOutcome::Unchanged;
    }
    let Some(first) = routes.offers.iter().find(|o| o.of == of) else {
        return RouteOutcome::Unchanged;
    };
    let (stub, own) = (first.stub, first.own);
    let word = match wanted {
        Some(i) => match Native::route_jump(stub, own, routes.offers[i].route_stub) {
            Some(w) => w,
            None => return RouteOutcome::Failed,
        },
        None => {
            let on = w.function(of).reserved & function_flags::COUNTING_OFF == 0;
            let mut b = own;
            b[..2].copy_from_slice(&Native::counting_switch(on));
            b
        }
    };
    if let Err(e) = store_stub_word(stub, word) {
        vlog!("route: {e}");
        return RouteOutcome::Failed;
    }
    routes.routed.retain(|r| r.0 != of);
    if let Some(i) = wanted {
        routes.routed.push((of, i));
    }
    w.set_active(of, wanted.is_none());
    for (i, o) in routes.offers.iter().enumerate().filter(|(_, o)| o.of == of) {
        w.set_active(o.row, Some(i) == wanted);
    }
    RouteOutcome::Routed
}

/// Answers a route request rtprofd relayed (`function\0name`).
pub fn serve(a: &Agent, request: &[u8]) -> RouteOutcome {
    let Some((function, name)) = rtprof_abi::route::parse_request(request) else {
        return RouteOutcome::Malformed;
    };
    let outcome = route(a, function, name);
    vlog!(
        "rtprofd: route {} to {}: {}",
        String::from_utf8_lossy(function),
        String::from_utf8_lossy(name),
        outcome.text()
    );
    outcome
}

// ---- Offers in ELF sections ----

/// An entry of the `rtprof_offers` section (`RTPROF_OFFER` in rtprof.h).
#[repr(C)]
#[derive(Clone, Copy)]
struct SectionEntry {
    function: *const c_char,
    implementation: *const c_void,
    name: *const c_char,
}

/// The runtime address and size of `file`'s `rtprof_offers` section, if
/// it has one: the ELF header, the section headers and their names, read
/// with three `pread`s.
fn offers_section(file: &str) -> Option<(u64, u64)> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(file).ok()?;
    let mut eh = [0u8; 64];
    f.read_exact_at(&mut eh, 0).ok()?;
    if eh[..4] != *b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return None;
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or([0; 4]));
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
    let (shoff, shentsize, shnum, shstrndx) = (
        u64_at(&eh, 0x28),
        u16_at(&eh, 0x3a),
        u16_at(&eh, 0x3c),
        u16_at(&eh, 0x3e),
    );
    if shentsize != 64 || shnum == 0 || shnum > 4096 || shstrndx >= shnum {
        return None;
    }
    let mut sh = vec![0u8; shnum * 64];
    f.read_exact_at(&mut sh, shoff).ok()?;
    let names = &sh[shstrndx * 64..shstrndx * 64 + 64];
    let (names_off, names_len) = (u64_at(names, 24), u64_at(names, 32).min(1 << 20));
    let mut strtab = vec![0u8; names_len as usize];
    f.read_exact_at(&mut strtab, names_off).ok()?;
    (0..shnum).find_map(|i| {
        let s = &sh[i * 64..i * 64 + 64];
        let name = strtab.get(u32_at(s, 0) as usize..)?;
        let name = &name[..name.iter().position(|&c| c == 0)?];
        (name == SECTION).then(|| (u64_at(s, 16), u64_at(s, 32)))
    })
}

/// A NUL-terminated string of at most 255 bytes at `p`, if readable.
fn c_string(maps: &Maps, p: *const c_char) -> Option<Vec<u8>> {
    let at = p as u64;
    let m = maps.at(at).filter(|m| m.read)?;
    let len = (m.end - at).min(256) as usize;
    // SAFETY: [p, p + len) lies in one readable mapping (checked above).
    let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
    let n = bytes.iter().position(|&c| c == 0)?;
    Some(bytes[..n].to_vec())
}

/// Makes the offers of the sections of the modules loaded and not read
/// yet: at start-up, and after a `dlopen` (once the loader has relocated
/// the library's pointers).
pub fn read_sections(a: &Agent) {
    let Some(mut state) = a.state.lock() else {
        return;
    };
    let new: Vec<(u64, String)> = state
        .known
        .0
        .iter()
        .map(|k| (k.bias, k.file.clone()))
        .filter(|m| !state.routes.read.contains(m))
        .collect();
    let mut maps: Option<Maps> = None;
    for (bias, file) in new {
        state.routes.read.push((bias, file.clone()));
        let Some((vaddr, size)) = offers_section(&file) else {
            continue;
        };
        let maps = maps.get_or_insert_with(Maps::current);
        let n = (size as usize / std::mem::size_of::<SectionEntry>()).min(MAX_SECTION_OFFERS);
        let at = bias.wrapping_add(vaddr);
        if !maps.readable(at, (n * std::mem::size_of::<SectionEntry>()) as u64) {
            continue;
        }
        for i in 0..n {
            // SAFETY: entry `i` of the section, inside the readable range
            // checked above; read unaligned, as plain integers.
            let e: SectionEntry =
                unsafe { std::ptr::read_unaligned((at as *const SectionEntry).add(i)) };
            let (Some(function), Some(name)) = (c_string(maps, e.function), c_string(maps, e.name))
            else {
                vlog!(
                    "{file}: offer {i} of its {} section unreadable",
                    "rtprof_offers"
                );
                continue;
            };
            let target = e.implementation as u64;
            let outcome = if !valid_name(&name) {
                Err(OfferRefusal::BadName)
            } else if !maps.executable(target) {
                Err(OfferRefusal::NotExecutable)
            } else {
                offer_locked(a, &mut state, &function, target, &name)
            };
            if let Err(why) = outcome {
                vlog!(
                    "{file}: offer of {} as {} refused: {why:?}",
                    String::from_utf8_lossy(&function),
                    String::from_utf8_lossy(&name)
                );
            }
        }
    }
}

// ---- Libraries unloaded ----

/// Before library `handle` may be unloaded: every function routed to an
/// implementation in it, or routed and in it, goes back to its own code,
/// and the offers for and from it are forgotten (whether or not this
/// `dlclose` really unloads it).
fn before_dlclose(handle: *mut c_void) {
    if !ANY.load(Ordering::Acquire) {
        return;
    }
    let Some(a) = crate::agent() else { return };
    /// The start of glibc's `struct link_map` (link.h).
    #[repr(C)]
    struct LinkMap {
        l_addr: usize,
    }
    let mut map: *mut LinkMap = std::ptr::null_mut();
    // SAFETY: RTLD_DI_LINKMAP writes the handle's link_map pointer into
    // `map`; a bad handle is refused with -1.
    if unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LINKMAP,
            (&mut map as *mut *mut LinkMap).cast(),
        )
    } != 0
        || map.is_null()
    {
        return;
    }
    // SAFETY: the loader's own record of a loaded library.
    let bias = unsafe { (*map).l_addr } as u64;
    let Some(m) = crate::discover::modules::loaded()
        .into_iter()
        .find(|m| m.bias == bias && !m.is_main)
    else {
        return;
    };
    let (lo, hi) = m.span();
    let Some(mut state) = a.state.lock() else {
        return;
    };
    let Locked { writer, routes, .. } = &mut *state;
    let inside = |addr: u64| addr >= lo && addr < hi;
    let gone: Vec<u32> = routes
        .offers
        .iter()
        .filter(|o| {
            let f = writer.function(o.of);
            inside(o.target) || inside(writer.module(f.module).base.wrapping_add(f.vaddr))
        })
        .map(|o| o.of)
        .collect();
    for &of in &gone {
        if routes.routed_to(of).is_some() {
            let outcome = set_route(routes, writer, of, None);
            vlog!(
                "{}: unloading; routed back to its own code: {}",
                m.path,
                outcome.text()
            );
        }
    }
    // Indices shift: no route points past here (all of `gone` are back).
    let mut i = 0;
    while i < routes.offers.len() {
        let o = &routes.offers[i];
        let f = writer.function(o.of);
        if inside(o.target) || inside(writer.module(f.module).base.wrapping_add(f.vaddr)) {
            routes.offers.remove(i);
            for r in &mut routes.routed {
                if r.1 > i {
                    r.1 -= 1;
                }
            }
        } else {
            i += 1;
        }
    }
    routes.read.retain(|r| r.0 != bias);
}

pub static DLOPEN: Real = Real::new(c"dlopen");
pub static DLCLOSE: Real = Real::new(c"dlclose");
/// The functions wrapped for offers and routes, resolved at start-up.
pub static ALL: [&Real; 2] = [&DLOPEN, &DLCLOSE];

/// # Safety
/// Same contract as `dlopen(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    type F = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
    let Some(real) = DLOPEN.get::<F>() else {
        return std::ptr::null_mut();
    };
    let h = real(file, mode);
    if !h.is_null() && !crate::lifecycle::sandbox::on() {
        if let Some(a) = crate::agent() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read_sections(a)));
        }
    }
    h
}

/// # Safety
/// Same contract as `dlclose(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    type F = unsafe extern "C" fn(*mut c_void) -> c_int;
    let _ = std::panic::catch_unwind(|| before_dlclose(handle));
    match DLCLOSE.get::<F>() {
        Some(real) => real(handle),
        None => -1,
    }
}

/// The C API: offers `implementation` as `name` for `function`.
///
/// # Safety
/// `function` and `name` must be NUL-terminated strings (or null).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn rtprof_offer(
    function: *const c_char,
    implementation: *const c_void,
    name: *const c_char,
) -> c_int {
    if function.is_null() || name.is_null() || implementation.is_null() {
        return -(OfferRefusal::Inactive as c_int);
    }
    let Some(a) = crate::agent() else {
        return -(OfferRefusal::Inactive as c_int);
    };
    let (function, name) = (CStr::from_ptr(function), CStr::from_ptr(name));
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        offer(
            a,
            function.to_bytes(),
            implementation as u64,
            name.to_bytes(),
        )
    }))
    .map_or(-(OfferRefusal::Inactive as c_int), |r| match r {
        Ok(_) => 0,
        Err(why) => -(why as c_int),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_refused() {
        assert!(valid_name(b"fast"));
        assert!(!valid_name(b""));
        assert!(!valid_name(b"original"));
        assert!(!valid_name(&[b'x'; MAX_NAME + 1]));
    }

    /// The section's place is found in a real file: this test's own
    /// binary has none, a C program built with the macro has one.
    #[test]
    fn the_offers_section_is_found_by_name() {
        assert_eq!(offers_section("/proc/self/exe"), None);
        assert_eq!(offers_section("/nonexistent"), None);
    }

    #[test]
    fn a_counting_switch_skips_routed_stubs_and_follows_route_stubs() {
        let offer = |of, stub, route_stub| Offer {
            of,
            stub,
            own: [0; 8],
            row: 100 + of,
            name: b"fast"[..].into(),
            target: 0,
            route_stub,
        };
        let r = Routes {
            offers: vec![offer(1, 0x1000, 0x9000), offer(2, 0x2000, 0xa000)],
            routed: vec![(1, 0)],
            read: Vec::new(),
        };
        let mut stubs = vec![0x1000, 0x2000, 0x3000];
        r.counting_stubs(&[1, 2, 3], &mut stubs);
        assert_eq!(stubs, [0x2000, 0x3000, 0x9000, 0xa000]);
        let mut only_3 = vec![0x3000];
        r.counting_stubs(&[3], &mut only_3);
        assert_eq!(only_3, [0x3000]);
    }
}
