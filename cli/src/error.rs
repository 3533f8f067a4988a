//! Why an rtprof command fails: one enum for the whole tool, each variant
//! naming the reason and carrying what the system said or the value at
//! fault. `Display` is the sentence the user reads after the command's
//! prefix (`rtprof: `, `rtprof cache: `, ...); the end-to-end tests match
//! some of these words, so they change only with the tests.

use rtprof_abi::escape::escape_text;
use rtprof_abi::present::OpenError;
use rtprof_abi::protocol::MAX_PATTERN;
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;

#[derive(Debug)]
pub enum Error {
    // Finding the agent (agent.rs).
    /// rtprof cannot find its own executable, which the agent is installed
    /// beside.
    NoSelf(io::Error),
    /// A candidate agent that cannot be resolved to an absolute path.
    AgentPath { path: PathBuf, source: io::Error },
    /// The agent's absolute path has a space or a colon.
    AgentPathUnpreloadable(PathBuf),
    /// No agent at any of the places looked at.
    NoAgent { looked_at: Vec<PathBuf> },

    // rtprofd's presentation segment (presentation.rs).
    /// Its file cannot be opened, or is not a regular file.
    PresentOpen { path: PathBuf, source: OpenError },
    /// Its file was opened but cannot be examined or mapped.
    PresentMap { path: PathBuf, source: io::Error },

    // `rtprof cache` (cache.rs).
    /// Neither XDG_CACHE_HOME nor HOME says where the user's cache is.
    NoCacheDir,
    /// An entry that cannot be removed, by file name.
    CacheRemove { name: PathBuf, source: io::Error },
    /// A path to warm that cannot be examined or started.
    WarmStart { path: PathBuf, source: io::Error },
    /// A set-ID program to warm: it ignores the environment, so it would
    /// simply run.
    WarmSetId(PathBuf),
    /// A program (or /bin/true loading a library) that failed while
    /// warming.
    WarmFailed { path: PathBuf, status: ExitStatus },
    /// A program to warm the agent did not act in (switched off, a
    /// sandbox): it ended before its `main` with nothing cached.
    WarmNotDone(PathBuf),
    /// A program to warm that is not dynamically linked: nothing can be
    /// preloaded into it, so it would simply run.
    WarmStatic(PathBuf),

    // `rtprof switch` (switch.rs).
    /// A pattern the request cannot carry: empty, too long, or with NUL.
    BadPattern,
    /// rtprofd's socket does not answer.
    Unreachable { socket: PathBuf, source: io::Error },
    /// The connection's timeouts cannot be set.
    SocketTimeout(io::Error),
    /// The request cannot be sent.
    Send(io::Error),
    /// rtprofd's answer cannot be read.
    NoAnswer(io::Error),
    /// rtprofd closed the connection with no answer line.
    EmptyAnswer,

    // `rtprof run --modules` (run/modules_arg.rs); `glob` as given.
    /// Only commas and spaces.
    NoGlob,
    /// A path where a file name is matched.
    GlobIsPath { glob: String },
    /// A wildcard of other globs, which would be matched as it is.
    GlobWildcard { glob: String, wildcard: char },
    /// Globs separated by spaces instead of commas.
    GlobSpaces { glob: String },
    /// A control character.
    GlobControl { glob: String },

    // `--json FILE`, `--output FILE` (export/destination.rs).
    /// FILE is a directory.
    OutIsDirectory,
    /// FILE is a FIFO with no reader (the write would block).
    OutUnreadFifo,
    /// FILE exists and cannot be written.
    OutNotWritable,
    /// FILE cannot be examined, resolved or opened.
    OutInaccessible(io::Error),
    /// No file can be made beside FILE to replace it with.
    OutNoReplacement(io::Error),
    /// FILE does not exist and cannot be created.
    OutNotCreatable(io::Error),
    /// No --format, and FILE's name ends in none of the known endings.
    UnknownFormat { endings: String },

    // Room for counter segments in TMPDIR (run/room.rs).
    /// TMPDIR's path has a NUL byte (statvfs cannot take it).
    NulInPath,
    /// No free blocks.
    NoFreeSpace,
    /// No free inodes.
    NoFreeInodes,
    /// Out of space, inodes or quota, as a system call said.
    OutOfSpace(io::Error),
    /// Less free space than the smallest counter segment (bytes).
    TooLittleSpace { free: u64, need: u64 },
    /// No file can be created there for another reason.
    CannotCreateFile(io::Error),
    /// Space cannot be reserved there (no fallocate, say).
    CannotReserve(io::Error),

    // `rtprof system` (system/).
    /// Not run as root; `action` is what would have been changed.
    NotRoot { action: &'static str },
    /// No agent installed where `enable` puts it (the path).
    NotInstalled(&'static str),
    /// A file or directory that cannot be read, examined or written; `what`
    /// says which step (`cannot read`, `cannot create`, ...).
    SystemIo {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// A directory every process would load the agent from, but that
    /// someone besides root owns or may write.
    UnsafeDir(PathBuf),
    /// The agent broke (or did not load into) a test process.
    ProbeFailed {
        agent: PathBuf,
        command: String,
        problem: String,
    },
    /// /etc/ld.so.preload lists an agent installed elsewhere.
    OtherAgent(Vec<String>),
    /// rtprofd is not installed beside rtprof, so no unit can name it.
    NoDaemonBinary(PathBuf),
    /// A `systemctl` command that failed.
    Systemctl { args: String, problem: String },
    /// The agent was switched on, but rtprofd's service did not start.
    ServiceFailed(Box<Error>),
    /// A failure that left `file` as it was.
    Unchanged {
        source: Box<Error>,
        file: &'static str,
    },

    // A counter segment left by the run (run/segments.rs).
    /// It cannot be opened.
    SegmentOpen(io::Error),
    /// It cannot be mapped.
    SegmentMap(io::Error),
}

impl Error {
    /// Whether TMPDIR is full (space, inodes or quota), rather than
    /// unable to hold counter segments at all.
    pub fn is_out_of_space(&self) -> bool {
        matches!(
            self,
            Error::NoFreeSpace
                | Error::NoFreeInodes
                | Error::OutOfSpace(_)
                | Error::TooLittleSpace { .. }
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoSelf(e) => write!(f, "cannot locate rtprof itself: {e}"),
            Error::AgentPath { path, source: e }
            | Error::PresentMap { path, source: e }
            | Error::CacheRemove {
                name: path,
                source: e,
            }
            | Error::WarmStart { path, source: e } => write!(f, "{}: {e}", path.display()),
            Error::AgentPathUnpreloadable(p) => write!(
                f,
                "{}: agent path contains a space or colon, which LD_PRELOAD cannot carry",
                p.display()
            ),
            Error::NoAgent { looked_at } => {
                f.write_str("cannot find librtprof.so (looked at ")?;
                for (i, p) in looked_at.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    write!(f, "{sep}{}", p.display())?;
                }
                f.write_str("); set RTPROF_AGENT or pass --agent")
            }
            Error::PresentOpen { path, source } => {
                let hint = match source {
                    OpenError::Io(io) if io.kind() == io::ErrorKind::NotFound => {
                        " (is rtprofd running?)"
                    }
                    _ => "",
                };
                write!(f, "{}: {source}{hint}", path.display())
            }
            Error::NoCacheDir => {
                f.write_str("no cache directory: neither XDG_CACHE_HOME nor HOME is set")
            }
            Error::WarmSetId(p) => write!(
                f,
                "{}: set-user-ID or set-group-ID, not started",
                p.display()
            ),
            Error::WarmFailed { path, status } => {
                write!(f, "{}: ended with {status} while warming", path.display())
            }
            Error::WarmNotDone(p) => write!(
                f,
                "{}: the agent did not act in it (switched off, or a sandbox); nothing cached",
                p.display()
            ),
            Error::WarmStatic(p) => write!(
                f,
                "{}: not dynamically linked (no agent can be preloaded into it), not started",
                p.display()
            ),
            Error::BadPattern => write!(
                f,
                "the pattern must be 1 to {MAX_PATTERN} bytes without NUL"
            ),
            Error::Unreachable { socket, source } => {
                write!(f, "cannot reach rtprofd at {}: {source}", socket.display())
            }
            Error::Send(e) => write!(f, "cannot send: {e}"),
            Error::NoAnswer(e) => write!(f, "no answer from rtprofd: {e}"),
            Error::EmptyAnswer => {
                f.write_str("rtprofd closed the connection without an answer (an older rtprofd?)")
            }
            Error::NoGlob => f.write_str("no glob given (e.g. 'libpython*', or 'all')"),
            Error::GlobIsPath { glob } => write!(
                f,
                "'{}': globs match a module's file name, not its path (try '{}')",
                escape_text(glob),
                escape_text(glob.rsplit('/').next().unwrap_or(""))
            ),
            Error::GlobWildcard { glob, wildcard } => write!(
                f,
                "'{}': only * and ? are wildcards, '{wildcard}' would be matched as it is",
                escape_text(glob)
            ),
            Error::GlobSpaces { glob } => write!(
                f,
                "'{}': separate globs with commas, not spaces",
                escape_text(glob)
            ),
            Error::GlobControl { glob } => {
                write!(f, "'{}': contains a control character", escape_text(glob))
            }
            Error::OutIsDirectory => f.write_str("is a directory"),
            Error::OutUnreadFifo => f.write_str("is a FIFO that nobody reads"),
            Error::OutNotWritable => f.write_str("exists and is not writable"),
            Error::OutNoReplacement(e) => {
                write!(f, "cannot create a file beside it to replace it with: {e}")
            }
            Error::OutNotCreatable(e) => write!(f, "cannot be created: {e}"),
            Error::UnknownFormat { endings } => write!(
                f,
                "cannot tell the format from the file name (it ends in none of {endings}); name it with --format"
            ),
            Error::NulInPath => f.write_str("NUL in path"),
            Error::NoFreeSpace => f.write_str("no free space"),
            Error::NoFreeInodes => f.write_str("no free inodes"),
            Error::TooLittleSpace { free, need } => write!(
                f,
                "{} KiB free, a counter segment needs at least {} KiB",
                free / 1024,
                need.div_ceil(1024)
            ),
            Error::CannotCreateFile(e) => write!(f, "cannot create a file: {e}"),
            Error::CannotReserve(e) => write!(f, "cannot reserve space: {e}"),
            Error::NotRoot { action } => write!(f, "must be run as root ({action})"),
            Error::NotInstalled(path) => write!(
                f,
                "no agent at {path}: `rtprof system enable` installs it"
            ),
            Error::SystemIo { what, path, source } => {
                write!(f, "{what} {}: {source}", path.display())
            }
            Error::UnsafeDir(p) => write!(
                f,
                "{}: owned by someone other than root or writable by others; every process would load the agent from it",
                p.display()
            ),
            Error::ProbeFailed {
                agent,
                command,
                problem,
            } => write!(
                f,
                "the agent {} fails a test run of `{command}`: {problem}",
                agent.display()
            ),
            Error::OtherAgent(paths) => write!(
                f,
                "/etc/ld.so.preload already lists another rtprof agent ({}); every process would load two: remove it first",
                paths.join(", ")
            ),
            Error::NoDaemonBinary(p) => write!(
                f,
                "{}: no rtprofd there, so no systemd unit can start it",
                p.display()
            ),
            Error::Systemctl { args, problem } => write!(f, "systemctl {args}: {problem}"),
            Error::ServiceFailed(e) => write!(
                f,
                "the agent is in /etc/ld.so.preload, but rtprofd's service did not start: {e}"
            ),
            Error::Unchanged { source, file } => write!(f, "{source}; {file} is unchanged"),
            // What the system says is the whole message: the caller names
            // the file or the connection.
            Error::SocketTimeout(e)
            | Error::OutInaccessible(e)
            | Error::OutOfSpace(e)
            | Error::SegmentOpen(e)
            | Error::SegmentMap(e) => e.fmt(f),
        }
    }
}

// No `source()`: every message already ends with its cause's text, and a
// reporter walking the chain would print it twice.
impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_keep_their_wording() {
        let looked_at = vec![PathBuf::from("/a/librtprof.so"), PathBuf::from("/b")];
        assert_eq!(
            Error::NoAgent { looked_at }.to_string(),
            "cannot find librtprof.so (looked at /a/librtprof.so, /b); set RTPROF_AGENT or pass --agent"
        );
        let missing = Error::PresentOpen {
            path: "/run/rtprof/present".into(),
            source: OpenError::Io(io::Error::from(io::ErrorKind::NotFound)),
        };
        assert!(
            missing.to_string().ends_with(" (is rtprofd running?)"),
            "{missing}"
        );
        assert_eq!(
            Error::GlobIsPath {
                glob: "/usr/lib/libz*".into()
            }
            .to_string(),
            "'/usr/lib/libz*': globs match a module's file name, not its path (try 'libz*')"
        );
        assert_eq!(
            Error::TooLittleSpace {
                free: 4096,
                need: 1025
            }
            .to_string(),
            "4 KiB free, a counter segment needs at least 2 KiB"
        );
    }

    #[test]
    fn only_a_full_filesystem_is_out_of_space() {
        assert!(Error::NoFreeInodes.is_out_of_space());
        assert!(Error::OutOfSpace(io::Error::from_raw_os_error(libc::ENOSPC)).is_out_of_space());
        let other = Error::CannotReserve(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        assert!(!other.is_out_of_space());
    }
}
