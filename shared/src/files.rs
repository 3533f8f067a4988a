//! Files rtprof creates or trusts, reached through directory descriptors so
//! that no name can be re-pointed between a check and its use: a path is
//! walked component by component from `/` (or the working directory) with
//! `O_NOFOLLOW`, a link on the way read and what it names walked in turn,
//! unless the link may have been planted by another user (in a sticky
//! directory every user may write, as /tmp, and owned by neither the
//! directory's owner nor this user: the kernel's `protected_symlinks`
//! rule, applied whether or not the system sets it), each directory
//! checked on its descriptor; files are created beside their destination
//! under names no one can predict, with `O_CREAT|O_EXCL|O_NOFOLLOW`, and
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
    /// A link in a sticky directory every user may write (as /tmp), owned
    /// by `owner`, neither the directory's owner nor this user: anyone
    /// could have planted it there, so it is not followed.
    ProtectedLink {
        path: PathBuf,
        owner: u32,
    },
    /// More than [`MAX_LINKS`] links on the way (a loop of links).
    TooManyLinks {
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
            FileError::ProtectedLink { path, owner } => write!(
                f,
                "{}: a link owned by user {owner} in a sticky directory other users may write, \
                 not the directory's owner's nor this user's; not followed",
                path.display()
            ),
            FileError::TooManyLinks { path } => write!(
                f,
                "{}: more than {MAX_LINKS} links on the way; not followed",
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

/// Links one resolution follows at most, the kernel's own bound
/// (`MAXSYMLINKS`): a loop of links is an error, not a hang.
pub const MAX_LINKS: u32 = 40;

/// `name` in `dirfd` as a directory handle that reads nothing
/// (`O_PATH|O_DIRECTORY`), a link at `name` not followed.
fn open_dir_at(dirfd: libc::c_int, name: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name relative to a directory descriptor the
    // caller holds (or AT_FDCWD); the new descriptor is owned below.
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
}

/// Status of `name` in `dirfd`, the link itself if it is one.
fn lstat_at(dirfd: libc::c_int, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data, filled by fstatat before use.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated name relative to a descriptor the caller
    // holds, a stat on our stack.
    let r = unsafe { libc::fstatat(dirfd, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// What the link `name` in `dirfd` names.
fn readlink_at(dirfd: libc::c_int, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: a NUL-terminated name relative to a descriptor the caller
    // holds; readlinkat writes at most `buf.len()` bytes into `buf`.
    let n = unsafe { libc::readlinkat(dirfd, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // A target that fills the buffer may have been cut short.
    if n as usize >= buf.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// Whether a link found in the directory `dir` may be followed by `euid`:
/// the rule of the kernel's `fs.protected_symlinks`, applied whatever that
/// setting says. Anyone may plant a link in a sticky directory every user
/// may write (as /tmp), so there only a link owned by the directory's
/// owner or by the follower is followed.
pub fn may_follow_link(dir: &libc::stat, link: &libc::stat, euid: u32) -> bool {
    let open_sticky = sticky(dir) && dir.st_mode & 0o002 != 0;
    !open_sticky || link.st_uid == dir.st_uid || link.st_uid == euid
}

/// One part of a path still to walk.
enum Part {
    Root,
    Up,
    Name(Vec<u8>),
}

/// `path`'s parts, in walking order.
fn parts(path: &Path) -> Vec<Part> {
    path.components()
        .filter_map(|c| match c {
            Component::RootDir => Some(Part::Root),
            Component::ParentDir => Some(Part::Up),
            Component::Normal(n) => Some(Part::Name(n.as_bytes().to_vec())),
            Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// A walk through directories, one component at a time, each opened
/// relative to the one above without following links: the directories
/// from where the walk started down to where it is, each with its path
/// (for messages).
struct Walk {
    steps: Vec<(OwnedFd, PathBuf)>,
    euid: u32,
}

impl Walk {
    /// A walk from `/`.
    fn root(euid: u32) -> Result<Walk, FileError> {
        let at = PathBuf::from("/");
        let fd = open_dir_at(libc::AT_FDCWD, c"/").map_err(|e| io_at(&at, e))?;
        Ok(Walk {
            steps: vec![(fd, at)],
            euid,
        })
    }

    /// A walk for `path`: from `/` if it is absolute, else from `from`
    /// (or the working directory).
    fn start(path: &Path, from: Option<&Dir>, euid: u32) -> Result<Walk, FileError> {
        if path.is_absolute() {
            return Walk::root(euid);
        }
        let (fd, at) = match from {
            Some(d) => (
                d.fd.try_clone().map_err(|e| io_at(&d.path, e))?,
                d.path.clone(),
            ),
            None => {
                let at = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
                let fd = open_dir_at(libc::AT_FDCWD, c".").map_err(|e| io_at(&at, e))?;
                (fd, at)
            }
        };
        Ok(Walk {
            steps: vec![(fd, at)],
            euid,
        })
    }

    fn top(&self) -> &(OwnedFd, PathBuf) {
        self.steps.last().expect("a walk always has a directory")
    }

    /// The directory above `(fd, at)`, `None` at the root.
    fn above(fd: &OwnedFd, at: &Path) -> Result<Option<(OwnedFd, PathBuf)>, FileError> {
        let up = open_dir_at(fd.as_raw_fd(), c"..").map_err(|e| io_at(at, e))?;
        let (a, b) = (
            fstat(fd).map_err(|e| io_at(at, e))?,
            fstat(&up).map_err(|e| io_at(at, e))?,
        );
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) {
            return Ok(None);
        }
        let path = match at.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => at.join(".."),
        };
        Ok(Some((up, path)))
    }

    /// Walks `path` from where the walk is. A link on the way is followed
    /// (at most `links` more in all) unless the kernel's
    /// `protected_symlinks` rule forbids it ([`may_follow_link`]), checked
    /// on the link and the directory it was found in, whatever the
    /// system's setting.
    fn walk(&mut self, path: &Path, links: &mut u32) -> Result<(), FileError> {
        let mut todo = parts(path);
        todo.reverse();
        while let Some(part) = todo.pop() {
            let name = match part {
                Part::Root => {
                    *self = Walk::root(self.euid)?;
                    continue;
                }
                Part::Up if self.steps.len() > 1 => {
                    self.steps.pop();
                    continue;
                }
                Part::Up => {
                    let (fd, at) = self.top();
                    if let Some(up) = Walk::above(fd, at)? {
                        self.steps = vec![up];
                    }
                    continue;
                }
                Part::Name(n) => n,
            };
            let (dirfd, dir_at) = self.top();
            let at = dir_at.join(std::ffi::OsStr::from_bytes(&name));
            let c = cstr(&name).map_err(|e| io_at(&at, e))?;
            let err = match open_dir_at(dirfd.as_raw_fd(), &c) {
                Ok(fd) => {
                    self.steps.push((fd, at));
                    continue;
                }
                Err(e) => e,
            };
            // O_NOFOLLOW|O_DIRECTORY on a link fails (ELOOP or ENOTDIR):
            // is it one?
            if !matches!(err.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) {
                return Err(io_at(&at, err));
            }
            let link = lstat_at(dirfd.as_raw_fd(), &c).map_err(|e| io_at(&at, e))?;
            if file_type(&link) != libc::S_IFLNK {
                return Err(io_at(&at, err));
            }
            let dir = fstat(dirfd).map_err(|e| io_at(dir_at, e))?;
            if !may_follow_link(&dir, &link, self.euid) {
                return Err(FileError::ProtectedLink {
                    path: at,
                    owner: link.st_uid,
                });
            }
            if *links == 0 {
                return Err(FileError::TooManyLinks { path: at });
            }
            *links -= 1;
            let target = readlink_at(dirfd.as_raw_fd(), &c).map_err(|e| io_at(&at, e))?;
            // What the link names, walked from the directory it is in,
            // before the rest.
            let mut more = parts(Path::new(std::ffi::OsStr::from_bytes(&target)));
            more.reverse();
            todo.extend(more);
        }
        Ok(())
    }

    fn into_dir(mut self) -> Dir {
        let (fd, path) = self.steps.pop().expect("a walk always has a directory");
        Dir { fd, path }
    }
}

/// How much of a destination's name its temporary name keeps: a name is
/// at most 255 bytes, and the rest needs 45.
const TEMP_NAME_KEEPS: usize = 200;

/// `.name.rtprof-` and `bits` in hex: hidden, beside `name`.
fn temp_name(name: &str, bits: u128) -> String {
    let mut keep = name.len().min(TEMP_NAME_KEEPS);
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    format!(".{}.rtprof-{bits:032x}", &name[..keep])
}

/// 128 bits no other user can predict, from getrandom(2) without waiting
/// (`GRND_NONBLOCK`; early in boot, before the pool is ready,
/// `GRND_INSECURE`, which never waits). Where getrandom is refused (a
/// seccomp filter, a kernel before 3.17), the clocks, the pid and a count:
/// a name guessed then only makes `O_EXCL` fail, and the next try differs.
fn unpredictable() -> u128 {
    let mut b = [0u8; 16];
    for flags in [libc::GRND_NONBLOCK, libc::GRND_INSECURE] {
        // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
        let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), flags) };
        if n == b.len() as isize {
            return u128::from_ne_bytes(b);
        }
    }
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let count = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let clock = |id| {
        // SAFETY: timespec is plain data, filled by clock_gettime.
        let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
        // SAFETY: a timespec on our stack; a failure leaves it zero.
        unsafe { libc::clock_gettime(id, &mut ts) };
        (ts.tv_sec as u64).wrapping_mul(1_000_000_000) ^ ts.tv_nsec as u64
    };
    // splitmix64's finaliser: each input bit spreads over the output.
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let hi = mix(clock(libc::CLOCK_REALTIME) ^ count.rotate_left(32));
    let lo = mix(clock(libc::CLOCK_MONOTONIC) ^ u64::from(std::process::id()) ^ hi);
    (u128::from(hi) << 64) | u128::from(lo)
}

/// A directory opened by [`Dir::open`]: names are looked up relative to
/// it, never through its path again.
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

impl Dir {
    /// Opens the directory `path`, walked from `/` (or the working
    /// directory, for a relative path) component by component with
    /// `O_NOFOLLOW`; a link on the way is read and what it names walked in
    /// turn, unless found in a sticky directory every user may write and
    /// owned by neither that directory's owner nor this user
    /// ([`FileError::ProtectedLink`]). Then `check` sees each directory of
    /// the path as resolved, from `/` down: its path, its status (from its
    /// descriptor) and whether it is the last.
    pub fn open(
        path: &Path,
        mut check: impl FnMut(&Path, &libc::stat, bool) -> Result<(), FileError>,
    ) -> Result<Dir, FileError> {
        // SAFETY: geteuid cannot fail.
        let euid = unsafe { libc::geteuid() };
        let mut walk = Walk::start(path, None, euid)?;
        let mut links = MAX_LINKS;
        walk.walk(path, &mut links)?;
        // The directories above where the walk began (all of them, for a
        // relative path), so that `check` sees the whole path.
        let mut above = Vec::new();
        let mut from = Walk::above(&walk.steps[0].0, &walk.steps[0].1)?;
        while let Some((fd, at)) = from {
            from = Walk::above(&fd, &at)?;
            above.push((fd, at));
        }
        above.reverse();
        let n = above.len() + walk.steps.len();
        for (i, (fd, at)) in above.iter().chain(walk.steps.iter()).enumerate() {
            check(at, &fstat(fd).map_err(|e| io_at(at, e))?, i + 1 == n)?;
        }
        Ok(walk.into_dir())
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

    /// A new file beside `name`, `.name.rtprof-` and 32 hex digits no
    /// one can predict ([`unpredictable`]): a name planted in advance
    /// cannot stop the write. Created with `O_CREAT|O_EXCL|O_NOFOLLOW` and
    /// `mode` (nothing at the name is followed nor taken over), open for
    /// reading and writing (a segment is mapped shared).
    pub fn create_temp(&self, name: &str, mode: u32) -> io::Result<(String, File)> {
        let mut tries = 0;
        loop {
            let tmp = temp_name(name, unpredictable());
            match self.open_file(&tmp, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, mode) {
                Ok(f) => return Ok((tmp, f)),
                // Only a guess (or the clock of the fallback) collides.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 16 => tries += 1,
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

/// What a destination's path leads to, once settled.
enum Settled {
    /// Nothing at `name` in `dir` yet.
    Absent(Dir, String),
    Found(Destination),
}

impl Destination {
    /// Settles where `path` is written. A descriptor's name is that
    /// descriptor (duplicated, whatever it is: a pipe, a socket, a file
    /// written after what the program wrote). Otherwise the directory is
    /// walked to (see [`Dir::open`]: a link on the way that another user
    /// may have planted in a sticky shared directory is refused) and the
    /// name looked up in it without following a link: a directory other
    /// users may write must be sticky, and the name there absent or this
    /// user's own (file, FIFO, device or link alike); a link elsewhere is
    /// followed to where it leads, checked there in turn (one that leads
    /// nowhere is replaced by the file); a device, FIFO or socket is
    /// opened now, without waiting (a FIFO that nobody reads is an error,
    /// not a hang).
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
        let mut links = MAX_LINKS;
        match Self::settle(path, None, &mut links)? {
            Settled::Absent(dir, name) => Ok(Destination::Replace { dir, name }),
            Settled::Found(d) => Ok(d),
        }
    }

    /// Settles `path`, walked from `from` if it is relative (else from the
    /// working directory), following at most `links` more links.
    fn settle(path: &Path, from: Option<&Dir>, links: &mut u32) -> Result<Settled, FileError> {
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
        let mut walk = Walk::start(parent, from, euid)?;
        walk.walk(parent, links)?;
        let dir = walk.into_dir();
        let st = fstat(&dir.fd).map_err(|e| io_at(dir.path(), e))?;
        let shared = others_may_write(&st, euid, egid);
        if shared && !sticky(&st) {
            return Err(FileError::SharedDirectory {
                path: dir.path().into(),
            });
        }
        let target = dir.path().join(&name);
        let Some(t) = dir.stat(&name).map_err(|e| io_at(&target, e))? else {
            return Ok(Settled::Absent(dir, name));
        };
        if shared && t.st_uid != euid {
            return Err(FileError::NotOwnDestination { path: target });
        }
        let found = match file_type(&t) {
            libc::S_IFDIR => return Err(FileError::IsDirectory { path: target }),
            libc::S_IFREG => Destination::Replace { dir, name },
            libc::S_IFLNK if shared => return Err(FileError::NotOwnDestination { path: target }),
            libc::S_IFLNK => {
                if *links == 0 {
                    return Err(FileError::TooManyLinks { path: target });
                }
                *links -= 1;
                let c = cstr(name.as_bytes()).map_err(|e| io_at(&target, e))?;
                let to = readlink_at(dir.fd.as_raw_fd(), &c).map_err(|e| io_at(&target, e))?;
                let to = Path::new(std::ffi::OsStr::from_bytes(&to));
                // Where the link leads, walked from the link's directory
                // and checked there in turn; one that leads nowhere (yet)
                // is replaced by the file.
                return match Self::settle(to, Some(&dir), links) {
                    Ok(Settled::Absent(..)) => {
                        Ok(Settled::Found(Destination::Replace { dir, name }))
                    }
                    Err(FileError::Io { source, .. })
                        if source.kind() == io::ErrorKind::NotFound =>
                    {
                        Ok(Settled::Found(Destination::Replace { dir, name }))
                    }
                    r => r,
                };
            }
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
                Destination::InPlace(f)
            }
        };
        Ok(Settled::Found(found))
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

    /// A link `at` to `to`, owned by `uid` (root makes it for another
    /// user, as that user could have).
    fn link_owned_by(to: &Path, at: &Path, uid: u32) {
        std::os::unix::fs::symlink(to, at).unwrap();
        std::os::unix::fs::lchown(at, Some(uid), Some(uid)).unwrap();
    }

    #[test]
    fn links_in_sticky_shared_directories_follow_the_kernels_rule() {
        // SAFETY: stat is plain data.
        let mut dir: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut link: libc::stat = unsafe { std::mem::zeroed() };
        dir.st_mode = libc::S_IFDIR | 0o1777;
        dir.st_uid = 0;
        link.st_uid = 65534;
        // Another user's link in /tmp: not for root, nor for a third user.
        assert!(!may_follow_link(&dir, &link, 0));
        assert!(!may_follow_link(&dir, &link, 1000));
        // Her own link, for her; the directory owner's link, for anyone.
        assert!(may_follow_link(&dir, &link, 65534));
        link.st_uid = 0;
        assert!(may_follow_link(&dir, &link, 1000));
        // Not sticky, or sticky but not writable by all: followed.
        link.st_uid = 65534;
        dir.st_mode = libc::S_IFDIR | 0o777;
        assert!(may_follow_link(&dir, &link, 0));
        dir.st_mode = libc::S_IFDIR | 0o1775;
        assert!(may_follow_link(&dir, &link, 0));
    }

    #[test]
    fn a_link_another_user_planted_in_a_sticky_directory_is_not_followed() {
        let d = scratch("protected");
        let sticky = d.join("sticky");
        let private = d.join("private");
        std::fs::create_dir(&sticky).unwrap();
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
        std::fs::write(private.join("important"), b"root's own").unwrap();
        std::fs::create_dir(private.join("sub")).unwrap();
        link_owned_by(&private, &sticky.join("d"), 65534);
        // The last directory, and one further up the path.
        for dest in [
            sticky.join("d/important"),
            sticky.join("d/new"),
            sticky.join("d/sub/new"),
        ] {
            let e = write_destination(&dest, b"x", 0o600).unwrap_err();
            match &e {
                FileError::ProtectedLink { path, owner } => {
                    assert_eq!((path, *owner), (&sticky.join("d"), 65534), "{e}")
                }
                _ => panic!("{}: {e}", dest.display()),
            }
            assert!(e.to_string().contains("not followed"), "{e}");
        }
        assert_eq!(
            std::fs::read(private.join("important")).unwrap(),
            b"root's own"
        );
        assert!(!private.join("new").exists() && !private.join("sub/new").exists());
        let e = Dir::open(&sticky.join("d/sub"), |_, _, _| Ok(())).err();
        assert!(matches!(e, Some(FileError::ProtectedLink { .. })));
        // Reached through a link of this user's elsewhere, as well.
        let mine = d.join("mine");
        std::fs::create_dir(&mine).unwrap();
        std::os::unix::fs::symlink(sticky.join("d/important"), mine.join("r")).unwrap();
        let e = write_destination(&mine.join("r"), b"x", 0o600).unwrap_err();
        assert!(matches!(e, FileError::ProtectedLink { .. }), "{e}");
        assert_eq!(
            std::fs::read(private.join("important")).unwrap(),
            b"root's own"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn links_of_the_directory_owner_or_the_writer_are_followed() {
        let d = scratch("own-links");
        let sticky = d.join("sticky");
        let private = d.join("private");
        std::fs::create_dir(&sticky).unwrap();
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
        // SAFETY: geteuid cannot fail.
        let euid = unsafe { libc::geteuid() };
        link_owned_by(&private, &sticky.join("d"), euid);
        write_destination(&sticky.join("d/r"), b"through", 0o600).unwrap();
        assert_eq!(std::fs::read(private.join("r")).unwrap(), b"through");
        let dir = Dir::open(&sticky.join("d"), |_, _, _| Ok(())).unwrap();
        assert_eq!(dir.path(), private);
        // A relative link, and `..` after it: resolved where the link is.
        std::fs::create_dir(private.join("sub")).unwrap();
        std::os::unix::fs::symlink("../private/sub", sticky.join("rel")).unwrap();
        let dir = Dir::open(&sticky.join("rel/../sub/."), |_, _, _| Ok(())).unwrap();
        assert_eq!(dir.path(), private.join("sub"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_loop_of_links_ends_in_an_error() {
        let d = scratch("loop");
        std::os::unix::fs::symlink("b", d.join("a")).unwrap();
        std::os::unix::fs::symlink("a", d.join("b")).unwrap();
        let e = write_destination(&d.join("a/r"), b"x", 0o600).unwrap_err();
        assert!(matches!(e, FileError::TooManyLinks { .. }), "{e}");
        let e = write_destination(&d.join("a"), b"x", 0o600).unwrap_err();
        assert!(matches!(e, FileError::TooManyLinks { .. }), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_link_that_leads_nowhere_is_replaced_by_the_file() {
        let d = scratch("dangling");
        std::os::unix::fs::symlink(d.join("absent"), d.join("a")).unwrap();
        std::os::unix::fs::symlink(d.join("no/such/dir/f"), d.join("b")).unwrap();
        for n in ["a", "b"] {
            write_destination(&d.join(n), b"x", 0o600).unwrap();
            let m = std::fs::symlink_metadata(d.join(n)).unwrap();
            assert!(m.is_file(), "{n}");
        }
        assert!(!d.join("absent").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_relative_path_is_walked_from_the_working_directory() {
        let cwd = std::env::current_dir().unwrap();
        let mut seen = Vec::new();
        let dir = Dir::open(Path::new("src/../src"), |p, _, last| {
            seen.push((p.to_path_buf(), last));
            Ok(())
        })
        .unwrap();
        assert_eq!(dir.path(), cwd.join("src"));
        // Every directory from `/` down, for checks on the ones above.
        assert_eq!(seen.first().unwrap(), &(PathBuf::from("/"), false));
        assert_eq!(seen.last().unwrap(), &(cwd.join("src"), true));
        assert_eq!(seen.len(), cwd.join("src").components().count());
    }

    #[test]
    fn temporary_names_are_unpredictable_and_short_enough() {
        let (a, b) = (unpredictable(), unpredictable());
        assert_ne!(a, b);
        assert_ne!(a, 0);
        let n = temp_name("r.json", a);
        assert!(
            n.starts_with(".r.json.rtprof-") && n.len() == 15 + 32,
            "{n}"
        );
        let long = "é".repeat(127);
        assert!(temp_name(&long, a).len() <= 255);
        // Names an earlier version used, planted: no obstacle.
        let d = scratch("planted");
        let dir = Dir::open(&d, |_, _, _| Ok(())).unwrap();
        for n in 0..=100 {
            let at = d.join(format!(".r.rtprof-{}-{n}", std::process::id()));
            std::os::unix::fs::symlink("/nonexistent", at).unwrap();
        }
        let (tmp, _) = dir.create_temp("r", 0o600).unwrap();
        assert!(!tmp.contains(&format!("-{}-", std::process::id())), "{tmp}");
        write_destination(&d.join("r"), b"x", 0o600).unwrap();
        assert_eq!(std::fs::read(d.join("r")).unwrap(), b"x");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
