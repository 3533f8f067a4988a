//! Trap entries (`RTPROF_TRAPS=1`): functions no jump can enter (2-byte
//! bodies packed together at -Os) are counted exactly through traps, also
//! where a trap would be fatal if the program could block it (the cases
//! are listed in tests/c/traps.c), and the program's own SIGTRAP handlers
//! still see its own traps. Libraries with trap entries come and go
//! safely. Without the setting nothing changes.

use rtprof_e2e::*;
use std::path::Path;
use std::process::Command;

fn calls_of(report: &serde_json::Value, bin: &Path, unstripped: &Path, name: &str) -> (u64, bool) {
    let addrs = symbol_addrs(unstripped);
    let f = function_at(process(report, bin), addrs[name]).unwrap_or_else(|| panic!("{name}"));
    (f["calls"].as_u64().unwrap(), f["entry"] == "trap")
}

#[test]
fn tiny_functions_counted_through_traps_wherever_they_are_called() {
    let dir = scratch("traps");
    for v in Variant::all()
        .into_iter()
        .filter(|v| v.opt == "-Os" && !v.strip)
    {
        let what = format!("traps.c {}", v.tag());
        let (bin, unstripped) = compile("traps.c", &v, &["-pthread"], &dir);
        let plain = run_plain(&bin, &[]);
        let text = String::from_utf8_lossy(&plain.stdout).into_owned();
        assert!(text.contains("own handler kept\ntraps seen 6\n"), "{text}");
        let cache = dir.join(format!("cache-{}", v.tag()));
        std::fs::create_dir_all(&cache).unwrap();
        let cache = cache.to_str().unwrap();
        let traps = [("RTPROF_TRAPS", "1"), ("RTPROF_CACHE", cache)];
        // Analysed, then from the cache: the same.
        for round in ["analysed", "cached"] {
            let prof = run_profiled(&bin, &[], &traps, &dir);
            assert_same_behaviour(&what, &plain, &prof.output);
            let want = expectations(&prof.output.stdout).counts;
            assert_eq!(want.len(), 2, "{what}");
            for (name, n) in &want {
                assert_eq!(
                    calls_of(&prof.report, &bin, &unstripped, name),
                    (*n, true),
                    "{what} ({round}): {name} exact, through a trap"
                );
            }
            // The program's handlers, called for its own traps.
            for (name, n) in [("on_trap", 5), ("on_trap_plain", 1)] {
                assert_eq!(
                    calls_of(&prof.report, &bin, &unstripped, name),
                    (n, false),
                    "{what}: {name}"
                );
            }
        }
        // Without the setting (the cache holds plans with traps): none.
        let prof = run_profiled(&bin, &[], &[("RTPROF_CACHE", cache)], &dir);
        assert_same_behaviour(&what, &plain, &prof.output);
        let p = process(&prof.report, &bin);
        for name in ["zero", "same"] {
            let f = function_at(p, symbol_addrs(&unstripped)[name]).unwrap();
            assert_eq!(f["refused"], "too_small", "{what}: {name}");
            assert!(f.get("entry").is_none(), "{what}: {name}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Libraries with trap entries loaded and unloaded in turn at one address:
/// the trap entries of one that is gone never send a thread to its stubs
/// (the next library's traps are its own), and every call is counted.
#[test]
fn trap_entries_leave_with_their_library() {
    let dir = scratch("traps-dl");
    let bin = compile_o2("trap_dl.c", &["-ldl"], &dir);
    let lib = |name: &str, define: &[&str]| {
        let out = dir.join(name);
        let st = Command::new("gcc")
            .args(["-O2", "-shared", "-fPIC", "-o"])
            .arg(&out)
            .args(define)
            .arg(root().join("tests/c/trap_lib.c"))
            .status()
            .unwrap();
        assert!(st.success());
        out
    };
    let (a, b) = (
        lib("libtrap_a.so", &[]),
        lib("libtrap_b.so", &["-DREFUSED"]),
    );
    let args = [a.to_str().unwrap(), b.to_str().unwrap()];
    let plain = run_plain(&bin, &args);
    assert!(plain.status.success());
    let env = [
        ("RTPROF_TRAPS", "1"),
        ("RTPROF_MODULES", "libtrap*"),
        ("RTPROF_CACHE", "off"),
    ];
    let prof = run_profiled(&bin, &args, &env, &dir);
    assert_same_behaviour("trap_dl", &plain, &prof.output);
    // Each load is a module of its own: 3 of each library, every one
    // with 10 calls of each function, through traps.
    let p = process(&prof.report, &bin);
    let mut tiny = Vec::new();
    for f in p["functions"].as_array().unwrap() {
        if f["name"] == "tiny" || f["name"] == "tiny2" {
            assert_eq!(f["entry"], "trap", "{f}");
            tiny.push(f["calls"].as_u64().unwrap());
        }
    }
    assert_eq!(tiny, vec![10; 12], "{}", prof.report);
    let _ = std::fs::remove_dir_all(&dir);
}
