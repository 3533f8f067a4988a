//! Replacing files every process reads, so that a crash or a full disk
//! leaves either the old file or the new one, never a part of either: a
//! temporary file in the same directory, flushed to disk, renamed over the
//! old one, and the directory flushed so the rename lasts.

use crate::error::Error;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

fn io_error<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Error + 'a {
    move |source| Error::SystemIo {
        what,
        path: path.into(),
        source,
    }
}

/// A file's bytes, or `None` if it does not exist.
pub fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, Error> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error("cannot read", path)(e)),
    }
}

/// `dir/.NAME.rtprof-PID`: hidden, and unique to this process.
pub fn temp_beside(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.rtprof-{}", std::process::id()))
}

/// Creates `path` (which must not exist) with `mode`, holding `bytes`,
/// flushed to disk.
pub fn create_flushed(path: &Path, bytes: &[u8], mode: u32) -> Result<(), Error> {
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        f.write_all(bytes)?;
        // The umask played no part in this mode.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.sync_all()
    })();
    written.map_err(|e| {
        let _ = std::fs::remove_file(path);
        io_error("cannot write", path)(e)
    })
}

/// Renames `from` over `to` and flushes their directory; `from` is removed
/// if that fails.
pub fn rename_flushed(from: &Path, to: &Path) -> Result<(), Error> {
    if let Err(e) = std::fs::rename(from, to) {
        let _ = std::fs::remove_file(from);
        return Err(io_error("cannot replace", to)(e));
    }
    sync_dir(to)
}

/// Flushes the directory holding `path`, so a rename or removal in it
/// survives a crash.
pub fn sync_dir(path: &Path) -> Result<(), Error> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error("cannot flush", dir))
}

/// Replaces (or creates) `path` with `bytes` at once. A regular file keeps
/// its mode, less any write permission for group and others (these files
/// are root's); anything else (a new file, a symbolic link, whose target's
/// mode says nothing) gets `mode`.
pub fn replace(path: &Path, bytes: &[u8], mode: u32) -> Result<(), Error> {
    let mode = std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.file_type().is_file())
        .map_or(mode, |m| m.permissions().mode() & 0o7777 & !0o022);
    let temp = temp_beside(path);
    let _ = std::fs::remove_file(&temp);
    create_flushed(&temp, bytes, mode)?;
    rename_flushed(&temp, path)
}

/// Removes `path` if it is there.
pub fn remove(path: &Path) -> Result<(), Error> {
    match std::fs::remove_file(path) {
        Ok(()) => sync_dir(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error("cannot remove", path)(e)),
    }
}

/// Makes `dir` (and its parents) with mode 0755 if missing, then checks
/// that only root may change what is in it.
pub fn root_dir(dir: &Path) -> Result<(), Error> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if !dir.is_dir() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(io_error("cannot create", dir))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
            .map_err(io_error("cannot set the mode of", dir))?;
    }
    let m = std::fs::metadata(dir).map_err(io_error("cannot examine", dir))?;
    if !m.is_dir() || m.uid() != 0 || m.mode() & 0o022 != 0 {
        return Err(Error::UnsafeDir(dir.into()));
    }
    Ok(())
}

/// An exclusive lock on `path` (created if missing) while this lives, so
/// two `rtprof system` commands never interleave their changes.
pub struct Lock {
    _file: File,
}

impl Lock {
    pub fn take(path: &Path) -> Result<Lock, Error> {
        use std::os::fd::AsRawFd;
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(io_error("cannot create", path))?;
        // SAFETY: flock on a descriptor this function owns; it touches no
        // memory.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io_error("cannot lock", path)(io::Error::last_os_error()));
        }
        Ok(Lock { _file: f })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_keeping_the_mode_and_leaving_no_temporary() {
        let dir = std::env::temp_dir().join(format!("rtprof-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("ld.so.preload");
        replace(&p, b"one\n", 0o644).unwrap();
        assert_eq!(read_optional(&p).unwrap().unwrap(), b"one\n");
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o644
        );
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        replace(&p, b"two\n", 0o644).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two\n");
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o640
        );
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no temporary");
        remove(&p).unwrap();
        remove(&p).unwrap();
        assert_eq!(read_optional(&p).unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
