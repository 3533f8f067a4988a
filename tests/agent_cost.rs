//! What the agent costs each process, as it measures it: the report's
//! `rtprof_cost` (and its text line) carries the process's CPU time, the
//! samples that landed in stubs (counting's cost), the sampler's and the
//! budget's own time, and the time the budget held the program's threads.

use rtprof_e2e::*;
use serde_json::Value;

fn cost(bin: &std::path::Path, env: &[(&str, &str)], dir: &std::path::Path) -> Value {
    let prof = run_profiled(bin, &["60000000", "1"], env, dir);
    assert!(prof.output.status.success(), "{:?}", prof.output);
    process(&prof.report, bin)["rtprof_cost"].clone()
}

fn ns(c: &Value, k: &str) -> u64 {
    c[k].as_u64().unwrap_or_else(|| panic!("no {k} in {c}"))
}

#[test]
fn each_process_measures_what_the_agent_costs_it() {
    let dir = scratch("agent-cost");
    let bin = compile_o2("budget.c", &["-pthread"], &dir);

    // One run first, untimed: the first start after a build reads the
    // agent and the program from disk and fills the plan cache, which a
    // set-up time of half a second shows (more than the run's CPU time).
    let _ = cost(&bin, &[], &dir);
    // Every call counted: hot1 and hot2, tens of millions of calls of a
    // few instructions, spend a share of the samples in their stubs.
    let exact = cost(&bin, &[], &dir);
    let cpu = ns(&exact, "process_cpu_ns");
    assert!(cpu > 0, "{exact}");
    assert!(ns(&exact, "samples_in_stubs") > 0, "{exact}");
    assert!(ns(&exact, "counting_ns") < cpu, "{exact}");
    // The timers' handlers time themselves.
    assert!(ns(&exact, "sampling_ns") > 0, "{exact}");
    assert_eq!((ns(&exact, "budget_ns"), ns(&exact, "held_ns")), (0, 0));
    let exact_share = exact["share"].as_f64().unwrap();
    assert!(exact_share > 0.0 && exact_share < 1.0, "{exact}");

    // Under a 1% budget: the budget's thread ran and held the program's
    // threads still to switch entries, and fewer samples land in stubs
    // than with every call counted. (Not the whole share: the time threads
    // are held is wall-clock time, which a busy machine stretches; the
    // budget's cost is measured by `examples/bench/compare.py`, not
    // asserted here.)
    let budget = cost(&bin, &[("RTPROF_BUDGET", "1")], &dir);
    assert!(ns(&budget, "budget_ns") > 0, "{budget}");
    assert!(ns(&budget, "held_ns") > 0, "{budget}");
    assert!(
        ns(&budget, "samples_in_stubs") < ns(&exact, "samples_in_stubs"),
        "budget {budget}, every call counted {exact}"
    );

    // Sampling off: counting's cost is not measured, and says so.
    let off = cost(&bin, &[("RTPROF_SAMPLE_HZ", "0")], &dir);
    assert!(off.get("counting_ns").is_none(), "{off}");
    assert_eq!(ns(&off, "sampling_ns"), 0, "{off}");

    // The text report has the same line.
    let o = std::process::Command::new(rtprof())
        .args(["run", "--"])
        .arg(&bin)
        .args(["3000000", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(
        text.contains("rtprof's cost: ") && text.contains("% of its CPU time: set-up "),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
