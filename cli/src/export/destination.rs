//! Where an exported report goes (`--json FILE`, `--output FILE`): checked
//! before the program runs, written after it ends, through
//! `rtprof_shared::files` (a device or FIFO written in place; a file
//! written beside its name with `O_EXCL|O_NOFOLLOW` and renamed over it,
//! relative to the directory's descriptor; a directory other users may
//! write refused unless sticky and the file is this user's).

use crate::error::Error;
use rtprof_shared::files::{self, FileError};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Where a report goes, settled before the program starts.
pub struct Destination {
    to: files::Destination,
    /// The replaced file's mode, kept; a new report is private (0600: it
    /// names the program's functions).
    mode: u32,
}

fn refused(e: FileError, exists: bool) -> Error {
    match e {
        FileError::IsDirectory { .. } => Error::OutIsDirectory,
        FileError::UnreadFifo { .. } => Error::OutUnreadFifo,
        FileError::Io { source, .. } if exists => Error::OutInaccessible(source),
        FileError::Io { source, .. } => Error::OutNotCreatable(source),
        other => Error::OutInaccessible(std::io::Error::other(other.to_string())),
    }
}

impl Destination {
    /// Checks that a report can be written to `path`.
    pub fn prepare(path: &Path) -> Result<Destination, Error> {
        // Where a link at the name leads (in a directory only this user
        // may write: `files` refuses links elsewhere).
        let meta = std::fs::metadata(path).ok();
        let regular = meta.as_ref().is_some_and(|m| m.is_file());
        if regular && std::fs::OpenOptions::new().write(true).open(path).is_err() {
            return Err(Error::OutNotWritable);
        }
        let to = files::Destination::prepare(path).map_err(|e| refused(e, meta.is_some()))?;
        if let files::Destination::Replace { dir, name } = &to {
            // A file can be made beside it (the directory may be writable
            // to nobody but its owner, or full).
            let (tmp, _) = dir.create_temp(name, 0o600).map_err(|e| {
                if meta.is_some() {
                    Error::OutNoReplacement(e)
                } else {
                    Error::OutNotCreatable(e)
                }
            })?;
            let _ = dir.unlink(&tmp);
        }
        let mode = meta
            .filter(|m| m.is_file())
            .map_or(0o600, |m| m.permissions().mode() & 0o7777);
        Ok(Destination { to, mode })
    }

    /// Writes the report, on disk before it replaces an older one.
    pub fn write(self, bytes: &[u8]) -> std::io::Result<()> {
        self.to.write(bytes, self.mode, true).map_err(|e| match e {
            FileError::Io { source, .. } => source,
            other => std::io::Error::other(other.to_string()),
        })
    }
}
