//! The bearer token `/metrics` asks for (`--metrics-token-file`). The
//! metrics name root's executables and functions, which the presentation
//! segment shows to root and `--group` only: a scraper must prove it may
//! read what only root (or the daemon's user) may, a file of theirs.
//! Missing, the file is made, mode 0600, with random bytes from the
//! kernel; present, it is used only if nobody else could have written or
//! read it.

use rtprof_shared::files::{self, FileError};
use std::fmt;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Random bytes in a new token (as 64 hex digits).
const TOKEN_BYTES: usize = 32;
/// A shorter token (after trimming white space) is refused.
const MIN_TOKEN: usize = 16;
/// A longer file is not a token.
const MAX_TOKEN: u64 = 4096;

#[derive(Debug)]
pub enum TokenError {
    /// Its metadata or contents cannot be read.
    Read { path: PathBuf, source: io::Error },
    /// It cannot be made.
    Create { path: PathBuf, source: io::Error },
    /// The kernel gave no random bytes.
    Random(io::Error),
    /// A symbolic link, a directory, ...: not a plain file.
    NotRegular(PathBuf),
    /// Owned by someone who is neither root nor the daemon's user.
    Owner { path: PathBuf, uid: u32 },
    /// Group or others may read or write it.
    Mode { path: PathBuf, mode: u32 },
    /// Too short (after trimming white space) or too long.
    Length { path: PathBuf, len: u64 },
    /// Its directory is owned by someone who is neither root nor the
    /// daemon's user: they could replace the token, or take it.
    DirOwner { dir: PathBuf, uid: u32 },
    /// Its directory may be written by group or others: they could
    /// replace the token.
    DirMode { dir: PathBuf, mode: u32 },
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenError::Read { path, source } => write!(f, "{}: {source}", path.display()),
            TokenError::Create { path, source } => {
                write!(f, "cannot create {}: {source}", path.display())
            }
            TokenError::Random(e) => write!(f, "no random bytes for a token: {e}"),
            TokenError::NotRegular(p) => write!(f, "{}: not a regular file", p.display()),
            TokenError::Owner { path, uid } => write!(
                f,
                "{}: owned by uid {uid}, neither root nor this daemon's user",
                path.display()
            ),
            TokenError::Mode { path, mode } => write!(
                f,
                "{}: mode {mode:04o}: group or others may read or write it (chmod 600)",
                path.display()
            ),
            TokenError::DirOwner { dir, uid } => write!(
                f,
                "directory {} is owned by uid {uid}, neither root nor this daemon's user: the token must be kept in a directory of theirs",
                dir.display()
            ),
            TokenError::DirMode { dir, mode } => write!(
                f,
                "directory {}: mode {mode:04o}: group or others may write it, and so replace the token (chmod go-w, or another directory)",
                dir.display()
            ),
            TokenError::Length { path, len } => write!(
                f,
                "{}: a token of {len} bytes (between {MIN_TOKEN} and {MAX_TOKEN} wanted)",
                path.display()
            ),
        }
    }
}

impl std::error::Error for TokenError {}

/// The token in `path`, made first if there is no file there.
pub fn load_or_create(path: &Path) -> Result<Vec<u8>, TokenError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.exists() {
        // Made by us, ours alone (whatever the umask lets through).
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| TokenError::Create {
                path: path.into(),
                source,
            })?;
    }
    check_dir(dir)?;
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => create(path),
        Err(source) => Err(TokenError::Read {
            path: path.into(),
            source,
        }),
        Ok(_) => load(path),
    }
}

/// Refuses a directory that someone but root and the daemon's user owns
/// or may write: the token kept there could be replaced or read.
fn check_dir(dir: &Path) -> Result<(), TokenError> {
    let m = std::fs::metadata(dir).map_err(|source| TokenError::Read {
        path: dir.into(),
        source,
    })?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if m.uid() != 0 && m.uid() != me {
        return Err(TokenError::DirOwner {
            dir: dir.into(),
            uid: m.uid(),
        });
    }
    if m.mode() & 0o022 != 0 {
        return Err(TokenError::DirMode {
            dir: dir.into(),
            mode: m.mode() & 0o7777,
        });
    }
    Ok(())
}

fn load(path: &Path) -> Result<Vec<u8>, TokenError> {
    let read = |source| TokenError::Read {
        path: path.into(),
        source,
    };
    // Not following a link: what is checked is what is read.
    let f = files::open_regular(path).map_err(|e| match e {
        FileError::Io { source, .. } => read(source),
        _ => TokenError::NotRegular(path.into()),
    })?;
    let m = f.metadata().map_err(read)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if m.uid() != 0 && m.uid() != me {
        return Err(TokenError::Owner {
            path: path.into(),
            uid: m.uid(),
        });
    }
    if m.mode() & 0o077 != 0 {
        return Err(TokenError::Mode {
            path: path.into(),
            mode: m.mode() & 0o7777,
        });
    }
    if m.len() > MAX_TOKEN {
        return Err(TokenError::Length {
            path: path.into(),
            len: m.len(),
        });
    }
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut io::Read::take(f, MAX_TOKEN + 1), &mut bytes).map_err(read)?;
    // As Prometheus reads a credentials file: surrounding white space is
    // not part of the token.
    let token = bytes.trim_ascii().to_vec();
    if token.len() < MIN_TOKEN || token.len() as u64 > MAX_TOKEN {
        return Err(TokenError::Length {
            path: path.into(),
            len: token.len() as u64,
        });
    }
    Ok(token)
}

fn create(path: &Path) -> Result<Vec<u8>, TokenError> {
    let mut raw = [0u8; TOKEN_BYTES];
    let mut got = 0;
    while got < raw.len() {
        // SAFETY: writes at most `raw.len() - got` bytes inside `raw`.
        let n = unsafe { libc::getrandom(raw[got..].as_mut_ptr().cast(), raw.len() - got, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(TokenError::Random(e));
            }
        } else {
            got += n as usize;
        }
    }
    let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let err = |source| TokenError::Create {
        path: path.into(),
        source,
    };
    // Never over someone else's file or link (create_new: O_EXCL).
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(err)?;
    f.write_all(token.as_bytes()).map_err(err)?;
    Ok(token.into_bytes())
}

/// Whether `given` is `token`, in time that depends on their lengths only
/// (not on where they first differ).
pub fn matches(given: &[u8], token: &[u8]) -> bool {
    let mut diff = (given.len() != token.len()) as u8;
    for (i, &t) in token.iter().enumerate() {
        diff |= t ^ given.get(i).copied().unwrap_or(!t);
    }
    // Not optimised into an early exit.
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rtprofd-token-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_missing_token_is_made_private_and_read_back() {
        let d = dir("new");
        let p = d.join("sub/metrics.token");
        let t = load_or_create(&p).unwrap();
        assert_eq!(t.len(), 2 * TOKEN_BYTES);
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        assert_eq!(load_or_create(&p).unwrap(), t);
        // Another daemon makes another.
        let q = d.join("other.token");
        assert_ne!(load_or_create(&q).unwrap(), t);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_token_others_may_read_or_a_link_is_refused() {
        let d = dir("refused");
        let p = d.join("t");
        std::fs::write(&p, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_or_create(&p).unwrap_err();
        assert!(matches!(e, TokenError::Mode { mode: 0o644, .. }), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(load_or_create(&p).unwrap(), b"0123456789abcdef0123");
        let l = d.join("link");
        std::os::unix::fs::symlink(&p, &l).unwrap();
        let e = load_or_create(&l).unwrap_err();
        assert!(matches!(e, TokenError::NotRegular(_)), "{e}");
        let short = d.join("short");
        std::fs::write(&short, "abc").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = load_or_create(&short).unwrap_err();
        assert!(matches!(e, TokenError::Length { len: 3, .. }), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_directory_others_may_write_or_own_is_refused() {
        let d = dir("dirs");
        let open = d.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = load_or_create(&open.join("t")).unwrap_err();
        assert!(matches!(e, TokenError::DirMode { mode: 0o1777, .. }), "{e}");
        assert!(!open.join("t").exists());
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o775)).unwrap();
        let e = load_or_create(&open.join("t")).unwrap_err();
        assert!(matches!(e, TokenError::DirMode { mode: 0o775, .. }), "{e}");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let theirs = d.join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
            let e = load_or_create(&theirs.join("t")).unwrap_err();
            assert!(matches!(e, TokenError::DirOwner { uid: 65534, .. }), "{e}");
            assert!(!theirs.join("t").exists());
        }
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            load_or_create(&open.join("t")).unwrap().len(),
            2 * TOKEN_BYTES
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn tokens_match_exactly() {
        assert!(matches(b"secret-token", b"secret-token"));
        assert!(!matches(b"secret-tokem", b"secret-token"));
        assert!(!matches(b"secret-toke", b"secret-token"));
        assert!(!matches(b"secret-token!", b"secret-token"));
        assert!(!matches(b"", b"secret-token"));
    }
}
