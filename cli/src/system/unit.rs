//! rtprofd as a systemd service, when systemd runs the machine. The
//! Debian package ships the unit; otherwise `enable` writes one into
//! /etc/systemd/system from the repository's unit, naming the rtprofd
//! installed beside this rtprof (unless someone else wrote one there), and
//! `disable` removes only a unit it wrote.

use super::files;
use crate::error::Error;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Exists (a directory) while systemd is the init system (sd_booted(3)).
pub const SYSTEMD_RUNNING: &str = "/run/systemd/system";
/// Where the package puts the unit.
pub const PACKAGED_UNIT: &str = "/lib/systemd/system/rtprofd.service";
/// Where `enable` writes one when no package did.
pub const LOCAL_UNIT: &str = "/etc/systemd/system/rtprofd.service";
const NAME: &str = "rtprofd.service";

/// The repository's unit; its ExecStart names [`TEMPLATE_EXEC`].
const TEMPLATE: &str = include_str!("../../../daemon/rtprofd.service");
const TEMPLATE_EXEC: &str = "/usr/local/bin/rtprofd";
/// The first line of a unit `enable` wrote, so `disable` never removes
/// one that someone else put there.
const MARKER: &str = "# Written by `rtprof system enable`; `rtprof system disable` removes it.";

pub fn systemd_running() -> bool {
    Path::new(SYSTEMD_RUNNING).is_dir()
}

/// The repository's unit with `rtprofd` in its ExecStart, and our marker
/// in place of its installation comment.
pub fn unit_text(rtprofd: &Path) -> String {
    let body: Vec<&str> = TEMPLATE
        .lines()
        .skip_while(|l| l.starts_with('#'))
        .collect();
    let body = body
        .join("\n")
        .replace(TEMPLATE_EXEC, &rtprofd.to_string_lossy());
    format!("{MARKER}\n{body}\n")
}

/// rtprofd installed beside this rtprof, if it is.
pub fn rtprofd_beside_me() -> Option<PathBuf> {
    let me = std::env::current_exe().ok()?;
    let d = me.parent()?.join("rtprofd").canonicalize().ok()?;
    d.is_file().then_some(d)
}

/// What `start` did.
pub enum Started {
    /// `systemctl enable --now` on this unit file.
    Service(PathBuf),
    /// systemd does not run here; the daemon is left to the user.
    NoSystemd,
    /// Something other than a unit file is at the unit's path in /etc (a
    /// mask): left as it is, nothing started.
    Masked(PathBuf),
}

/// Installs (if no package did) and starts rtprofd's unit, when systemd
/// runs.
pub fn start() -> Result<Started, Error> {
    if !systemd_running() {
        return Ok(Started::NoSystemd);
    }
    let local = Path::new(LOCAL_UNIT);
    // Anything else at the unit's path in /etc (a unit someone wrote, a
    // mask: a symbolic link to /dev/null) overrides the package's and is
    // theirs: used as it is, never replaced.
    let theirs = std::fs::symlink_metadata(local).is_ok_and(|m| !m.file_type().is_file());
    if theirs {
        return Ok(Started::Masked(local.to_path_buf()));
    }
    let unit = if local.is_file() && !ours(local) {
        local.to_path_buf()
    } else if Path::new(PACKAGED_UNIT).is_file() {
        // One we wrote before the package came would shadow its unit.
        if local.is_file() {
            files::remove(local)?;
            systemctl(&["daemon-reload"])?;
        }
        PathBuf::from(PACKAGED_UNIT)
    } else {
        let me = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf))
            .unwrap_or_default();
        let rtprofd = rtprofd_beside_me().ok_or(Error::NoDaemonBinary(me.join("rtprofd")))?;
        files::replace(Path::new(LOCAL_UNIT), unit_text(&rtprofd).as_bytes(), 0o644)?;
        systemctl(&["daemon-reload"])?;
        PathBuf::from(LOCAL_UNIT)
    };
    systemctl(&["enable", "--now", NAME])?;
    Ok(Started::Service(unit))
}

/// Whether `path` is a unit `enable` wrote.
fn ours(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| t.starts_with(MARKER))
}

/// Stops and disables rtprofd's unit if systemd runs and one is installed;
/// removes the unit if `enable` wrote it. Says what it did.
pub fn stop() -> Result<Option<String>, Error> {
    let local = Path::new(LOCAL_UNIT);
    if !systemd_running() || !(local.is_file() || Path::new(PACKAGED_UNIT).is_file()) {
        return Ok(None);
    }
    systemctl(&["disable", "--now", NAME])?;
    if ours(local) {
        files::remove(local)?;
        systemctl(&["daemon-reload"])?;
        return Ok(Some(format!(
            "stopped and disabled {NAME}, removed {LOCAL_UNIT}"
        )));
    }
    Ok(Some(format!("stopped and disabled {NAME}")))
}

fn systemctl(args: &[&str]) -> Result<(), Error> {
    let failed = |problem: String| Error::Systemctl {
        args: args.join(" "),
        problem,
    };
    let out = Command::new("systemctl")
        .args(args)
        .output()
        .map_err(|e| failed(format!("cannot run it: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    Err(failed(format!("{}: {err}", out.status)))
}

/// The unit's state in one word (`enabled`, `disabled`, ...), if systemd
/// runs and knows it.
pub fn state() -> Option<String> {
    if !systemd_running() {
        return None;
    }
    let active = Command::new("systemctl")
        .args(["is-active", NAME])
        .output()
        .ok()?;
    let enabled = Command::new("systemctl")
        .args(["is-enabled", NAME])
        .output()
        .ok()?;
    let word = |o: &std::process::Output| String::from_utf8_lossy(&o.stdout).trim().to_string();
    Some(format!("{}, {}", word(&active), word(&enabled)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_written_unit_starts_the_rtprofd_beside_rtprof() {
        let exec = |l: &&str| l.starts_with(&format!("ExecStart={TEMPLATE_EXEC} "));
        assert_eq!(
            TEMPLATE.lines().filter(exec).count(),
            1,
            "daemon/rtprofd.service starts {TEMPLATE_EXEC}"
        );
        let text = unit_text(Path::new("/opt/rtprof/bin/rtprofd"));
        assert!(text.starts_with(MARKER));
        let exec: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("ExecStart="))
            .collect();
        assert_eq!(exec.len(), 1);
        assert!(
            exec[0].starts_with("ExecStart=/opt/rtprof/bin/rtprofd --socket "),
            "{}",
            exec[0]
        );
        assert!(!text.contains("/usr/local/bin"));
        assert!(text.contains("[Install]\nWantedBy=multi-user.target\n"));
    }
}
