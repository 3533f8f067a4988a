//! Implementations a program offers for its functions (`rtprof_offer`, or
//! the `RTPROF_OFFER` macro's ELF section `rtprof_offers`, read at
//! start-up and, for a library loaded later, once its pointers are
//! relocated), and a function's calls routed to one of them while the
//! program's threads run (rtprofd's route requests).
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
//! exec starts a new agent without any. Before a `dlclose`, every route
//! into (or of) a library loaded after start-up goes back to `original`;
//! the offers of a library that did go are forgotten when the loader hook
//! sees it gone.

use crate::arch::{CounterRef, Native, Routed, StubWriter};
use crate::discover::maps::Maps;
use crate::discover::modules::Module;
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
    /// No agent runs.
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
    /// The function's name, the implementation or its name is null.
    Null = 6,
    /// The implementation is the function itself (its address, an alias
    /// of it, or an address inside its code, where its patched entry is):
    /// routed, every call would run into the route again, or into the
    /// middle of an instruction.
    ItsOwnCode = 7,
    /// The implementation is not where a function of its module starts
    /// (by the module's symbols, or its unwind entries where it has none).
    NotAFunctionStart = 8,
    /// The name is not UTF-8, or holds a control character (a newline, a
    /// tab...): `rtprof route` could not name it.
    Unnameable = 9,
    /// Several patched functions have that name (static functions of
    /// several files, C++ overloads named without their parameters): the
    /// offer is made by address (`rtprof_offer_at`).
    Ambiguous = 10,
}

impl OfferRefusal {
    /// Why, as a log line says it.
    pub fn text(self) -> &'static str {
        match self {
            OfferRefusal::Inactive => "the agent is not active",
            OfferRefusal::NotPatched => "no patched function of that name",
            OfferRefusal::NotExecutable => "the implementation is not in executable memory",
            OfferRefusal::BadName => {
                "a bad name (empty, original, longer than 64 bytes, or offered already with another address)"
            }
            OfferRefusal::NoRoom => "no room",
            OfferRefusal::Null => "a null name or implementation",
            OfferRefusal::ItsOwnCode => "the implementation is the function's own code",
            OfferRefusal::NotAFunctionStart => "the implementation is not at a function's start",
            OfferRefusal::Unnameable => "the name is not UTF-8 or holds a control character",
            OfferRefusal::Ambiguous => {
                "several patched functions have that name: offer by address (rtprof_offer_at)"
            }
        }
    }
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
    /// The function's calls are routed to it now.
    active: bool,
}

/// Every offer and route of the process (under the state lock).
#[derive(Default)]
pub struct Routes {
    offers: Vec<Offer>,
    /// Modules whose offers section is not read yet.
    pending: Vec<Pending>,
    /// The address ranges of the modules loaded at start-up (never
    /// unloaded by a `dlclose`).
    startup: Vec<(u64, u64)>,
    /// `dlclose` calls under way: no route into a later module meanwhile.
    closing: u32,
    /// Every module noted (loaded and not unloaded since): where an
    /// implementation's address is looked up without asking the loader
    /// (whose lock a thread in the loader hook holds while it waits for
    /// the state lock).
    modules: Vec<Module>,
    /// Where the functions of a module start (runtime addresses, sorted),
    /// by its lowest address: read from its file once an offer needs them.
    starts: Vec<(u64, Vec<u64>)>,
}

/// Whether any offer was made: `dlclose` looks no further otherwise.
static ANY: AtomicBool = AtomicBool::new(false);

impl Routes {
    /// Notes the modules loaded at start-up: what a `dlclose` cannot take.
    /// The agent's own, the loader and the vDSO offer nothing: their
    /// files are not read.
    pub fn note_startup(&mut self, modules: &[Module]) {
        use crate::discover::modules::{skip_reason, Skip};
        for m in modules {
            self.startup.push(m.span());
            if !matches!(
                skip_reason(m, &|_| true),
                Some(Skip::Agent | Skip::Loader | Skip::Vdso)
            ) {
                self.note_module(m);
            } else {
                self.modules.push(m.clone());
            }
        }
    }

    /// Whether `addr` lies in a module loaded at start-up.
    fn loaded_at_start(&self, addr: u64) -> bool {
        self.startup.iter().any(|&(lo, hi)| addr >= lo && addr < hi)
    }

    /// The offer function `slot`'s calls are routed to now.
    fn routed_to(&self, slot: u32) -> Option<usize> {
        self.offers.iter().position(|o| o.of == slot && o.active)
    }

    /// The stubs a counting switch of `chosen` (sorted slots) writes,
    /// given those of their own stubs in `stubs`: a routed function's own
    /// stub starts with the route's jump, so its route stubs are switched
    /// instead; every route stub follows its function's counting.
    pub fn counting_stubs(&self, chosen: &[u32], stubs: &mut Vec<u64>) {
        if self.offers.is_empty() {
            return;
        }
        stubs.retain(|s| !self.offers.iter().any(|o| o.active && o.stub == *s));
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

/// The patched functions (not implementation rows) that have a stub now
/// (an unloaded library's records stay, their stubs do not), with their
/// stubs, for which `wanted` holds.
fn functions<'a>(
    w: &'a SegmentWriter,
    stubs: &'a StubMap,
    wanted: impl Fn(u32) -> bool + 'a,
) -> impl Iterator<Item = (u32, u64)> + 'a {
    (0..w.func_count())
        .filter(move |&slot| {
            let f = w.function(slot);
            f.status == 0
                && w.module(f.module).flags & module_flags::IMPLEMENTATIONS == 0
                && wanted(slot)
        })
        .filter_map(|slot| Some((slot, stubs.ranges().iter().find(|r| r.2 == slot)?.0)))
}

/// The patched functions called `name` (see [`is_called`]), with stubs.
fn named(w: &SegmentWriter, stubs: &StubMap, name: &[u8]) -> Vec<(u32, u64)> {
    functions(w, stubs, |slot| is_called(w.function_name(slot), name)).collect()
}

/// The one patched function called `name`: none, or several, refused.
fn function(w: &SegmentWriter, stubs: &StubMap, name: &[u8]) -> Result<(u32, u64), OfferRefusal> {
    match named(w, stubs, name)[..] {
        [] => Err(OfferRefusal::NotPatched),
        [one] => Ok(one),
        _ => Err(OfferRefusal::Ambiguous),
    }
}

/// The patched function whose code starts at `addr`, with its stub.
fn function_at(w: &SegmentWriter, stubs: &StubMap, addr: u64) -> Option<(u32, u64)> {
    functions(w, stubs, |slot| {
        let f = w.function(slot);
        w.module(f.module).base.wrapping_add(f.vaddr) == addr
    })
    .next()
}

/// Whether a function whose symbol is `symbol` is called `name`: its
/// symbol, or the symbol demangled as reports print it (C++'s
/// `k::sum(int)`, with or without its parameters; Rust's `dot::dot_plain`,
/// without the hash).
fn is_called(symbol: &[u8], name: &[u8]) -> bool {
    if symbol == name {
        return true;
    }
    let Ok(symbol) = std::str::from_utf8(symbol) else {
        return false;
    };
    if !(symbol.starts_with("_Z") || symbol.starts_with("_R")) {
        return false;
    }
    // Both schemes spell each identifier out: a symbol without the name's
    // last one is not demangled (a lookup scans every function).
    let Ok(wanted) = std::str::from_utf8(name) else {
        return false;
    };
    let last = without_parameters(wanted).rsplit("::").next().unwrap_or("");
    // (Operators and templates are spelt otherwise: those are demangled.)
    let spelt = !last.starts_with("operator") && !last.contains('<');
    if spelt && !symbol.contains(last) {
        return false;
    }
    let readable = rtprof_shared::names::demangle(symbol);
    readable.as_bytes() == name || without_parameters(&readable).as_bytes() == name
}

/// A demangled C++ name without its parameter list and qualifiers:
/// `k::sum(int) const` -> `k::sum`.
fn without_parameters(readable: &str) -> &str {
    let b = readable.as_bytes();
    let Some(close) = readable.rfind(')') else {
        return readable;
    };
    let mut depth = 0usize;
    for i in (0..=close).rev() {
        match b[i] {
            b')' => depth += 1,
            b'(' => {
                depth -= 1;
                if depth == 0 {
                    return &readable[..i];
                }
            }
            _ => {}
        }
    }
    readable
}

fn valid_name(name: &[u8]) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME && name != ORIGINAL.as_bytes()
}

/// Whether `rtprof route` can carry `name`: UTF-8, without control
/// characters (a request is one line of text).
fn nameable(name: &[u8]) -> bool {
    std::str::from_utf8(name).is_ok_and(|s| !s.chars().any(char::is_control))
}

/// Why implementation `name` is refused before anything is looked up.
fn check_name(name: &[u8]) -> Result<(), OfferRefusal> {
    if !nameable(name) {
        Err(OfferRefusal::Unnameable)
    } else if !valid_name(name) {
        Err(OfferRefusal::BadName)
    } else {
        Ok(())
    }
}

impl Routes {
    /// Whether `target` may implement function `of`: not inside the
    /// function's own code (its start, an alias, its patched entry), and,
    /// in a module noted, where one of its functions starts. An address in
    /// no module (generated code) or in one whose file names no function
    /// cannot be checked, and is taken.
    fn check_target(
        &mut self,
        w: &SegmentWriter,
        of: u32,
        target: u64,
    ) -> Result<(), OfferRefusal> {
        let f = w.function(of);
        let start = w.module(f.module).base.wrapping_add(f.vaddr);
        if target >= start && target - start < (f.size as u64).max(1) {
            return Err(OfferRefusal::ItsOwnCode);
        }
        let Some(m) = self.modules.iter().find(|m| m.contains(target)) else {
            return Ok(());
        };
        let lo = m.span().0;
        let i = match self.starts.iter().position(|(at, _)| *at == lo) {
            Some(i) => i,
            None => {
                let starts = function_starts(m);
                self.starts.push((lo, starts));
                self.starts.len() - 1
            }
        };
        let starts = &self.starts[i].1;
        if starts.is_empty() || starts.binary_search(&target).is_ok() {
            Ok(())
        } else {
            Err(OfferRefusal::NotAFunctionStart)
        }
    }
}

/// Where the functions of module `m` start, from its file's symbols (its
/// unwind entries where it has none): sorted runtime addresses, none if
/// the file cannot be read.
fn function_starts(m: &Module) -> Vec<u64> {
    let maps = Maps::current();
    let Ok(image) = crate::discover::fileimage::FileImage::open(m, &maps) else {
        return Vec::new();
    };
    let mut starts: Vec<u64> = crate::discover::symbols::list_for_sampling(image.data(), None)
        .iter()
        .map(|f| m.bias.wrapping_add(f.vaddr))
        .collect();
    starts.sort_unstable();
    starts.dedup();
    starts
}

/// Offers `target` as implementation `name` of `function`; returns its
/// row's slot.
pub fn offer(a: &Agent, function: Of, target: u64, name: &[u8]) -> Result<u32, OfferRefusal> {
    check_name(name)?;
    if !Maps::current().executable(target) {
        return Err(OfferRefusal::NotExecutable);
    }
    read_pending(a);
    let mut state = a.state.lock().ok_or(OfferRefusal::Inactive)?;
    offer_locked(a, &mut state, function, target, name)
}

/// The function an offer is for: by name, or by the address of its code.
#[derive(Clone, Copy)]
pub enum Of<'a> {
    Name(&'a [u8]),
    Address(u64),
}

fn offer_locked(
    a: &Agent,
    state: &mut Locked,
    of: Of,
    target: u64,
    name: &[u8],
) -> Result<u32, OfferRefusal> {
    let Locked {
        stubs,
        writer,
        routes,
        ..
    } = state;
    let (of, stub) = match of {
        Of::Name(n) => function(writer, stubs, n)?,
        Of::Address(at) => function_at(writer, stubs, at).ok_or(OfferRefusal::NotPatched)?,
    };
    let function_name = writer.function_name(of).to_vec();
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
    routes.check_target(writer, of, target)?;
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
        ..CounterRef::default()
    };
    // SAFETY: the area is freshly mapped, writable, and at least a page.
    let out = unsafe { std::slice::from_raw_parts_mut(area.addr as *mut u8, area.len as usize) };
    // The function's code as it runs now says what its callers expect.
    let maps = Maps::current();
    let read = |at: u64, n: usize| {
        // SAFETY: [at, at + n) was mapped readable just now: the routed
        // function's code and what it calls, which a program does not
        // unload while it offers implementations of it.
        maps.readable(at, n as u64)
            .then(|| unsafe { std::slice::from_raw_parts(at as *const u8, n) })
    };
    let f = writer.function(of);
    let routed = Routed {
        start: writer.module(f.module).base.wrapping_add(f.vaddr),
        stub,
        counter: CounterRef {
            slot: of,
            shared_counter: a.segment.counters.stripe_ptr(0) as u64 + of as u64 * 8,
            ..counter
        },
        read: &read,
    };
    if Native::emit_route_stub(area.addr, &counter, target, &routed, out).is_err() || !area.seal() {
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
        active: false,
    });
    ANY.store(true, Ordering::Release);
    vlog!(
        "{} offered as {} at {target:#x}",
        String::from_utf8_lossy(&function_name),
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
    // Of the functions of that name (static functions of several files,
    // C++ overloads), the one with an offer of that name (`original`: one
    // with any offer).
    let candidates = named(writer, stubs, function_name);
    let Some(&(first, _)) = candidates.first() else {
        return RouteOutcome::NotPatched;
    };
    if budget.is_some() {
        return RouteOutcome::Budget;
    }
    let original = name == ORIGINAL.as_bytes();
    let found = candidates.iter().find_map(|&(slot, _)| {
        routes
            .offers
            .iter()
            .position(|o| o.of == slot && (original || *o.name == *name))
            .map(|i| (slot, i))
    });
    let (of, wanted) = match (found, original) {
        (Some((slot, _)), true) => (slot, None),
        (None, true) => (first, None),
        (Some((slot, i)), false) => (slot, Some(i)),
        (None, false) => return RouteOutcome::NotOffered,
    };
    if let Some(i) = wanted {
        if routes.closing > 0 && !routes.loaded_at_start(routes.offers[i].target) {
            return RouteOutcome::Unloading;
        }
    }
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
    w.set_active(of, wanted.is_none());
    for (i, o) in routes
        .offers
        .iter_mut()
        .enumerate()
        .filter(|(_, o)| o.of == of)
    {
        o.active = Some(i) == wanted;
        w.set_active(o.row, o.active);
        // Samples in the implementation's code count for its row while
        // its route is active (the code's own row keeps the others).
        if let Some(code) = crate::sampling::addrmap::slot_at(o.target) {
            crate::sampling::addrmap::set_routed(code, o.row, o.active);
        }
    }
    RouteOutcome::Routed
}

/// Answers a route request rtprofd relayed (`function\0name\0expiry`):
/// carried out only if taken before it expired (rtprofd withdraws it then:
/// see `rtprof_abi::route`).
pub fn serve(a: &Agent, request: &[u8]) -> RouteOutcome {
    let Some((function, name, expires)) = rtprof_abi::route::parse_segment_request(request) else {
        return RouteOutcome::Malformed;
    };
    let outcome = if a.segment.counters.control_claim(expires) {
        route(a, function, name)
    } else {
        RouteOutcome::Withdrawn
    };
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

/// A module whose offers section is not read yet: the loader maps a
/// library before it relocates the pointers of its section, so a library
/// loaded later is read once they are (see [`read_pending`]).
pub struct Pending {
    module: Module,
    /// Where its section is (`None` until the file was looked at).
    section: Option<Section>,
    /// Reads that found pointers not relocated yet.
    tries: u32,
}

/// A module's offers section as its file has it.
struct Section {
    /// Its runtime address, and how many entries are read.
    at: u64,
    entries: usize,
    /// What each entry's three pointers read once the loader has
    /// relocated them, if the file holds the section's bytes.
    file: Option<Vec<[Relocated; 3]>>,
}

/// How a section pointer reads once the loader has relocated it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Relocated {
    /// Nothing relocates it: as the file has it (a null stays null).
    AsIs,
    /// A relative relocation: the module's base plus its addend.
    Exactly(u64),
    /// A symbol's address, or a packed relative relocation: anything but
    /// what the file has.
    Not(u64),
}

impl Relocated {
    fn by(self, now: u64) -> bool {
        match self {
            Relocated::AsIs => true,
            Relocated::Exactly(v) => now == v,
            Relocated::Not(v) => now != v,
        }
    }
}

/// What the `n` entries of the section at link-time address `vaddr`
/// read once relocated, given the file's bytes of them and the module's
/// `bias`: by the file's dynamic relocations (`.rela.dyn`); a pointer
/// none of them names is either null (left as it is) or relocated by a
/// packed relative relocation (`.relr.dyn`), which changes it.
fn relocated_values(data: &[u8], bytes: &[u8], vaddr: u64, bias: u64) -> Vec<[Relocated; 3]> {
    const R_X86_64_RELATIVE: u32 = 8;
    let relocs: Vec<(u64, u32, i64)> = goblin::elf::Elf::parse(data)
        .map(|elf| {
            elf.dynrelas
                .iter()
                .map(|r| (r.r_offset, r.r_type, r.r_addend.unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default();
    bytes
        .chunks_exact(std::mem::size_of::<SectionEntry>())
        .enumerate()
        .map(|(i, e)| {
            let slot = |k: usize| {
                let was = u64::from_le_bytes(e[k * 8..k * 8 + 8].try_into().unwrap_or([0; 8]));
                let at = vaddr + (i * std::mem::size_of::<SectionEntry>() + k * 8) as u64;
                match relocs.iter().find(|r| r.0 == at) {
                    Some(&(_, R_X86_64_RELATIVE, addend)) => {
                        Relocated::Exactly(bias.wrapping_add(addend as u64))
                    }
                    Some(_) => Relocated::Not(was),
                    None if was == 0 => Relocated::AsIs,
                    None => Relocated::Not(was),
                }
            };
            [slot(0), slot(1), slot(2)]
        })
        .collect()
}

/// Reads of a module whose entries are still as the file has them before
/// they are taken as they are (a tick apart).
const MAX_TRIES: u32 = 50;

/// Whether modules wait for their section to be read.
static PENDING: AtomicBool = AtomicBool::new(false);

impl Routes {
    /// Notes module `m` (loaded now): its offers are read by
    /// [`read_pending`].
    pub fn note_module(&mut self, m: &Module) {
        self.modules.push(m.clone());
        self.pending.push(Pending {
            module: m.clone(),
            section: None,
            tries: 0,
        });
        PENDING.store(true, Ordering::Release);
    }

    /// Module `[lo, hi)` was unloaded: offers of its functions or into its
    /// code are forgotten, and a function still routed into it goes back
    /// to its own code (its stub may be gone with the module, then only
    /// the record goes).
    pub fn forget_unloaded(&mut self, w: &mut SegmentWriter, lo: u64, hi: u64) {
        self.pending.retain(|p| p.module.span().0 != lo);
        self.modules.retain(|m| m.span().0 != lo);
        self.starts.retain(|(at, _)| *at != lo);
        if self.offers.is_empty() {
            return;
        }
        let inside = |a: u64| a >= lo && a < hi;
        let own = |w: &SegmentWriter, of: u32| {
            let f = w.function(of);
            inside(w.module(f.module).base.wrapping_add(f.vaddr))
        };
        let back: Vec<u32> = self
            .offers
            .iter()
            .filter(|o| o.active && inside(o.target) && !own(w, o.of))
            .map(|o| o.of)
            .collect();
        for of in back {
            let _ = set_route(self, w, of, None);
        }
        // A function of the module goes with its stub, routed or not.
        self.offers.retain(|o| !inside(o.target) && !own(w, o.of));
    }
}

/// The address and size of the `rtprof_offers` section in `data` (an ELF
/// file), if it has one.
fn offers_section(data: &[u8]) -> Option<(u64, u64)> {
    let at = |o: usize, n: usize| data.get(o..o.checked_add(n)?);
    let u16_at = |o: usize| at(o, 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u32_at = |o: usize| at(o, 4).map(|b| u32::from_le_bytes(b.try_into().unwrap_or([0; 4])));
    let u64_at = |o: usize| at(o, 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
    if at(0, 6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let shoff = usize::try_from(u64_at(0x28)?).ok()?;
    let (entsize, shnum, shstrndx) = (u16_at(0x3a)?, u16_at(0x3c)?, u16_at(0x3e)?);
    if entsize != 64 || shstrndx >= shnum {
        return None;
    }
    let header = |i: usize| shoff.checked_add(i * 64);
    let names = usize::try_from(u64_at(header(shstrndx)? + 24)?).ok()?;
    (0..shnum).find_map(|i| {
        let h = header(i)?;
        let name = names.checked_add(u32_at(h)? as usize)?;
        let wanted = at(name, SECTION.len() + 1)?;
        (wanted[..SECTION.len()] == *SECTION && wanted[SECTION.len()] == 0)
            .then_some((u64_at(h + 16)?, u64_at(h + 32)?))
    })
}

/// A NUL-terminated string of at most 255 bytes at `p` inside `[lo, hi)`,
/// if readable.
fn c_string(maps: &Maps, p: *const c_char, (lo, hi): (u64, u64)) -> Option<Vec<u8>> {
    let at = p as u64;
    if at < lo || at >= hi {
        return None;
    }
    let m = maps.at(at).filter(|m| m.read)?;
    let len = (m.end.min(hi) - at).min(256) as usize;
    // SAFETY: [p, p + len) lies in one readable mapping (checked above).
    let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
    let n = bytes.iter().position(|&c| c == 0)?;
    Some(bytes[..n].to_vec())
}

/// A section entry read: (function, implementation, name).
type Entry = (Vec<u8>, u64, Vec<u8>);

/// One section entry checked: both names readable inside the module (a
/// string of another library is not taken: a module offers for itself)
/// and the implementation in executable memory; else why not.
fn entry(maps: &Maps, e: &SectionEntry, span: (u64, u64)) -> Result<Entry, &'static str> {
    if e.function.is_null() || e.name.is_null() || e.implementation.is_null() {
        return Err("a null function name, implementation or name");
    }
    let function = c_string(maps, e.function, span)
        .ok_or("its function name is not a string inside the module")?;
    let name = c_string(maps, e.name, span).ok_or("its name is not a string inside the module")?;
    let target = e.implementation as u64;
    if !maps.executable(target) {
        return Err(OfferRefusal::NotExecutable.text());
    }
    Ok((function, target, name))
}

/// The three pointers of entry `e`.
fn pointers(e: &SectionEntry) -> [u64; 3] {
    [e.function as u64, e.implementation as u64, e.name as u64]
}

/// Makes the offers of the modules noted and not read yet: at start-up
/// (every module relocated), and for libraries loaded later on the drain
/// thread's next tick, a route request or an offer, once the loader has
/// relocated their sections' pointers.
pub fn read_pending(a: &Agent) {
    if !PENDING.load(Ordering::Acquire) || crate::lifecycle::sandbox::on() {
        return;
    }
    let Some(mut state) = a.state.lock() else {
        return;
    };
    let mut pending = std::mem::take(&mut state.routes.pending);
    let maps = Maps::current();
    pending.retain_mut(|p| !read_module(a, &mut state, &maps, p));
    state.routes.pending.append(&mut pending);
    PENDING.store(!state.routes.pending.is_empty(), Ordering::Release);
}

/// Finds `m`'s offers section in the file the loader mapped (not whatever
/// has its name now), with its entries' values in the file.
fn find_section(m: &Module, maps: &Maps) -> Option<Section> {
    let image = crate::discover::fileimage::FileImage::open(m, maps).ok()?;
    let (vaddr, size) = offers_section(image.data())?;
    let entries = (size as usize / std::mem::size_of::<SectionEntry>()).min(MAX_SECTION_OFFERS);
    let at = m.bias.wrapping_add(vaddr);
    let len = entries * std::mem::size_of::<SectionEntry>();
    let file = image
        .bytes(at, len as u64)
        .map(|b| relocated_values(image.data(), b, vaddr, m.bias));
    Some(Section { at, entries, file })
}

/// Reads `p`'s section; whether it is done with (read, none, or given up).
/// Each entry is taken or refused on its own, every refusal logged.
fn read_module(a: &Agent, state: &mut Locked, maps: &Maps, p: &mut Pending) -> bool {
    let m = &p.module;
    if p.section.is_none() {
        match find_section(m, maps) {
            Some(s) => p.section = Some(s),
            None => return true,
        }
    }
    let Some(section) = &p.section else {
        return true;
    };
    let (at, n) = (section.at, section.entries);
    let bytes = (n * std::mem::size_of::<SectionEntry>()) as u64;
    if m.load_containing(at, bytes).is_none() || !maps.readable(at, bytes) {
        vlog!(
            "{}: its {} section lies outside its loaded segments",
            m.path,
            "rtprof_offers"
        );
        return true;
    }
    let raw: Vec<SectionEntry> = (0..n)
        .map(|i| {
            // SAFETY: entry `i` of the section, inside the readable range
            // checked above; read unaligned, as plain integers.
            unsafe { std::ptr::read_unaligned((at as *const SectionEntry).add(i)) }
        })
        .collect();
    // The loader maps a library before it relocates it: its pointers are
    // final once each reads as its relocation makes it. A module loaded at
    // start-up was relocated before the agent started.
    let span = m.span();
    let relocated = state.routes.loaded_at_start(at)
        || m.bias == 0
        || match &section.file {
            Some(file) => raw
                .iter()
                .zip(file)
                .all(|(e, f)| pointers(e).iter().zip(f).all(|(&now, r)| r.by(now))),
            // No file values to compare with: names inside the module.
            None => raw.iter().all(|e| {
                [e.function as u64, e.name as u64]
                    .iter()
                    .all(|&p| p == 0 || (p >= span.0 && p < span.1))
            }),
        };
    if !relocated {
        p.tries += 1;
        if p.tries < MAX_TRIES {
            return false;
        }
        vlog!(
            "{}: its {} section still reads as in its file; its entries taken as they are",
            m.path,
            "rtprof_offers"
        );
    }
    for (i, e) in raw.iter().enumerate() {
        let why = match entry(maps, e, span) {
            Err(why) => why.to_string(),
            Ok((function, target, name)) => {
                match check_name(&name)
                    .and_then(|()| offer_locked(a, state, Of::Name(&function), target, &name))
                {
                    Ok(_) => continue,
                    Err(why) => format!(
                        "offer of {} as {} refused: {} (code -{})",
                        String::from_utf8_lossy(&function),
                        String::from_utf8_lossy(&name).escape_debug(),
                        why.text(),
                        why as u32
                    ),
                }
            }
        };
        vlog!("{}: {} entry {i} refused: {why}", m.path, "rtprof_offers");
    }
    true
}

// ---- Libraries unloaded ----

/// Before `dlclose`: which modules the call may unload is known only
/// after it, so every function routed into a module loaded after start-up
/// (or routed and in one) goes back to its own code first, and no route
/// into one is taken until the call returns. The offers of a module that
/// did go are forgotten by the loader hook ([`Routes::forget_unloaded`]).
fn before_dlclose() {
    if !ANY.load(Ordering::Acquire) || crate::lifecycle::sandbox::on() {
        return;
    }
    let Some(a) = crate::agent() else { return };
    let Some(mut state) = a.state.lock() else {
        return;
    };
    let Locked { writer, routes, .. } = &mut *state;
    routes.closing += 1;
    let active: Vec<(u32, u64)> = routes
        .offers
        .iter()
        .filter(|o| o.active)
        .map(|o| (o.of, o.target))
        .collect();
    for (of, target) in active {
        let f = writer.function(of);
        let own = writer.module(f.module).base.wrapping_add(f.vaddr);
        if !routes.loaded_at_start(target) || !routes.loaded_at_start(own) {
            let outcome = set_route(routes, writer, of, None);
            vlog!(
                "dlclose: {} routed back to its own code: {}",
                String::from_utf8_lossy(writer.function_name(of)),
                outcome.text()
            );
        }
    }
}

fn after_dlclose() {
    if !ANY.load(Ordering::Acquire) {
        return;
    }
    if let Some(mut state) = crate::agent().and_then(|a| a.state.lock()) {
        state.routes.closing = state.routes.closing.saturating_sub(1);
    }
}

pub static DLCLOSE: Real = Real::new(c"dlclose");
/// The functions wrapped for routes, resolved at start-up. (`dlopen` is
/// not: glibc takes its caller's return address for the library whose
/// search path and `$ORIGIN` apply.)
pub static ALL: [&Real; 1] = [&DLCLOSE];

/// # Safety
/// Same contract as `dlclose(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    type F = unsafe extern "C" fn(*mut c_void) -> c_int;
    let _ = std::panic::catch_unwind(before_dlclose);
    let rc = match DLCLOSE.get::<F>() {
        Some(real) => real(handle),
        None => -1,
    };
    let _ = std::panic::catch_unwind(after_dlclose);
    rc
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
    if function.is_null() {
        return -(OfferRefusal::Null as c_int);
    }
    // SAFETY: the caller's NUL-terminated string.
    let function = unsafe { CStr::from_ptr(function) }.to_bytes();
    // SAFETY: the caller's contract, passed on.
    unsafe { offer_from_c(Of::Name(function), implementation, name) }
}

/// The C API by address: offers `implementation` as `name` for the
/// function whose code starts at `function` (C++ overloads, static
/// functions of one name in several files, Rust functions by pointer).
///
/// # Safety
/// `name` must be a NUL-terminated string (or null).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn rtprof_offer_at(
    function: *const c_void,
    implementation: *const c_void,
    name: *const c_char,
) -> c_int {
    if function.is_null() {
        return -(OfferRefusal::Null as c_int);
    }
    // SAFETY: the caller's contract, passed on.
    unsafe { offer_from_c(Of::Address(function as u64), implementation, name) }
}

/// What both C entry points do: the offer, its refusal logged and
/// returned negated.
///
/// # Safety
/// `name` must be a NUL-terminated string (or null).
unsafe fn offer_from_c(function: Of, implementation: *const c_void, name: *const c_char) -> c_int {
    if name.is_null() || implementation.is_null() {
        return -(OfferRefusal::Null as c_int);
    }
    // Under a seccomp filter the agent makes no system call it may forbid.
    let Some(a) = crate::agent().filter(|_| !crate::lifecycle::sandbox::on()) else {
        return -(OfferRefusal::Inactive as c_int);
    };
    // SAFETY: the caller's NUL-terminated string.
    let name = unsafe { CStr::from_ptr(name) }.to_bytes();
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        offer(a, function, implementation as u64, name)
    }))
    .map_or(-(OfferRefusal::Inactive as c_int), |r| match r {
        Ok(_) => 0,
        Err(why) => {
            let of = match function {
                Of::Name(n) => String::from_utf8_lossy(n).into_owned(),
                Of::Address(at) => format!("the function at {at:#x}"),
            };
            vlog!(
                "rtprof_offer of {of} as {} refused: {} (code -{})",
                String::from_utf8_lossy(name).escape_debug(),
                why.text(),
                why as c_int
            );
            -(why as c_int)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_are_found_by_their_readable_names() {
        assert_eq!(without_parameters("k::sum(int) const"), "k::sum");
        assert_eq!(without_parameters("f(void (*)(int))"), "f");
        assert_eq!(without_parameters("plain"), "plain");
        assert!(is_called(b"_ZN1k3sumEi", b"k::sum"));
        assert!(is_called(b"_ZN1k3sumEi", b"k::sum(int)"));
        assert!(!is_called(b"_ZN1k3sumEi", b"sum"));
        assert!(is_called(
            b"_ZN3dot9dot_plain17h0123456789abcdefE",
            b"dot::dot_plain"
        ));
        assert!(is_called(b"work", b"work"));
        assert!(!is_called(b"work", b"work2"));
    }

    #[test]
    fn names_that_are_refused() {
        assert!(valid_name(b"fast"));
        assert!(!valid_name(b""));
        assert!(!valid_name(b"original"));
        assert!(!valid_name(&[b'x'; MAX_NAME + 1]));
        assert_eq!(check_name(b"avx2"), Ok(()));
        assert_eq!(check_name("ü-fast".as_bytes()), Ok(()));
        for bad in [&b"\xff\xfe"[..], b"a\nb", b"tab\t", b"nul\x01"] {
            assert_eq!(check_name(bad), Err(OfferRefusal::Unnameable), "{bad:?}");
        }
        assert_eq!(check_name(b"original"), Err(OfferRefusal::BadName));
    }

    /// The section is found by name, in bounds: this test's own binary
    /// has none; a file cut short or not ELF gives none, never a panic.
    #[test]
    fn the_offers_section_is_found_by_name() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        assert_eq!(offers_section(&exe), None);
        for cut in [0, 6, 64, 0x40, exe.len() / 2] {
            assert_eq!(offers_section(&exe[..cut]), None);
        }
        assert_eq!(offers_section(b"not an ELF file at all"), None);
    }

    /// Names are read only inside the module's range: a pointer the
    /// loader has not relocated yet (the file's value) is not.
    #[test]
    fn names_outside_the_module_are_not_read() {
        let maps = Maps::current();
        let s = c"kernel";
        let at = s.as_ptr() as u64;
        assert_eq!(
            c_string(&maps, s.as_ptr(), (at, at + 64)),
            Some(b"kernel".to_vec())
        );
        assert_eq!(c_string(&maps, s.as_ptr(), (at + 1, at + 64)), None);
        assert_eq!(
            c_string(&maps, 0x2000 as *const c_char, (0, u64::MAX)),
            None
        );
    }

    /// Without a relocation naming it, a null pointer is final as it is
    /// and any other must change (a packed relative relocation); one the
    /// file relocates reads as that relocation makes it.
    #[test]
    fn section_pointers_are_final_once_they_read_as_relocated() {
        let mut bytes = Vec::new();
        for w in [0u64, 0x2000, 0] {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        let r = relocated_values(b"not an ELF file", &bytes, 0x4000, 0x7f00_0000_0000);
        assert_eq!(
            r,
            [[Relocated::AsIs, Relocated::Not(0x2000), Relocated::AsIs]]
        );
        assert!(Relocated::AsIs.by(0) && Relocated::Not(0x2000).by(0x7f00_0000_2000));
        assert!(!Relocated::Not(0x2000).by(0x2000));
        assert!(Relocated::Exactly(5).by(5) && !Relocated::Exactly(5).by(0));
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
            active: of == 1,
        };
        let r = Routes {
            offers: vec![offer(1, 0x1000, 0x9000), offer(2, 0x2000, 0xa000)],
            ..Routes::default()
        };
        let mut stubs = vec![0x1000, 0x2000, 0x3000];
        r.counting_stubs(&[1, 2, 3], &mut stubs);
        assert_eq!(stubs, [0x2000, 0x3000, 0x9000, 0xa000]);
        let mut only_3 = vec![0x3000];
        r.counting_stubs(&[3], &mut only_3);
        assert_eq!(only_3, [0x3000]);
    }
}
