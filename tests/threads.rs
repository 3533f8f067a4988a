//! Exact calls per thread: threads named by the program, each with the
//! counts it made, ended ones kept with their names, a thread still alive
//! at exit listed as live, CPU time per thread from its samples, and per
//! thread and function; `rtprof run --threads` shows them.

use rtprof_e2e::*;
use std::collections::HashMap;
use std::process::Command;

/// Field `field` of function `f`'s row under thread `t` (0 without one).
fn in_thread(t: &serde_json::Value, f: &str, field: &str) -> u64 {
    t["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == f)
        .map_or(0, |r| r[field].as_u64().unwrap())
}

/// The CPU time a test program says a thread spun (its `SPIN` line).
fn spun_ns(stdout: &str) -> f64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("SPIN "))
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn every_thread_has_its_exact_calls_and_name() {
    let dir = scratch("named-threads");
    let bin = compile_o2("named_threads.c", &["-pthread"], &dir);
    let prof = run_profiled(&bin, &[], &[], &dir);
    // Same output and status with and without the agent, but for the
    // spinner's CPU time, which varies by nature.
    let plain = run_plain(&bin, &[]);
    let steady = |o: &std::process::Output| {
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let lines: Vec<String> = out
            .lines()
            .filter(|l| !l.starts_with("SPIN "))
            .map(str::to_string)
            .collect();
        (lines, o.status.code())
    };
    assert_eq!(steady(&plain), steady(&prof.output));
    // What the program itself knows: THREAD <name> (<function> <calls>)...
    let stdout = String::from_utf8_lossy(&prof.output.stdout).into_owned();
    let expected: Vec<(String, HashMap<String, u64>)> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("THREAD "))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let calls = f[1..]
                .chunks(2)
                .map(|c| (c[0].to_string(), c[1].parse().unwrap()))
                .collect();
            (f[0].to_string(), calls)
        })
        .collect();
    assert_eq!(expected.len(), 10, "{stdout}");
    let p = process(&prof.report, &bin);
    let threads = p["threads"].as_array().expect("threads in the report");
    let main_name = bin.file_name().unwrap().to_string_lossy()
        [..15.min(bin.file_name().unwrap().len())]
        .to_string();
    for (name, calls) in &expected {
        let name = if name == "main" { &main_name } else { name };
        let t = threads
            .iter()
            .find(|t| t["name"] == name.as_str())
            .unwrap_or_else(|| panic!("no thread {name}: {threads:?}"));
        let ended = name.starts_with("worker-");
        assert_eq!(t["ended"], ended, "{t}");
        for (f, n) in calls {
            assert_eq!(in_thread(t, f, "calls"), *n, "{name} {f}: {t}");
        }
    }
    // The per-thread counts add up to the process's.
    for f in ["work", "shared_step"] {
        let per_thread: u64 = threads
            .iter()
            .flat_map(|t| t["functions"].as_array().unwrap())
            .filter(|r| r["name"] == f)
            .map(|r| r["calls"].as_u64().unwrap())
            .sum();
        assert_eq!(per_thread, function_named(p, f)["calls"], "{f}");
    }
    // Samples land in the thread that ran: the spinner's time agrees with
    // its own CPU clock (within sampling's resolution), and no thread has
    // more samples than the process.
    let spun = spun_ns(&stdout);
    let spinner = threads.iter().find(|t| t["name"] == "spinner").unwrap();
    let ns = spinner["time_ns"].as_f64().unwrap();
    assert!(
        ns > 0.5 * spun && ns < 1.5 * spun,
        "spinner: {ns} ns sampled, {spun} ns by its clock"
    );
    // Samples per thread and function: the spinner's are in `spinner`
    // (but for its clock reads, in the vDSO), and in no other thread's.
    let samples_in = |t: &serde_json::Value, f: &str| in_thread(t, f, "samples");
    assert_eq!(
        p["thread_function_samples_dropped"].as_u64(),
        Some(0),
        "{p}"
    );
    let own = samples_in(spinner, "spinner");
    let total = spinner["samples"].as_u64().unwrap();
    assert!(own > 0 && own as f64 >= 0.8 * total as f64, "{spinner}");
    let by_thread: u64 = threads.iter().map(|t| samples_in(t, "spinner")).sum();
    assert_eq!(
        by_thread, own,
        "only the spinner runs spinner(): {threads:?}"
    );
    assert_eq!(
        Some(own),
        function_named(p, "spinner")["samples"].as_u64(),
        "every sample of spinner() is its thread's"
    );
    for t in threads {
        let listed: u64 = t["functions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["samples"].as_u64().unwrap())
            .sum();
        assert!(listed <= t["samples"].as_u64().unwrap(), "{t}");
    }
    let sampled: u64 = threads.iter().map(|t| t["samples"].as_u64().unwrap()).sum();
    assert!(
        sampled <= p["sampler"]["samples"].as_u64().unwrap(),
        "{sampled}"
    );
    // The same under the perf sampler, whose drain thread counts them by
    // the thread id each sample carries.
    let perf = run_profiled(&bin, &[], &[("RTPROF_SAMPLER", "perf")], &dir);
    let p = process(&perf.report, &bin);
    assert_eq!(p["sampler"]["name"], "perf", "{}", p["sampler"]);
    let threads = p["threads"].as_array().expect("threads in the report");
    let spinner = threads.iter().find(|t| t["name"] == "spinner").unwrap();
    let own = samples_in(spinner, "spinner");
    let total = spinner["samples"].as_u64().unwrap();
    assert!(
        own > 0 && own as f64 >= 0.8 * total as f64,
        "perf: {spinner}"
    );
    let by_thread: u64 = threads.iter().map(|t| samples_in(t, "spinner")).sum();
    assert_eq!(
        Some(by_thread),
        function_named(p, "spinner")["samples"].as_u64()
    );
    // The text report lists them on request.
    let out = Command::new(rtprof())
        .args(["run", "--threads", "--"])
        .arg(&bin)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("\"worker-7\" (ended): 8701 calls"), "{text}");
    assert!(text.contains("\"sleeper\": 6 calls"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains(" samples  spinner") && !l.contains(" 0 samples")),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Threads that come and go (2,000, one after another, each sampled in
/// four functions): every one is listed with its exact calls, and every
/// sample of those functions is in the rows of the thread that ran it.
/// Samples by function are counted per stripe, and a stripe's next thread
/// starts from zero, so the table holding them never fills.
#[test]
fn threads_that_come_and_go_keep_their_samples() {
    let dir = scratch("thread-churn");
    let bin = compile_o2("thread_churn.c", &["-pthread"], &dir);
    let plain = run_plain(&bin, &["2000"]);
    let prof = run_profiled(&bin, &["2000"], &[], &dir);
    assert_same_behaviour("churn", &plain, &prof.output);
    let p = &prof.report["processes"][0];
    assert_eq!(p["threads_dropped"], 0, "{}", p["threads_dropped"]);
    assert_eq!(p["thread_function_samples_dropped"], 0);
    let threads = p["threads"].as_array().unwrap();
    // The 2,000 and the main thread.
    assert_eq!(threads.len(), 2001);
    let ticks: u64 = threads.iter().map(|t| in_thread(t, "tick", "calls")).sum();
    assert_eq!(ticks, (0..2000u64).map(|k| k % 7).sum::<u64>());
    let mut total = 0;
    let mut late = 0;
    for f in ["spin_a", "spin_b", "spin_c", "spin_d"] {
        let all = function_named(p, f)["samples"].as_u64().unwrap_or(0);
        let in_threads: u64 = threads.iter().map(|t| in_thread(t, f, "samples")).sum();
        // Never more in the threads' rows than in all; fewer only by the
        // samples of a thread that ended while the drain was naming a
        // module (it does not wait for such a drain: docs/limits.md, known
        // limits), which go to the process's rows: a few of 2,000 threads.
        assert!(in_threads <= all, "{f}: {in_threads} in threads of {all}");
        late += all - in_threads;
        total += all;
    }
    assert!(
        late <= 4,
        "{late} samples of ended threads not in their rows"
    );
    // 1.6 ms of CPU per thread at 1 kHz, each thread's clock its own:
    // about one sample each with perf, in its last functions (fewer with
    // the timer sampler, whose timers are checked at the scheduler tick).
    assert!(total >= 100, "{total} samples");
    let _ = std::fs::remove_dir_all(&dir);
}

/// [started, completed, pid] as `ending_threads.c` keeps them.
fn ending_state(file: &std::path::Path) -> [u64; 3] {
    let b = std::fs::read(file).unwrap_or_default();
    let word = |i: usize| {
        b.get(i * 8..i * 8 + 8)
            .map_or(0, |w| u64::from_le_bytes(w.try_into().unwrap()))
    };
    [word(0), word(1), word(2)]
}

/// A process that ends, by `exit` or by SIGKILL, while its threads end
/// and their stripes are folded: every run is reported, with the calls of
/// every thread that made them all and none a thread never started
/// (1,000 per thread). A fold takes effect in one store, so a process
/// killed in the middle of one leaves counts that still add up.
#[test]
fn a_process_ending_while_its_threads_end_keeps_their_calls() {
    let dir = scratch("ending-threads");
    let bin = compile_o2("ending_threads.c", &["-pthread"], &dir);
    let json = dir.join("run.json");
    for run in 0..16u64 {
        let file = dir.join(format!("state-{run}"));
        std::fs::write(&file, [0u8; 4096]).unwrap();
        let kill = run % 2 == 1;
        let wait_ms = 30 + run * 7 % 50;
        let _ = std::fs::remove_file(&json);
        let mut cmd = Command::new(rtprof());
        cmd.arg("run").arg("--json").arg(&json).arg("--").arg(&bin);
        cmd.arg(&file);
        if kill {
            cmd.arg("wait");
        } else {
            cmd.args(["exit", &wait_ms.to_string()]);
        }
        let (out_file, err_file) = (dir.join("stdout"), dir.join("stderr"));
        let mut child = Killed(
            cmd.stdout(std::fs::File::create(&out_file).unwrap())
                .stderr(std::fs::File::create(&err_file).unwrap())
                .spawn()
                .unwrap(),
        );
        if kill {
            let pid = poll(
                "the program's threads",
                std::time::Duration::from_secs(30),
                || {
                    let [_, done, pid] = ending_state(&file);
                    (done >= 20).then_some(pid)
                },
            );
            std::thread::sleep(std::time::Duration::from_millis(wait_ms));
            // SAFETY: a plain system call; the pid is the program's own
            // (rtprof run's child), still unreaped.
            assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
        }
        let status = child.wait().unwrap();
        let stderr = std::fs::read_to_string(&err_file).unwrap();
        let what = format!(
            "run {run} ({}): {stderr}",
            if kill { "killed" } else { "exit" }
        );
        if !kill {
            assert!(status.success(), "{what}");
            assert_eq!(
                std::fs::read_to_string(&out_file).unwrap(),
                "exiting\n",
                "{what}"
            );
        }
        assert!(!stderr.contains("skipping"), "{what}");
        let text =
            std::fs::read_to_string(&json).unwrap_or_else(|e| panic!("{what}: no report: {e}"));
        let report: serde_json::Value = serde_json::from_str(&text).unwrap();
        let [started, completed, _] = ending_state(&file);
        let p = &report["processes"][0];
        let calls = function_named(p, "tick")["calls"].as_u64().unwrap();
        assert!(
            calls >= completed * 1000 && calls <= started * 1000,
            "{what}: {calls} calls of tick; {completed} threads made all 1,000, {started} started"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A thread sharing its CPU with busier ones has the CPU time it ran
/// sampled, under each sampler: the timers run on each thread's CPU
/// clock (the user-time clock, sampled by the kernel at the tick, charged
/// this thread a quarter to a third of its time).
#[test]
fn a_thread_sharing_its_cpu_has_its_time_sampled() {
    let dir = scratch("contended");
    let bin = compile_o2("contended.c", &["-pthread"], &dir);
    for sampler in ["timer", "perf"] {
        let prof = run_profiled(&bin, &[], &[("RTPROF_SAMPLER", sampler)], &dir);
        assert!(prof.output.status.success(), "{:?}", prof.output);
        let stdout = String::from_utf8_lossy(&prof.output.stdout).into_owned();
        let spun = spun_ns(&stdout);
        let p = process(&prof.report, &bin);
        let t = p["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "measured")
            .unwrap_or_else(|| panic!("no measured thread: {p}"));
        let lost = p["sampler"]["lost"].as_u64().unwrap() as f64;
        let ns = t["time_ns"].as_f64().unwrap();
        let period = p["sampler"]["period_ns"].as_f64().unwrap();
        assert!(
            ns + lost * period > 0.7 * spun && ns < 1.3 * spun,
            "{sampler}: {ns} ns sampled, {spun} ns by the thread's clock ({lost} lost)"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
