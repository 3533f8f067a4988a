//! `rtprof run`: runs a command under the agent, then reports every process
//! of its tree from the counter segments the agents left in a private
//! directory. Arguments, stdin, stdout and the exit status pass through.

use clap::Args;
use rtprof_shared::report::escape_text;
use rtprof_shared::{read_snapshot, report, Capacities, Layout, Snapshot};
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus};

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
    /// Only these patched functions count from the start (RTPROF_COUNT), e.g. 'lua_*,luaV_*'.
    #[arg(long, value_name = "GLOBS")]
    count: Option<String>,
    /// These patched functions do not count from the start (RTPROF_NOCOUNT).
    #[arg(long, value_name = "GLOBS")]
    nocount: Option<String>,
    /// Overhead budget in percent of CPU time (RTPROF_BUDGET): over it,
    /// the hottest functions are counted in bursts and their calls
    /// estimated, with an error bound.
    #[arg(long, value_name = "PERCENT")]
    budget: Option<f64>,
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
        // SAFETY: `tmpl` is a writable, NUL-terminated template.
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

fn out_of_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// Why counter segments cannot be kept in the run directory.
enum NoRoom {
    /// The filesystem is full (space, inodes or quota).
    Full(String),
    /// It cannot reserve space at all (no fallocate, say).
    Unusable(String),
}

/// Bytes the agent reserves at start-up for the smallest segment it makes
/// (a program with no functions): `capacities()` in agent/src/startup.rs
/// with its 512 spare modules, the spare functions and name bytes, and one
/// stripe, honouring the same variables. A filesystem that cannot hold
/// this cannot hold any segment.
fn smallest_segment() -> u64 {
    let var = |k: &str| std::env::var(k).ok()?.trim().parse::<u32>().ok();
    let spare = var("RTPROF_SPARE_FUNCTIONS").map_or(16384, |n| n.min(1 << 22));
    let threads = var("RTPROF_MAX_THREADS").map_or(1024, |n| n.clamp(1, 1 << 16));
    Layout::new(Capacities {
        modules: 512 + 1,
        functions: spare,
        strings: spare.saturating_mul(48).saturating_add(4096),
        stripes: threads + 1,
    })
    .stripe_off(1)
}

/// Whether `dir`'s filesystem has room for a counter segment: free blocks
/// and inodes (statvfs), then a reservation of the smallest segment's size
/// with fallocate, as the agent makes it.
fn room_for_segments(dir: &Path) -> Result<(), NoRoom> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| NoRoom::Unusable("NUL in path".into()))?;
    // SAFETY: all-zero is a valid statvfs (plain integers).
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path, `st` a struct to fill.
    let ok = unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0;
    // Root may use the blocks and inodes a filesystem keeps for it.
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let (blocks, inodes) = if root {
        (st.f_bfree, st.f_ffree)
    } else {
        (st.f_bavail, st.f_favail)
    };
    if ok && blocks == 0 {
        return Err(NoRoom::Full("no free space".into()));
    }
    // Some filesystems report no inode counts at all (f_files 0).
    if ok && st.f_files != 0 && inodes == 0 {
        return Err(NoRoom::Full("no free inodes".into()));
    }
    let need = smallest_segment();
    let free = blocks.saturating_mul(st.f_frsize);
    let probe = dir.join(".rtprof-space-probe");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| {
            if out_of_space(&e) {
                NoRoom::Full(e.to_string())
            } else {
                NoRoom::Unusable(format!("cannot create a file: {e}"))
            }
        })?;
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on a descriptor this function owns.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, need as libc::off_t) };
    let err = std::io::Error::last_os_error();
    drop(f);
    let _ = std::fs::remove_file(&probe);
    match r {
        0 => Ok(()),
        _ if out_of_space(&err) => Err(NoRoom::Full(format!(
            "{} KiB free, a counter segment needs at least {} KiB",
            free / 1024,
            need.div_ceil(1024)
        ))),
        _ => Err(NoRoom::Unusable(format!("cannot reserve space: {err}"))),
    }
}

/// Where the JSON report goes, settled before the program starts.
enum JsonOut {
    /// A regular file, new or not: the report is written to a temporary
    /// file beside it and renamed over it, so it is never left truncated.
    File {
        path: PathBuf,
        mode: Option<std::fs::Permissions>,
    },
    /// A FIFO, terminal or device, or a descriptor's name (`/dev/stdout`,
    /// a process substitution): opened now, written in place.
    Stream(std::fs::File),
}

/// A new file beside `target`, its name unique to this process.
fn temp_beside(target: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = target
        .file_name()
        .map_or("report".into(), |n| n.to_string_lossy());
    let mut n = 0;
    loop {
        let p = dir.join(format!(".{name}.rtprof-{}-{n}", std::process::id()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
        {
            Ok(f) => return Ok((p, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 100 => n += 1,
            Err(e) => return Err(e),
        }
    }
}

impl JsonOut {
    /// Checks that the report can be written to `path`; the error is one
    /// sentence.
    fn prepare(path: &Path) -> Result<JsonOut, String> {
        use std::os::unix::fs::OpenOptionsExt;
        // /dev/stdout and the like name a descriptor: when it is a file
        // (stdout redirected), the report goes after what the program
        // wrote there, not over it.
        let descriptor = ["/dev/stdout", "/dev/stderr", "/dev/fd", "/proc/self/fd"]
            .iter()
            .any(|d| path.starts_with(d));
        match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => Err("is a directory".into()),
            Ok(m) if !m.is_file() || descriptor => {
                // Non-blocking: a FIFO nobody reads is an error, not a hang.
                let f = std::fs::OpenOptions::new()
                    .append(m.is_file())
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(path)
                    .map_err(|e| match e.raw_os_error() {
                        Some(libc::ENXIO) => "is a FIFO that nobody reads".to_string(),
                        _ => e.to_string(),
                    })?;
                use std::os::fd::AsRawFd;
                // SAFETY: fcntl on a descriptor owned by `f`. Writes of the
                // report may block like any write to a pipe.
                unsafe {
                    let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
                    libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
                }
                Ok(JsonOut::Stream(f))
            }
            Ok(m) => {
                // Through a symbolic link: replace the file it names.
                let target = path.canonicalize().map_err(|e| e.to_string())?;
                if std::fs::OpenOptions::new()
                    .write(true)
                    .open(&target)
                    .is_err()
                {
                    return Err("exists and is not writable".into());
                }
                let (tmp, _) = temp_beside(&target).map_err(|e| {
                    format!("cannot create a file beside it to replace it with: {e}")
                })?;
                let _ = std::fs::remove_file(tmp);
                Ok(JsonOut::File {
                    path: target,
                    mode: Some(m.permissions()),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let (tmp, _) = temp_beside(path).map_err(|e| format!("cannot be created: {e}"))?;
                let _ = std::fs::remove_file(tmp);
                Ok(JsonOut::File {
                    path: path.to_path_buf(),
                    mode: None,
                })
            }
            Err(e) => Err(e.to_string()),
        }
    }

    fn write(self, text: &str) -> std::io::Result<()> {
        match self {
            JsonOut::Stream(mut f) => f.write_all(text.as_bytes()),
            JsonOut::File { path, mode } => {
                let (tmp, mut f) = temp_beside(&path)?;
                let r = (|| {
                    f.write_all(text.as_bytes())?;
                    if let Some(m) = mode {
                        f.set_permissions(m)?;
                    }
                    // On disk before it replaces the old report.
                    f.sync_all()?;
                    std::fs::rename(&tmp, &path)
                })();
                if r.is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
                r
            }
        }
    }
}

/// Checks `--modules` as the agent reads `RTPROF_MODULES`
/// (agent/src/config.rs): comma-separated globs matched against a module's
/// file name, with `*` and `?` the only wildcards; `all` (or `*`) for every
/// module, `main` for the executable.
fn check_modules(spec: &str) -> Result<(), String> {
    let globs: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .collect();
    if globs.is_empty() {
        return Err("no glob given (e.g. 'libpython*', or 'all')".into());
    }
    for g in globs {
        let shown = escape_text(g);
        if g.contains('/') {
            let name = g.rsplit('/').next().unwrap_or("");
            return Err(format!(
                "'{shown}': globs match a module's file name, not its path (try '{}')",
                escape_text(name)
            ));
        }
        if let Some(c) = g
            .chars()
            .find(|c| matches!(c, '[' | ']' | '{' | '}' | '\\'))
        {
            return Err(format!(
                "'{shown}': only * and ? are wildcards, '{c}' would be matched as it is"
            ));
        }
        if g.contains(char::is_whitespace) {
            return Err(format!("'{shown}': separate globs with commas, not spaces"));
        }
        if g.contains(char::is_control) {
            return Err(format!("'{shown}': contains a control character"));
        }
    }
    Ok(())
}

/// Maps a segment read-only: the reader touches only the pages it needs
/// (most of a segment is stripes no thread ever used). `None` for a file
/// with nothing in it: a process that died while its agent was starting,
/// or an agent that could not reserve the file's memory (a full
/// filesystem) and counted elsewhere. Those are recognised by reading, not
/// mapping: on a full tmpfs, touching a hole through a shared mapping
/// needs a page the filesystem cannot give, and the reader dies of
/// SIGBUS.
fn map_file(p: &Path) -> Result<Option<memmap2::Mmap>, String> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(p).map_err(|e| e.to_string())?;
    let mut magic = [0u8; 8];
    if f.read_exact_at(&mut magic, 0).is_err() || magic == [0; 8] {
        return Ok(None);
    }
    // SAFETY: a read-only mapping of a file in our private directory;
    // the reader validates every byte it uses.
    unsafe { memmap2::Mmap::map(&f) }
        .map(Some)
        .map_err(|e| e.to_string())
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
            Ok(Some(b)) => b,
            // No data, nothing to complain about.
            Ok(None) => continue,
            Err(e) => {
                eprintln!("rtprof: skipping {}: {e}", p.display());
                continue;
            }
        };
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

/// Runs `cmd` the way time(1) does: a terminal's Ctrl-C and Ctrl-\\ are
/// for the program (which starts with the default dispositions).
fn run_program(cmd: &mut Command) -> std::io::Result<ExitStatus> {
    // SAFETY: signal() with SIG_IGN, restored below.
    let old_int = unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    // SAFETY: as above.
    let old_quit = unsafe { libc::signal(libc::SIGQUIT, libc::SIG_IGN) };
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure only calls signal(),
    // which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGQUIT, libc::SIG_DFL);
            Ok(())
        })
    };
    let status = cmd.status();
    // SAFETY: restores the dispositions saved above.
    unsafe {
        libc::signal(libc::SIGINT, old_int);
        libc::signal(libc::SIGQUIT, old_quit);
    }
    status
}

/// rtprof's exit: the program's status, or death by the same signal.
fn exit_like(status: ExitStatus) -> ExitCode {
    if let Some(sig) = status.signal() {
        // Die the way the program died, so callers see the same status.
        // SAFETY: plain signal calls on this process.
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

pub fn run(args: RunArgs) -> ExitCode {
    // Mistakes in the arguments are reported before the program runs:
    // finding them after a long run would lose the profile.
    if let Some(m) = &args.modules {
        if let Err(e) = check_modules(m) {
            eprintln!("rtprof: --modules: {e}; the program was not run");
            return ExitCode::from(2);
        }
    }
    let json = match args.json.as_deref().map(JsonOut::prepare).transpose() {
        Ok(j) => j,
        Err(e) => {
            let p = args.json.as_deref().unwrap_or(Path::new(""));
            eprintln!(
                "rtprof: --json {}: {e}; the program was not run",
                escape_text(&p.to_string_lossy())
            );
            return ExitCode::from(2);
        }
    };
    let agent = match crate::find_agent(args.agent.clone()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rtprof: {e}");
            return ExitCode::from(127);
        }
    };
    let tmp = std::env::temp_dir();
    let shown_tmp = escape_text(&tmp.to_string_lossy()).into_owned();
    // A full filesystem loses the profile, not the program's run.
    let unprofiled = |why: &str| {
        eprintln!("rtprof: TMPDIR ({shown_tmp}) {why}; the program runs unprofiled");
    };
    let dir = match RunDir::new() {
        Ok(d) => match room_for_segments(&d.0) {
            Ok(()) => Some(d),
            Err(NoRoom::Full(why)) => {
                unprofiled(&format!("is full: {why}"));
                None
            }
            Err(NoRoom::Unusable(why)) => {
                unprofiled(&format!("cannot hold counter segments: {why}"));
                None
            }
        },
        Err(e) if out_of_space(&e) => {
            unprofiled(&format!("is full: {e}"));
            None
        }
        Err(e) => {
            eprintln!("rtprof: cannot create a private directory in {shown_tmp}: {e}");
            return ExitCode::from(127);
        }
    };
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    if let Some(dir) = &dir {
        let mut preload = agent.to_string_lossy().into_owned();
        if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
            preload.push(' ');
            preload.push_str(&old.to_string_lossy());
        }
        cmd.env("LD_PRELOAD", preload)
            .env("RTPROF_RUN_DIR", &dir.0)
            .env_remove("RTPROF_REPORT");
        if let Some(m) = &args.modules {
            cmd.env("RTPROF_MODULES", m);
        }
        if let Some(c) = &args.count {
            cmd.env("RTPROF_COUNT", c);
        }
        if let Some(c) = &args.nocount {
            cmd.env("RTPROF_NOCOUNT", c);
        }
        if let Some(b) = args.budget {
            cmd.env("RTPROF_BUDGET", b.to_string());
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
    }
    let status = match run_program(&mut cmd) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rtprof: cannot run {}: {e}", escape_text(&args.command[0]));
            return ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };

    let procs = dir.as_ref().map(|d| collect(&d.0)).unwrap_or_default();
    if let (Some(d), true) = (&dir, procs.is_empty()) {
        // The agent falls back to anonymous memory when it cannot reserve
        // its segment in the run directory: say so if that is why.
        match room_for_segments(&d.0) {
            Err(NoRoom::Full(why)) => eprintln!(
                "rtprof: no profile was recorded: TMPDIR ({shown_tmp}) is full: {why}"
            ),
            Err(NoRoom::Unusable(why)) => eprintln!(
                "rtprof: no profile was recorded: TMPDIR ({shown_tmp}) cannot hold counter segments: {why}"
            ),
            _ => eprintln!("rtprof: no profile was recorded (the program may be static, setuid, or not an ELF program)"),
        }
    }
    match json {
        Some(out) => {
            if let Err(e) = out.write(&report::json(&procs)) {
                eprintln!(
                    "rtprof: cannot write the report to {}: {e}",
                    escape_text(&args.json.unwrap_or_default().to_string_lossy())
                );
            }
        }
        None if dir.is_some() => eprint!(
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
        None => {}
    }
    drop(dir);
    exit_like(status)
}
