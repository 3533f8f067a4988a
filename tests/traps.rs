//! Trap entries (`RTPROF_TRAPS=1`): functions no jump can enter (2-byte
//! bodies packed together at -Os) are counted exactly through traps, also
//! where a trap would be fatal if the program could block it: in a thread
//! blocking every signal, in a handler whose mask blocks every signal,
//! under `sigprocmask(SIG_SETMASK, all)`; and the program's own SIGTRAP
//! handler still sees its own traps. Without the setting nothing changes.

use rtprof_e2e::*;
use std::path::Path;

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
        assert!(text.contains("own handler kept\ntraps seen 4\n"), "{text}");
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
            // The program's handler, called for its own traps.
            assert_eq!(
                calls_of(&prof.report, &bin, &unstripped, "on_trap"),
                (4, false),
                "{what}"
            );
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
