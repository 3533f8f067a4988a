//! The daemon's presentation segment as `rtprof report` and `rtprof top`
//! read it: mapped from its file, and how old its last span is.

use crate::error::Error;
use rtprof_abi::present::{open_file, View};
use std::path::Path;

/// A mapped presentation segment and the file it came from.
pub struct Segment {
    pub map: memmap2::Mmap,
    /// (device, inode): a restarted daemon publishes into a new file.
    pub id: (u64, u64),
}

/// Maps the presentation segment at `path`.
pub fn open(path: &Path) -> Result<Segment, Error> {
    use std::os::unix::fs::MetadataExt;
    let f = open_file(path).map_err(|source| Error::PresentOpen {
        path: path.into(),
        source,
    })?;
    let unmappable = |source| Error::PresentMap {
        path: path.into(),
        source,
    };
    let m = f.metadata().map_err(unmappable)?;
    // SAFETY: a read-only shared mapping; rtprofd never shrinks a segment
    // it publishes in (it replaces the file instead), and the readers
    // validate every byte they use.
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(unmappable)?;
    Ok(Segment {
        map,
        id: (m.dev(), m.ino()),
    })
}

/// "0.4 s", "12.0 s", "3 min 5 s", "2.5 h".
pub fn age_text(ns: u64) -> String {
    let s = ns as f64 / 1e9;
    if s < 60.0 {
        format!("{s:.1} s")
    } else if s < 3600.0 {
        format!("{} min {} s", ns / 60_000_000_000, ns / 1_000_000_000 % 60)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

/// The line that says a table is stale, or `None` while it is current.
pub fn stale_text(v: &View, now: u64) -> Option<String> {
    let (age, stale) = v.age(now);
    stale.then(|| {
        format!(
            "STALE: nothing new for {} (rtprofd publishes every {}): it has stopped or is stuck, these are its last numbers",
            age_text(age),
            age_text(v.tick_ns)
        )
    })
}
