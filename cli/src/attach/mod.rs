//! `rtprof attach PID` and `rtprof detach PID`: load the agent into a
//! running process, profile it for a while, report, and leave it running
//! its original code.
//!
//! The process's threads are held with ptrace only for two short calls
//! made in one of them (`dlopen` of the agent, then its
//! `rtprof_attach`); the agent instruments in a thread of its own
//! afterwards, holding the threads still only while it writes entries
//! (its own helper task, as for the overhead budget). Detaching is one
//! more call, `rtprof_detach`, which puts every entry back the same way.

mod arch;
mod hazards;
mod inject;
mod ptrace;
mod refuse;

use crate::export::{model, Output, OutputArgs};
use crate::run::room::RunDir;
use clap::Args;
use hazards::Hazards;
use inject::{call, mappings, remote_symbol, Arg};
use ptrace::{SeizeError, Stopped};
use refuse::AttachRefusal;
use rtprof_shared::report;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct AttachArgs {
    /// The process to profile.
    pid: i32,
    /// Modules to instrument besides the executable, e.g. 'libpython*' or 'all'.
    #[arg(long, value_name = "GLOBS")]
    modules: Option<String>,
    /// Seconds to profile (default: until Ctrl-C).
    #[arg(long, value_name = "SECONDS")]
    duration: Option<f64>,
    #[command(flatten)]
    output: OutputArgs,
    /// Samples per second of CPU time, per thread (0: no sampling).
    #[arg(long, value_name = "HZ")]
    sample_hz: Option<u32>,
    /// List every function of the instrumented modules in the JSON
    /// report, called or not (by default only those called or sampled).
    #[arg(long)]
    all_functions: bool,
    /// Rows listed (0: all that were called).
    #[arg(long, default_value_t = 25)]
    top: usize,
    /// Show per-module patch statistics with refusal reasons.
    #[arg(long)]
    stats: bool,
    /// Each thread's calls and samples after the process's rows (threads
    /// there at attach, and those created or ended while attached).
    #[arg(long)]
    threads: bool,
    /// Agent diagnostics on the process's stderr, and how long it was held.
    #[arg(long)]
    verbose: bool,
    /// Path of librtprof.so.
    #[arg(long, value_name = "PATH")]
    agent: Option<PathBuf>,
}

#[derive(Args)]
pub struct DetachArgs {
    /// The process to stop profiling.
    pid: i32,
}

/// How long the agent may take to instrument (large libraries without a
/// cached plan take seconds) and to put entries back.
const AGENT_DEADLINE: Duration = Duration::from_secs(120);

/// Settings of the agent's environment that rtprof hands on from its own.
const FORWARDED: [&str; 7] = [
    "RTPROF_DAEMON_SOCKET",
    "RTPROF_CACHE",
    "RTPROF_DEBUG_DIR",
    "RTPROF_COUNT",
    "RTPROF_NOCOUNT",
    "RTPROF_MAX_THREADS",
    "RTPROF_SPARE_FUNCTIONS",
];

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

#[derive(Debug)]
enum Failure {
    Refused(AttachRefusal),
    Seize(SeizeError),
    NoFunction(&'static str),
    Call(&'static str, inject::CallError),
    DlopenFailed,
    AgentSaid(String),
    /// No answer in time: what the process's threads were doing then.
    AgentSilent(String),
    /// No thread was found outside libc and the loader in time.
    Busy,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Refused(r) => write!(f, "{r}"),
            Failure::Seize(SeizeError::Refused(e)) => write!(f, "{}", refuse::ptrace_refused(*e)),
            Failure::Seize(SeizeError::Timeout(t)) => {
                write!(f, "thread {t} did not stop within 2 s; nothing was changed")
            }
            Failure::Seize(SeizeError::Other(what, e)) => write!(f, "{what}: {e}"),
            Failure::NoFunction(name) => write!(f, "no {name} found in the process"),
            Failure::Call(what, e) => write!(f, "calling {what} in the process: {e}"),
            Failure::DlopenFailed => write!(
                f,
                "the process could not load the agent (dlopen returned NULL: a different \
                 libc, no room in its static TLS, or the agent's path is not visible to it)"
            ),
            Failure::AgentSaid(m) => write!(f, "{m}"),
            Failure::Busy => write!(
                f,
                "no thread of the process could be caught outside libc within {} s (a call \
                 made inside malloc would deadlock); nothing was changed, try again",
                MOVE_LIMIT.as_secs()
            ),
            Failure::AgentSilent(threads) => write!(
                f,
                "the agent did not answer within {} s (threads then: {threads})",
                AGENT_DEADLINE.as_secs()
            ),
        }
    }
}

fn maps_of(pid: i32) -> Result<String, Failure> {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| {
        // Reading another process's memory map takes what ptrace takes.
        match e.raw_os_error() {
            Some(libc::EACCES | libc::EPERM) => {
                Failure::Refused(refuse::ptrace_refused(libc::EPERM))
            }
            _ => Failure::Refused(AttachRefusal::NoSuchProcess),
        }
    })
}

fn seize(pid: i32) -> Result<Stopped, Failure> {
    Stopped::seize(pid).map_err(|e| match e {
        SeizeError::Refused(errno) => Failure::Refused(refuse::ptrace_refused(errno)),
        e => Failure::Seize(e),
    })
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Each thread of `pid` as `tid name state syscall`: what a silent agent
/// is doing (its threads are named `rtprof-*`), for the message.
fn thread_states(pid: i32) -> String {
    let mut tids = ptrace::tasks(pid);
    if tids.is_empty() {
        return "unreadable".into();
    }
    tids.sort_unstable();
    let read = |tid: i32, what: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/{what}")).unwrap_or_default()
    };
    let states: Vec<String> = tids
        .into_iter()
        .map(|tid| {
            let stat = read(tid, "stat");
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .unwrap_or("?")
                .to_string();
            let syscall = read(tid, "syscall");
            let call = syscall.split_whitespace().next().unwrap_or("?");
            format!("{tid} {} {state} syscall {call}", read(tid, "comm").trim())
        })
        .collect();
    states.join("; ")
}

/// Waits for the agent's answer in `path` ("ok" or a message).
fn await_status(pid: i32, path: &Path) -> Result<String, Failure> {
    let started = Instant::now();
    loop {
        // Not through a link, never a FIFO: the directory may be the
        // process's user's (root attaching to another user's process).
        let read = crate::run::segments::open_regular(path).and_then(|f| {
            let mut t = String::new();
            std::io::Read::read_to_string(&mut std::io::Read::take(f, 1 << 20), &mut t)?;
            Ok(t)
        });
        if let Ok(text) = read {
            let text = text.trim().to_string();
            return match text.strip_prefix("error: ") {
                Some(m) => Err(Failure::AgentSaid(m.to_string())),
                None => Ok(text),
            };
        }
        if !alive(pid) {
            return Err(Failure::Refused(AttachRefusal::NoSuchProcess));
        }
        if started.elapsed() > AGENT_DEADLINE {
            return Err(Failure::AgentSilent(thread_states(pid)));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Loads the agent and starts it; returns how long the threads were held.
/// Everything that can be found out beforehand (addresses, symbols) is,
/// so the threads are held only for the calls.
fn inject(pid: i32, agent: &Path, spec: &str) -> Result<Duration, Failure> {
    refuse::check_process(pid).map_err(Failure::Refused)?;
    let maps_text = maps_of(pid)?;
    refuse::check_maps(&maps_text).map_err(Failure::Refused)?;
    let agent_path = agent.to_string_lossy().into_owned();
    let maps = mappings(&maps_text);
    let loaded = maps
        .iter()
        .any(|m| refuse::file_name(&m.path).starts_with("librtprof"));
    // Attached before and detached since, or preloaded: the agent is there.
    let start = if loaded {
        match agent_function(pid, "rtprof_attach") {
            // An agent without attach, preloaded: it profiles already.
            Err(Failure::NoFunction(_)) => {
                return Err(Failure::Refused(AttachRefusal::AlreadyProfiled))
            }
            r => Start::At(r?),
        }
    } else {
        let libc = refuse::libc_path(&maps).ok_or(Failure::Refused(AttachRefusal::Static))?;
        let dlopen = remote_symbol(pid, &maps, libc, &["dlopen", "__libc_dlopen_mode"])
            .ok_or(Failure::NoFunction("dlopen"))?;
        let value = inject::symbol_value(&agent_path, &["rtprof_attach"])
            .ok_or(Failure::NoFunction("rtprof_attach in the agent"))?;
        Start::AfterDlopen { dlopen, value }
    };
    let hazards = Hazards::of(pid, &maps_text);
    let held = Instant::now();
    let mut stopped = seize(pid)?;
    stopped.choose_caller();
    if !stopped.move_caller_out_of(&hazards, MOVE_LIMIT) {
        return Err(Failure::Busy);
    }
    let start = match start {
        Start::At(a) => a,
        Start::AfterDlopen { dlopen, value } => {
            let handle = call(
                &mut stopped,
                dlopen,
                &[Arg::Str(&agent_path), Arg::Int(libc::RTLD_NOW as u64)],
            )
            .map_err(|e| Failure::Call("dlopen", e))?;
            if handle == 0 {
                return Err(Failure::DlopenFailed);
            }
            // The handle is the library's link_map, whose first field is
            // its load bias.
            let bias =
                inject::read_u64(pid, handle).ok_or(Failure::NoFunction("the agent's link map"))?;
            bias + value
        }
    };
    let r = call(&mut stopped, start, &[Arg::Str(spec)])
        .map_err(|e| Failure::Call("rtprof_attach", e))?;
    drop(stopped);
    let held = held.elapsed();
    match r {
        0 => Ok(held),
        1 => Err(Failure::Refused(AttachRefusal::AlreadyProfiled)),
        _ => Err(Failure::AgentSaid(
            "the agent could not start its thread in the process".into(),
        )),
    }
}

/// How long a busy calling thread may take to be found outside libc.
const MOVE_LIMIT: Duration = Duration::from_secs(2);

enum Start {
    /// The agent is loaded: its entry point.
    At(u64),
    /// Load it first; the entry point is its load bias plus `value`.
    AfterDlopen { dlopen: u64, value: u64 },
}

/// An exported function of the agent loaded in `pid`.
fn agent_function(pid: i32, name: &'static str) -> Result<u64, Failure> {
    let maps = mappings(&maps_of(pid)?);
    let path = maps
        .iter()
        .find(|m| refuse::file_name(&m.path).starts_with("librtprof"))
        .map(|m| m.path.clone())
        .ok_or(Failure::NoFunction("librtprof.so"))?;
    remote_symbol(pid, &maps, &path, &[name]).ok_or(Failure::NoFunction(name))
}

/// Asks the agent in `pid` to put every entry back; waits until it has.
fn detach(pid: i32, status_dir: &Path) -> Result<String, Failure> {
    let status = status_dir.join("detach.status");
    let f = agent_function(pid, "rtprof_detach")?;
    let held = Instant::now();
    let hazards = Hazards::of(pid, &maps_of(pid)?);
    let mut stopped = seize(pid)?;
    stopped.choose_caller();
    if !stopped.move_caller_out_of(&hazards, MOVE_LIMIT) {
        return Err(Failure::Busy);
    }
    let path = status.to_string_lossy().into_owned();
    let r =
        call(&mut stopped, f, &[Arg::Str(&path)]).map_err(|e| Failure::Call("rtprof_detach", e))?;
    drop(stopped);
    let held = held.elapsed();
    if r != 0 {
        return Err(Failure::AgentSaid(
            "the agent is not attached in the process".into(),
        ));
    }
    await_status(pid, &status).map(|said| {
        format!(
            "{said}; process held {:.1} ms for the call",
            held.as_secs_f64() * 1e3
        )
    })
}

/// rtprof's private directory, where the agent in `pid` writes its answers
/// and its counters' copy: handed to the process's user when that is not
/// us (root attaching to another user's process), still closed to others.
fn private_dir_for(pid: i32) -> Result<RunDir, String> {
    let dir = RunDir::new(&crate::run::room::base().0)
        .map_err(|e| format!("cannot create a private directory: {e}"))?;
    // SAFETY: a plain system call without arguments.
    let me = unsafe { libc::geteuid() };
    // Anyone else is refused later, with the reason.
    let theirs = refuse::owner(pid).filter(|&(uid, _)| uid != me && refuse::may_trace_anyone());
    if let Some((uid, gid)) = theirs {
        std::os::unix::fs::chown(&dir.0, Some(uid), Some(gid)).map_err(|e| {
            format!(
                "cannot give the private directory {} to the process's user {uid}: {e}",
                dir.0.display()
            )
        })?;
    }
    Ok(dir)
}

/// Checks the arguments and finds the agent before anything is done to
/// the process: the output asked for and the agent's path. Says why not,
/// and the exit code (2: the arguments, 127: no agent).
fn check_args(args: &AttachArgs) -> Result<(Option<Output>, PathBuf), ExitCode> {
    if let Some(m) = &args.modules {
        if let Err(e) = crate::run::modules_arg::check(m) {
            eprintln!("rtprof: --modules: {e}; nothing was attached");
            return Err(ExitCode::from(2));
        }
    }
    let output = match Output::from_args(&args.output) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("rtprof: {e}; nothing was attached");
            return Err(ExitCode::from(2));
        }
    };
    match crate::agent::find(args.agent.clone()) {
        Ok(a) => Ok((output, a)),
        Err(e) => {
            eprintln!("rtprof: {e}");
            Err(ExitCode::from(127))
        }
    }
}

/// The settings handed to `rtprof_attach`, one `NAME=value` a line: the
/// private directory `dir` and where to answer in it, the arguments', and
/// what the agent would read from its environment, as rtprof has it.
fn agent_spec(args: &AttachArgs, dir: &Path) -> String {
    let mut spec = format!(
        "RTPROF_RUN_DIR={}\nRTPROF_ATTACH_STATUS={}\n",
        dir.display(),
        dir.join("attach.status").display()
    );
    if let Some(m) = &args.modules {
        spec.push_str(&format!("RTPROF_MODULES={m}\n"));
    }
    if args.verbose {
        spec.push_str("RTPROF_VERBOSE=1\n");
    }
    if let Some(hz) = args.sample_hz {
        spec.push_str(&format!("RTPROF_SAMPLE_HZ={hz}\n"));
    }
    for var in FORWARDED {
        if let Some(v) = std::env::var_os(var) {
            spec.push_str(&format!("{var}={}\n", v.to_string_lossy()));
        }
    }
    spec
}

/// Ctrl-C (or a terminal hang-up, a kill) while the threads are held or
/// the agent is attached must still detach: it only ends the wait.
fn end_wait_on_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installs an async-signal-safe handler (one atomic store).
        unsafe { libc::signal(sig, on_sigint as *const () as libc::sighandler_t) };
    }
}

/// Loads the agent at `agent` into `pid` with `spec` and waits for it to
/// say it has attached (in `dir`). Says why not, and the exit code.
fn start_agent(
    pid: i32,
    agent: &Path,
    spec: &str,
    dir: &Path,
    verbose: bool,
) -> Result<(), ExitCode> {
    let held = match inject(pid, agent, spec) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("rtprof: cannot attach to {pid}: {e}");
            return Err(ExitCode::from(1));
        }
    };
    if verbose {
        eprintln!(
            "rtprof: process {pid} held for {:.1} ms to load the agent",
            held.as_secs_f64() * 1e3
        );
    }
    match await_status(pid, &dir.join("attach.status")) {
        Ok(said) => {
            if verbose {
                eprintln!("rtprof: attached to {pid}: {said}");
            }
            Ok(())
        }
        Err(e) => {
            eprintln!("rtprof: cannot attach to {pid}: {e}");
            Err(ExitCode::from(1))
        }
    }
}

/// Profiles until `duration` seconds have passed (if given), a signal
/// came, or the process ended.
fn wait_for_end(pid: i32, duration: Option<f64>) {
    let until = duration.map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    while !INTERRUPTED.load(Ordering::Relaxed)
        && until.is_none_or(|u| Instant::now() < u)
        && alive(pid)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Calls `detach` again while the process is busy (no thread of it was
/// caught outside libc), [`DETACH_TRIES`] times at most: a busy process
/// may take a few tries.
fn retry_while_busy(
    mut detach: impl FnMut() -> Result<String, Failure>,
) -> Result<String, Failure> {
    let mut tries = 0;
    loop {
        tries += 1;
        match detach() {
            Err(Failure::Busy) if tries < DETACH_TRIES => continue,
            r => break r,
        }
    }
}

/// Tries at most to detach from a busy process.
const DETACH_TRIES: u32 = 5;

/// Detaches from `pid` if it still runs (answers in `dir`): the exit
/// code, 1 if the agent could not be detached.
fn detach_if_alive(pid: i32, dir: &Path, verbose: bool) -> ExitCode {
    if !alive(pid) {
        return ExitCode::SUCCESS;
    }
    match retry_while_busy(|| detach(pid, dir)) {
        Ok(said) if verbose => eprintln!("rtprof: detached from {pid}: {said}"),
        Ok(_) => {}
        Err(e) => {
            eprintln!("rtprof: detaching from {pid}: {e}");
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}

/// Reports the profile the agent left in `dir`, to `output` or as text;
/// whether there was one (said if not).
fn write_report(args: &AttachArgs, dir: &Path, output: Option<Output>) -> bool {
    let mut procs = crate::run::segments::collect(dir);
    crate::source_lines::annotate(&mut procs);
    crate::loops::annotate(&mut procs);
    if procs.is_empty() {
        eprintln!("rtprof: no profile was recorded");
        return false;
    }
    match output {
        Some(o) => {
            let name = format!("pid {}", args.pid);
            o.write(
                || {
                    report::json(
                        &procs,
                        match args.all_functions {
                            true => report::Listing::All,
                            false => report::Listing::Used,
                        },
                    )
                },
                || model::from_snapshots(&name, &procs),
            );
        }
        None => eprint!(
            "{}",
            report::text(
                &procs,
                report::TextOptions {
                    top: args.top,
                    stats: args.stats,
                    threads: args.threads,
                    ..Default::default()
                }
            )
        ),
    }
    true
}

pub fn run_attach(args: AttachArgs) -> ExitCode {
    let (output, agent) = match check_args(&args) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let pid = args.pid;
    let dir = match private_dir_for(pid) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("rtprof: {e}");
            return ExitCode::from(1);
        }
    };
    let spec = agent_spec(&args, &dir.0);
    end_wait_on_signals();
    if let Err(code) = start_agent(pid, &agent, &spec, &dir.0, args.verbose) {
        return code;
    }
    wait_for_end(pid, args.duration);
    let code = detach_if_alive(pid, &dir.0, args.verbose);
    if !write_report(&args, &dir.0, output) {
        return ExitCode::from(1);
    }
    code
}

pub fn run_detach(args: DetachArgs) -> ExitCode {
    let dir = match private_dir_for(args.pid) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("rtprof: {e}");
            return ExitCode::from(1);
        }
    };
    match detach(args.pid, &dir.0) {
        Ok(_) => {
            eprintln!("rtprof: detached from {}", args.pid);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rtprof: cannot detach from {}: {e}", args.pid);
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Line {
        #[command(flatten)]
        args: AttachArgs,
    }

    fn args(line: &[&str]) -> AttachArgs {
        let line = std::iter::once("rtprof").chain(line.iter().copied());
        Line::try_parse_from(line).unwrap().args
    }

    /// The agent learns its directory and where to answer first, then
    /// only what was asked for.
    #[test]
    fn the_spec_names_the_directory_and_what_was_asked() {
        let dir = Path::new("/run/rtprof/x");
        let spec = agent_spec(&args(&["7"]), dir);
        assert!(spec.starts_with(
            "RTPROF_RUN_DIR=/run/rtprof/x\nRTPROF_ATTACH_STATUS=/run/rtprof/x/attach.status\n"
        ));
        assert!(!spec.contains("RTPROF_MODULES") && !spec.contains("RTPROF_VERBOSE"));
        let spec = agent_spec(
            &args(&["7", "--modules", "libz*", "--verbose", "--sample-hz", "99"]),
            dir,
        );
        assert!(spec.contains("\nRTPROF_MODULES=libz*\nRTPROF_VERBOSE=1\nRTPROF_SAMPLE_HZ=99\n"));
    }

    static HANDLED: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

    extern "C" fn count_usr1(_: libc::c_int) {
        HANDLED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// A child asleep in `epoll_wait` (no timeout) is held, gets a signal
    /// while a call is made in it (withheld, as the agent's sampling
    /// signal is when the call takes CPU time), and is let go: the signal's
    /// handler runs once and the wait goes on, as if it had come just
    /// before the call; it never fails with EINTR.
    #[test]
    fn a_signal_withheld_during_a_call_never_ends_the_wait_with_eintr() {
        let mut wake = [0i32; 2];
        let mut report = [0i32; 2];
        // SAFETY: pipes into our arrays.
        assert!(unsafe {
            libc::pipe(wake.as_mut_ptr()) == 0 && libc::pipe(report.as_mut_ptr()) == 0
        });
        // SAFETY: the child makes only async-signal-safe system calls and
        // leaves with _exit.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: as above: plain system calls on our own descriptors.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = count_usr1 as *const () as usize;
                sa.sa_flags = libc::SA_RESTART;
                libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
                let ep = libc::epoll_create1(0);
                let mut ev = libc::epoll_event {
                    events: libc::EPOLLIN as u32,
                    u64: 0,
                };
                libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, wake[0], &mut ev);
                libc::write(report[1], b"r".as_ptr().cast(), 1);
                let n = libc::epoll_wait(ep, &mut ev, 1, -1);
                let said = if n < 0 {
                    b'E'
                } else {
                    b'0' + HANDLED.load(std::sync::atomic::Ordering::Relaxed)
                };
                libc::write(report[1], [said].as_ptr().cast(), 1);
                libc::_exit(0);
            }
        }
        let read_byte = || {
            let mut b = [0u8];
            // SAFETY: one byte into our buffer.
            let n = unsafe { libc::read(report[0], b.as_mut_ptr().cast(), 1) };
            assert_eq!(n, 1);
            b[0]
        };
        assert_eq!(read_byte(), b'r');
        // Asleep in epoll_wait (232) before it is held.
        while !std::fs::read_to_string(format!("/proc/{child}/syscall"))
            .unwrap_or_default()
            .starts_with("232 ")
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut stopped = Stopped::seize(child).unwrap();
        // SAFETY: a signal to our own child, held still: it comes at the call.
        unsafe { libc::kill(child, libc::SIGUSR1) };
        // The child is a fork of this process: getpid is at the same address.
        let getpid = libc::getpid as *const () as u64;
        assert_eq!(call(&mut stopped, getpid, &[]).unwrap(), child as u64);
        drop(stopped);
        std::thread::sleep(Duration::from_millis(100));
        // SAFETY: one byte from our buffer.
        assert_eq!(unsafe { libc::write(wake[1], b"w".as_ptr().cast(), 1) }, 1);
        assert_eq!(read_byte() as char, '1', "E: the wait failed with EINTR");
        let mut status = 0;
        // SAFETY: reaps our own child.
        unsafe { libc::waitpid(child, &mut status, 0) };
    }

    /// A silent agent's message names each thread with its state.
    #[test]
    fn thread_states_name_each_thread_with_its_state() {
        let pid = std::process::id() as i32;
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("states-probe".into())
            .spawn(move || rx.recv())
            .unwrap();
        // Named and asleep in its futex wait within moments.
        let mut said = thread_states(pid);
        for _ in 0..200 {
            if said.contains("states-probe S syscall 202") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            said = thread_states(pid);
        }
        drop(tx);
        t.join().unwrap().ok();
        assert!(said.starts_with(&format!("{pid} ")), "{said}");
        assert!(said.contains("states-probe S syscall 202"), "{said}");
        assert_eq!(thread_states(-1), "unreadable");
    }

    /// A busy process is tried a few times; any other outcome ends the
    /// tries at once.
    #[test]
    fn detaching_is_tried_again_only_while_the_process_is_busy() {
        let mut tries = 0;
        let r = retry_while_busy(|| {
            tries += 1;
            Err(Failure::Busy)
        });
        assert!(matches!(r, Err(Failure::Busy)));
        assert_eq!(tries, DETACH_TRIES);
        let mut tries = 0;
        let r = retry_while_busy(|| {
            tries += 1;
            match tries {
                1 => Err(Failure::Busy),
                _ => Err(Failure::AgentSilent(String::new())),
            }
        });
        assert!(matches!(r, Err(Failure::AgentSilent(_))));
        assert_eq!(tries, 2);
    }
}
