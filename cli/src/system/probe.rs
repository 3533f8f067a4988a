//! Before the agent goes into every process: it must load into a test
//! process and leave it working. Each test program runs twice, plainly and
//! with the agent preloaded, and the two must agree on exit status, output
//! and error output: a shell, a program under a seccomp filter that kills
//! on perf_event_open and timer_create (as systemd's `SystemCallFilter=`
//! does), and, run as root, a drop to nobody's privileges (setpriv keeps
//! its capabilities across setresuid, which glibc repeats in every
//! thread). The loader only warns (on stderr) when it cannot preload a
//! library, so a run also checks that the agent is mapped.

use crate::error::Error;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A run that takes longer has hung (the agent analyses these small
/// programs in milliseconds).
const LIMIT: Duration = Duration::from_secs(30);

/// Runs the test programs with `agent` preloaded.
pub fn check(agent: &Path) -> Result<(), Error> {
    let failed = |command: &str, problem: String| Error::ProbeFailed {
        agent: agent.into(),
        command: command.into(),
        problem,
    };
    let mut programs: Vec<(&[&str], Sandbox)> = vec![
        (&["/bin/true"], Sandbox::None),
        (
            &["/bin/sh", "-c", "echo ok; echo to-stderr >&2; exit 3"],
            Sandbox::None,
        ),
        (
            &["/bin/sh", "-c", "echo sandboxed; exit 4"],
            Sandbox::SystemdLike,
        ),
    ];
    // SAFETY: geteuid takes nothing and cannot fail.
    if unsafe { libc::geteuid() } == 0 && Path::new(SETPRIV).exists() {
        programs.push((DROP_TO_NOBODY, Sandbox::None));
    }
    for (argv, sandbox) in programs {
        let mut shown = shown(argv);
        if sandbox == Sandbox::SystemdLike {
            shown.push_str(" (under a seccomp filter)");
        }
        let plain = run_in(argv, None, sandbox).map_err(|p| failed(&shown, p))?;
        let with = run_in(argv, Some(agent), sandbox).map_err(|p| failed(&shown, p))?;
        if let Some(p) = difference(&plain, &with) {
            return Err(failed(&shown, p));
        }
    }
    let argv = ["/bin/cat", "/proc/self/maps"];
    let maps = run(&argv, Some(agent)).map_err(|p| failed(&shown(&argv), p))?;
    let mapped = String::from_utf8_lossy(&maps.stdout)
        .lines()
        .any(|l| l.ends_with(&*agent.to_string_lossy()));
    if !maps.status.success() || !mapped {
        return Err(failed(
            &shown(&argv),
            format!(
                "the agent is not loaded{}",
                stderr_text(&maps.stderr)
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            ),
        ));
    }
    Ok(())
}

const SETPRIV: &str = "/usr/bin/setpriv";
const DROP_TO_NOBODY: &[&str] = &[
    SETPRIV,
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "/bin/sh",
    "-c",
    "id -u; id -g",
];

/// What a test program runs under.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Sandbox {
    None,
    /// A seccomp filter from its start that kills the process on
    /// perf_event_open and timer_create, and allows the rest.
    SystemdLike,
}

/// The BPF program of [`Sandbox::SystemdLike`].
fn systemd_like_filter() -> Vec<libc::sock_filter> {
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let load = |at: usize| stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, at as u32);
    let kill = stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_KILL_PROCESS);
    let allow = stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW);
    vec![
        load(std::mem::offset_of!(libc::seccomp_data, arch)),
        jeq(AUDIT_ARCH_X86_64, 1, 0),
        kill,
        load(std::mem::offset_of!(libc::seccomp_data, nr)),
        jeq(libc::SYS_perf_event_open as u32, 0, 1),
        kill,
        jeq(libc::SYS_timer_create as u32, 0, 1),
        kill,
        allow,
    ]
}

fn shown(argv: &[&str]) -> String {
    argv.iter()
        .map(|a| {
            if a.contains(' ') {
                format!("'{a}'")
            } else {
                a.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `argv` with no input, the caller's environment less anything that
/// would steer the agent (an `RTPROF_DISABLE=1` left in root's shell would
/// make the test say nothing), and `agent` preloaded if given.
fn run(argv: &[&str], agent: Option<&Path>) -> Result<Output, String> {
    run_in(argv, agent, Sandbox::None)
}

/// [`run`], under `sandbox`.
fn run_in(argv: &[&str], agent: Option<&Path>, sandbox: Sandbox) -> Result<Output, String> {
    let mut c = Command::new(argv[0]);
    if sandbox == Sandbox::SystemdLike {
        let filter = systemd_like_filter();
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs in the forked child before exec and
        // makes two system calls only (no allocation: the filter was
        // built before the fork and is only read).
        unsafe {
            c.pre_exec(move || {
                let prog = libc::sock_fprog {
                    len: filter.len() as u16,
                    filter: filter.as_ptr() as *mut libc::sock_filter,
                };
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || libc::prctl(
                        libc::PR_SET_SECCOMP,
                        libc::SECCOMP_MODE_FILTER,
                        &prog as *const libc::sock_fprog,
                    ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        };
    }
    c.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("LD_PRELOAD");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("RTPROF_") {
            c.env_remove(k);
        }
    }
    if let Some(a) = agent {
        c.env("LD_PRELOAD", a);
    }
    let mut child = c.spawn().map_err(|e| format!("cannot start it: {e}"))?;
    // Read as it comes, so a full pipe never holds the program up.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut b);
            }
            b
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() < LIMIT => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("still running after {} s; killed", LIMIT.as_secs()));
            }
            Err(e) => return Err(format!("cannot wait for it: {e}")),
        }
    };
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

fn stderr_text(b: &[u8]) -> Option<String> {
    let t = String::from_utf8_lossy(b).trim().to_string();
    (!t.is_empty()).then_some(t)
}

/// How the run with the agent differs from the plain one, if it does.
fn difference(plain: &Output, with: &Output) -> Option<String> {
    if plain.status != with.status {
        return Some(format!(
            "it ended with {} instead of {}{}",
            with.status,
            plain.status,
            stderr_text(&with.stderr)
                .map(|e| format!(" (stderr: {e})"))
                .unwrap_or_default()
        ));
    }
    if plain.stdout != with.stdout {
        return Some(format!(
            "its output was {:?} instead of {:?}",
            String::from_utf8_lossy(&with.stdout),
            String::from_utf8_lossy(&plain.stdout)
        ));
    }
    if plain.stderr != with.stderr {
        return Some(format!(
            "its error output was {:?} instead of {:?}",
            String::from_utf8_lossy(&with.stderr),
            String::from_utf8_lossy(&plain.stderr)
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn out(code: i32, stdout: &str, stderr: &str) -> Output {
        Output {
            status: std::process::ExitStatus::from_raw(code << 8),
            stdout: stdout.into(),
            stderr: stderr.into(),
        }
    }

    #[test]
    fn any_difference_fails() {
        let plain = out(3, "ok\n", "to-stderr\n");
        assert_eq!(difference(&plain, &out(3, "ok\n", "to-stderr\n")), None);
        let loader_warning = "ERROR: ld.so: object 'x' from LD_PRELOAD cannot be preloaded";
        assert!(difference(&plain, &out(3, "ok\n", loader_warning))
            .unwrap()
            .starts_with("its error output was"));
        assert!(difference(&plain, &out(3, "", "to-stderr\n"))
            .unwrap()
            .starts_with("its output was"));
        assert!(difference(&plain, &out(0, "ok\n", "to-stderr\n"))
            .unwrap()
            .contains("instead of exit status: 3"));
    }

    /// The filter is in place in the program, and kills it on the calls
    /// it names (here perf_event_open, made by perf itself if present,
    /// else by nothing: the status line is the proof that counts).
    #[test]
    fn the_sandboxed_program_runs_under_a_filter() {
        let o = run_in(
            &["/bin/sh", "-c", "grep '^Seccomp:' /proc/self/status"],
            None,
            Sandbox::SystemdLike,
        )
        .unwrap();
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "Seccomp:\t2");
        let plain = run(
            &["/bin/sh", "-c", "grep '^Seccomp:' /proc/self/status"],
            None,
        )
        .unwrap();
        assert_eq!(String::from_utf8_lossy(&plain.stdout).trim(), "Seccomp:\t0");
    }

    #[test]
    fn the_plain_programs_behave() {
        let o = run(&["/bin/sh", "-c", "echo ok; exit 3"], None).unwrap();
        assert_eq!(o.status.code(), Some(3));
        assert_eq!(o.stdout, b"ok\n");
        let e = check(Path::new("/nonexistent/librtprof.so")).unwrap_err();
        assert!(
            e.to_string().contains("fails a test run of `/bin/true`"),
            "{e}"
        );
    }
}
