//! Offers implementations of a Rust program's functions to rtprof's agent,
//! so that a scheduler may route their calls while the program runs
//! (`rtprof route PID FUNCTION NAME`, through rtprofd). One line in
//! `Cargo.toml` (`rtprof-offer = { path = ".../offer" }`), one call:
//!
//! ```no_run
//! #[inline(never)]
//! fn dot_plain(a: &[f32], b: &[f32]) -> f32 {
//!     a.iter().zip(b).map(|(x, y)| x * y).sum()
//! }
//! #[inline(never)]
//! fn dot_chunks(a: &[f32], b: &[f32]) -> f32 {
//!     a.chunks(4).zip(b.chunks(4)).map(|(x, y)| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>()).sum()
//! }
//! // Compiles only if both functions have the same signature.
//! let answer = rtprof_offer::offer!(dot_plain, dot_chunks, "chunks");
//! ```
//!
//! Without the agent (the program not run under `rtprof run` or with
//! `LD_PRELOAD=librtprof.so`) an offer answers [`Refusal::NoAgent`] and
//! nothing else happens. Stable Rust has no weak symbols, so the agent's C
//! entry points are looked up when first used (`dlsym`), not linked.

use std::ffi::{c_char, c_int, c_void, CString};
use std::fmt;
use std::sync::OnceLock;

/// Why an offer was refused: the agent's answer (`rtprof.h` lists them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No agent in this process, or it is not active.
    NoAgent,
    /// No patched function there, or of that name.
    NotPatched,
    /// The implementation is not in executable memory.
    NotExecutable,
    /// The name is empty, `original`, longer than 64 bytes, or offered
    /// already with another implementation.
    BadName,
    /// No room for another offer.
    NoRoom,
    /// The implementation is the function's own code.
    ItsOwnCode,
    /// The implementation is not where a function starts.
    NotAFunctionStart,
    /// The name is not UTF-8, or holds a control character (or a NUL).
    Unnameable,
    /// Several patched functions have that name: offer by pointer.
    Ambiguous,
    /// An answer this library does not know.
    Other(i32),
}

impl Refusal {
    fn from_code(code: c_int) -> Refusal {
        match -code {
            1 => Refusal::NoAgent,
            2 => Refusal::NotPatched,
            3 => Refusal::NotExecutable,
            4 => Refusal::BadName,
            5 => Refusal::NoRoom,
            7 => Refusal::ItsOwnCode,
            8 => Refusal::NotAFunctionStart,
            9 => Refusal::Unnameable,
            10 => Refusal::Ambiguous,
            _ => Refusal::Other(code),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self {
            Refusal::NoAgent => "rtprof's agent is not active in this process",
            Refusal::NotPatched => "no patched function there",
            Refusal::NotExecutable => "the implementation is not in executable memory",
            Refusal::BadName => {
                "a bad name (empty, original, longer than 64 bytes, or offered already)"
            }
            Refusal::NoRoom => "no room for another offer",
            Refusal::ItsOwnCode => "the implementation is the function's own code",
            Refusal::NotAFunctionStart => "the implementation is not at a function's start",
            Refusal::Unnameable => "the name is not UTF-8 or holds a control character",
            Refusal::Ambiguous => "several functions have that name: offer by pointer",
            Refusal::Other(c) => return write!(f, "refused with code {c}"),
        };
        f.write_str(why)
    }
}

impl std::error::Error for Refusal {}

type OfferAt = unsafe extern "C" fn(*const c_void, *const c_void, *const c_char) -> c_int;
type OfferNamed = unsafe extern "C" fn(*const c_char, *const c_void, *const c_char) -> c_int;

/// The agent's entry point `symbol`, if an agent is loaded (looked up once).
fn entry(cell: &OnceLock<usize>, symbol: &std::ffi::CStr) -> Option<usize> {
    let f = *cell.get_or_init(|| {
        // SAFETY: a NUL-terminated name, looked up in every loaded object.
        unsafe { libc::dlsym(libc::RTLD_DEFAULT, symbol.as_ptr()) as usize }
    });
    (f != 0).then_some(f)
}

/// Offers `implementation` as `name` for the function at `function`.
///
/// # Safety
/// Both must be functions of the same signature (`offer!` checks that):
/// routed, the function's callers run `implementation` in its place.
pub unsafe fn offer_at(
    function: *const (),
    implementation: *const (),
    name: &str,
) -> Result<(), Refusal> {
    static AT: OnceLock<usize> = OnceLock::new();
    let Some(f) = entry(&AT, c"rtprof_offer_at") else {
        return Err(Refusal::NoAgent);
    };
    let name = CString::new(name).map_err(|_| Refusal::Unnameable)?;
    // SAFETY: the agent's rtprof_offer_at, of this C signature.
    let f: OfferAt = unsafe { std::mem::transmute::<usize, OfferAt>(f) };
    // SAFETY: two code addresses and a NUL-terminated name.
    match unsafe { f(function.cast(), implementation.cast(), name.as_ptr()) } {
        0 => Ok(()),
        code => Err(Refusal::from_code(code)),
    }
}

/// Offers `implementation` as `name` for the function called `function`:
/// its symbol or its name as rtprof's reports print it (`dot::dot_plain`).
///
/// # Safety
/// `implementation` must have that function's signature.
pub unsafe fn offer_named(
    function: &str,
    implementation: *const (),
    name: &str,
) -> Result<(), Refusal> {
    static NAMED: OnceLock<usize> = OnceLock::new();
    let Some(f) = entry(&NAMED, c"rtprof_offer") else {
        return Err(Refusal::NoAgent);
    };
    let function = CString::new(function).map_err(|_| Refusal::NotPatched)?;
    let name = CString::new(name).map_err(|_| Refusal::Unnameable)?;
    // SAFETY: the agent's rtprof_offer, of this C signature.
    let f: OfferNamed = unsafe { std::mem::transmute::<usize, OfferNamed>(f) };
    // SAFETY: NUL-terminated strings and a code address.
    match unsafe { f(function.as_ptr(), implementation.cast(), name.as_ptr()) } {
        0 => Ok(()),
        code => Err(Refusal::from_code(code)),
    }
}

/// Offers function `$implementation` as `$name` for function `$function`:
/// `Result<(), Refusal>`. Compiles only if the two have the same
/// signature, so it is safe.
#[macro_export]
macro_rules! offer {
    ($function:path, $implementation:path, $name:expr) => {{
        // The two function items meet in one function pointer type only if
        // their signatures are the same.
        let function = if true { $function } else { $implementation };
        let implementation = if true { $implementation } else { $function };
        let name: &str = $name;
        // SAFETY: the same signature, checked above.
        unsafe { $crate::offer_at(function as *const (), implementation as *const (), name) }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(x: u64) -> u64 {
        x + 1
    }
    fn other(x: u64) -> u64 {
        x + 2
    }

    #[test]
    fn without_an_agent_an_offer_says_so() {
        assert_eq!(offer!(one, other, "other"), Err(Refusal::NoAgent));
        // SAFETY: the same signature.
        let named = unsafe { offer_named("one", other as fn(u64) -> u64 as *const (), "o") };
        assert_eq!(named, Err(Refusal::NoAgent));
        assert_eq!(one(1) + other(1), 5);
    }

    #[test]
    fn codes_map_to_reasons() {
        assert_eq!(Refusal::from_code(-10), Refusal::Ambiguous);
        assert_eq!(Refusal::from_code(-2), Refusal::NotPatched);
        assert_eq!(Refusal::from_code(-42), Refusal::Other(-42));
        assert!(Refusal::Ambiguous.to_string().contains("pointer"));
    }
}
