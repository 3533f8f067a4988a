//! Files rtprof creates or trusts, reached through directory descriptors so
//! that no name can be re-pointed between a check and its use: a path is
//! resolved once, then opened component by component from `/` without
//! following links, each component checked on its descriptor; files are
//! created beside their destination with `O_CREAT|O_EXCL|O_NOFOLLOW` and
//! renamed over it relative to the same descriptor.
//!
//! Destinations (reports, the presentation segment) follow one policy: a
//! device, FIFO or socket is written in place, never replaced; a directory
//! other users may write is refused, unless it is sticky (as /tmp) and the
//! destination is absent or this user's own regular file.

use std::ffi::{CStr, CString};
use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Why a file was not written or a directory not trusted.
#[derive(Debug)]
pub enum FileError {
    Io {
        path: PathBuf,
        source: io::Error,
    },
    /// A directory users other than this one (and root) may write, not
    /// sticky: a name in it can be replaced under us.
    SharedDirectory {
        path: PathBuf,
    },
    /// In a sticky directory others may write, a destination that is a
    /// link or belongs to another user.
    NotOwnDestination {
        path: PathBuf,
    },
    /// The destination is a directory.
    IsDirectory {
        path: PathBuf,
    },
    /// The destination is a FIFO nobody reads.
    UnreadFifo {
        path: PathBuf,
    },
    /// A path with no file name (`/`, `..`).
    NoName {
        path: PathBuf,
    },
    /// Not a regular file (a device, FIFO, socket or link) where only a
    /// regular file will do.
    NotRegular {
        path: PathBuf,
    },
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            FileError::SharedDirectory { path } => write!(
                f,
                "{}: other users may write this directory (and it is not sticky)",
                path.display()
            ),
            FileError::NotOwnDestination { path } => write!(
                f,
                "{}: in a directory other users may write, and not this user's own file",
                path.display()
            ),
            FileError::IsDirectory { path } => write!(f, "{}: is a directory", path.display()),
            FileError::UnreadFifo { path } => {
                write!(f, "{}: a FIFO that no process reads", path.display())
            }
            FileError::NoName { path } => write!(f, "{}: names no file", path.display()),
            FileError::NotRegular { path } => write!(
                f,
                "{}: not a regular file (a device, FIFO, socket or link); left as it is",
                path.display()
            ),
        }
    }
}

impl std::error::Error for FileError {}

fn io_at(path: &Path, source: io::Error) -> FileError {
    FileError::Io {
        path: path.into(),
        source,
    }
}

fn cstr(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `fstat` of a descriptor.
pub fn fstat(fd: &impl AsRawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data, filled by fstat before use.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a descriptor the caller owns and a stat on our stack.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn file_type(st: &libc::stat) -> libc::mode_t {
    st.st_mode & libc::S_IFMT
}

/// A directory opened by [`Dir::open`]: names are looked up relative to
/// it, never through its path again.
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

impl Dir {
    /// Opens the directory `path`, resolved once (`realpath`), then walked
    /// from `/` component by component with `O_NOFOLLOW`; `check` sees
    /// each component's path, status (from its descriptor) and whether it
    /// is the last.
    pub fn open(
        path: &Path,
        mut check: impl FnMut(&Path, &libc::stat, bool) -> Result<(), FileError>,
    ) -> Result<Dir, FileError> {
        let real = std::fs::canonicalize(path).map_err(|e| io_at(path, e))?;
        let names: Vec<&[u8]> = real
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.as_bytes()),
                _ => None,
            })
            .collect();
        let open_at = |dirfd: libc::c_int, name: &CStr| -> io::Result<OwnedFd> {
            // SAFETY: a NUL-terminated name relative to a directory
            // descriptor we hold (or an absolute "/"); the new descriptor
            // is owned by the result.
            let fd = unsafe {
                libc::openat(
                    dirfd,
                    name.as_ptr(),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                )
            };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: a descriptor just opened, owned by nothing else.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        };
        let mut at = PathBuf::from("/");
        let mut fd = open_at(libc::AT_FDCWD, c"/").map_err(|e| io_at(&at, e))?;
        check(
            &at,
            &fstat(&fd).map_err(|e| io_at(&at, e))?,
            names.is_empty(),
        )?;
        for (i, name) in names.iter().enumerate() {
            at.push(std::ffi::OsStr::from_bytes(name));
            let c = cstr(name).map_err(|e| io_at(&at, e))?;
            fd = open_at(fd.as_raw_fd(), &c).map_err(|e| io_at(&at, e))?;
            check(
                &at,
                &fstat(&fd).map_err(|e| io_at(&at, e))?,
                i + 1 == names.len(),
            )?;
        }
        Ok(Dir { fd, path: real })
    }

    /// The directory's path as resolved (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Status of `name` in it, the link itself if it is one; `None` if
    /// absent.
    pub fn stat(&self, name: &str) -> io::Result<Option<libc::stat>> {
        let c = cstr(name.as_bytes())?;
        // SAFETY: stat is plain data, filled before use.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a name relative to our directory descriptor, a stat on
        // our stack.
        let r = unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r == 0 {
            return Ok(Some(st));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            _ => Err(e),
        }
    }

    /// Opens `name` in it with `flags` (`O_NOFOLLOW | O_CLOEXEC` added).
    pub fn open_file(&self, name: &str, flags: libc::c_int, mode: u32) -> io::Result<File> {
        let c = cstr(name.as_bytes())?;
        // SAFETY: a name relative to our directory descriptor; the new
        // descriptor is owned by the File.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened, owned by nothing else.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// A new file beside `name`: `.name.rtprof-PID-N`, created with
    /// `O_CREAT|O_EXCL|O_NOFOLLOW` and `mode`, open for reading and
    /// writing (a segment is mapped shared).
    pub fn create_temp(&self, name: &str, mode: u32) -> io::Result<(String, File)> {
        let mut n = 0;
        loop {
            let tmp = format!(".{name}.rtprof-{}-{n}", std::process::id());
            match self.open_file(&tmp, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, mode) {
                Ok(f) => return Ok((tmp, f)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 100 => n += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Renames `from` over `to`, both in this directory.
    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let (f, t) = (cstr(from.as_bytes())?, cstr(to.as_bytes())?);
        let d = self.fd.as_raw_fd();
        // SAFETY: two names relative to our directory descriptor.
        match unsafe { libc::renameat(d, f.as_ptr(), d, t.as_ptr()) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// Removes `name` from it.
    pub fn unlink(&self, name: &str) -> io::Result<()> {
        let c = cstr(name.as_bytes())?;
        // SAFETY: a name relative to our directory descriptor.
        match unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// The names in it (`.` and `..` left out).
    pub fn names(&self) -> io::Result<Vec<String>> {
        // Listing needs a descriptor opened for reading, of this very
        // directory: "." relative to ours.
        let d = self.open_file(".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        let fd = std::os::fd::IntoRawFd::into_raw_fd(d);
        // SAFETY: fdopendir takes over `fd` (closed by closedir).
        let dir = unsafe { libc::fdopendir(fd) };
        if dir.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: `fd` is still ours when fdopendir failed.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        let mut out = Vec::new();
        loop {
            // SAFETY: a stream from fdopendir, read by this thread only.
            let e = unsafe { libc::readdir(dir) };
            if e.is_null() {
                break;
            }
            // SAFETY: readdir's entry holds a NUL-terminated name, valid
            // until the next readdir on this stream.
            let name = unsafe { CStr::from_ptr((*e).d_name.as_ptr()) };
            let name = name.to_string_lossy();
            if name != "." && name != ".." {
                out.push(name.into_owned());
            }
        }
        // SAFETY: the stream opened above, closed once.
        unsafe { libc::closedir(dir) };
        Ok(out)
    }
}

/// Whether a directory's status lets users other than `euid` and root
/// replace names in it. Group write counts unless the directory is the
/// user's own and its group the user's (a private group, as with umask
/// 002 on systems that give each user one).
pub fn others_may_write(st: &libc::stat, euid: u32, egid: u32) -> bool {
    let own = st.st_uid == euid;
    let group_is_ours = own && st.st_gid == egid;
    st.st_mode & 0o002 != 0
        || (st.st_mode & 0o020 != 0 && !group_is_ours)
        || (!own && st.st_uid != 0)
}

fn sticky(st: &libc::stat) -> bool {
    st.st_mode & libc::S_ISVTX != 0
}

/// Where a destination goes, settled before anything is written.
pub enum Destination {
    /// A device, FIFO or socket, or a descriptor's name such as
    /// `/dev/stdout` (its descriptor, duplicated): written in place.
    InPlace(File),
    /// A regular file (new or not) named `name` in `dir`: written beside
    /// it, then renamed over it.
    Replace { dir: Dir, name: String },
}

/// The descriptor a path names, if it names one: `/dev/stdout`,
/// `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N`.
fn descriptor_number(path: &Path) -> Option<i32> {
    let p = path.to_str()?;
    match p {
        "/dev/stdout" => Some(1),
        "/dev/stderr" => Some(2),
        _ => p
            .strip_prefix("/dev/fd/")
            .or_else(|| p.strip_prefix("/proc/self/fd/"))?
            .parse()
            .ok(),
    }
}

impl Destination {
    /// Settles where `path` is written. A descriptor's name is that
    /// descriptor (duplicated, whatever it is: a pipe, a socket, a file
    /// written after what the program wrote). Otherwise the directory is
    /// opened (see [`Dir::open`]) and the name looked up in it without
    /// following a link: a directory other users may write must be sticky,
    /// and the name there absent or this user's own (file, FIFO, device or
    /// link alike); a link elsewhere is followed to where it leads; a
    /// device, FIFO or socket is opened now, without waiting (a FIFO that
    /// nobody reads is an error, not a hang).
    pub fn prepare(path: &Path) -> Result<Destination, FileError> {
        if let Some(fd) = descriptor_number(path) {
            // SAFETY: duplicates a descriptor number of this process (an
            // invalid one fails with EBADF); the copy is owned below.
            let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
            if dup < 0 {
                return Err(io_at(path, io::Error::last_os_error()));
            }
            // SAFETY: a descriptor just made, owned by nothing else.
            return Ok(Destination::InPlace(unsafe { File::from_raw_fd(dup) }));
        }
        Self::prepare_at(path, true)
    }

    fn prepare_at(path: &Path, follow: bool) -> Result<Destination, FileError> {
        // SAFETY: geteuid and getegid cannot fail.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| FileError::NoName { path: path.into() })?
            .to_string();
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = Dir::open(parent, |_, _, _| Ok(()))?;
        let st = fstat(&dir.fd).map_err(|e| io_at(dir.path(), e))?;
        let shared = others_may_write(&st, euid, egid);
        if shared && !sticky(&st) {
            return Err(FileError::SharedDirectory {
                path: dir.path().into(),
            });
        }
        let target = dir.path().join(&name);
        let Some(t) = dir.stat(&name).map_err(|e| io_at(&target, e))? else {
            return Ok(Destination::Replace { dir, name });
        };
        if shared && t.st_uid != euid {
            return Err(FileError::NotOwnDestination { path: target });
        }
        match file_type(&t) {
            libc::S_IFDIR => Err(FileError::IsDirectory { path: target }),
            libc::S_IFREG => Ok(Destination::Replace { dir, name }),
            libc::S_IFLNK if shared => Err(FileError::NotOwnDestination { path: target }),
            libc::S_IFLNK => match std::fs::canonicalize(&target) {
                // Where the link leads, checked there in turn.
                Ok(real) if follow => Self::prepare_at(&real, false),
                // A link that leads nowhere (yet) is replaced by the file.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    Ok(Destination::Replace { dir, name })
                }
                Ok(_) => Err(FileError::NotRegular { path: target }),
                Err(e) => Err(io_at(&target, e)),
            },
            _ => {
                let f = dir
                    .open_file(&name, libc::O_WRONLY | libc::O_NONBLOCK, 0)
                    .map_err(|e| match e.raw_os_error() {
                        Some(libc::ENXIO) => FileError::UnreadFifo {
                            path: target.clone(),
                        },
                        _ => io_at(&target, e),
                    })?;
                // SAFETY: fcntl on a descriptor `f` owns: writes may block
                // from now on, as any write to a pipe.
                unsafe {
                    let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
                    libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
                }
                Ok(Destination::InPlace(f))
            }
        }
    }

    /// Writes `bytes`: in place, or to a new file (`mode`) renamed over
    /// the destination once complete (and, with `sync`, on disk first).
    pub fn write(self, bytes: &[u8], mode: u32, sync: bool) -> Result<(), FileError> {
        match self {
            Destination::InPlace(mut f) => f
                .write_all(bytes)
                .map_err(|e| io_at(Path::new("(destination)"), e)),
            Destination::Replace { dir, name } => {
                let at = dir.path().join(&name);
                let (tmp, mut f) = dir.create_temp(&name, 0o600).map_err(|e| io_at(&at, e))?;
                let r = (|| {
                    f.write_all(bytes)?;
                    // SAFETY: a descriptor `f` owns; fchmod changes only
                    // the file's mode (the umask applied at creation).
                    if unsafe { libc::fchmod(f.as_raw_fd(), mode) } != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    if sync {
                        f.sync_all()?;
                    }
                    dir.rename(&tmp, &name)
                })();
                if let Err(e) = r {
                    let _ = dir.unlink(&tmp);
                    return Err(io_at(&at, e));
                }
                Ok(())
            }
        }
    }
}

/// Opens `path` for reading if it is a regular file: not through a link
/// (a link is [`FileError::NotRegular`]) and without waiting (a FIFO
/// opens at once and is refused). For files another user may have put
/// where this one reads.
pub fn open_regular(path: &Path) -> Result<File, FileError> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => FileError::NotRegular { path: path.into() },
            _ => io_at(path, e),
        })?;
    match f.metadata() {
        Ok(m) if m.is_file() => Ok(f),
        Ok(_) => Err(FileError::NotRegular { path: path.into() }),
        Err(e) => Err(io_at(path, e)),
    }
}

/// Writes `bytes` to `path` as [`Destination`] says, a new file with
/// `mode`.
pub fn write_destination(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FileError> {
    Destination::prepare(path)?.write(bytes, mode, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rtprof-files-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    #[test]
    fn a_new_file_is_written_whole_with_its_mode() {
        let d = scratch("new");
        let p = d.join("r.json");
        write_destination(&p, b"{}", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"{}");
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        write_destination(&p, b"[1]", 0o640).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"[1]");
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o640);
        // Nothing left beside it.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn devices_and_fifos_are_written_in_place() {
        write_destination(Path::new("/dev/null"), b"x", 0o600).unwrap();
        let st = std::fs::metadata("/dev/null").unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_char_device(
            &st.file_type()
        ));
        let d = scratch("fifo");
        let fifo = d.join("f");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = write_destination(&fifo, b"x", 0o600).unwrap_err();
        assert!(matches!(e, FileError::UnreadFifo { .. }), "{e}");
        let reader = {
            let f = fifo.clone();
            std::thread::spawn(move || std::fs::read(f).unwrap())
        };
        // The reader opens the FIFO at some point: try until it has.
        let mut tries = 0;
        loop {
            match write_destination(&fifo, b"through", 0o600) {
                Ok(()) => break,
                Err(FileError::UnreadFifo { .. }) if tries < 2000 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(reader.join().unwrap(), b"through");
        let st = std::fs::symlink_metadata(&fifo).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_fifo(&st.file_type()));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn shared_directories_are_refused_unless_sticky_and_the_file_is_ours() {
        let d = scratch("shared");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = write_destination(&d.join("r"), b"x", 0o600).unwrap_err();
        assert!(matches!(e, FileError::SharedDirectory { .. }), "{e}");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
        write_destination(&d.join("r"), b"x", 0o600).unwrap();
        // Another user's file at the name, in a sticky shared directory:
        // refused, left as it is.
        std::fs::write(d.join("hers"), b"hers").unwrap();
        std::os::unix::fs::chown(d.join("hers"), Some(65534), Some(65534)).unwrap();
        let e = write_destination(&d.join("hers"), b"x", 0o600).unwrap_err();
        assert!(matches!(e, FileError::NotOwnDestination { .. }), "{e}");
        assert_eq!(std::fs::read(d.join("hers")).unwrap(), b"hers");
        // A link planted at the name, in a sticky shared directory.
        std::os::unix::fs::symlink("/nonexistent-target", d.join("planted")).unwrap();
        let e = write_destination(&d.join("planted"), b"x", 0o600).unwrap_err();
        assert!(matches!(e, FileError::NotOwnDestination { .. }), "{e}");
        assert!(std::fs::symlink_metadata(d.join("planted"))
            .unwrap()
            .file_type()
            .is_symlink());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_link_in_a_private_directory_leads_to_what_it_names() {
        let d = scratch("link");
        std::fs::write(d.join("target"), b"old").unwrap();
        std::os::unix::fs::symlink(d.join("target"), d.join("link")).unwrap();
        write_destination(&d.join("link"), b"new", 0o600).unwrap();
        assert!(std::fs::symlink_metadata(d.join("link"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(d.join("target")).unwrap(), b"new");
        // A link to a device: written in place.
        std::os::unix::fs::symlink("/dev/null", d.join("null")).unwrap();
        write_destination(&d.join("null"), b"x", 0o600).unwrap();
        assert!(std::fs::symlink_metadata(d.join("null"))
            .unwrap()
            .file_type()
            .is_symlink());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_private_group_may_write_the_users_own_directory() {
        // SAFETY: stat is plain data.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        st.st_uid = 1000;
        st.st_gid = 1000;
        st.st_mode = libc::S_IFDIR | 0o775;
        assert!(!others_may_write(&st, 1000, 1000));
        assert!(others_may_write(&st, 1000, 100));
        st.st_uid = 1001;
        assert!(others_may_write(&st, 1000, 1000));
        st.st_uid = 0;
        st.st_mode = libc::S_IFDIR | 0o755;
        assert!(!others_may_write(&st, 1000, 1000));
        st.st_mode = libc::S_IFDIR | 0o1777;
        assert!(others_may_write(&st, 1000, 1000));
    }

    #[test]
    fn a_descriptors_name_is_that_descriptor() {
        assert_eq!(descriptor_number(Path::new("/dev/stdout")), Some(1));
        assert_eq!(descriptor_number(Path::new("/dev/stderr")), Some(2));
        assert_eq!(descriptor_number(Path::new("/proc/self/fd/7")), Some(7));
        assert_eq!(descriptor_number(Path::new("/dev/fd/3")), Some(3));
        assert_eq!(descriptor_number(Path::new("/dev/null")), None);
        // A socket, which cannot be opened by its /proc name: duplicated.
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let p = PathBuf::from(format!("/proc/self/fd/{}", a.as_raw_fd()));
        write_destination(&p, b"through", 0o600).unwrap();
        drop(a);
        let mut got = String::new();
        std::io::Read::read_to_string(&mut &b, &mut got).unwrap();
        assert_eq!(got, "through");
    }

    #[test]
    fn a_directory_is_opened_where_it_was_resolved() {
        let d = scratch("resolve");
        std::fs::create_dir_all(d.join("a")).unwrap();
        std::fs::create_dir_all(d.join("b")).unwrap();
        std::fs::write(d.join("a/entry"), b"from a").unwrap();
        std::fs::write(d.join("b/entry"), b"from b").unwrap();
        std::os::unix::fs::symlink(d.join("a"), d.join("link")).unwrap();
        let mut seen = Vec::new();
        let dir = Dir::open(&d.join("link"), |p, _, last| {
            seen.push((p.to_path_buf(), last));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen.last().unwrap(), &(d.join("a"), true));
        // Re-pointed after the walk: the descriptor still names `a`.
        std::fs::remove_file(d.join("link")).unwrap();
        std::os::unix::fs::symlink(d.join("b"), d.join("link")).unwrap();
        let mut f = dir.open_file("entry", libc::O_RDONLY, 0).unwrap();
        let mut s = String::new();
        std::io::Read::read_to_string(&mut f, &mut s).unwrap();
        assert_eq!(s, "from a");
        // A link in the directory is not followed.
        std::os::unix::fs::symlink(d.join("b/entry"), d.join("a/linked")).unwrap();
        let e = dir.open_file("linked", libc::O_RDONLY, 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
