//! Reading back the counter segments the run's processes left behind.

use crate::error::Error;
use rtprof_shared::loops::{LoopCounts, Offsets};
use rtprof_shared::{read_snapshot, Callers, Events, Snapshot, Stacks, Threads};
use std::path::Path;

/// Maps a segment read-only: the reader touches only the pages it needs
/// (most of a segment is stripes no thread ever used). `None` for a file
/// with nothing in it: a process that died while its agent was starting,
/// or an agent that could not reserve the file's memory (a full
/// filesystem) and counted elsewhere. Those are recognised by reading, not
/// mapping: on a full tmpfs, touching a hole through a shared mapping
/// needs a page the filesystem cannot give, and the reader dies of
/// SIGBUS.
fn map_file(p: &Path) -> Result<Option<memmap2::Mmap>, Error> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(p).map_err(Error::SegmentOpen)?;
    let mut magic = [0u8; 8];
    if f.read_exact_at(&mut magic, 0).is_err() || magic == [0; 8] {
        return Ok(None);
    }
    // SAFETY: a read-only mapping of a file in our private directory;
    // the reader validates every byte it uses.
    unsafe { memmap2::Mmap::map(&f) }
        .map(Some)
        .map_err(Error::SegmentMap)
}

/// What the agent wrote beside a segment at exit, in the file `p`, read
/// by `parse` (`what` names it in the message if it cannot be): the call
/// stacks it sampled, the exact callers (`RTPROF_CALLERS=1`), the calls
/// per thread. No file: none.
fn read_beside<T: Default, E: std::fmt::Display>(
    p: &Path,
    what: &str,
    text: Option<String>,
    parse: impl FnOnce(&str) -> Result<T, E>,
) -> T {
    let Some(text) = text else {
        return T::default();
    };
    parse(&text).unwrap_or_else(|e| {
        eprintln!("rtprof: {what} of {} not used: {e}", p.display());
        T::default()
    })
}

/// The files an agent writes beside its segment at exit.
const BESIDE: [&str; 6] = ["stacks", "callers", "threads", "events", "offsets", "loops"];

/// Every readable segment in `dir`, oldest process first; unreadable ones
/// are reported on stderr and skipped.
pub fn collect(dir: &Path) -> Vec<Snapshot> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "seg") {
            continue;
        }
        // Read before the segment: a process the program left behind may
        // still be running, and its files name only functions its segment
        // already lists once they exist (they appear whole, at its exit).
        let texts = BESIDE.map(|x| std::fs::read_to_string(p.with_extension(x)).ok());
        let bytes = match map_file(&p) {
            Ok(Some(b)) => b,
            // No data, nothing to complain about.
            Ok(None) => continue,
            Err(e) => {
                eprintln!("rtprof: skipping {}: {e}", p.display());
                continue;
            }
        };
        match read_snapshot(&bytes) {
            Ok(mut s) => {
                let [stacks, callers, threads, events, offsets, loops] = texts;
                let beside = |x: &str| p.with_extension(x);
                s.stacks = read_beside(&beside("stacks"), "stacks", stacks, |t| {
                    Stacks::parse(t, s.functions.len(), s.modules.len())
                });
                s.callers = read_beside(&beside("callers"), "callers", callers, |t| {
                    Callers::parse(t, &s)
                });
                s.threads = read_beside(&beside("threads"), "per-thread calls", threads, |t| {
                    Threads::parse(t, &s)
                });
                s.events = read_beside(&beside("events"), "events", events, |t| {
                    Events::parse(t, &s)
                });
                s.offsets = read_beside(&beside("offsets"), "sampled offsets", offsets, |t| {
                    Offsets::parse(t, &s)
                });
                s.loop_counts = read_beside(&beside("loops"), "loop counts", loops, |t| {
                    LoopCounts::parse(t, &s)
                });
                out.push(s)
            }
            Err(e) => eprintln!("rtprof: skipping {}: {e}", p.display()),
        }
    }
    out.sort_by_key(|s| (s.start_ns, s.pid));
    mark_execs(&mut out);
    out
}

/// An image followed by a later one with the same pid replaced itself by
/// exec (snapshots sorted by start time).
fn mark_execs(procs: &mut [Snapshot]) {
    for i in 0..procs.len() {
        let (pid, start) = (procs[i].pid, procs[i].start_ns);
        procs[i].replaced_by_exec = procs[i + 1..]
            .iter()
            .any(|later| later.pid == pid && later.start_ns >= start);
    }
}
