//! What makes `rtprof attach` refuse a process, checked before anything
//! touches it: one message each, saying why and, where the user can, how
//! to allow it.

use std::os::unix::fs::MetadataExt;

#[derive(Debug)]
pub enum AttachRefusal {
    NoSuchProcess,
    OtherUser {
        owner: u32,
    },
    SetId,
    AlreadyProfiled,
    Traced {
        by: u32,
    },
    Static,
    /// PTRACE_SEIZE refused: the errno and Yama's ptrace_scope, if any.
    Ptrace {
        errno: i32,
        yama: Option<u32>,
    },
    Ourselves,
    /// Stopped (SIGSTOP, a shell's Ctrl-Z): holding and letting go of its
    /// threads would make it run.
    Stopped,
    /// In another mount namespace (a container): it would not find the
    /// agent or rtprof's directory by their paths.
    OtherMountNamespace,
    /// Yama lets no process trace its own threads' peers: the agent could
    /// not hold the threads to rewrite entries.
    YamaAgent(u32),
}

impl std::fmt::Display for AttachRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttachRefusal::NoSuchProcess => write!(f, "no such process"),
            AttachRefusal::OtherUser { owner } => write!(
                f,
                "the process belongs to another user (uid {owner}); attach as that user, \
                 or as root"
            ),
            AttachRefusal::SetId => write!(
                f,
                "the process runs a set-user-ID or set-group-ID program; it is not profiled"
            ),
            AttachRefusal::AlreadyProfiled => write!(
                f,
                "the process is already profiled (its librtprof.so is active)"
            ),
            AttachRefusal::Traced { by } => write!(
                f,
                "the process is already traced by pid {by} (a debugger?); detach it first"
            ),
            AttachRefusal::Static => write!(
                f,
                "the program is statically linked (no libc to load the agent with)"
            ),
            AttachRefusal::Ptrace { errno, yama } => match yama {
                Some(1) => write!(
                    f,
                    "ptrace refused: kernel.yama.ptrace_scope is 1 (only a parent may trace); \
                     run as root or allow it with `sysctl kernel.yama.ptrace_scope=0`"
                ),
                Some(2) => write!(
                    f,
                    "ptrace refused: kernel.yama.ptrace_scope is 2 (admin only); \
                     run as root (CAP_SYS_PTRACE)"
                ),
                Some(3) => write!(
                    f,
                    "ptrace refused: kernel.yama.ptrace_scope is 3 (no ptrace until reboot)"
                ),
                _ => write!(
                    f,
                    "ptrace refused ({}): CAP_SYS_PTRACE is missing (a container or a seccomp \
                     policy?); run as root or grant CAP_SYS_PTRACE",
                    std::io::Error::from_raw_os_error(*errno)
                ),
            },
            AttachRefusal::Ourselves => write!(f, "rtprof cannot attach to itself"),
            AttachRefusal::Stopped => write!(
                f,
                "the process is stopped (SIGSTOP or a terminal's Ctrl-Z); continue it first \
                 (kill -CONT)"
            ),
            AttachRefusal::OtherMountNamespace => write!(
                f,
                "the process runs in another mount namespace (a container?); run rtprof \
                 attach inside it"
            ),
            AttachRefusal::YamaAgent(scope) => write!(
                f,
                "kernel.yama.ptrace_scope is {scope}: the agent inside the process could not \
                 hold its threads still to rewrite function entries; allow it with \
                 `sysctl kernel.yama.ptrace_scope=0`"
            ),
        }
    }
}

/// Yama's ptrace_scope, if Yama is there.
pub fn yama_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn status_field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .map(str::trim)
}

/// The checks of who the process is, from /proc/PID/status and its
/// executable: before its memory map, which only a tracer may read.
pub fn check_process(pid: i32) -> Result<(), AttachRefusal> {
    if pid as u32 == std::process::id() {
        return Err(AttachRefusal::Ourselves);
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|_| AttachRefusal::NoSuchProcess)?;
    // SAFETY: a plain system call without arguments.
    let me = unsafe { libc::geteuid() };
    let ids = |name| -> Vec<u32> {
        status_field(&status, name)
            .unwrap_or("")
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect()
    };
    let (uids, gids) = (ids("Uid:"), ids("Gid:"));
    // Real, effective, saved and filesystem ids all the same: otherwise the
    // process changed identity (set-ID). Someone else's only with
    // CAP_SYS_PTRACE (root), as for gdb and perf.
    if let Some(&owner) = uids.iter().find(|&&u| u != me) {
        if uids.iter().any(|&u| u != uids[0]) {
            return Err(AttachRefusal::SetId);
        }
        if !may_trace_anyone() {
            return Err(AttachRefusal::OtherUser { owner });
        }
    }
    // A set-group-ID program runs with groups that differ.
    if gids.iter().any(|&g| g != gids[0]) {
        return Err(AttachRefusal::SetId);
    }
    if let Ok(m) = std::fs::metadata(format!("/proc/{pid}/exe")) {
        if m.mode() & (libc::S_ISUID | libc::S_ISGID) != 0 {
            return Err(AttachRefusal::SetId);
        }
    }
    if let Some(by) = status_field(&status, "TracerPid:")
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|&p| p != 0)
    {
        return Err(AttachRefusal::Traced { by });
    }
    let ns = |p: String| std::fs::metadata(p).map(|m| (m.dev(), m.ino())).ok();
    if status_field(&status, "State:").is_some_and(|s| s.starts_with('T')) {
        return Err(AttachRefusal::Stopped);
    }
    // Unreadable without ptrace access: that refusal comes later.
    if let (Some(theirs), Some(ours)) = (
        ns(format!("/proc/{pid}/ns/mnt")),
        ns("/proc/self/ns/mnt".into()),
    ) {
        if theirs != ours {
            return Err(AttachRefusal::OtherMountNamespace);
        }
    }
    Ok(())
}

/// Whether we hold CAP_SYS_PTRACE (effective): the kernel lets us trace
/// another user's process.
pub fn may_trace_anyone() -> bool {
    const CAP_SYS_PTRACE: u32 = 19;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| u64::from_str_radix(status_field(&s, "CapEff:")?, 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_PTRACE) != 0)
}

/// The real user and group of process `pid` (whose ids all agree, as
/// [`check_process`] made sure).
pub fn owner(pid: i32) -> Option<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let first = |name| -> Option<u32> {
        status_field(&status, name)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some((first("Uid:")?, first("Gid:")?))
}

/// The checks of what the process has loaded (`maps`: its /proc/PID/maps).
pub fn check_maps(maps: &str) -> Result<(), AttachRefusal> {
    // A process with the agent loaded (preloaded, or attached before) is
    // asked by the agent itself: it refuses if it is profiling.
    let paths = super::inject::mappings(maps);
    if libc_path(&paths).is_none() {
        return Err(AttachRefusal::Static);
    }
    // Checked last: the other reasons are the process's own.
    if let Some(scope) = yama_scope().filter(|&s| s > 0) {
        return Err(AttachRefusal::YamaAgent(scope));
    }
    Ok(())
}

pub fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The target's libc, which defines `dlopen`.
pub fn libc_path(maps: &[super::inject::Mapping]) -> Option<&str> {
    maps.iter().map(|m| m.path.as_str()).find(|p| {
        let n = file_name(p);
        n.starts_with("libc.so") || (n.starts_with("libc-") && n.ends_with(".so"))
    })
}

/// PTRACE_SEIZE's errno as the refusal the user reads.
pub fn ptrace_refused(errno: i32) -> AttachRefusal {
    if errno == libc::ESRCH {
        return AttachRefusal::NoSuchProcess;
    }
    AttachRefusal::Ptrace {
        errno,
        yama: yama_scope().filter(|&s| s > 0),
    }
}
