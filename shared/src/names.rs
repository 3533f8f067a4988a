//! Function names as people read them: symbols demangled (C++'s Itanium
//! scheme, Rust's legacy and v0 schemes), and copies a compiler made of a
//! function (`.constprop.N`, `.isra.N`, `.part.N`, `.lto_priv.N`, the
//! `.cold` split part, ...) named after the function they belong to, so a
//! report can show them as one.

use std::borrow::Cow;

/// Suffixes GCC and LLVM append to a function's symbol for a copy or a part
/// of it. Everything from the first of them on is the suffix.
const COPY_MARKERS: &[&str] = &[
    ".constprop.",
    ".isra.",
    ".part.",
    ".lto_priv.",
    ".cold",
    ".localalias",
    ".clone.",
    ".specialized.",
    ".llvm.",
];

/// Splits a symbol into the function's own symbol and the suffix of a
/// compiler's copy or part: `deep.constprop.0` -> (`deep`, `.constprop.0`),
/// `f.part.0.cold` -> (`f`, `.part.0.cold`), `main` -> (`main`, ``).
pub fn split_copy(symbol: &str) -> (&str, &str) {
    let at = COPY_MARKERS
        .iter()
        .filter_map(|m| symbol.find(m))
        .filter(|&i| i > 0)
        .min();
    match at {
        Some(i) => symbol.split_at(i),
        None => (symbol, ""),
    }
}

/// `symbol` demangled, or as it is if it is not a mangled name (C).
pub fn demangle(symbol: &str) -> Cow<'_, str> {
    if let Ok(d) = rustc_demangle::try_demangle(symbol) {
        // `{:#}` leaves out the hash of legacy names, as backtraces do.
        return Cow::Owned(format!("{d:#}"));
    }
    if symbol.starts_with("_Z") {
        if let Ok(s) = cpp_demangle::Symbol::new(symbol) {
            if let Ok(d) = s.demangle() {
                return Cow::Owned(d);
            }
        }
    }
    Cow::Borrowed(symbol)
}

/// The readable name of the function `symbol` belongs to: its copies and
/// parts all give the same one.
pub fn function(symbol: &str) -> Cow<'_, str> {
    demangle(split_copy(symbol).0)
}

/// The readable name of `symbol` itself: a copy or part says which, as
/// `c++filt` does (`deep(int) [clone .constprop.0]`).
pub fn readable(symbol: &str) -> Cow<'_, str> {
    match split_copy(symbol) {
        (_, "") => demangle(symbol),
        (base, suffix) => Cow::Owned(format!("{} [clone {suffix}]", demangle(base))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_and_parts_belong_to_their_function() {
        assert_eq!(split_copy("deep.constprop.0"), ("deep", ".constprop.0"));
        assert_eq!(split_copy("f.part.0.cold"), ("f", ".part.0.cold"));
        assert_eq!(split_copy("g.isra.3"), ("g", ".isra.3"));
        assert_eq!(split_copy("h.lto_priv.0"), ("h", ".lto_priv.0"));
        assert_eq!(split_copy("main.cold"), ("main", ".cold"));
        assert_eq!(split_copy("main"), ("main", ""));
        // A name that only looks like a marker is not split at its start.
        assert_eq!(split_copy(".cold"), (".cold", ""));
        assert_eq!(function("deep.constprop.7"), "deep");
    }

    #[test]
    fn cxx_and_rust_names_are_demangled_and_c_names_kept() {
        assert_eq!(demangle("_Z4leafi"), "leaf(int)");
        assert_eq!(
            demangle("_Z18reg_class_subset_pii"),
            "reg_class_subset_p(int, int)"
        );
        assert_eq!(demangle("_ZN5outer5inner3runEv"), "outer::inner::run()");
        // Rust, legacy (hash left out) and v0.
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
        assert_eq!(demangle("memcpy"), "memcpy");
        assert_eq!(demangle("sub_12520"), "sub_12520");
        // A clone of a C++ function: demangled, marked, grouped.
        assert_eq!(
            readable("_Z6middlei.constprop.0"),
            "middle(int) [clone .constprop.0]"
        );
        assert_eq!(function("_Z6middlei.constprop.0"), "middle(int)");
        // Not a valid mangling: kept as it is.
        assert_eq!(demangle("_Zgarbage"), "_Zgarbage");
    }
}
