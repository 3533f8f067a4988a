//! `rtprof cache`: what the agent's plan cache holds, emptying it, and
//! filling it ahead of time.

use crate::error::Error;
use clap::{Args, Subcommand};
use rtprof_shared::cachedir::{user_dir, ENTRY_SUFFIX, SYSTEM_DIR, WARM_NOT_DONE};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

#[derive(Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    action: Action,
    /// The machine-wide cache (/var/cache/rtprof) instead of the user's.
    #[arg(long, global = true)]
    system: bool,
}

#[derive(Subcommand)]
enum Action {
    /// Entries and bytes in the user's and the machine-wide cache.
    Stats,
    /// Remove every entry.
    Clear,
    /// Analyse programs and libraries now, so that their next start finds
    /// their plans cached. A program is started with the agent and ends
    /// before its `main` (its libraries' initialisers do run); a library is
    /// loaded into /bin/true.
    Warm {
        /// The agent to use (default: next to rtprof).
        #[arg(long, value_name = "PATH")]
        agent: Option<PathBuf>,
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
    },
}

fn dir(system: bool) -> Result<PathBuf, Error> {
    if system {
        return Ok(PathBuf::from(SYSTEM_DIR));
    }
    user_dir().ok_or(Error::NoCacheDir)
}

/// (entries, bytes) in `d`; temporary files count as entries in progress.
pub(crate) fn usage(d: &Path) -> (usize, u64) {
    let Ok(rd) = std::fs::read_dir(d) else {
        return (0, 0);
    };
    rd.flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(ENTRY_SUFFIX))
        .filter_map(|e| e.metadata().ok())
        .fold((0, 0), |(n, b), m| (n + 1, b + m.len()))
}

fn is_library(p: &Path) -> bool {
    let name = p.file_name().unwrap_or_default().to_string_lossy();
    name.ends_with(".so") || name.contains(".so.")
}

fn warm(paths: &[PathBuf], agent: Option<PathBuf>, system: bool) -> Result<(), Error> {
    let agent = crate::agent::find(agent)?;
    let cache = if system {
        "system".to_string()
    } else {
        dir(false)?.display().to_string()
    };
    for p in paths {
        warm_one(p, &agent, &cache)?;
        println!("warmed {}", p.display());
    }
    Ok(())
}

/// Fills cache `cache` (an `RTPROF_CACHE` value) for program or library
/// `p` with `agent`: a program is started and ends before its `main`; a
/// library is loaded into /bin/true.
pub(crate) fn warm_one(p: &Path, agent: &Path, cache: &str) -> Result<(), Error> {
    let unstartable = |source| Error::WarmStart {
        path: p.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(p).map_err(unstartable)?;
    // A set-ID program ignores the environment: it would simply run.
    if meta.permissions().mode() & 0o6000 != 0 {
        return Err(Error::WarmSetId(p.to_path_buf()));
    }
    let name = p
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let library = is_library(p);
    if !library && !dynamically_linked(p) {
        return Err(Error::WarmStatic(p.to_path_buf()));
    }
    let mut c = if library {
        let mut c = Command::new("/bin/true");
        c.env("LD_PRELOAD", format!("{} {}", agent.display(), p.display()))
            .env("RTPROF_MODULES", &name);
        c
    } else {
        let mut c = Command::new(p);
        c.env("LD_PRELOAD", agent);
        c
    };
    let st = c
        .env("RTPROF_WARM", "1")
        .env("RTPROF_CACHE", cache)
        .env("RTPROF_DAEMON_SOCKET", "")
        .stdin(std::process::Stdio::null())
        .status()
        .map_err(unstartable)?;
    match st.code() {
        Some(0) => Ok(()),
        Some(WARM_NOT_DONE) => Err(Error::WarmNotDone(p.to_path_buf())),
        _ => Err(Error::WarmFailed {
            path: p.to_path_buf(),
            status: st,
        }),
    }
}

/// Whether `p` is an ELF program with an interpreter (the dynamic
/// loader), the only kind the agent can be preloaded into.
fn dynamically_linked(p: &Path) -> bool {
    use goblin::elf::{program_header, Elf, ProgramHeader};
    use std::io::Read;
    // The headers: the ELF header and its program headers, at the start.
    let mut head = Vec::new();
    let read = std::fs::File::open(p).and_then(|f| f.take(1 << 16).read_to_end(&mut head));
    let Some(h) = read.ok().and_then(|_| Elf::parse_header(&head).ok()) else {
        return false;
    };
    let (Ok(container), Ok(endian)) = (h.container(), h.endianness()) else {
        return false;
    };
    let ctx = goblin::container::Ctx::new(container, endian);
    ProgramHeader::parse(&head, h.e_phoff as usize, h.e_phnum as usize, ctx)
        .is_ok_and(|phs| phs.iter().any(|ph| ph.p_type == program_header::PT_INTERP))
}

pub fn run(args: CacheArgs) -> ExitCode {
    let result = match args.action {
        Action::Stats => {
            for (what, d) in [("user", user_dir()), ("system", Some(SYSTEM_DIR.into()))] {
                match d {
                    Some(d) => {
                        let (n, bytes) = usage(&d);
                        println!(
                            "{what}: {} — {n} entries, {:.1} MiB",
                            d.display(),
                            bytes as f64 / (1 << 20) as f64
                        );
                    }
                    None => println!("{what}: none (neither XDG_CACHE_HOME nor HOME is set)"),
                }
            }
            Ok(())
        }
        Action::Clear => dir(args.system).and_then(|d| {
            let Ok(rd) = std::fs::read_dir(&d) else {
                return Ok(());
            };
            let mut n = 0;
            for e in rd.flatten() {
                let name = e.file_name();
                let shown = name.to_string_lossy();
                // Entries, and the temporary files they are written as
                // (`.NAME.rtc.rtprof-PID-N`; older agents' `.NAME.rtc.PID.tmp`).
                let temporary = shown.starts_with('.')
                    && (shown.contains(&format!("{ENTRY_SUFFIX}.rtprof-"))
                        || shown.ends_with(".tmp"));
                if shown.ends_with(ENTRY_SUFFIX) || temporary {
                    std::fs::remove_file(e.path()).map_err(|source| Error::CacheRemove {
                        name: name.into(),
                        source,
                    })?;
                    n += 1;
                }
            }
            println!("removed {n} entries from {}", d.display());
            Ok(())
        }),
        Action::Warm { agent, paths } => warm(&paths, agent, args.system),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rtprof cache: {e}");
            ExitCode::FAILURE
        }
    }
}
