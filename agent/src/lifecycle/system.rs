//! Machine-wide settings only root can make: the kill switch and the
//! policy for secure-execution (set-user-ID) processes. Files that are not
//! owned by root, or that others may write, are ignored.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// While this file exists, every newly started agent stays inert.
pub const KILL_SWITCH: &str = "/etc/rtprof/disable";
/// The same path, for `access`.
const KILL_SWITCH_C: &std::ffi::CStr = c"/etc/rtprof/disable";
/// `key = value` lines; `#` starts a comment.
pub const CONFIG: &str = "/etc/rtprof/rtprof.conf";

/// Opens `path` for reading only if it is a regular file owned by root and
/// writable by nobody else (checked on the opened file, no race). Only
/// calls the dynamic loader itself made (openat, newfstatat, close), since
/// a seccomp filter has not been tried out yet.
fn root_owned(path: &str) -> Option<OwnedFd> {
    let c = CString::new(path).ok()?;
    // Non-blocking: a FIFO put there must not stall every process.
    // SAFETY: a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: a descriptor just opened, owned by nobody else.
    let f = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: an all-zero stat is valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: our descriptor, a stat on our stack.
    if unsafe { libc::fstat(f.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    let regular = st.st_mode & libc::S_IFMT == libc::S_IFREG;
    (regular && st.st_uid == 0 && st.st_mode & 0o022 == 0).then_some(f)
}

/// Whether the machine's kill switch is on. First asked with `access`,
/// which the dynamic loader made too (for /etc/ld.so.preload): with the
/// switch off, and while it is on, nothing else is called.
pub fn kill_switch_on() -> bool {
    // SAFETY: a static NUL-terminated path.
    if unsafe { libc::access(KILL_SWITCH_C.as_ptr(), libc::F_OK) } != 0 {
        return false;
    }
    root_owned(KILL_SWITCH).is_some()
}

#[derive(Debug, Default, PartialEq)]
pub struct SystemConfig {
    /// Profile processes in secure-execution mode (default: no).
    pub profile_secure: bool,
    /// `budget = PERCENT`: the overhead budget of processes that set none.
    pub budget: Option<f64>,
}

impl SystemConfig {
    pub fn parse(text: &str) -> SystemConfig {
        let mut c = SystemConfig::default();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("").trim();
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            match k.trim() {
                "profile_secure_processes" => {
                    c.profile_secure = matches!(v.trim(), "yes" | "on" | "true" | "1")
                }
                "budget" => c.budget = crate::config::parse_budget(v),
                _ => {}
            }
        }
        c
    }

    pub fn load() -> SystemConfig {
        match root_owned(CONFIG) {
            Some(f) => {
                let bytes = crate::discover::maps::read_all(f.as_raw_fd());
                SystemConfig::parse(&String::from_utf8_lossy(&bytes))
            }
            None => SystemConfig::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_switch_paths_agree() {
        assert_eq!(KILL_SWITCH_C.to_str().unwrap(), KILL_SWITCH);
    }

    #[test]
    fn parses_the_secure_policy() {
        assert!(!SystemConfig::parse("").profile_secure);
        assert!(
            SystemConfig::parse("# policy\nprofile_secure_processes = yes # ok\n").profile_secure
        );
        assert!(!SystemConfig::parse("profile_secure_processes = no").profile_secure);
        assert!(!SystemConfig::parse("profile_secure_processes").profile_secure);
    }

    #[test]
    fn parses_the_budget() {
        assert_eq!(
            SystemConfig::parse("budget = 1.5 # percent").budget,
            Some(1.5)
        );
        assert_eq!(SystemConfig::parse("budget = 0").budget, None);
        assert_eq!(SystemConfig::parse("budget = lots").budget, None);
    }

    #[test]
    fn files_others_may_write_are_ignored() {
        let dir = std::env::temp_dir().join(format!("rtprof-sys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("conf");
        std::fs::write(&p, "x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(root_owned(p.to_str().unwrap()).is_none(), "world-writable");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        // SAFETY: a system call without arguments.
        let owned_by_root = unsafe { libc::geteuid() } == 0;
        assert_eq!(root_owned(p.to_str().unwrap()).is_some(), owned_by_root);
        assert!(root_owned(dir.join("missing").to_str().unwrap()).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
