//! Machine-wide controls, which need root: the kill switch in /etc/rtprof,
//! set-user-ID programs, whose environment must not steer the agent, and
//! segments other users must not read. The tests change /etc/rtprof and a
//! standard library directory, and put everything back (also when they
//! fail). They take one lock, so no two run at once in this binary (the
//! kill switch would silence the other's agents); cargo runs test binaries
//! one after another.

use rtprof_e2e::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const ETC: &str = "/etc/rtprof";
/// The loader preloads in secure mode only from a standard directory, a
/// file with the set-user-ID bit, named without a slash.
const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";
const LIB_NAME: &str = "librtprof-systemtest.so";

/// Held by every test here for its whole run.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Files the test created, removed again when it ends.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            let _ = std::fs::remove_file(p).or_else(|_| std::fs::remove_dir_all(p));
        }
    }
}

fn put(cleanup: &mut Cleanup, path: &str, text: &str) {
    assert!(
        !Path::new(path).exists(),
        "{path} exists already; refusing to touch it"
    );
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    cleanup.0.push(path.into());
}

/// Runs `bin` as nobody with `env` set for it alone (not for the tools
/// that switch user, which would otherwise load the agent themselves).
fn as_nobody(bin: &Path, env: &[(&str, &str)]) -> std::process::Output {
    let assignments: Vec<String> = env.iter().map(|(k, v)| format!("{k}='{v}'")).collect();
    as_nobody_sh(&format!("{} exec {}", assignments.join(" "), bin.display()))
}

/// Runs `script` with /bin/sh as nobody, with a minimal environment.
fn as_nobody_sh(script: &str) -> std::process::Output {
    Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "/bin/sh",
            "-c",
        ])
        .arg(script)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .expect("setpriv runs")
}

#[test]
fn kill_switch_and_setuid_programs() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(
        // SAFETY: geteuid takes nothing and cannot fail.
        unsafe { libc::geteuid() },
        0,
        "the system tests need root (they change /etc/rtprof and install a set-user-ID file)"
    );
    let dir = scratch("system");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = compile_o2("suid.c", &[], &dir);
    let mut cleanup = Cleanup(Vec::new());
    if !Path::new(ETC).exists() {
        std::fs::create_dir(ETC).unwrap();
        cleanup.0.push(ETC.into());
    }

    // Kill switch: a new agent stays inert while the file exists.
    let kill = format!("{ETC}/disable");
    put(&mut cleanup, &kill, "");
    let out = Command::new(rtprof())
        .args(["run", "--"])
        .arg(&bin)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("loaded 1 patched 0"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no profile was recorded"));
    std::fs::remove_file(&kill).unwrap();
    let out = Command::new(rtprof())
        .args(["run", "--"])
        .arg(&bin)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("loaded 1 patched 1"),
        "switched on again"
    );

    // Set-user-ID root program started by nobody, with every RTPROF_*
    // variable set: loaded (the loader allows it), but inert by default.
    let lib = format!("{LIB_DIR}/{LIB_NAME}");
    assert!(!Path::new(&lib).exists());
    std::fs::copy(agent(), &lib).unwrap();
    cleanup.0.push(lib.clone().into());
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let report = dir.join("report.txt");
    // A cache the invoking user controls: a secure process must neither
    // read nor write it (only root's cache, written by root).
    let user_cache = dir.join("user-cache");
    std::fs::create_dir(&user_cache).unwrap();
    std::fs::set_permissions(&user_cache, std::fs::Permissions::from_mode(0o777)).unwrap();
    let system_cache = Path::new("/var/cache/rtprof");
    if !system_cache.exists() {
        cleanup.0.push(system_cache.into());
    }
    let env = [
        ("LD_PRELOAD", LIB_NAME),
        ("RTPROF_VERBOSE", "1"),
        ("RTPROF_MODULES", "all"),
        ("RTPROF_REPORT", report.to_str().unwrap()),
        ("RTPROF_MAX_THREADS", "1"),
        ("RTPROF_CACHE", user_cache.to_str().unwrap()),
        ("XDG_CACHE_HOME", user_cache.to_str().unwrap()),
    ];
    let out = as_nobody(&bin, &env);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("euid 0 loaded 1"),
        "the program runs set-user-ID with the agent: {text}"
    );
    assert!(
        text.contains("patched 0"),
        "secure processes are not profiled by default: {text}"
    );
    assert!(
        out.stderr.is_empty(),
        "RTPROF_VERBOSE ignored: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!report.exists(), "RTPROF_REPORT ignored");

    // Root's policy may profile them, still without reading the environment.
    let suid_entries = |d: &Path| {
        std::fs::read_dir(d)
            .map(|r| {
                r.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("suid"))
                    .count()
            })
            .unwrap_or(0)
    };
    let system_before = suid_entries(system_cache);
    put(
        &mut cleanup,
        &format!("{ETC}/rtprof.conf"),
        "profile_secure_processes = yes\n",
    );
    let out = as_nobody(&bin, &env);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("loaded 1 patched 1 result 17"),
        "profiled by policy: {text}"
    );
    assert!(out.stderr.is_empty(), "RTPROF_VERBOSE still ignored");
    assert!(!report.exists(), "RTPROF_REPORT still ignored");
    assert!(
        suid_entries(&user_cache) + suid_entries(&user_cache.join("rtprof")) == 0,
        "RTPROF_CACHE and XDG_CACHE_HOME ignored"
    );
    assert!(
        suid_entries(system_cache) > system_before,
        "root's cache used, by a root process"
    );
    let out = as_nobody(&bin, &env);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("loaded 1 patched 1 result 17"),
        "profiled again, from root's cache"
    );

    // Control: the same variables do steer an ordinary process.
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(&bin)
        .env("LD_PRELOAD", agent())
        .env("RTPROF_VERBOSE", "1")
        .env("RTPROF_REPORT", &report)
        .output()
        .unwrap();
    assert!(
        !out.stderr.is_empty() && report.exists(),
        "ordinary processes read RTPROF_*"
    );
    drop(cleanup);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs a shell command as nobody; true if it succeeded.
fn nobody_can(cmd: &str) -> bool {
    as_nobody_sh(cmd).status.success()
}

/// A process's counters are readable by its owner and root only: another
/// user can neither open its memfd segment through /proc nor the segment
/// file `rtprof run` collects, while root can (so the check is not empty).
#[test]
fn another_user_cannot_read_a_segment() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("segment-owner");
    let bin = compile_o2("rate.c", &[], &dir);
    let run_dir = dir.join("run");
    std::fs::create_dir(&run_dir).unwrap();
    std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let start = |env: &[(&str, &Path)]| {
        let mut c = Command::new(&bin);
        c.args(["1", "hold"])
            .env("LD_PRELOAD", agent())
            .stdout(std::process::Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().unwrap();
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        child
    };
    let mut in_memory = start(&[]);
    let mut in_file = start(&[("RTPROF_RUN_DIR", &run_dir)]);
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", in_memory.id())).unwrap();
    let range = maps
        .lines()
        .find(|l| l.ends_with(rtprof_abi::protocol::SEGMENT_MEMFD_MAPPED))
        .and_then(|l| l.split_whitespace().next())
        .expect("segment mapping");
    let memfd = format!("/proc/{}/map_files/{range}", in_memory.id());
    let file = std::fs::read_dir(&run_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains(&in_file.id().to_string()))
        .expect("segment file");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().mode() & 0o077,
        0,
        "file mode"
    );
    for path in [memfd.as_str(), &file.to_string_lossy()] {
        assert!(
            std::fs::read(path).is_ok_and(|b| b.starts_with(b"RTPROFC")),
            "root reads {path}"
        );
        assert!(
            !nobody_can(&format!("head -c 8 '{path}' > /dev/null")),
            "nobody read {path}"
        );
    }
    for c in [&mut in_memory, &mut in_file] {
        let _ = c.kill();
        let _ = c.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
