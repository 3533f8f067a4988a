//! The daemon's presentation segment as `top` follows it: re-opened when
//! a restarted daemon publishes a new file at the same path, retried while
//! the daemon rewrites the buffer under the reader.

use crate::presentation::{open, Segment};
use rtprof_abi::present::{read_view, PresentError, View};
use std::path::{Path, PathBuf};

/// Consecutive `Busy` reads (one per poll) before giving up.
const BUSY_LIMIT: u32 = 50;

/// What one look at the segment found.
pub enum Reading {
    /// No segment could be opened.
    Absent(crate::error::Error),
    /// The daemon rewrote the buffer under every attempt: look again.
    Busy,
    View(View),
    Failed(PresentError),
}

pub struct Source {
    path: PathBuf,
    seg: Option<Segment>,
    busy: u32,
}

impl Source {
    /// Opens the segment at `path` now: an error if it cannot be.
    pub fn open(path: &Path) -> Result<Source, crate::error::Error> {
        Ok(Source {
            seg: Some(open(path)?),
            ..Source::waiting(path)
        })
    }

    /// Follows the segment at `path`, which may not exist yet.
    pub fn waiting(path: &Path) -> Source {
        Source {
            path: path.into(),
            seg: None,
            busy: 0,
        }
    }

    /// Reads the current table, and whether it comes from a segment that
    /// replaced the one read before (a restarted daemon).
    pub fn read(&mut self) -> (Reading, bool) {
        let mut restarted = false;
        let seg = match self.seg.take() {
            None => match open(&self.path) {
                Ok(s) => s,
                Err(e) => return (Reading::Absent(e), false),
            },
            Some(current) => match replaced(&self.path, &current) {
                Some(s) => {
                    restarted = true;
                    s
                }
                None => current,
            },
        };
        let seg = self.seg.insert(seg);
        let reading = match read_view(&seg.map) {
            Ok(v) => {
                self.busy = 0;
                Reading::View(v)
            }
            Err(PresentError::Busy) if self.busy < BUSY_LIMIT => {
                self.busy += 1;
                Reading::Busy
            }
            Err(e) => {
                self.busy = 0;
                Reading::Failed(e)
            }
        };
        (reading, restarted)
    }
}

/// The segment now at `path`, if it is another file than `current` and
/// already published: a restarted daemon. A new daemon's segment that has
/// nothing in it yet is left for the next look.
fn replaced(path: &Path, current: &Segment) -> Option<Segment> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    if (m.dev(), m.ino()) == current.id {
        return None;
    }
    let s = open(path).ok()?;
    read_view(&s.map).is_ok().then_some(s)
}
