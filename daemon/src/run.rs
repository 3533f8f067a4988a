//! `rtprof run`: runs a command under the agent, then reports every process
//! of its tree from the counter segments the agents left in a private
//! directory. Arguments, stdin, stdout and the exit status pass through.

use clap::Args;
use rtprof_shared::{read_snapshot, report, Snapshot};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

#[derive(Args)]
pub struct RunArgs {
    /// Write the report as JSON to FILE instead of text on stderr.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Show per-module patch statistics with refusal reasons.
    #[arg(long)]
    stats: bool,
    /// Rows listed per process (0: all that were called or sampled).
    #[arg(long, default_value_t = 25)]
    top: usize,
    /// Order of the rows.
    #[arg(long, value_enum, default_value_t = SortBy::Time)]
    sort: SortBy,
    /// Samples per second of CPU time (RTPROF_SAMPLE_HZ; 0 switches sampling off).
    #[arg(long, value_name = "HZ")]
    sample_hz: Option<u32>,
    /// Sampler to use (RTPROF_SAMPLER): perf events, CPU-time timers, or none.
    #[arg(long, value_enum)]
    sampler: Option<SamplerArg>,
    /// Sample only: patch no function entries, count no calls (RTPROF_INSTRUMENT=0).
    #[arg(long)]
    no_calls: bool,
    /// Modules to instrument besides the executable (RTPROF_MODULES), e.g. 'libpython*' or 'all'.
    #[arg(long, value_name = "GLOBS")]
    modules: Option<String>,
    /// Agent diagnostics on stderr (RTPROF_VERBOSE).
    #[arg(long)]
    verbose: bool,
    /// Path of librtprof.so.
    #[arg(long, value_name = "PATH")]
    agent: Option<PathBuf>,
    /// The command to run, after `--`.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum SortBy {
    /// Estimated CPU time.
    Time,
    Calls,
    Samples,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum SamplerArg {
    Perf,
    Timer,
    Off,
}

/// A private directory, removed when dropped.
struct RunDir(PathBuf);

impl RunDir {
    fn new() -> std::io::Result<RunDir> {
        let base = std::env::temp_dir().join("rtprof-run-XXXXXX");
        let mut tmpl = base.into_os_string().into_encoded_bytes();
        tmpl.push(0);
        // mkdtemp creates the directory with mode 0700.
        let p = unsafe { libc::mkdtemp(tmpl.as_mut_ptr() as *mut libc::c_char) };
        if p.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        tmpl.pop();
        Ok(RunDir(PathBuf::from(
            String::from_utf8_lossy(&tmpl).into_owned(),
        )))
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Maps a segment read-only: the reader touches only the pages it needs
/// (most of a segment is stripes no thread ever used).
fn map_file(p: &Path) -> Result<memmap2::Mmap, String> {
    let f = std::fs::File::open(p).map_err(|e| e.to_string())?;
    unsafe { memmap2::Mmap::map(&f) }.map_err(|e| e.to_string())
}

/// Every readable segment in `dir`, oldest process first; unreadable ones
/// are reported on stderr and skipped.
pub fn collect(dir: &Path) -> Vec<Snapshot> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "seg") {
            continue;
        }
        let bytes = match map_file(&p) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("rtprof: skipping {}: {e}", p.display());
                continue;
            }
        };
        // A process that died while its agent was starting leaves a file
        // with nothing in it yet: no data, nothing to complain about.
        if bytes.len() < 8 || bytes[..8] == [0; 8] {
            continue;
        }
        match read_snapshot(&bytes) {
            Ok(s) => out.push(s),
            Err(e) => eprintln!("rtprof: skipping {}: {e}", p.display()),
        }
    }
    out.sort_by_key(|s| (s.start_ns, s.pid));
    mark_execs(&mut out);
    out
}

/// An image followed by a later one with the same pid replaced itself by
/// exec (snapshots sorted by start time).
fn mark_execs(procs: &mut [Snapshot]) {
    for i in 0..procs.len() {
        let (pid, start) = (procs[i].pid, procs[i].start_ns);
        procs[i].replaced_by_exec = procs[i + 1..]
            .iter()
            .any(|later| later.pid == pid && later.start_ns >= start);
    }
}

pub fn run(args: RunArgs) -> ExitCode {
    let agent = match crate::find_agent(args.agent.clone()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rtprof: {e}");
            return ExitCode::from(127);
        }
    };
    let dir = match RunDir::new() {
        Ok(d) => d,
        Err(e) => {
            eprintln!(
                "rtprof: cannot create a private directory in {}: {e}",
                std::env::temp_dir().display()
            );
            return ExitCode::from(127);
        }
    };
    let mut preload = agent.to_string_lossy().into_owned();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(' ');
        preload.push_str(&old.to_string_lossy());
    }
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("LD_PRELOAD", preload)
        .env("RTPROF_RUN_DIR", &dir.0)
        .env_remove("RTPROF_REPORT");
    if let Some(m) = &args.modules {
        cmd.env("RTPROF_MODULES", m);
    }
    if args.verbose {
        cmd.env("RTPROF_VERBOSE", "1");
    }
    if args.no_calls {
        cmd.env("RTPROF_INSTRUMENT", "0");
    }
    if let Some(hz) = args.sample_hz {
        cmd.env("RTPROF_SAMPLE_HZ", hz.to_string());
    }
    if let Some(s) = args.sampler {
        let name = match s {
            SamplerArg::Perf => "perf",
            SamplerArg::Timer => "timer",
            SamplerArg::Off => "off",
        };
        cmd.env("RTPROF_SAMPLER", name);
    }
    // Like time(1): a terminal's Ctrl-C is for the program; we still report.
    let old_int = unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    let old_quit = unsafe { libc::signal(libc::SIGQUIT, libc::SIG_IGN) };
    let status = {
        // The child starts with the default dispositions.
        use std::os::unix::process::CommandExt;
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                libc::signal(libc::SIGQUIT, libc::SIG_DFL);
                Ok(())
            })
        };
        cmd.status()
    };
    unsafe {
        libc::signal(libc::SIGINT, old_int);
        libc::signal(libc::SIGQUIT, old_quit);
    }
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rtprof: cannot run {}: {e}", args.command[0]);
            return ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };

    let procs = collect(&dir.0);
    if procs.is_empty() {
        eprintln!("rtprof: no profile was recorded (the program may be static, setuid, or not an ELF program)");
    }
    match &args.json {
        Some(path) => {
            if let Err(e) = std::fs::write(path, report::json(&procs)) {
                eprintln!("rtprof: cannot write {}: {e}", path.display());
            }
        }
        None => eprint!(
            "{}",
            report::text(
                &procs,
                report::TextOptions {
                    top: args.top,
                    stats: args.stats,
                    sort: match args.sort {
                        SortBy::Time => report::Sort::Time,
                        SortBy::Calls => report::Sort::Calls,
                        SortBy::Samples => report::Sort::Samples,
                    },
                }
            )
        ),
    }
    drop(dir);

    if let Some(sig) = status.signal() {
        // Die the way the program died, so callers see the same status.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
        }
        return ExitCode::from(128 + sig as u8);
    }
    ExitCode::from(status.code().unwrap_or(1) as u8)
}
