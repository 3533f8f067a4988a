//! Readable names: C++ and Rust symbols demangled in the text report and
//! beside the raw symbol in JSON; a function's compiler copies in one row
//! (or apart with `--no-merge-clones`), their calls summed exactly.

use rtprof_e2e::*;
use std::path::Path;
use std::process::Command;

/// `rtprof run [flags] -- bin`: the text report on stderr.
fn text_report(bin: &Path, flags: &[&str]) -> String {
    let out = Command::new(rtprof())
        .arg("run")
        .args(flags)
        .arg("--")
        .arg(bin)
        .output()
        .expect("rtprof runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The calls column of the report row whose function column is `name`.
fn calls_of(report: &str, name: &str) -> Option<u64> {
    report.lines().find_map(|l| {
        let cols: Vec<&str> = l
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        (cols.len() >= 7 && cols[5] == name).then(|| cols[0].parse().ok())?
    })
}

#[test]
fn cxx_names_are_demangled_with_symbols_kept_in_json() {
    let dir = scratch("names-cxx");
    let bin = compile_o2("names.cpp", &[], &dir);
    let prof = run_profiled(&bin, &[], &[], &dir);
    assert_same_behaviour("names.cpp", &run_plain(&bin, &[]), &prof.output);
    let p = process(&prof.report, &bin);
    for (symbol, readable, calls) in [
        ("_Z4leafi", "leaf(int)", 10_000),
        ("_Z6middlei", "middle(int)", 1000),
        ("_ZNK3geo5Point4normEi", "geo::Point::norm(int) const", 1000),
    ] {
        let f = function_named(p, symbol);
        assert_eq!(f["demangled"], readable, "{f}");
        assert_eq!(f["function"], readable, "{f}");
        assert_eq!(f["calls"], calls, "{f}");
    }
    let text = text_report(&bin, &[]);
    assert_eq!(calls_of(&text, "leaf(int)"), Some(10_000), "{text}");
    assert_eq!(
        calls_of(&text, "geo::Point::norm(int) const"),
        Some(1000),
        "{text}"
    );
    assert!(!text.contains("_Z4leafi"), "{text}");
}

#[test]
fn rust_names_are_demangled() {
    let dir = scratch("names-rust");
    let bin = dir.join("names_rs");
    let o = Command::new("rustc")
        .args(["-O", "-o"])
        .arg(&bin)
        .arg(root().join("tests/programs/rust/names.rs"))
        .output()
        .expect("rustc runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = text_report(&bin, &[]);
    assert_eq!(calls_of(&text, "names::hot"), Some(5000), "{text}");
    let prof = run_profiled(&bin, &[], &[], &dir);
    let p = process(&prof.report, &bin);
    let hot = p["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["demangled"] == "names::hot")
        .unwrap_or_else(|| panic!("no names::hot in {p}"));
    let raw = hot["name"].as_str().unwrap();
    assert!(raw.starts_with("_ZN5names3hot17h"), "{raw}");
}

#[test]
fn compiler_copies_are_one_row_unless_asked_apart() {
    let dir = scratch("names-clones");
    let bin = compile_o2("clones.c", &["-O3"], &dir);
    let copies: Vec<String> = symbol_addrs(&bin)
        .into_keys()
        .filter(|n| n.starts_with("deep."))
        .collect();
    assert!(
        copies.len() >= 2,
        "the compiler made copies of deep: {copies:?}"
    );
    // The program's own count of calls to deep, whatever copy ran.
    let plain = run_plain(&bin, &[]);
    let own: u64 = String::from_utf8_lossy(&plain.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("CALLS deep "))
        .and_then(|n| n.parse().ok())
        .expect("the program says how often it called deep");
    let merged = text_report(&bin, &[]);
    let row = format!(
        "deep [+{} cop{}]",
        copies.len() - 1,
        if copies.len() == 2 { "y" } else { "ies" }
    );
    assert_eq!(calls_of(&merged, &row), Some(own), "{merged}");
    let apart = text_report(&bin, &["--no-merge-clones"]);
    let sum: u64 = copies
        .iter()
        .map(|c| {
            let (_, suffix) = c.split_at(4);
            calls_of(&apart, &format!("deep [clone {suffix}]")).unwrap_or(0)
        })
        .sum();
    assert_eq!(sum, own, "{apart}");
    assert!(
        !apart.contains("copies]") && !apart.contains("copy]"),
        "{apart}"
    );
    let prof = run_profiled(&bin, &[], &[], &dir);
    let p = process(&prof.report, &bin);
    for c in &copies {
        assert_eq!(function_named(p, c)["function"], "deep");
    }
}

/// Runs `objcopy` with `args`.
fn objcopy(args: &[&std::ffi::OsStr]) {
    let o = Command::new("objcopy")
        .args(args)
        .output()
        .expect("objcopy runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The GNU build-id of an ELF file, as hex.
fn build_id(path: &Path) -> String {
    let data = std::fs::read(path).unwrap();
    let elf = goblin::elf::Elf::parse(&data).unwrap();
    let note = elf
        .iter_note_headers(&data)
        .expect("notes")
        .filter_map(Result::ok)
        .find(|n| n.n_type == goblin::elf::note::NT_GNU_BUILD_ID)
        .expect("a build-id");
    note.desc.iter().map(|b| format!("{b:02x}")).collect()
}

/// A stripped binary whose debug information was moved to a build-id path
/// under a debug directory gets its names back from there (and exact
/// counts under them); without that directory its functions are
/// `sub_<hex>`.
#[test]
fn stripped_binaries_are_named_from_their_debug_files() {
    let dir = scratch("names-debugfile");
    let full = compile_o2("names.cpp", &["-g", "-Wl,--build-id"], &dir);
    let id = build_id(&full);
    let debug_dir = dir.join("debug");
    let at = debug_dir.join(".build-id").join(&id[..2]);
    std::fs::create_dir_all(&at).unwrap();
    let debug = at.join(format!("{}.debug", &id[2..]));
    objcopy(&[
        "--only-keep-debug".as_ref(),
        full.as_os_str(),
        debug.as_os_str(),
    ]);
    let bin = dir.join("names-stripped");
    objcopy(&["--strip-all".as_ref(), full.as_os_str(), bin.as_os_str()]);

    let plain = run_plain(&bin, &[]);
    let named = run_profiled(
        &bin,
        &[],
        &[("RTPROF_DEBUG_DIR", debug_dir.to_str().unwrap())],
        &dir,
    );
    assert_same_behaviour("stripped names.cpp", &plain, &named.output);
    let p = process(&named.report, &bin);
    for e in expectations(&plain.stdout).counts {
        let f = function_named(p, &e.0);
        assert_eq!(f["calls"], e.1, "{f}");
    }
    let leaf = function_named(p, "_Z4leafi");
    assert_eq!(leaf["demangled"], "leaf(int)");
    // Its source line, from the debug file too.
    assert!(
        leaf["file"]
            .as_str()
            .unwrap()
            .ends_with("tests/c/names.cpp"),
        "{leaf}"
    );
    assert_eq!(
        leaf["line"],
        line_of("names.cpp", "int leaf(int n)"),
        "{leaf}"
    );

    let unnamed = run_profiled(&bin, &[], &[("RTPROF_DEBUG_DIR", "/nonexistent")], &dir);
    let p = process(&unnamed.report, &bin);
    let names: Vec<&str> = p["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["name"].as_str())
        .collect();
    assert!(!names.contains(&"_Z4leafi"), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("sub_")), "{names:?}");
}

/// With Debian's libc6-dbg installed, libc's functions have their names:
/// fewer than 1% are left `sub_<hex>` (about 40% without it).
#[test]
fn libc_is_named_from_libc6_dbg() {
    let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let id = build_id(libc);
    let debug = Path::new("/usr/lib/debug/.build-id")
        .join(&id[..2])
        .join(format!("{}.debug", &id[2..]));
    assert!(
        debug.exists(),
        "{} is missing: install Debian's libc6-dbg (.ci/run does)",
        debug.display()
    );
    let dir = scratch("names-libc");
    let bin = compile_o2("calls.c", &[], &dir);
    let share = |env: &[(&str, &str)]| {
        let mut env = env.to_vec();
        env.push(("RTPROF_MODULES", "libc.so*"));
        let prof = run_profiled(&bin, &["10"], &env, &dir);
        let p = process(&prof.report, &bin);
        let libc: Vec<&str> = p["functions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["module"] == "libc.so.6")
            .filter_map(|f| f["name"].as_str())
            .collect();
        assert!(libc.len() > 1000, "libc listed: {}", libc.len());
        if env.len() == 1 {
            // Source lines from the debug file's compressed DWARF.
            let with_lines = p["functions"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|f| f["module"] == "libc.so.6" && f["calls"].as_u64() > Some(0))
                .filter(|f| {
                    f["file"]
                        .as_str()
                        .is_some_and(|f| f.ends_with(".c") || f.ends_with(".S"))
                })
                .count();
            assert!(with_lines > 0, "no libc function has a source line");
        }
        let unnamed = libc.iter().filter(|n| is_sub_hex(n)).count();
        unnamed as f64 / libc.len() as f64
    };
    let with = share(&[]);
    assert!(
        with < 0.01,
        "{:.1}% of libc's functions unnamed",
        with * 100.0
    );
    let without = share(&[("RTPROF_DEBUG_DIR", "/nonexistent")]);
    assert!(
        without > 0.1,
        "without debug files {:.1}% unnamed",
        without * 100.0
    );
}

fn is_sub_hex(name: &str) -> bool {
    name.strip_prefix("sub_")
        .is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The 1-based line of `tests/c/<src>` that contains `text`.
fn line_of(src: &str, text: &str) -> u64 {
    let source = std::fs::read_to_string(root().join("tests/c").join(src)).unwrap();
    1 + source
        .lines()
        .position(|l| l.contains(text))
        .expect("in the source") as u64
}

/// Each reported function's source file and line, from the binary's own
/// DWARF; none without debug information.
#[test]
fn functions_say_where_they_are_defined() {
    let dir = scratch("names-lines");
    let bin = compile_o2("names.cpp", &["-g"], &dir);
    let prof = run_profiled(&bin, &[], &[], &dir);
    let p = process(&prof.report, &bin);
    for (symbol, text) in [
        ("_Z4leafi", "int leaf(int n)"),
        ("_Z6middlei", "int middle(int n)"),
        ("_ZNK3geo5Point4normEi", "int norm(int k) const"),
    ] {
        let f = function_named(p, symbol);
        assert!(
            f["file"].as_str().unwrap().ends_with("tests/c/names.cpp"),
            "{f}"
        );
        assert_eq!(f["line"], line_of("names.cpp", text), "{f}");
    }
    let text = text_report(&bin, &[]);
    let want = format!("names.cpp:{}", line_of("names.cpp", "int leaf(int n)"));
    assert!(
        text.lines()
            .any(|l| l.contains("leaf(int)") && l.ends_with(&want)),
        "{text}"
    );
    let g0 = dir.join("g0");
    std::fs::create_dir_all(&g0).unwrap();
    let plain = compile_o2("names.cpp", &["-g0"], &g0);
    let prof = run_profiled(&plain, &[], &[], &dir);
    assert!(function_named(process(&prof.report, &plain), "_Z4leafi")["file"].is_null());
}
