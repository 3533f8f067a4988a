//! Where an exported report goes (`--json FILE`, `--output FILE`): checked
//! before the program runs, written after it ends.

use crate::error::Error;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Where a report goes, settled before the program starts.
pub enum Destination {
    /// A regular file, new or not: the report is written to a temporary
    /// file beside it and renamed over it, so it is never left truncated.
    File {
        path: PathBuf,
        mode: Option<std::fs::Permissions>,
    },
    /// A FIFO, terminal or device, or a descriptor's name (`/dev/stdout`,
    /// a process substitution): opened now, written in place.
    Stream(std::fs::File),
}

/// A new file beside `target`, its name unique to this process.
fn temp_beside(target: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = target
        .file_name()
        .map_or("report".into(), |n| n.to_string_lossy());
    let mut n = 0;
    loop {
        let p = dir.join(format!(".{name}.rtprof-{}-{n}", std::process::id()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
        {
            Ok(f) => return Ok((p, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 100 => n += 1,
            Err(e) => return Err(e),
        }
    }
}

impl Destination {
    /// Checks that a report can be written to `path`.
    pub fn prepare(path: &Path) -> Result<Destination, Error> {
        use std::os::unix::fs::OpenOptionsExt;
        // /dev/stdout and the like name a descriptor: when it is a file
        // (stdout redirected), the report goes after what the program
        // wrote there, not over it.
        let descriptor = ["/dev/stdout", "/dev/stderr", "/dev/fd", "/proc/self/fd"]
            .iter()
            .any(|d| path.starts_with(d));
        match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => Err(Error::OutIsDirectory),
            Ok(m) if !m.is_file() || descriptor => {
                // Non-blocking: a FIFO nobody reads is an error, not a hang.
                let f = std::fs::OpenOptions::new()
                    .append(m.is_file())
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(path)
                    .map_err(|e| match e.raw_os_error() {
                        Some(libc::ENXIO) => Error::OutUnreadFifo,
                        _ => Error::OutInaccessible(e),
                    })?;
                use std::os::fd::AsRawFd;
                // SAFETY: fcntl on a descriptor owned by `f`. Writes of the
                // report may block like any write to a pipe.
                unsafe {
                    let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
                    libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
                }
                Ok(Destination::Stream(f))
            }
            Ok(m) => {
                // Through a symbolic link: replace the file it names.
                let target = path.canonicalize().map_err(Error::OutInaccessible)?;
                if std::fs::OpenOptions::new()
                    .write(true)
                    .open(&target)
                    .is_err()
                {
                    return Err(Error::OutNotWritable);
                }
                let (tmp, _) = temp_beside(&target).map_err(Error::OutNoReplacement)?;
                let _ = std::fs::remove_file(tmp);
                Ok(Destination::File {
                    path: target,
                    mode: Some(m.permissions()),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let (tmp, _) = temp_beside(path).map_err(Error::OutNotCreatable)?;
                let _ = std::fs::remove_file(tmp);
                Ok(Destination::File {
                    path: path.to_path_buf(),
                    mode: None,
                })
            }
            Err(e) => Err(Error::OutInaccessible(e)),
        }
    }

    pub fn write(self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Destination::Stream(mut f) => f.write_all(bytes),
            Destination::File { path, mode } => {
                let (tmp, mut f) = temp_beside(&path)?;
                let r = (|| {
                    f.write_all(bytes)?;
                    if let Some(m) = mode {
                        f.set_permissions(m)?;
                    }
                    // On disk before it replaces the old report.
                    f.sync_all()?;
                    std::fs::rename(&tmp, &path)
                })();
                if r.is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
                r
            }
        }
    }
}
