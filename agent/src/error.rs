//! Why something the agent tried did not happen, one type per layer:
//! [`Errno`], what a system call said; [`DiscoverError`], why a module's
//! file gives no functions; [`PlanError`], why a module's file gives no
//! plan or a cache entry is not used or written; [`PatchError`], why
//! entries or counting switches could not be written; [`CountError`], why
//! there is no counter segment; [`LifecycleError`], why a libc function
//! goes without its hook. Every failure leaves the process running as it
//! would without the agent; these only say why, under `RTPROF_VERBOSE`
//! (some end-to-end tests match the words, so they change only with the
//! tests).

use crate::patch::stopworld::{DEADLINE, MAX_THREADS};
use std::fmt;
use std::io;
use std::path::PathBuf;

/// An errno value. `Copy` and made without allocating: it is returned in
/// signal handlers, in a forked child and with the other threads stopped.
/// Shown (which allocates) as the system describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// The calling thread's errno, as the last failed call left it.
    pub fn last() -> Errno {
        // SAFETY: `__errno_location` is this thread's errno, always valid.
        Errno(unsafe { *libc::__errno_location() })
    }

    /// The errno an I/O error carries (0 if it carries none).
    pub fn of(e: &io::Error) -> Errno {
        Errno(e.raw_os_error().unwrap_or(0))
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        io::Error::from_raw_os_error(self.0).fmt(f)
    }
}

impl std::error::Error for Errno {}

/// Why a module's file gives no plan, or a plan cache entry is not read
/// or not written.
#[derive(Debug)]
pub enum PlanError {
    // The module's file (discover/fileimage.rs).
    /// The file at the module's path cannot be opened.
    Open(io::Error),
    /// Opened, but not examined.
    Stat(io::Error),
    /// The module has no loaded segment.
    NoLoadedSegment,
    /// Its first segment is not in the memory map.
    NotMapped,
    /// The file at its path is another than the one mapped.
    Replaced,
    /// The file cannot be mapped.
    Map(io::Error),
    /// Its functions cannot be listed (plan/pipeline.rs).
    NotElf(DiscoverError),

    // Where the cache is (plan/cache.rs).
    /// A cache directory, or one above it, or an entry, that cannot be
    /// examined, opened or created.
    Io {
        path: PathBuf,
        source: io::Error,
    },
    /// The cache directory is not a directory owned by this user or root
    /// and writable by no one else.
    DirNotTrusted {
        path: PathBuf,
    },
    /// A directory above the cache may be written by other users.
    AncestorWritable {
        path: PathBuf,
    },
    /// An entry not owned by this user or root, or writable by others.
    EntryNotTrusted {
        path: PathBuf,
    },
    /// An entry larger than the whole cache may be.
    TooLarge {
        path: PathBuf,
    },
    /// An entry opened but not examined or mapped.
    Unreadable(io::Error),
    /// An entry not written (or not renamed into place).
    Write(io::Error),

    // An entry's bytes (cache.rs `decode`).
    NotACacheEntry,
    /// A plan where a function list is asked for, or the other way round.
    OtherKind,
    /// Another format, or another agent build (which may decide otherwise).
    OtherBuild,
    /// Another file's identity.
    OtherFile,
    BadSource,
    /// Lengths that overflow.
    BadLength,
    /// Lengths that do not add up to the entry's size.
    Truncated,
    Checksum,
    BadName,
    BadPlan,
    BadOutcome,
    /// A per-process outcome, a pad too large, or functions out of order.
    BadRecord,
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Open(e) => write!(f, "cannot open: {e}"),
            PlanError::Stat(e) => write!(f, "cannot stat: {e}"),
            PlanError::NoLoadedSegment => f.write_str("no loaded segment"),
            PlanError::NotMapped => f.write_str("its first segment is not mapped"),
            PlanError::Replaced => {
                f.write_str("the file at its path is not the one mapped (replaced since?)")
            }
            PlanError::Map(e) => write!(f, "cannot map: {e}"),
            PlanError::NotElf(e) => e.fmt(f),
            PlanError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            PlanError::DirNotTrusted { path } => write!(
                f,
                "{}: not a directory owned by this user or root and writable only by them",
                path.display()
            ),
            PlanError::AncestorWritable { path } => {
                write!(f, "{}: writable by other users", path.display())
            }
            PlanError::EntryNotTrusted { path } => write!(
                f,
                "{}: not owned by this user or root, or writable by others",
                path.display()
            ),
            PlanError::TooLarge { path } => write!(f, "{}: too large", path.display()),
            PlanError::Unreadable(e) | PlanError::Write(e) => e.fmt(f),
            PlanError::NotACacheEntry => f.write_str("not a cache entry"),
            PlanError::OtherKind => f.write_str("another kind of entry"),
            PlanError::OtherBuild => f.write_str("written by another agent build"),
            PlanError::OtherFile => f.write_str("made for another file"),
            PlanError::BadSource => f.write_str("bad symbol source"),
            PlanError::BadLength => f.write_str("bad length"),
            PlanError::Truncated => f.write_str("truncated or padded"),
            PlanError::Checksum => f.write_str("checksum mismatch"),
            PlanError::BadName => f.write_str("bad name"),
            PlanError::BadPlan => f.write_str("bad plan"),
            PlanError::BadOutcome => f.write_str("bad outcome"),
            PlanError::BadRecord => f.write_str("bad record"),
        }
    }
}

// No `source()`: every message already ends with its cause's text, and a
// reporter walking the chain would print it twice.
impl std::error::Error for PlanError {}

impl From<DiscoverError> for PlanError {
    fn from(e: DiscoverError) -> PlanError {
        PlanError::NotElf(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_reads_as_the_system_says() {
        for e in [
            libc::EPERM,
            libc::ENOENT,
            libc::EWOULDBLOCK,
            libc::ENOSYS,
            0,
        ] {
            let io = io::Error::from_raw_os_error(e);
            assert_eq!(Errno(e).to_string(), io.to_string());
            assert_eq!(Errno::of(&io), Errno(e));
        }
        assert_eq!(Errno::of(&io::Error::other("not the system's")), Errno(0));
    }

    #[test]
    fn errno_last_is_this_threads_without_allocating() {
        // SAFETY: this thread's errno slot.
        unsafe { *libc::__errno_location() = libc::EMFILE };
        let before = crate::test_alloc::allocs();
        let e = Errno::last();
        assert_eq!(crate::test_alloc::allocs(), before, "allocated");
        assert_eq!(e, Errno(libc::EMFILE));
        std::thread::spawn(|| {
            // SAFETY: as above, in the new thread.
            unsafe { *libc::__errno_location() = 0 };
            assert_eq!(Errno::last(), Errno(0));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn plan_errors_keep_their_wording() {
        let enoent = || io::Error::from_raw_os_error(libc::ENOENT);
        let cases = [
            (
                PlanError::Open(enoent()),
                "cannot open: No such file or directory (os error 2)",
            ),
            (
                PlanError::Replaced,
                "the file at its path is not the one mapped (replaced since?)",
            ),
            (
                PlanError::NotElf(DiscoverError::NotElf64),
                "not a 64-bit ELF file",
            ),
            (
                PlanError::Io {
                    path: "/c/d".into(),
                    source: enoent(),
                },
                "/c/d: No such file or directory (os error 2)",
            ),
            (
                PlanError::AncestorWritable { path: "/c".into() },
                "/c: writable by other users",
            ),
            (
                PlanError::TooLarge {
                    path: "/c/x.rtc".into(),
                },
                "/c/x.rtc: too large",
            ),
            (
                PlanError::Write(enoent()),
                "No such file or directory (os error 2)",
            ),
            (PlanError::Checksum, "checksum mismatch"),
            (PlanError::OtherBuild, "written by another agent build"),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text, "{e:?}");
        }
    }
}

/// Why a module's file gives no functions.
#[derive(Debug)]
pub enum DiscoverError {
    /// The ELF parser's reason.
    Parse(String),
    NotElf64,
}

impl fmt::Display for DiscoverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiscoverError::Parse(e) => write!(f, "malformed ELF file: {e}"),
            DiscoverError::NotElf64 => f.write_str("not a 64-bit ELF file"),
        }
    }
}

impl std::error::Error for DiscoverError {}

/// Why entries or counting switches could not be written.
#[derive(Debug, PartialEq, Eq)]
pub enum PatchError {
    /// The stubs' page could not be made writable (a W^X policy).
    Protect(Errno),
    /// The other threads could not be stopped: a debugger or tracer
    /// already traces this process.
    Traced,
    /// ptrace of our own threads is not allowed here (Yama's ptrace scope,
    /// a process that is not dumpable, a seccomp filter): the errno.
    NotPermitted(Errno),
    /// The helper task that stops the threads could not be made.
    Helper(Errno),
    /// More threads than can be tracked.
    TooManyThreads,
    /// Some thread did not stop in time.
    Timeout,
}

impl fmt::Display for PatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PatchError::Protect(e) => write!(f, "stub memory cannot be made writable: {e}"),
            PatchError::Traced => write!(f, "the process is traced by a debugger"),
            PatchError::NotPermitted(e) => write!(f, "ptrace of its threads refused: {e}"),
            PatchError::Helper(e) => write!(f, "no helper task: {e}"),
            PatchError::TooManyThreads => write!(f, "more than {MAX_THREADS} threads"),
            PatchError::Timeout => write!(f, "a thread did not stop within {DEADLINE:?}"),
        }
    }
}

impl std::error::Error for PatchError {}

/// Why there is no counter segment.
#[derive(Debug)]
pub enum CountError {
    /// `rtprof run`'s directory is not one to write in.
    RunDir(String),
    Create(io::Error),
    Reserve(io::Error),
    Map(io::Error),
}

impl fmt::Display for CountError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CountError::RunDir(why) => write!(f, "run directory unusable: {why}"),
            CountError::Create(e) => write!(f, "cannot create counter segment: {e}"),
            CountError::Reserve(e) => write!(f, "cannot reserve counter memory: {e}"),
            CountError::Map(e) => write!(f, "cannot map counter segment: {e}"),
        }
    }
}

impl std::error::Error for CountError {}

/// Why a function of libc goes without its hook.
#[derive(Debug)]
pub enum LifecycleError {
    /// libc's function or its size was not found.
    NotFound,
    /// Its first instructions cannot be moved (the reason).
    Unmovable(rtprof_abi::Refusal),
    /// A branch, or an indirect jump that could be one, reaches them.
    BranchInto,
    /// No memory within jump range for the detour.
    NoMemory,
}

impl fmt::Display for LifecycleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LifecycleError::NotFound => write!(f, "libc's definition not found"),
            LifecycleError::Unmovable(r) => {
                write!(f, "its first instructions cannot be moved: {r:?}")
            }
            LifecycleError::BranchInto => write!(f, "a branch reaches its first instructions"),
            LifecycleError::NoMemory => write!(f, "no memory within jump range"),
        }
    }
}

impl std::error::Error for LifecycleError {}
