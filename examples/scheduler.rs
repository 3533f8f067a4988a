//! A scheduler in Rust against a live rtprofd: every span, the hottest
//! functions of all profiled programs (merged per executable) and which it
//! would move to an accelerator. Moving saves time x (1 - 1/speedup) and
//! costs a transfer per call; a function moves if the saving is larger.
//!
//! usage: scheduler [--present PATH] [--once] [--speedup S] [--transfer-ns T]

use rtprof_shared::present::{read_view, RowView};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let path = opt("--present").unwrap_or_else(|| "/run/rtprof/present".into());
    let speedup: f64 = opt("--speedup").map_or(10.0, |v| v.parse().expect("number"));
    let transfer_ns: f64 = opt("--transfer-ns").map_or(5000.0, |v| v.parse().expect("number"));
    let once = args.iter().any(|a| a == "--once");
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let map = unsafe { memmap2::Mmap::map(&file) }.expect("map");
    let mut last = 0;
    loop {
        match read_view(&map) {
            Ok(v) if v.generation != last => {
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
                        r.name,
                        exe,
                        r.calls_per_s(v.span_ns),
                        r.time_ns as f64 / 1e6
                    );
                }
                if once {
                    return;
                }
            }
            Ok(_) => {}
            Err(e) => eprintln!("{path}: {e}"),
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
