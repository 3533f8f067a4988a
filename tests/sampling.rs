//! Sampling, end to end: programs that know how much CPU each of their
//! functions used (they measure it with the thread CPU clock) are profiled,
//! and the sample shares are compared with that truth, with both samplers,
//! in one thread and in several, in a forked child, and with perf denied.

use rtprof_e2e::*;
use serde_json::Value;
use std::path::Path;

const SPLIT: [&str; 3] = ["hot60", "warm30", "cool10"];

/// The CPU nanoseconds per function the program measured itself.
fn measured(stdout: &[u8]) -> Vec<f64> {
    let text = String::from_utf8_lossy(stdout);
    SPLIT
        .iter()
        .map(|name| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("CPU {name} ")))
                .unwrap_or_else(|| panic!("no CPU line for {name} in {text}"))
                .trim()
                .parse()
                .unwrap()
        })
        .collect()
}

fn samples(p: &Value, name: &str) -> f64 {
    function_named(p, name)["samples"].as_u64().unwrap() as f64
}

/// Checks one process section against the program's own measurements:
/// shares within 3 points or three standard deviations of sampling noise,
/// whichever is wider, and sampled CPU time close to the measured one (so
/// no thread went unsampled). The timer sampler's signals arrive on the
/// kernel's tick (4 ms at 250 Hz) carrying up to 4 periods each, so its
/// samples are a quarter as many independent draws.
fn check_split(p: &Value, truth: &[f64], sampler: &str) {
    assert_eq!(p["sampler"]["name"], sampler, "{}", p["sampler"]);
    let period = p["sampler"]["period_ns"].as_u64().unwrap() as f64;
    assert_eq!(period, 1e6, "default 1000 Hz");
    let got: Vec<f64> = SPLIT.iter().map(|n| samples(p, n)).collect();
    let (got_sum, truth_sum): (f64, f64) = (got.iter().sum(), truth.iter().sum());
    let draws = if sampler == "timer" {
        got_sum / 4.0
    } else {
        got_sum
    };
    for (i, name) in SPLIT.iter().enumerate() {
        let (share, want) = (100.0 * got[i] / got_sum, 100.0 * truth[i] / truth_sum);
        let q = want / 100.0;
        let tolerance = (300.0 * (q * (1.0 - q) / draws).sqrt()).max(3.0);
        assert!(
            (share - want).abs() <= tolerance,
            "{sampler}: {name} has {share:.1}% of samples, measured {want:.1}% (allowed {tolerance:.1}; {got:?} vs {truth:?})"
        );
    }
    // Samples the kernel dropped (a drain thread held up on a loaded
    // machine lets a ring fill) were taken all the same: a thread that
    // went unsampled is what this looks for.
    let lost = p["sampler"]["lost"].as_u64().unwrap_or(0) as f64;
    let sampled_ns = (got_sum + lost) * period;
    let ratio = sampled_ns / truth_sum;
    assert!(
        (0.85..=1.15).contains(&ratio),
        "{sampler}: samples account for {sampled_ns:.0} ns of {truth_sum:.0} ns measured: {}",
        p["sampler"]
    );
    let total = p["sampler"]["samples"].as_u64().unwrap() as f64;
    assert!(
        got_sum >= 0.9 * total,
        "{got_sum} of {total} samples in the three functions"
    );
}

fn run_split(dir: &Path, threads: &str, env: &[(&str, &str)]) -> (Profiled, Vec<f64>) {
    let bin = compile_o2("split.c", &["-pthread"], dir);
    let prof = run_profiled(&bin, &[threads, "1000"], env, dir);
    assert!(prof.output.status.success(), "{:?}", prof.output);
    let truth = measured(&prof.output.stdout);
    (prof, truth)
}

fn split_test(name: &str, threads: &str, sampler: &str) {
    let dir = scratch(name);
    let (prof, truth) = run_split(&dir, threads, &[("RTPROF_SAMPLER", sampler)]);
    let procs = prof.report["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1);
    check_split(&procs[0], &truth, sampler);
    assert_eq!(procs[0]["sampler"]["why"], "requested");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn perf_shares_match_one_thread() {
    split_test("split-perf-1", "1", "perf");
}

/// The four threads start long after the agent: inherited events sample
/// them all (the sampled time covers all four).
#[test]
fn perf_shares_match_four_threads() {
    split_test("split-perf-4", "4", "perf");
}

#[test]
fn timer_shares_match_one_thread() {
    split_test("split-timer-1", "1", "timer");
}

#[test]
fn timer_shares_match_four_threads() {
    split_test("split-timer-4", "4", "timer");
}

/// Nothing instrumented: a module's functions are listed only when its
/// first sample arrives (the drain thread lists them before attributing
/// it: a perf sample waits in its ring, a timer sample among the held
/// ones), so a library loaded but never run lists none; and the shares
/// still match.
#[test]
fn sampled_only_functions_are_named_when_samples_arrive() {
    for sampler in ["perf", "timer"] {
        let dir = scratch(&format!("split-ondemand-{sampler}"));
        // libm loaded, never called.
        let bin = compile_o2("split.c", &["-pthread", "-Wl,--no-as-needed", "-lm"], &dir);
        let env = [("RTPROF_SAMPLER", sampler), ("RTPROF_INSTRUMENT", "0")];
        let prof = run_profiled(&bin, &["2", "1000"], &env, &dir);
        assert!(prof.output.status.success(), "{:?}", prof.output);
        let truth = measured(&prof.output.stdout);
        let p = &prof.report["processes"][0];
        check_split(p, &truth, sampler);
        for name in SPLIT {
            let f = function_named(p, name);
            assert_eq!(f["instrumented"], false, "{f}");
        }
        let modules = p["modules"].as_array().unwrap();
        let libm = modules
            .iter()
            .find(|m| m["path"].as_str().unwrap().contains("libm.so"))
            .unwrap_or_else(|| panic!("{sampler}: libm not loaded: {modules:?}"));
        assert_eq!(libm["functions"], 0, "{sampler}: {libm}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A forked child samples itself, with its own events; the parent, which
/// only waits, has next to nothing.
#[test]
fn forked_child_reports_its_own_samples() {
    let dir = scratch("split-fork");
    let bin = compile_o2("split.c", &["-pthread"], &dir);
    let prof = run_profiled(&bin, &["2", "600", "fork"], &[], &dir);
    assert!(prof.output.status.success());
    let truth = measured(&prof.output.stdout);
    let procs = prof.report["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2, "parent and child");
    let (parent, child) = (&procs[0], &procs[1]);
    assert_eq!(child["ppid"], parent["pid"]);
    check_split(child, &truth, "timer");
    assert_eq!(child["sampler"]["why"], "default");
    let parent_samples = parent["sampler"]["samples"].as_u64().unwrap();
    assert!(
        parent_samples < 50,
        "parent only waited: {parent_samples} samples"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A child forked while every signal is blocked (as perl forks) starts its
/// timer once it unblocks SIGPROF, and is sampled like any other.
#[test]
fn child_forked_with_signals_blocked_is_sampled() {
    let dir = scratch("blocked-fork");
    let bin = compile_o2("blocked_fork.c", &[], &dir);
    let prof = run_profiled(&bin, &[], &[("RTPROF_SAMPLER", "timer")], &dir);
    assert!(prof.output.status.success(), "{:?}", prof.output);
    let procs = prof.report["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2, "parent and child");
    let child = &procs[1];
    assert_eq!(child["ppid"], procs[0]["pid"]);
    assert_eq!(child["sampler"]["name"], "timer", "{}", child["sampler"]);
    // 0.4 s of CPU at 1 kHz: about 400 samples, nearly all in spin.
    let spin = samples(child, "spin");
    let total = child["sampler"]["samples"].as_u64().unwrap() as f64;
    assert!(
        total >= 100.0 && spin >= 0.8 * total,
        "child sampled: spin {spin} of {total}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// With perf_event_open denied by a seccomp filter (a sandbox), the
/// default timers sample as anywhere and measure the same split; perf,
/// asked for, is off and says why.
#[test]
fn denied_perf_leaves_the_timers() {
    let dir = scratch("split-noperf");
    let noperf = compile_o2("noperf.c", &[], &dir);
    let bin = compile_o2("split.c", &["-pthread"], &dir);
    let plain = run_plain(&noperf, &[bin.to_str().unwrap(), "2", "600"]);
    assert!(plain.status.success(), "{plain:?}");
    let perf = run_profiled(
        &noperf,
        &[bin.to_str().unwrap(), "2", "600"],
        &[("RTPROF_SAMPLER", "perf")],
        &dir,
    );
    assert!(perf.output.status.success(), "{:?}", perf.output);
    let p = &process(&perf.report, &bin)["sampler"];
    assert_eq!(
        (&p["name"], &p["why"]),
        (&"off".into(), &"perf_event_open refused".into()),
        "{p}"
    );
    assert_eq!(p["errno"], libc::EPERM);
    let prof = run_profiled(&noperf, &[bin.to_str().unwrap(), "2", "600"], &[], &dir);
    assert!(prof.output.status.success(), "{:?}", prof.output);
    let p = process(&prof.report, &bin);
    assert_eq!(p["sampler"]["why"], "default", "{}", p["sampler"]);
    check_split(p, &measured(&prof.output.stdout), "timer");
    // The launcher sampled until it installed its filter, and stopped
    // then (the agent makes no call of its own under a filter it has not
    // tried out).
    let launcher = &process(&prof.report, &noperf)["sampler"];
    assert_eq!(
        (&launcher["name"], &launcher["why"]),
        (&"off".into(), &"seccomp filter".into()),
        "{launcher}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A program that takes SIGPROF for itself (its own profiler) finds it
/// unused, and gets exactly its own ticks, in every thread: the agent's
/// timers stop the moment it installs a handler.
#[test]
fn program_taking_sigprof_stops_timer_sampling() {
    let dir = scratch("sigprof");
    let bin = compile_o2("sigprof.c", &["-pthread"], &dir);
    let plain = run_plain(&bin, &[]);
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        "before: default\nown ticks: yes, foreign: 0\n"
    );
    let prof = run_profiled(&bin, &[], &[("RTPROF_SAMPLER", "timer")], &dir);
    assert_same_behaviour("sigprof", &plain, &prof.output);
    let p = &prof.report["processes"][0];
    assert_eq!(p["sampler"]["name"], "off");
    assert_eq!(p["sampler"]["why"], "SIGPROF taken over by the program");
    assert!(
        p["sampler"]["samples"].as_u64().unwrap() > 0,
        "sampled until then"
    );
    // So with the default sampler (the timers).
    let prof = run_profiled(&bin, &[], &[], &dir);
    assert_same_behaviour("sigprof", &plain, &prof.output);
    assert_eq!(prof.report["processes"][0]["sampler"]["name"], "off");
    // With perf the program's signal is never touched.
    let prof = run_profiled(&bin, &[], &[("RTPROF_SAMPLER", "perf")], &dir);
    assert_same_behaviour("sigprof", &plain, &prof.output);
    assert_eq!(prof.report["processes"][0]["sampler"]["name"], "perf");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rate_zero_switches_sampling_off() {
    let dir = scratch("split-off");
    let (prof, _) = run_split(&dir, "1", &[("RTPROF_SAMPLE_HZ", "0")]);
    let p = &prof.report["processes"][0];
    assert_eq!(p["sampler"]["name"], "off");
    assert_eq!(p["sampler"]["why"], "switched off");
    assert_eq!(p["sampler"]["samples"], 0);
    // Counting goes on.
    assert_eq!(
        function_named(p, "hot60")["calls"],
        21,
        "20 rounds and one calibration"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The drain thread never keeps a process alive nor ends it early: when
/// the program's last thread ends (not the main one), the process exits as
/// it would without the agent, after that thread's key destructors; a child
/// forked from a thread whose only thread calls pthread_exit ends; threads
/// glibc makes itself (SIGEV_THREAD) keep the process alive as they would.
#[test]
fn process_ends_with_its_last_program_thread() {
    let dir = scratch("lastthread");
    let bin = compile_o2("lastthread.c", &["-pthread"], &dir);
    // The drain thread runs with either sampler (the timers' names
    // modules on demand).
    for (mode, sampler) in ["main", "fork", "sigev"]
        .into_iter()
        .flat_map(|m| [(m, "timer"), (m, "perf")])
    {
        let plain = run_plain(&bin, &[mode]);
        // `timeout` turns a hang into a failure (status 124).
        let prof = run_profiled(
            Path::new("/usr/bin/timeout"),
            &["20", bin.to_str().unwrap(), mode],
            &[("RTPROF_SAMPLER", sampler)],
            &dir,
        );
        assert_same_behaviour(mode, &plain, &prof.output);
        let want = match mode {
            "main" => "worker done\nkey destructor ran for worker\n",
            "fork" => "child done\nchild status 0\n",
            _ => "three ticks\n",
        };
        assert_eq!(String::from_utf8_lossy(&plain.stdout), want);
        let p = process(&prof.report, &bin);
        assert_eq!(
            p["sampler"]["name"], sampler,
            "{mode}: the drain thread ran"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A process may enter a user namespace only while single-threaded: the
/// drain thread steps aside for `unshare(CLONE_NEWUSER)` (in the process and
/// in a forked child) and sampling goes on afterwards.
#[test]
fn user_namespace_can_be_entered() {
    let dir = scratch("userns");
    let bin = compile_o2("userns.c", &[], &dir);
    let plain = run_plain(&bin, &[]);
    let text = String::from_utf8_lossy(&plain.stdout);
    assert!(
        text.contains("parent: ok") || text.contains("parent: EPERM"),
        "{text}"
    );
    for sampler in ["timer", "perf"] {
        let prof = run_profiled(&bin, &[], &[("RTPROF_SAMPLER", sampler)], &dir);
        assert_same_behaviour("userns", &plain, &prof.output);
        let procs = prof.report["processes"].as_array().unwrap();
        assert_eq!(procs.len(), 2);
        for p in procs {
            assert_eq!(p["sampler"]["name"], sampler);
            // The work after unshare was sampled: the drain thread came back.
            assert!(samples(p, "after") >= 50.0, "{}", p["sampler"]);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The C API adds calls and time to a function by name and by address
/// (an accelerated kernel keeps counting); the program runs the same
/// without the agent.
#[test]
fn c_api_adds_calls_and_time() {
    let dir = scratch("addcalls");
    let include = root().join("abi/include");
    let inc = format!("-I{}", include.display());
    let bin = compile_o2("addcalls.c", &[&inc], &dir);
    let plain = run_plain(&bin, &[]);
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "0 0 -1\n");
    let prof = run_profiled(&bin, &[], &[], &dir);
    assert_same_behaviour("addcalls", &plain, &prof.output);
    let k = function_named(&prof.report["processes"][0], "kernel");
    assert_eq!(k["calls"], 1100, "10 calls, 1000 by name, 90 by address");
    // 5 ms at the 1 ms period (a real sample of 10 tiny calls is unlikely).
    let samples = k["samples"].as_u64().unwrap();
    assert!((5..=6).contains(&samples), "{samples} samples");
    // Without sampling the time is kept all the same.
    let quiet = run_profiled(&bin, &[], &[("RTPROF_SAMPLE_HZ", "0")], &dir);
    let k = function_named(&quiet.report["processes"][0], "kernel");
    assert_eq!(k["calls"], 1100, "{k}");
    assert_eq!(k["time_ns"], 5_000_000, "{k}");
    let _ = std::fs::remove_dir_all(&dir);
}
