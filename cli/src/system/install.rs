//! Putting the agent where every process will load it from: a directory
//! only root may change, a file only root may write. The new copy is
//! tested where it will live (a temporary name in that directory) and
//! renamed into place only if it passes, so a broken build never replaces
//! a working agent; processes that mapped the old file keep it.

use super::files;
use super::probe;
use super::{AGENT_DIR, AGENT_PATH};
use crate::error::Error;
use std::path::Path;

/// What `install` did.
#[derive(Debug, PartialEq)]
pub enum Installed {
    /// The agent was copied to [`AGENT_PATH`] (`replaced`: over another).
    Copied { replaced: bool },
    /// [`AGENT_PATH`] already held the same bytes.
    Unchanged,
}

/// Copies `source` to [`AGENT_PATH`] after testing it there.
pub fn install(source: &Path) -> Result<Installed, Error> {
    let dest = Path::new(AGENT_PATH);
    files::root_dir(Path::new(AGENT_DIR))?;
    // The packaged agent is already in place: `source` is `dest`.
    let same_file = source.canonicalize().ok() == dest.canonicalize().ok();
    let bytes = if same_file {
        None
    } else {
        Some(std::fs::read(source).map_err(|e| Error::SystemIo {
            what: "cannot read",
            path: source.into(),
            source: e,
        })?)
    };
    let current = files::read_optional(dest)?;
    let Some(bytes) = bytes.filter(|b| current.as_ref() != Some(b)) else {
        probe::check(dest)?;
        return Ok(Installed::Unchanged);
    };
    let temp = files::temp_beside(dest);
    let _ = std::fs::remove_file(&temp);
    files::create_flushed(&temp, &bytes, 0o644)?;
    if let Err(e) = probe::check(&temp) {
        let _ = std::fs::remove_file(&temp);
        // Named as the user gave it, not by its temporary name.
        return Err(match e {
            Error::ProbeFailed {
                command, problem, ..
            } => Error::ProbeFailed {
                agent: source.into(),
                command,
                problem,
            },
            e => e,
        });
    }
    files::rename_flushed(&temp, dest)?;
    Ok(Installed::Copied {
        replaced: current.is_some(),
    })
}
