//! `rtprof system enable/disable/status` on the real paths (/etc/ld.so.preload,
//! /etc/rtprof, /usr/lib/rtprof, /run/rtprof), each test in a private mount
//! namespace of its own thread: a copy of /etc, a writable overlay on
//! /usr/lib, and empty tmpfs on /run and /tmp. Nothing these tests write
//! reaches the machine's own files (beyond the agents' plan caches), and
//! the machine's systemd is out of reach (its sockets are in the hidden
//! /run). They need root, and fail without it.

use rtprof_abi::present::read_view;
use rtprof_e2e::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const PRELOAD: &str = "/etc/ld.so.preload";
const AGENT: &str = "/usr/lib/rtprof/librtprof.so";
const BACKUP: &str = "/etc/rtprof/ld.so.preload.orig";
const WAS_ABSENT: &str = "/etc/rtprof/ld.so.preload.absent";

fn rtprof_system(args: &[&str]) -> Output {
    Command::new(rtprof())
        .arg("system")
        .args(args)
        .env_remove("RTPROF_AGENT")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn enable() -> Output {
    let o = rtprof_system(&["enable", "--no-warm", "--agent", agent().to_str().unwrap()]);
    assert!(o.status.success(), "enable: {}", stderr(&o));
    o
}

fn disable() -> Output {
    let o = rtprof_system(&["disable"]);
    assert!(o.status.success(), "disable: {}", stderr(&o));
    o
}

fn status() -> String {
    let o = rtprof_system(&["status"]);
    assert!(o.status.success(), "status: {}", stderr(&o));
    stdout(&o)
}

fn read(path: &str) -> Option<Vec<u8>> {
    std::fs::read(path).ok()
}

/// Whether a process started now loads the agent.
fn new_process_loads_agent() -> bool {
    let o = Command::new("/bin/cat")
        .arg("/proc/self/maps")
        .output()
        .unwrap();
    stdout(&o).contains(AGENT)
}

fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // pid (comm) state ppid ...: comm may hold spaces, not ')'.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split(' ').nth(1).unwrap().parse().unwrap()
}

/// rtprofd on its default socket and segment (as the agents in
/// /etc/ld.so.preload expect), killed on drop.
struct DefaultDaemon(std::process::Child);

impl DefaultDaemon {
    fn start() -> DefaultDaemon {
        std::fs::create_dir_all("/run/rtprof").unwrap();
        let log = std::fs::File::create(scratch("default-daemon").join("rtprofd.log")).unwrap();
        let child = Command::new(rtprof().with_file_name("rtprofd"))
            .args(["--tick", "200", "--span", "1000", "--buffer-mib", "4"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        wait_until("rtprofd listens", Duration::from_secs(20), || {
            Path::new(rtprof_abi::protocol::DEFAULT_SOCKET).exists()
                && Path::new(rtprof_abi::protocol::DEFAULT_PRESENT).exists()
        });
        DefaultDaemon(child)
    }
}

impl Drop for DefaultDaemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// No /etc/ld.so.preload before: enable creates it with the agent alone,
/// twice is once, a new process tree is profiled and followed by the
/// daemon, status says so; disable removes the file again and new
/// processes run without the agent.
#[test]
fn enable_profiles_new_process_trees_and_disable_removes_the_file() {
    private_machine(&["/usr/lib"]);
    let dir = scratch("enable");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Compiled before the agent is in every process (gcc's too).
    let bin = compile_o2("rate.c", &[], &dir);
    assert!(status().contains("preload      off (no /etc/ld.so.preload)"));
    assert!(!new_process_loads_agent());

    let o = enable();
    assert!(
        stdout(&o).contains("/etc/ld.so.preload: added /usr/lib/rtprof/librtprof.so"),
        "{}",
        stdout(&o)
    );
    assert!(
        stdout(&o).contains("systemd is not running here"),
        "{}",
        stdout(&o)
    );
    assert_eq!(read(PRELOAD).unwrap(), format!("{AGENT}\n").as_bytes());
    assert_eq!(read(AGENT).unwrap(), std::fs::read(agent()).unwrap());
    use std::os::unix::fs::MetadataExt;
    let mode = |p: &str| std::fs::metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(mode(AGENT), 0o644);
    assert_eq!(mode("/usr/lib/rtprof"), 0o755);
    assert_eq!(mode(PRELOAD), 0o644);
    assert!(Path::new(WAS_ABSENT).exists() && !Path::new(BACKUP).exists());
    let st = status();
    assert!(
        st.contains("preload      on (/usr/lib/rtprof/librtprof.so in /etc/ld.so.preload)"),
        "{st}"
    );
    assert!(st.contains("daemon       not running"), "{st}");

    // Twice: nothing changes, and it says so.
    let o = enable();
    assert!(
        stdout(&o).contains("already lists /usr/lib/rtprof/librtprof.so; unchanged"),
        "{}",
        stdout(&o)
    );
    assert_eq!(read(PRELOAD).unwrap(), format!("{AGENT}\n").as_bytes());
    assert!(Path::new(WAS_ABSENT).exists());

    // A new process tree, started with nothing rtprof-specific in its
    // environment: a shell and the program it starts both register with
    // the daemon on its default socket, and the program's calls show.
    let daemon = DefaultDaemon::start();
    let mut shell = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("'{}' 60 hold; echo ended", bin.display()))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let shell_pid = shell.id();
    let present = std::fs::File::open(rtprof_abi::protocol::DEFAULT_PRESENT).unwrap();
    // SAFETY: rtprofd only ever writes the file (never truncates it), and
    // every read of it is validated.
    let map = unsafe { memmap2::Mmap::map(&present) }.unwrap();
    let exe = bin.canonicalize().unwrap().display().to_string();
    let program_pid = poll(
        "the daemon shows the shell and its program counting calls",
        Duration::from_secs(30),
        || {
            let v = read_view(&map).ok()?;
            v.procs.iter().find(|p| p.pid == shell_pid)?;
            let p = v.procs.iter().find(|p| p.exe == exe)?;
            v.rows[p.rows.clone()]
                .iter()
                .any(|r| r.name == "tick" && r.calls > 0)
                .then_some(p.pid)
        },
    );
    assert_eq!(parent_of(program_pid), shell_pid, "one process tree");
    let st = status();
    assert!(st.contains("daemon       running"), "{st}");
    assert!(st.contains("last span published"), "{st}");
    // SAFETY: kill sends a signal to a process this test started.
    unsafe { libc::kill(program_pid as i32, libc::SIGKILL) };
    let _ = shell.wait();
    drop(daemon);

    let o = disable();
    assert!(
        stdout(&o).contains("/etc/ld.so.preload: removed (it did not exist before"),
        "{}",
        stdout(&o)
    );
    assert_eq!(read(PRELOAD), None);
    assert!(!Path::new(WAS_ABSENT).exists() && !Path::new(BACKUP).exists());
    assert!(!new_process_loads_agent());
    assert!(status().contains("preload      off (no /etc/ld.so.preload)"));
    let o = disable();
    assert!(stdout(&o).contains("does not list"), "{}", stdout(&o));
}

/// The C library's path as this process mapped it: an existing library
/// that is harmless to preload (every program loads it anyway).
fn libc_path() -> String {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libc.so.6"))
        .expect("libc.so.6 mapped")
        .to_string()
}

/// A file with other entries and a comment, its last line without a
/// newline: disable puts it back byte for byte; edited after enable, only
/// our entry goes.
#[test]
fn disable_restores_other_entries_byte_for_byte() {
    private_machine(&["/usr/lib"]);
    let original = format!("# site preloads, keep\n{}", libc_path());
    std::fs::write(PRELOAD, &original).unwrap();
    std::fs::set_permissions(PRELOAD, std::fs::Permissions::from_mode(0o644)).unwrap();

    let o = enable();
    assert!(stdout(&o).contains(BACKUP), "{}", stdout(&o));
    let enabled = format!("{original}\n{AGENT}\n");
    assert_eq!(read(PRELOAD).unwrap(), enabled.as_bytes());
    assert_eq!(read(BACKUP).unwrap(), original.as_bytes());
    assert!(new_process_loads_agent());
    enable();
    assert_eq!(read(PRELOAD).unwrap(), enabled.as_bytes());
    assert_eq!(read(BACKUP).unwrap(), original.as_bytes());

    let o = disable();
    assert!(
        stdout(&o).contains("restored byte for byte"),
        "{}",
        stdout(&o)
    );
    assert_eq!(read(PRELOAD).unwrap(), original.as_bytes());
    assert!(!Path::new(BACKUP).exists());
    assert!(!new_process_loads_agent());

    // Someone adds a line while it is on: disable keeps it.
    enable();
    let mut edited = read(PRELOAD).unwrap();
    edited.extend_from_slice(b"# added later\n");
    std::fs::write(PRELOAD, &edited).unwrap();
    let o = disable();
    assert!(stdout(&o).contains("changed since"), "{}", stdout(&o));
    assert_eq!(
        read(PRELOAD).unwrap(),
        format!("{original}\n# added later\n").as_bytes()
    );
    assert!(status().contains("preload      off (/etc/ld.so.preload lists no rtprof agent)"));
}

/// The pre-flight runs a program under a seccomp filter that kills on
/// perf_event_open, and a drop to nobody with setpriv: a preloaded library
/// that opens a perf event whatever the filter, or keeps a thread of its
/// own through setpriv's drop (glibc then aborts), is refused, and
/// nothing changes. The agent itself passes (the other tests here).
#[test]
fn enable_refuses_an_agent_that_breaks_sandboxes_or_privilege_drops() {
    private_machine(&["/usr/lib"]);
    let dir = scratch("careless");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cases = [
        (
            "-DCARELESS_SECCOMP",
            "(under a seccomp filter)`: it ended with signal: 31 (SIGSYS)",
        ),
        ("-DCARELESS_THREAD", "setpriv --reuid=65534"),
    ];
    for (define, problem) in cases {
        let lib = dir.join(format!("careless{define}.so"));
        let o = Command::new("gcc")
            .args(["-shared", "-fPIC", "-O2", "-pthread", define, "-o"])
            .arg(&lib)
            .arg(root().join("tests/c/careless_preload.c"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let o = rtprof_system(&["enable", "--no-warm", "--agent", lib.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1), "{define}: {}", stdout(&o));
        let err = stderr(&o);
        assert!(
            err.contains(problem) && err.ends_with("; /etc/ld.so.preload is unchanged\n"),
            "{define}: {err}"
        );
        assert!(!Path::new(PRELOAD).exists(), "{define}");
    }
}

/// Every refusal is one message, and leaves /etc/ld.so.preload alone: not
/// root, no agent, an agent that breaks programs or does not load, a
/// read-only /etc.
#[test]
fn refusals_change_nothing() {
    private_machine(&["/usr/lib"]);
    let dir = scratch("refusals");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let unchanged = "; /etc/ld.so.preload is unchanged\n";

    // Not root: a copy of rtprof that nobody may run.
    let cli = dir.join("rtprof");
    std::fs::copy(rtprof(), &cli).unwrap();
    for action in ["enable", "disable"] {
        let o = Command::new("/usr/bin/setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&cli)
            .args(["system", action])
            .env_clear()
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{action}");
        let err = stderr(&o);
        assert!(
            err.starts_with(&format!("rtprof system {action}: must be run as root ("))
                && err.lines().count() == 1,
            "{err}"
        );
    }

    // status needs no root.
    let o = Command::new("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&cli)
        .args(["system", "status"])
        .env_clear()
        .output()
        .unwrap();
    assert!(o.status.success() && stdout(&o).starts_with("preload      off"));

    // No agent where it was said to be.
    let o = rtprof_system(&[
        "enable",
        "--no-warm",
        "--agent",
        "/nonexistent/librtprof.so",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).starts_with("rtprof system enable: cannot find librtprof.so")
            && stderr(&o).ends_with(unchanged),
        "{}",
        stderr(&o)
    );

    // A library that loads but changes what programs do, and a file that
    // is no library at all: refused after the test run, and not installed.
    let src = dir.join("breaks.c");
    std::fs::write(
        &src,
        "#include <unistd.h>\n__attribute__((constructor)) static void f(void) { write(1, \"hi\\n\", 3); }\n",
    )
    .unwrap();
    let breaks = dir.join("librtprof.so");
    let cc = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&breaks)
        .arg(&src)
        .output()
        .unwrap();
    assert!(cc.status.success(), "{}", stderr(&cc));
    let text = dir.join("notalib.so");
    std::fs::write(&text, "not a library\n").unwrap();
    for (bad, why) in [(&breaks, "its output was"), (&text, "its error output was")] {
        let o = rtprof_system(&["enable", "--no-warm", "--agent", bad.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1));
        let err = stderr(&o);
        assert!(
            err.starts_with(&format!(
                "rtprof system enable: the agent {} fails a test run of `/bin/true`: {why}",
                bad.display()
            )) && err.ends_with(unchanged),
            "{err}"
        );
        assert_eq!(read(PRELOAD), None);
        let left: Vec<PathBuf> = std::fs::read_dir("/usr/lib/rtprof")
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert!(left.is_empty(), "nothing installed: {left:?}");
    }

    // An agent installed elsewhere is already preloaded: two would be.
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o755)).unwrap();
    let other = elsewhere.join("librtprof.so");
    std::fs::copy(agent(), &other).unwrap();
    let listed = format!("{}\n", other.display());
    std::fs::write(PRELOAD, &listed).unwrap();
    let o = rtprof_system(&["enable", "--no-warm", "--agent", agent().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        format!(
            "rtprof system enable: /etc/ld.so.preload already lists another rtprof agent ({}); \
             every process would load two: remove it first{unchanged}",
            other.display()
        )
    );
    assert_eq!(read(PRELOAD).unwrap(), listed.as_bytes());
    assert!(!Path::new(AGENT).exists(), "nothing installed");
    std::fs::remove_file(PRELOAD).unwrap();

    // A read-only /etc.
    std::fs::write(PRELOAD, "# mine\n").unwrap();
    sh_ok("mount -o remount,bind,ro /etc");
    let o = rtprof_system(&["enable", "--no-warm", "--agent", agent().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.starts_with("rtprof system enable: cannot create /etc/rtprof")
            && err.contains("Read-only file system")
            && err.ends_with(unchanged)
            && err.lines().count() == 1,
        "{err}"
    );
    assert_eq!(read(PRELOAD).unwrap(), b"# mine\n");
    assert!(!Path::new(AGENT).exists(), "nothing installed");
}

/// Where systemd runs (as far as rtprof can tell: /run/systemd/system
/// exists), enable writes rtprofd's unit and asks systemctl to enable and
/// start it, and disable undoes both. systemctl is a stand-in that logs
/// its arguments: the machine's systemd is never asked.
#[test]
fn with_systemd_the_service_is_written_started_and_removed() {
    private_machine(&["/usr/lib"]);
    let dir = scratch("systemd");
    std::fs::create_dir_all("/run/systemd/system").unwrap();
    let log = dir.join("systemctl.log");
    let fake = dir.join("systemctl");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\ncase \"$1\" in is-*) echo fake-$1;; esac\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", dir.display());
    let system = |args: &[&str]| {
        let o = Command::new(rtprof())
            .arg("system")
            .args(args)
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        stdout(&o)
    };
    let unit = "/etc/systemd/system/rtprofd.service";

    let said = system(&["enable", "--no-warm", "--agent", agent().to_str().unwrap()]);
    assert!(
        said.contains(&format!("rtprofd: started and enabled ({unit})")),
        "{said}"
    );
    let text = std::fs::read_to_string(unit).unwrap();
    let rtprofd = rtprof().with_file_name("rtprofd").canonicalize().unwrap();
    assert!(
        text.contains(&format!(
            "\nExecStart={} --socket /run/rtprof/rtprofd.sock",
            rtprofd.display()
        )),
        "{text}"
    );
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "daemon-reload\nenable --now rtprofd.service\n"
    );
    assert!(system(&["status"])
        .contains("service      rtprofd.service: fake-is-active, fake-is-enabled"));

    std::fs::remove_file(&log).unwrap();
    let said = system(&["disable"]);
    assert!(
        said.contains(&format!(
            "stopped and disabled rtprofd.service, removed {unit}"
        )),
        "{said}"
    );
    assert!(!Path::new(unit).exists());
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "disable --now rtprofd.service\ndaemon-reload\n"
    );

    // A unit someone else wrote is disabled, but stays.
    std::fs::write(unit, "[Service]\nExecStart=/opt/rtprofd\n").unwrap();
    system(&["enable", "--no-warm", "--agent", agent().to_str().unwrap()]);
    system(&["disable"]);
    assert_eq!(
        std::fs::read_to_string(unit).unwrap(),
        "[Service]\nExecStart=/opt/rtprofd\n"
    );
}

/// `rtprof system warm` fills the machine-wide cache with the installed
/// agent, so a program's first start under /etc/ld.so.preload maps its
/// patched code from a page image (no code page of it written); `enable`
/// starts the same warming for the running programs in a session of its
/// own, at the lowest CPU priority.
#[test]
fn warming_ahead_makes_a_first_start_map_its_code() {
    private_machine(&["/usr/lib", "/var/cache"]);
    let dir = scratch("warm-ahead");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = compile_o2("own_code.c", &[], &dir);
    let plain = run_plain(&bin, &[]);
    assert!(plain.status.success());
    enable();

    let o = rtprof_system(&["warm", bin.to_str().unwrap()]);
    assert!(o.status.success(), "warm: {}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("warmed {}", bin.display()))
            && stdout(&o).contains("1 of 1 programs warmed"),
        "{}",
        stdout(&o)
    );
    let images: Vec<String> = std::fs::read_dir("/var/cache/rtprof")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("own_code") && n.contains(".image"))
        .collect();
    assert_eq!(images.len(), 1, "one image of the program: {images:?}");

    // Its first start with the agent (from /etc/ld.so.preload).
    let first = Command::new(&bin)
        .env("RTPROF_VERBOSE", "1")
        .env("RTPROF_DAEMON_SOCKET", "")
        .output()
        .unwrap();
    assert_eq!(first.status.code(), plain.status.code());
    assert_eq!(first.stdout, plain.stdout);
    let said = stderr(&first);
    assert!(
        said.contains(&format!("{}: code mapped from its image", bin.display())),
        "{said}"
    );
    // Its code and stubs are mapped from the image in the machine's
    // cache, and not one page of them is a private copy.
    let image = format!(" /var/cache/rtprof/{}", images[0]);
    let code: Vec<&str> = said
        .lines()
        .filter(|l| l.starts_with("CODE ") && l.ends_with(&image))
        .collect();
    assert!(
        code.len() >= 2 && code.iter().all(|l| l.starts_with("CODE 0 ")),
        "code and stubs from the image, no private page: {said}"
    );

    // Enabled again (nothing to change), with warming in the background.
    let o = rtprof_system(&["enable", "--agent", agent().to_str().unwrap()]);
    assert!(o.status.success(), "enable: {}", stderr(&o));
    let said = stdout(&o);
    let pid: i32 = said
        .split("(rtprof system warm, pid ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no background warming said: {said}"));
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
    // SAFETY: kill takes numbers only; the group is the warming's own
    // session, which it leads.
    let killed = unsafe { libc::kill(-pid, libc::SIGKILL) };
    // It may have finished already (few programs run here): then it is
    // gone or a zombie.
    if let Ok(stat) = stat {
        let after: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        if after[0] != "Z" {
            // Fields after the name, from field 3: session 6, nice 19,
            // policy 41 (SCHED_IDLE is 5).
            assert_eq!(after[6 - 3], pid.to_string(), "its own session: {stat}");
            assert_eq!(after[19 - 3], "19", "nice 19: {stat}");
            assert_eq!(after[41 - 3], "5", "SCHED_IDLE: {stat}");
            assert_eq!(killed, 0);
        }
    }
    disable();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A program started to fill the cache never runs its `main`: not when
/// the kill switch keeps the agent inert in it (the agent ends it and
/// says it did not act), not when it is statically linked (no agent can
/// be in it: it is not started).
#[test]
fn a_program_warmed_never_runs() {
    private_machine(&["/usr/lib", "/var/cache"]);
    let dir = scratch("warm-never-runs");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let dynamic = compile_o2("touch_mark.c", &[], &dir);
    let static_dir = dir.join("static");
    std::fs::create_dir_all(&static_dir).unwrap();
    let fixed = compile_o2("touch_mark.c", &["-static"], &static_dir);
    let mark = dir.join("mark");
    let ran = || std::fs::read_to_string(&mark).is_ok();
    // The mark works: the program run plainly leaves it.
    let o = Command::new(&dynamic)
        .env("RTPROF_TEST_MARK", &mark)
        .output()
        .unwrap();
    assert!(o.status.success() && ran());
    std::fs::remove_file(&mark).unwrap();
    enable();
    let warm = |bin: &Path| {
        Command::new(rtprof())
            .args(["system", "warm"])
            .arg(bin)
            .env("RTPROF_TEST_MARK", &mark)
            .output()
            .unwrap()
    };

    // Not warmed, and said why.
    let refused = |o: &Output, why: &str| {
        assert!(
            stderr(o).contains(why) && stdout(o).contains("0 of 1"),
            "{}{}",
            stdout(o),
            stderr(o)
        )
    };
    refused(&warm(&fixed), "not dynamically linked");
    assert!(!ran(), "a static program was started");

    std::fs::write("/etc/rtprof/disable", "").unwrap();
    refused(&warm(&dynamic), "the agent did not act in it");
    assert!(!ran(), "the program ran its main under the kill switch");
    std::fs::remove_file("/etc/rtprof/disable").unwrap();

    let o = warm(&dynamic);
    assert!(stdout(&o).contains("1 of 1"), "{}", stderr(&o));
    assert!(!ran(), "the program ran its main while warmed");
    disable();
    let _ = std::fs::remove_dir_all(&dir);
}
