//! Reading back the counter segments the run's processes left behind.

use crate::error::Error;
use rtprof_shared::{read_snapshot, Callers, Snapshot, Stacks, Threads};
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

/// The call stacks the process sampled, from the file its agent wrote
/// beside its segment at exit (none: no stacks).
fn read_stacks(p: &Path, s: &Snapshot) -> Stacks {
    let Ok(text) = std::fs::read_to_string(p) else {
        return Stacks::default();
    };
    Stacks::parse(&text, s.functions.len(), s.modules.len()).unwrap_or_else(|e| {
        eprintln!("rtprof: stacks of {} not used: {e}", p.display());
        Stacks::default()
    })
}

/// The exact callers the process counted (`RTPROF_CALLERS=1`), from the
/// file its agent wrote beside its segment at exit.
fn read_callers(p: &Path, s: &Snapshot) -> Callers {
    let Ok(text) = std::fs::read_to_string(p) else {
        return Callers::default();
    };
    Callers::parse(&text, s).unwrap_or_else(|e| {
        eprintln!("rtprof: callers of {} not used: {e}", p.display());
        Callers::default()
    })
}

fn read_threads(p: &Path, s: &Snapshot) -> Threads {
    let Ok(text) = std::fs::read_to_string(p) else {
        return Threads::default();
    };
    Threads::parse(&text, s).unwrap_or_else(|e| {
        eprintln!("rtprof: per-thread calls of {} not used: {e}", p.display());
        Threads::default()
    })
}

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
                s.stacks = read_stacks(&p.with_extension("stacks"), &s);
                s.callers = read_callers(&p.with_extension("callers"), &s);
                s.threads = read_threads(&p.with_extension("threads"), &s);
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
