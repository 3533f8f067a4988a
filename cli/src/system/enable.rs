//! `rtprof system enable`. The steps go from what is easy to undo to what
//! every process sees: the agent is installed and tested first, the
//! previous /etc/ld.so.preload is saved next, and the new one replaces it
//! at once, last. A failure before that leaves /etc/ld.so.preload as it
//! was (and says so).

use super::{files, install, need_root, preload, unit};
use super::{AGENT_PATH, BACKUP, ETC_DIR, KILL_SWITCH, LOCK, PRELOAD, WAS_ABSENT};
use crate::error::Error;
use std::io;
use std::path::{Path, PathBuf};

pub fn run(agent: Option<PathBuf>, warm: bool) -> Result<(), Error> {
    let unchanged = |source| Error::Unchanged {
        source: Box::new(source),
        file: PRELOAD,
    };
    need_root("it installs the agent in /usr/lib/rtprof and changes /etc/ld.so.preload")?;
    let source = crate::agent::find(agent).map_err(unchanged)?;
    // /etc/rtprof first: a read-only /etc fails here, before anything is
    // installed.
    files::root_dir(Path::new(ETC_DIR)).map_err(unchanged)?;
    let _lock = files::Lock::take(Path::new(LOCK)).map_err(unchanged)?;

    let before = files::read_optional(Path::new(PRELOAD)).map_err(unchanged)?;
    let text = match &before {
        None => String::new(),
        Some(b) => String::from_utf8(b.clone()).map_err(|_| {
            unchanged(Error::SystemIo {
                what: "cannot add to",
                path: PRELOAD.into(),
                source: io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"),
            })
        })?,
    };
    let others: Vec<String> = preload::agents(&text)
        .into_iter()
        .filter(|a| *a != AGENT_PATH)
        .map(String::from)
        .collect();
    if !others.is_empty() {
        return Err(unchanged(Error::OtherAgent(others)));
    }

    match install::install(&source).map_err(unchanged)? {
        install::Installed::Unchanged => {
            println!("agent: {AGENT_PATH} (already installed; it passed a test run)")
        }
        install::Installed::Copied { replaced } => println!(
            "agent: {} copied to {AGENT_PATH}{}; it passed a test run",
            source.display(),
            if replaced {
                ", replacing the older one"
            } else {
                ""
            }
        ),
    }

    match preload::with_entry(&text, AGENT_PATH) {
        None => println!("{PRELOAD}: already lists {AGENT_PATH}; unchanged"),
        Some(new) => {
            save(before.as_deref()).map_err(unchanged)?;
            if let Err(e) = files::replace(Path::new(PRELOAD), new.as_bytes(), 0o644) {
                // Nothing to restore: drop the record of a change not made.
                let _ = files::remove(Path::new(BACKUP));
                let _ = files::remove(Path::new(WAS_ABSENT));
                return Err(unchanged(e));
            }
            let was = match before {
                None => format!("it did not exist before; {WAS_ABSENT} records that"),
                Some(_) => format!("the previous file is saved as {BACKUP}"),
            };
            println!("{PRELOAD}: added {AGENT_PATH}; every program started from now on loads the agent ({was})");
        }
    }
    if Path::new(KILL_SWITCH).exists() {
        println!("kill switch: {KILL_SWITCH} exists, so new agents stay inert until it is removed");
    }

    match unit::start() {
        Ok(unit::Started::Service(path)) => {
            println!("rtprofd: started and enabled ({})", path.display())
        }
        Ok(unit::Started::Masked(path)) => println!(
            "rtprofd: {} is not a unit file (masked?); left as it is, and the service was not started",
            path.display()
        ),
        Ok(unit::Started::NoSystemd) => {
            let rtprofd = unit::rtprofd_beside_me()
                .map_or_else(|| "rtprofd".to_string(), |p| p.display().to_string());
            println!(
                "rtprofd: systemd is not running here, so no service was installed or started; \
                 to follow the profiled processes, start the daemon as root: {rtprofd} &"
            );
        }
        Err(e) => return Err(Error::ServiceFailed(Box::new(e))),
    }
    if warm {
        match super::warm::start_in_background() {
            Ok(pid) => println!(
                "cache: warming for the running programs in the background, at the lowest priority \
                 (rtprof system warm, pid {pid}), so their first starts map their code from page images"
            ),
            Err(e) => println!("cache: not warmed in the background ({e}); `rtprof system warm` does it"),
        }
    }
    Ok(())
}

/// Records /etc/ld.so.preload as it is before the change: its bytes, or
/// that it did not exist. Any older record goes.
fn save(before: Option<&[u8]>) -> Result<(), Error> {
    match before {
        Some(b) => {
            files::replace(Path::new(BACKUP), b, 0o644)?;
            files::remove(Path::new(WAS_ABSENT))
        }
        None => {
            files::replace(Path::new(WAS_ABSENT), b"", 0o644)?;
            files::remove(Path::new(BACKUP))
        }
    }
}
