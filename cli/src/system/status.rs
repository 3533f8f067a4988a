//! `rtprof system status`: one line per switch, read from the machine as
//! it is (no root needed; what cannot be read says why). It always exits
//! 0: it reports, it does not judge.

use super::{preload, unit, AGENT_PATH, BACKUP, KILL_SWITCH, PRELOAD, WAS_ABSENT};
use crate::presentation::{age_text, open};
use rtprof_abi::present::{now_ns, read_view};
use rtprof_abi::protocol::{DEFAULT_PRESENT, DEFAULT_SOCKET};
use rtprof_shared::cachedir::{user_dir, SYSTEM_DIR};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

pub fn run() {
    for (name, value) in lines() {
        println!("{name:<12} {value}");
    }
}

fn lines() -> Vec<(&'static str, String)> {
    vec![
        ("preload", preload_line()),
        ("agent", agent_line()),
        ("backup", backup_line()),
        ("kill switch", kill_switch_line()),
        ("daemon", daemon_line()),
        ("service", service_line()),
        ("segment", segment_line()),
        ("plan cache", cache_line()),
    ]
}

fn preload_line() -> String {
    match std::fs::read(PRELOAD) {
        Ok(b) => {
            let text = String::from_utf8_lossy(&b);
            let agents = preload::agents(&text);
            if agents.is_empty() {
                format!("off ({PRELOAD} lists no rtprof agent)")
            } else {
                format!("on ({} in {PRELOAD})", agents.join(", "))
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => format!("off (no {PRELOAD})"),
        Err(e) => format!("unknown (cannot read {PRELOAD}: {e})"),
    }
}

fn agent_line() -> String {
    match std::fs::metadata(AGENT_PATH) {
        Ok(m) => format!("{AGENT_PATH} ({} KiB)", m.len().div_ceil(1024)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => format!("not installed in {AGENT_PATH}"),
        Err(e) => format!("{AGENT_PATH}: {e}"),
    }
}

fn backup_line() -> String {
    if Path::new(BACKUP).exists() {
        format!("{BACKUP} (`rtprof system disable` restores {PRELOAD} from it)")
    } else if Path::new(WAS_ABSENT).exists() {
        format!("{WAS_ABSENT} (`rtprof system disable` removes {PRELOAD}, which did not exist)")
    } else {
        "none (`rtprof system enable` has not changed this machine)".into()
    }
}

/// The agent obeys the file only if root owns it and nobody else may
/// write it; so does this line.
fn kill_switch_line() -> String {
    match std::fs::symlink_metadata(KILL_SWITCH) {
        Err(_) => format!("off (no {KILL_SWITCH})"),
        Ok(m) if m.is_file() && m.uid() == 0 && m.mode() & 0o022 == 0 => {
            format!("ON ({KILL_SWITCH} exists: agents started now stay inert)")
        }
        Ok(_) => format!(
            "off ({KILL_SWITCH} exists but agents ignore it: not a regular file owned by root and writable by root alone)"
        ),
    }
}

fn daemon_line() -> String {
    // rtprofd closes a connection that sends nothing (and logs it).
    match UnixStream::connect(DEFAULT_SOCKET) {
        Ok(_) => format!("running ({DEFAULT_SOCKET} accepts connections)"),
        Err(e) => format!("not running ({DEFAULT_SOCKET}: {e})"),
    }
}

fn service_line() -> String {
    match unit::state() {
        None => "none (systemd is not running here)".into(),
        Some(s) => format!("rtprofd.service: {s}"),
    }
}

fn segment_line() -> String {
    let seg = match open(Path::new(DEFAULT_PRESENT)) {
        Ok(s) => s,
        Err(e) => return format!("none ({e})"),
    };
    match read_view(&seg.map) {
        Ok(v) => {
            let (age, stale) = v.age(now_ns());
            format!(
                "{DEFAULT_PRESENT}: last span published {} ago, {} processes{}",
                age_text(age),
                v.procs.len(),
                if stale {
                    " (STALE: rtprofd has stopped or is stuck)"
                } else {
                    ""
                }
            )
        }
        Err(e) => format!("{DEFAULT_PRESENT}: unreadable ({e})"),
    }
}

fn cache_line() -> String {
    let mut dirs = vec![std::path::PathBuf::from(SYSTEM_DIR)];
    dirs.extend(user_dir());
    dirs.iter()
        .map(|d| {
            if !d.is_dir() {
                return format!("{}: none", d.display());
            }
            let (n, bytes) = crate::cache::usage(d);
            format!("{}: {n} entries, {} KiB", d.display(), bytes.div_ceil(1024))
        })
        .collect::<Vec<_>>()
        .join("; ")
}
