//! A scheduler reads rtprofd's presentation segment with the ABI crate
//! alone (`rtprof-abi`, which depends on libc only, as its own unit test
//! checks): the example schedulers name no other rtprof crate, so what
//! they build against is what any reader needs.

use rtprof_e2e::root;

/// The rtprof crates a Rust source names in paths (`rtprof_x::`).
fn crates_named(source: &str) -> Vec<&str> {
    let mut named: Vec<&str> = source
        .match_indices("rtprof_")
        .filter_map(|(at, _)| {
            let rest = &source[at..];
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
            rest[end..].starts_with("::").then(|| &rest[..end])
        })
        .collect();
    named.sort_unstable();
    named.dedup();
    named
}

#[test]
fn the_rust_scheduler_needs_only_the_abi_crate() {
    let path = root().join("examples/scheduler.rs");
    let source = std::fs::read_to_string(&path).unwrap();
    assert_eq!(crates_named(&source), ["rtprof_abi"], "{}", path.display());
}

#[test]
fn the_c_scheduler_needs_only_the_abi_headers() {
    let source = std::fs::read_to_string(root().join("examples/scheduler.c")).unwrap();
    let includes: Vec<&str> = source
        .lines()
        .filter_map(|l| l.trim().strip_prefix("#include \""))
        .collect();
    assert_eq!(includes, ["rtprof_present.h\""]);
    assert!(root().join("abi/include/rtprof_present.h").is_file());
}
