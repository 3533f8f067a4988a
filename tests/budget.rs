//! The overhead budget (`RTPROF_BUDGET`): a steady program whose hot
//! functions would cost far more than 1% counted exactly, single- and
//! multi-threaded. Its output is unchanged, the hot functions are flagged
//! estimated, every estimate lies within its stated bound of the count the
//! program itself knows, the bounds are tight on a steady program, and the
//! rare functions stay exact.

use rtprof_e2e::*;

fn budgeted(threads: &str, iterations: &str) {
    let dir = scratch(&format!("budget{threads}"));
    let bin = compile_o2("budget.c", &["-pthread"], &dir);
    let args = [iterations, threads];
    let plain = run_plain(&bin, &args);
    let want = expectations(&plain.stdout).counts;
    let prof = run_profiled(&bin, &args, &[("RTPROF_BUDGET", "1")], &dir);
    assert_same_behaviour("budget", &plain, &prof.output);
    let p = process(&prof.report, &bin);
    for (name, n) in &want {
        let f = function_named(p, name);
        let calls = f["calls"].as_u64().unwrap();
        match name.as_str() {
            // 1 and 0.5 calls per loop: far over budget counted exactly.
            "hot1" | "hot2" => {
                assert_eq!(f["estimated"], true, "{f}");
                let bound = f["error_bound"].as_u64().unwrap();
                assert!(
                    calls.abs_diff(*n) <= bound,
                    "{name}: estimated {calls}, bound {bound}, exact {n}"
                );
                assert!(bound * 20 <= *n, "{name}: bound {bound} over 5% of {n}");
            }
            // A few thousand calls: counted exactly throughout.
            "cold" => {
                assert!(f.get("estimated").is_none(), "{f}");
                assert_eq!(calls, *n, "{f}");
            }
            // Either, but always within its bound.
            _ => {
                let bound = f["error_bound"].as_u64().unwrap_or(0);
                assert!(calls.abs_diff(*n) <= bound, "{name}: {f}, exact {n}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn one_thread_over_budget_is_estimated_within_bounds() {
    budgeted("1", "300000000");
}

/// The bursts switch entries while four threads run through them.
#[test]
fn four_threads_over_budget_are_estimated_within_bounds() {
    budgeted("4", "60000000");
}

/// A child forked while the hot functions run their own code gets its
/// jumps back and counts from zero, estimated again under its own budget.
#[test]
fn forked_child_counts_its_own_calls() {
    let dir = scratch("budgetfork");
    let bin = compile_o2("budget.c", &["-pthread"], &dir);
    let n = 150_000_000u64;
    let args = ["150000000", "1", "fork"];
    let plain = run_plain(&bin, &args);
    let prof = run_profiled(&bin, &args, &[("RTPROF_BUDGET", "1")], &dir);
    assert_same_behaviour("budget fork", &plain, &prof.output);
    let procs = prof.report["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2, "parent and child");
    for p in procs {
        let f = function_named(p, "hot1");
        let calls = f["calls"].as_u64().unwrap();
        let pid = &p["pid"];
        assert_eq!(f["estimated"], true, "pid {pid}: {f}");
        let bound = f["error_bound"].as_u64().unwrap();
        assert!(calls.abs_diff(n) <= bound, "pid {pid}: {f}, exact {n}");
        // The bound shrinks with the bursts the process ran, which a
        // loaded machine makes fewer (5-49% seen in CI for the child): what
        // is asserted is that the estimate says something (its bound is
        // below the count) and holds the exact count. The other tests
        // here hold the bound's size.
        assert!(bound < n, "pid {pid}: bound {bound} not below {n}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without a budget, nothing is estimated: the same functions count exactly.
#[test]
fn no_budget_counts_exactly() {
    let dir = scratch("nobudget");
    let bin = compile_o2("budget.c", &["-pthread"], &dir);
    let args = ["3000000", "2"];
    let plain = run_plain(&bin, &args);
    let prof = run_profiled(&bin, &args, &[], &dir);
    assert_same_behaviour("no budget", &plain, &prof.output);
    let p = process(&prof.report, &bin);
    for (name, n) in expectations(&plain.stdout).counts {
        let f = function_named(p, &name);
        assert_eq!(f["calls"].as_u64(), Some(n), "{f}");
        assert!(f.get("estimated").is_none(), "{f}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
