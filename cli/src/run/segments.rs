//! Reading back the counter segments the run's processes left behind.

use crate::error::Error;
use rtprof_abi::loops::{LoopCounts, Offsets};
use rtprof_abi::{read_snapshot, Callers, Events, Snapshot, Stacks, Threads};
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
    let f = open_regular(p).map_err(Error::SegmentOpen)?;
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

/// Opens `p` for reading if it is a regular file, not through a link and
/// without waiting: the directory may belong to the profiled process's
/// user (root attaching to another user's process hands it over), who
/// could leave a FIFO, a link or a device there.
pub fn open_regular(p: &Path) -> std::io::Result<std::fs::File> {
    rtprof_shared::files::open_regular(p).map_err(|e| match e {
        rtprof_shared::files::FileError::Io { source, .. } => source,
        other => std::io::Error::other(other.to_string()),
    })
}

/// Most bytes of a file written beside a segment that are read.
const MAX_BESIDE: u64 = 1 << 30;

/// The text of the file `p` written beside a segment, if it is a regular
/// file of reasonable size.
fn beside_text(p: &Path) -> Option<String> {
    let f = open_regular(p).ok()?;
    if f.metadata().ok()?.len() > MAX_BESIDE {
        eprintln!("rtprof: {} is larger than 1 GiB; not read", p.display());
        return None;
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(f, MAX_BESIDE), &mut text).ok()?;
    Some(text)
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
        let texts = BESIDE.map(|x| beside_text(&p.with_extension(x)));
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

#[cfg(test)]
mod open_tests {
    use super::*;

    /// A FIFO, a link and a directory where a file beside a segment is
    /// expected: refused at once (no wait for a writer), a regular file
    /// read.
    #[test]
    fn only_regular_files_are_read() {
        let d = std::env::temp_dir().join(format!("rtprof-beside-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let fifo = d.join("x.stacks");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(open_regular(&fifo).is_err());
        assert_eq!(beside_text(&fifo), None);
        std::fs::write(d.join("real"), "text").unwrap();
        std::os::unix::fs::symlink(d.join("real"), d.join("x.callers")).unwrap();
        assert_eq!(beside_text(&d.join("x.callers")), None);
        assert!(open_regular(&d).is_err());
        assert_eq!(beside_text(&d.join("real")).as_deref(), Some("text"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
