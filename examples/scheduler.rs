//! A scheduler in Rust against a live rtprofd: every span, the hottest
//! functions of all profiled programs (merged per executable) and which it
//! would move to an accelerator. Moving saves time x (1 - 1/speedup) and
//! costs a transfer per call; a function moves if the saving is larger.
//!
//! With `--act`, it moves them: every span it gives `--slots K` slots,
//! shared by every process, to the (process, function) pairs whose move to
//! an implementation the program offered saves most, measured from the
//! spans of each implementation (see `scheduler/act.rs`), and routes their
//! calls through rtprofd, logging each decision with its reason.
//!
//! usage: scheduler [--present PATH] [--once] [--speedup S] [--transfer-ns T]
//!        scheduler --act [--slots K] [--socket PATH] [--move-cost-ms C]
//!                  [--hysteresis H] [--min-spans N] [--present PATH]
//!
//! Exit status: 0 after `--once`; 1 when the segment cannot be read
//! (missing, not a segment, malformed, never published, or rewritten under
//! every read for five seconds); 2 for a bad argument.

#[path = "scheduler/act.rs"]
mod act;

use rtprof_abi::escape::escape_text;
use rtprof_abi::present::{now_ns, open_file, read_view, OpenError, PresentError, RowView, View};
use std::process::ExitCode;

const USAGE: &str = "usage: scheduler [--present PATH] [--once] [--speedup S] [--transfer-ns T]
       scheduler --act [--slots K] [--socket PATH] [--move-cost-ms C] [--hysteresis H] [--min-spans N] [--present PATH]";
/// Polls (100 ms apart) that may find the segment busy, or not yet
/// published by a daemon that just started, before giving up.
const RETRIES: u32 = 50;

/// Options followed by a value; flags; the options that only `--act` takes.
const VALUES: &[&str] = &[
    "--present",
    "--speedup",
    "--transfer-ns",
    "--slots",
    "--socket",
    "--move-cost-ms",
    "--hysteresis",
    "--min-spans",
];
const FLAGS: &[&str] = &["--act", "--once"];
const ACTING_ONLY: &[&str] = &[
    "--slots",
    "--socket",
    "--move-cost-ms",
    "--hysteresis",
    "--min-spans",
];

/// Checks the command line (without the program's name) before anything
/// runs: `Ok(true)` for `--help`; an unknown option or argument, one
/// without its value, or one of `--act`'s without it is refused.
fn check_args(args: &[String]) -> Result<bool, String> {
    let acting = args.iter().any(|a| a == "--act");
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "--help" || a == "-h" {
            return Ok(true);
        }
        if FLAGS.contains(&a) {
            i += 1;
            continue;
        }
        if !VALUES.contains(&a) {
            return Err(format!("unknown option {a:?}"));
        }
        if ACTING_ONLY.contains(&a) && !acting {
            return Err(format!("{a} is an option of --act"));
        }
        if args.get(i + 1).is_none() {
            return Err(format!("{a} needs a value"));
        }
        i += 2;
    }
    Ok(false)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match check_args(&args[1.min(args.len())..]) {
        Ok(true) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(false) => {}
        Err(e) => {
            eprintln!("scheduler: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    }
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| {
                args.get(i + 1)
                    .cloned()
                    .ok_or(format!("{name} needs a value"))
            })
            .transpose()
    };
    let number = |name: &str, default: f64| -> Result<f64, String> {
        opt(name)?.map_or(Ok(default), |v| {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or(format!("{name} {v}: not a positive number"))
        })
    };
    let parsed = (|| {
        let path =
            opt("--present")?.unwrap_or_else(|| rtprof_abi::protocol::DEFAULT_PRESENT.into());
        let acting = args.iter().any(|a| a == "--act").then(|| {
            Ok::<_, String>(Acting {
                placer: act::Placer::new(act::Options {
                    slots: number("--slots", 1.0)? as usize,
                    move_cost_ns: number("--move-cost-ms", 0.1)? * 1e6,
                    hysteresis: number("--hysteresis", 0.25)?,
                    min_spans: number("--min-spans", 2.0)? as u64,
                }),
                socket: opt("--socket")?
                    .map_or_else(rtprof_abi::protocol::default_socket, Into::into),
            })
        });
        Ok::<_, String>((
            path,
            number("--speedup", 10.0)?,
            number("--transfer-ns", 5000.0)?,
            acting.transpose()?,
        ))
    })();
    let (path, speedup, transfer_ns, mut acting) = match parsed {
        Ok(p) => p,
        Err(e) => {
            eprintln!("scheduler: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let once = args.iter().any(|a| a == "--once");
    let shown = escape_text(&path).into_owned();
    let file = match open_file(std::path::Path::new(&path)) {
        Ok(f) => f,
        Err(e) => {
            let hint = match &e {
                OpenError::Io(io) if io.kind() == std::io::ErrorKind::NotFound => {
                    " (is rtprofd running?)"
                }
                _ => "",
            };
            eprintln!("scheduler: {shown}: {e}{hint}");
            return ExitCode::from(1);
        }
    };
    // SAFETY: a read-only shared mapping; rtprofd never shrinks the file
    // it publishes in, and read_view validates every byte it uses.
    let map = match unsafe { memmap2::Mmap::map(&file) } {
        Ok(m) => m,
        Err(e) => {
            eprintln!("scheduler: {shown}: {e}");
            return ExitCode::from(1);
        }
    };
    let (mut last, mut retries, mut warned) = (0, 0, false);
    loop {
        match read_view(&map) {
            Ok(v) => {
                retries = 0;
                let (age, stale) = v.age(now_ns());
                if stale && !warned {
                    eprintln!(
                        "scheduler: {shown}: nothing new for {:.1} s: rtprofd has stopped or is stuck",
                        age as f64 / 1e9
                    );
                }
                warned = stale;
                if v.generation != last && acting.is_some() {
                    last = v.generation;
                    if let Some(a) = &mut acting {
                        a.act(&v);
                    }
                } else if v.generation != last {
                    last = v.generation;
                    let mut hot: Vec<&RowView> = v.global_rows().iter().collect();
                    hot.sort_by(|a, b| b.time_ns.cmp(&a.time_ns).then(b.calls.cmp(&a.calls)));
                    println!(
                        "span {:.1} s, {} process(es)",
                        v.span_ns as f64 / 1e9,
                        v.procs.len()
                    );
                    for r in hot.iter().take(5) {
                        let exe = v.exe_of(r).unwrap_or("?");
                        let saved = r.time_ns as f64 * (1.0 - 1.0 / speedup);
                        let cost = r.calls as f64 * transfer_ns;
                        let decision = if !r.counted {
                            "keep (calls unknown)"
                        } else if saved > cost {
                            "MOVE"
                        } else {
                            "keep"
                        };
                        println!(
                            "  {:<24} {:<28} {:>12.0} calls/s {:>9.1} ms {decision}",
                            escape_text(&r.name),
                            escape_text(exe),
                            r.calls_per_s(v.span_ns),
                            r.time_ns as f64 / 1e6
                        );
                    }
                }
                if once {
                    return ExitCode::SUCCESS;
                }
            }
            // Passing states: a daemon mid-publish, or one that has not
            // published its first span yet. Not for ever.
            Err(PresentError::Busy | PresentError::NotPublished) if retries < RETRIES => {
                retries += 1
            }
            Err(e) => {
                eprintln!("scheduler: {shown}: {e}");
                return ExitCode::from(1);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The acting scheduler: its placement and rtprofd's socket.
struct Acting {
    placer: act::Placer,
    socket: std::path::PathBuf,
}

impl Acting {
    /// Decides this span's moves, routes them and logs each.
    fn act(&mut self, v: &View) {
        let offered = act::offered_in(v);
        let span_s = v.span_ns as f64 / 1e9;
        // A table is published every tick: `--min-spans` counts spans.
        self.placer
            .set_ticks_per_span(v.span_ns.div_ceil(v.tick_ns.max(1)));
        for d in self.placer.decide(&offered, span_s) {
            // A move back refused keeps its slot: no newcomer beyond K.
            if d.to != rtprof_abi::route::ORIGINAL && self.placer.over_capacity() {
                self.placer.refused(&d);
                println!(
                    "tick {}: pid {} {} -> {}: skipped, no slot was freed",
                    v.generation,
                    d.pid,
                    escape_text(&d.function),
                    escape_text(&d.to)
                );
                continue;
            }
            let outcome = match rtprof_abi::protocol::route(&self.socket, d.pid, &d.function, &d.to)
            {
                Ok(_) => "done".to_string(),
                // A process gone holds no slot.
                Err(e)
                    if e.contains("has ended") || e.contains("not a process rtprofd follows") =>
                {
                    format!("refused: {e}")
                }
                Err(e) => {
                    self.placer.refused(&d);
                    format!("refused: {e}")
                }
            };
            println!(
                "tick {}: pid {} {} -> {}: {} ({outcome})",
                v.generation,
                d.pid,
                escape_text(&d.function),
                escape_text(&d.to),
                d.reason
            );
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
    }
}

#[cfg(test)]
mod tests {
    use super::check_args;

    #[test]
    fn options_are_checked_before_anything_runs() {
        let check = |a: &[&str]| check_args(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(check(&[]), Ok(false));
        assert_eq!(
            check(&["--act", "--slots", "2", "--min-spans", "3"]),
            Ok(false)
        );
        assert_eq!(check(&["--once", "--help"]), Ok(true));
        assert!(check(&["--slot", "2"])
            .unwrap_err()
            .contains("unknown option"));
        assert!(check(&["--slots", "2"])
            .unwrap_err()
            .contains("option of --act"));
        assert!(check(&["--act", "--slots"])
            .unwrap_err()
            .contains("needs a value"));
        assert!(check(&["stray"]).unwrap_err().contains("unknown option"));
    }
}
