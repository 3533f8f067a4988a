//! `rtprof system disable`: /etc/ld.so.preload goes back to what `enable`
//! found, byte for byte, if nobody changed it since; if somebody did, only
//! our entry goes and their change stays. The installed agent stays in
//! /usr/lib/rtprof: processes still running have it mapped, and nothing
//! new loads it.

use super::{files, need_root, preload, unit};
use super::{AGENT_PATH, BACKUP, ETC_DIR, LOCK, PRELOAD, WAS_ABSENT};
use crate::error::Error;
use std::io;
use std::path::Path;

/// /etc/ld.so.preload as `enable` found it.
#[derive(Debug, PartialEq)]
pub enum Before {
    Absent,
    Bytes(Vec<u8>),
}

/// What to do with /etc/ld.so.preload.
#[derive(Debug, PartialEq)]
pub enum Plan {
    /// It is exactly what `enable` made: put back what it found.
    Restore(Before),
    /// It changed since (or `enable` kept no record): these bytes are it
    /// without our entry; `None`: it goes (it did not exist before and
    /// holds nothing else).
    RemoveEntry(Option<String>),
    /// It does not list our agent.
    Nothing,
}

/// Decides from the file now and the record `enable` kept.
pub fn plan(now: Option<&[u8]>, before: Option<Before>, path: &str) -> Result<Plan, Error> {
    let Some(now) = now else {
        return Ok(Plan::Nothing);
    };
    if let Some(before) = before {
        let found = match &before {
            Before::Absent => Some(String::new()),
            Before::Bytes(b) => String::from_utf8(b.clone()).ok(),
        };
        let made = found.and_then(|t| preload::with_entry(&t, path));
        if made.as_deref().map(str::as_bytes) == Some(now) {
            return Ok(Plan::Restore(before));
        }
        if let Before::Absent = before {
            return remove_entry(now, path, true);
        }
    }
    remove_entry(now, path, false)
}

fn remove_entry(now: &[u8], path: &str, was_absent: bool) -> Result<Plan, Error> {
    let text = std::str::from_utf8(now).map_err(|_| Error::SystemIo {
        what: "cannot remove the agent from",
        path: PRELOAD.into(),
        source: io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"),
    })?;
    Ok(match preload::without_entry(text, path) {
        None => Plan::Nothing,
        Some(rest) if was_absent && preload::is_empty(&rest) => Plan::RemoveEntry(None),
        Some(rest) => Plan::RemoveEntry(Some(rest)),
    })
}

/// The record `enable` kept, if any.
fn record() -> Result<Option<Before>, Error> {
    if let Some(b) = files::read_optional(Path::new(BACKUP))? {
        return Ok(Some(Before::Bytes(b)));
    }
    Ok(Path::new(WAS_ABSENT).exists().then_some(Before::Absent))
}

pub fn run() -> Result<(), Error> {
    need_root("it changes /etc/ld.so.preload")?;
    // Without /etc/rtprof there is no record to read, nor a lock to take
    // (and a read-only /etc must not stop the removal of our entry).
    let _lock = if Path::new(ETC_DIR).is_dir() {
        Some(files::Lock::take(Path::new(LOCK))?)
    } else {
        None
    };
    let preload_path = Path::new(PRELOAD);
    let now = files::read_optional(preload_path)?;
    let unchanged = |source| Error::Unchanged {
        source: Box::new(source),
        file: PRELOAD,
    };
    let plan = plan(now.as_deref(), record()?, AGENT_PATH).map_err(unchanged)?;
    match plan {
        Plan::Restore(Before::Bytes(b)) => {
            files::replace(preload_path, &b, 0o644).map_err(unchanged)?;
            println!("{PRELOAD}: restored byte for byte as it was before `rtprof system enable`");
        }
        Plan::Restore(Before::Absent) => {
            files::remove(preload_path).map_err(unchanged)?;
            println!("{PRELOAD}: removed (it did not exist before `rtprof system enable`)");
        }
        Plan::RemoveEntry(rest) => {
            match rest {
                Some(t) => files::replace(preload_path, t.as_bytes(), 0o644),
                None => files::remove(preload_path),
            }
            .map_err(unchanged)?;
            println!(
                "{PRELOAD}: changed since `rtprof system enable` (or enabled by hand), so only {AGENT_PATH} was removed from it and the rest kept"
            );
        }
        Plan::Nothing => println!("{PRELOAD}: does not list {AGENT_PATH}; unchanged"),
    }
    // The record is used up: a later `enable` makes a new one.
    files::remove(Path::new(BACKUP))?;
    files::remove(Path::new(WAS_ABSENT))?;
    if let Some(done) = unit::stop()? {
        println!("rtprofd: {done}");
    }
    println!("new programs are no longer profiled; running ones keep the agent until they end");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGENT: &str = "/usr/lib/rtprof/librtprof.so";

    fn plan_of(now: Option<&str>, before: Option<Before>) -> Plan {
        plan(now.map(str::as_bytes), before, AGENT).unwrap()
    }

    #[test]
    fn an_unchanged_file_is_restored_exactly() {
        let orig = "# comment\n/lib/libm.so.6";
        let made = format!("{orig}\n{AGENT}\n");
        assert_eq!(
            plan_of(Some(&made), Some(Before::Bytes(orig.into()))),
            Plan::Restore(Before::Bytes(orig.into()))
        );
        assert_eq!(
            plan_of(Some(&format!("{AGENT}\n")), Some(Before::Absent)),
            Plan::Restore(Before::Absent)
        );
    }

    #[test]
    fn a_changed_file_loses_only_our_entry() {
        let orig = "/lib/a.so\n";
        let edited = format!("{orig}{AGENT}\n/lib/b.so\n");
        assert_eq!(
            plan_of(Some(&edited), Some(Before::Bytes(orig.into()))),
            Plan::RemoveEntry(Some("/lib/a.so\n/lib/b.so\n".into()))
        );
        // It did not exist before: it goes if only our entry was in it...
        assert_eq!(
            plan_of(Some(&format!("\n{AGENT}\n\n")), Some(Before::Absent)),
            Plan::RemoveEntry(None)
        );
        // ... and stays with what someone else added.
        assert_eq!(
            plan_of(Some(&format!("{AGENT}\n/lib/b.so\n")), Some(Before::Absent)),
            Plan::RemoveEntry(Some("/lib/b.so\n".into()))
        );
        // No record (added by hand): our entry goes, an empty file stays.
        assert_eq!(
            plan_of(Some(&format!("{AGENT}\n")), None),
            Plan::RemoveEntry(Some(String::new()))
        );
    }

    #[test]
    fn without_our_entry_nothing_changes() {
        assert_eq!(
            plan_of(
                Some("/lib/a.so\n"),
                Some(Before::Bytes(b"/lib/a.so\n".to_vec()))
            ),
            Plan::Nothing
        );
        assert_eq!(plan_of(None, Some(Before::Absent)), Plan::Nothing);
        assert_eq!(plan_of(Some(""), None), Plan::Nothing);
    }
}
