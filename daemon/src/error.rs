//! Why rtprofd cannot do something: one enum for the daemon, each variant
//! naming the reason and carrying what the system said or the value at
//! fault. `Display` is the text logged (after `segment rejected: ` or
//! `cannot create PATH: `) or sent back to a switch request's sender
//! (after `error: `); the end-to-end tests match some of these words, so
//! they change only with the tests.

use rtprof_abi::SegmentError;
use std::fmt;
use std::io;
use std::path::PathBuf;

#[derive(Debug)]
pub enum Error {
    // The presentation segment's file (present_file.rs).
    /// The new file beside the segment's path cannot be created.
    PresentCreate { path: PathBuf, source: io::Error },
    /// `--group` names no group.
    NoGroup(String),
    /// The file cannot be given to that group.
    PresentChown(io::Error),
    /// No room for the file's blocks (bytes asked for): its file system
    /// is full, or does not allocate ahead.
    PresentAllocate { len: u64, source: io::Error },
    /// The file cannot be mapped.
    PresentMap(io::Error),
    /// The file cannot be renamed over the segment's path.
    PresentRename(io::Error),
    /// The segment's path or its directory is refused: a device or FIFO
    /// there, or a directory other users may write.
    PresentRefused(rtprof_shared::files::FileError),

    // A registered counter segment (registry.rs, table.rs).
    /// Not a memfd sealed against shrinking: it could fault under us.
    NotSealed,
    /// Not a shmem file (a hugetlbfs memfd, whose punched holes fault
    /// once the huge pages are gone): its file system's magic number.
    NotShmem { f_type: u64 },
    /// Pages its reads would touch have no memory (bytes of them): reading
    /// them would give the file memory, charged to the daemon.
    Unbacked { absent: u64 },
    /// Its user's segments would have more bytes read each tick than the
    /// budget of a user (`--read-mib-per-user`).
    OverBudget { charge: u64, held: u64, budget: u64 },
    /// Its size cannot be read.
    SegmentStat(io::Error),
    /// Smaller than a header (bytes).
    Truncated { len: u64 },
    /// Larger than any segment followed (bytes).
    TooLarge { len: u64, max: u64 },
    /// It cannot be mapped.
    SegmentMap(io::Error),
    /// It asks for more bytes read per tick than any real process needs.
    ReadsTooMuch { bytes: u64 },
    /// What it holds fails validation.
    Unreadable(SegmentError),

    // A switch request (table.rs), refused.
    /// The pid is none of the processes followed.
    NotFollowed { pid: u32 },
    /// The sender is neither root nor the process's user.
    OtherUser { pid: u32 },
    /// The process's agent has not filled its segment in yet.
    Starting { pid: u32 },
    /// The process's agent predates switch requests.
    NoRelay { pid: u32 },
    /// The process has ended.
    Ended { pid: u32 },
    /// The process is stopped (a stop signal, or a debugger's stop): its
    /// agent cannot take a request until it runs again.
    Stopped { pid: u32, traced: bool },
    /// No instrumented function of the process matches the pattern.
    NoMatch { pid: u32, pattern: String },
    /// As many requests as may wait are waiting for the agent.
    Backlog { pid: u32, waiting: usize },
    /// A route request while another request waits for the agent.
    Busy { pid: u32 },
    /// A route request while one that was withdrawn is still not taken by
    /// the agent (no thread of it serves requests).
    Unserved { pid: u32 },
    /// A route request whose names do not fit the segment's request area.
    BadNames { pid: u32 },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::PresentCreate { path, source } => write!(f, "{}: {source}", path.display()),
            Error::NoGroup(g) => write!(f, "no group {g}"),
            Error::PresentRefused(e) => e.fmt(f),
            // What the system says is the whole message: the caller names
            // the file.
            Error::PresentChown(e)
            | Error::PresentMap(e)
            | Error::PresentRename(e)
            | Error::SegmentStat(e) => e.fmt(f),
            Error::NotSealed => f.write_str("segment is not a memfd sealed against shrinking"),
            Error::PresentAllocate { len, source } => write!(
                f,
                "cannot allocate {len} bytes for it ({source}); its file system must have room for all of it"
            ),
            Error::NotShmem { f_type } => write!(
                f,
                "segment is not a shmem memfd (file system magic {f_type:#x}{}); only plain memfds are followed",
                if *f_type == 0x9584_58f6 { ", hugetlbfs" } else { "" }
            ),
            Error::Unbacked { absent } => write!(
                f,
                "segment publishes {absent} bytes it never gave memory to (reading them would allocate it)"
            ),
            Error::OverBudget {
                charge,
                held,
                budget,
            } => write!(
                f,
                "segment would be read {charge} bytes a tick, and its user's segments already are {held}: over the {budget} bytes a user may have read (--read-mib-per-user)"
            ),
            Error::Truncated { len } => write!(f, "segment truncated: {len} bytes"),
            Error::TooLarge { len, max } => {
                write!(f, "segment of {len} bytes is larger than {max}")
            }
            Error::SegmentMap(e) => write!(f, "cannot map segment: {e}"),
            Error::ReadsTooMuch { bytes } => {
                write!(f, "segment asks for {bytes} bytes read per tick")
            }
            Error::Unreadable(e) => e.fmt(f),
            Error::NotFollowed { pid } => {
                write!(f, "pid {pid} is not a process rtprofd follows")
            }
            Error::OtherUser { pid } => write!(f, "pid {pid} belongs to another user"),
            Error::Starting { pid } => write!(f, "pid {pid}: its agent is still starting"),
            Error::NoRelay { pid } => write!(
                f,
                "pid {pid}: its agent takes no switch requests (an older rtprof)"
            ),
            Error::Ended { pid } => write!(f, "pid {pid} has ended"),
            Error::Stopped { pid, traced } => write!(
                f,
                "pid {pid} is stopped ({}): its agent cannot take a request until it runs again; nothing was asked of it",
                if *traced { "by a debugger" } else { "SIGSTOP or another stop signal" }
            ),
            Error::NoMatch { pid, pattern } => {
                write!(f, "pid {pid}: no instrumented function matches {pattern:?}")
            }
            Error::Backlog { pid, waiting } => write!(
                f,
                "pid {pid}: {waiting} requests are waiting for its agent already"
            ),
            Error::Busy { pid } => write!(
                f,
                "pid {pid}: another request is waiting for its agent; ask again"
            ),
            Error::Unserved { pid } => write!(
                f,
                "pid {pid}: its agent has not taken an earlier request, withdrawn (no thread of it serves requests where sampling is off and no budget runs); nothing can be asked of it until it does"
            ),
            Error::BadNames { pid } => write!(
                f,
                "pid {pid}: the function's and implementation's names are empty or too long"
            ),
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
        assert_eq!(
            Error::TooLarge { len: 9, max: 8 }.to_string(),
            "segment of 9 bytes is larger than 8"
        );
        assert_eq!(
            Error::NoMatch {
                pid: 7,
                pattern: "lua_*".into()
            }
            .to_string(),
            "pid 7: no instrumented function matches \"lua_*\""
        );
        assert_eq!(
            Error::PresentCreate {
                path: "/run/rtprof/present.new".into(),
                source: io::Error::from_raw_os_error(libc::EACCES),
            }
            .to_string(),
            "/run/rtprof/present.new: Permission denied (os error 13)"
        );
    }
}
