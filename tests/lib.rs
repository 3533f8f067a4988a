//! Helpers for rtprof's end-to-end tests: compile C/C++ programs at test
//! time, run them with and without the agent, and read the JSON report.
//! The agent and CLI must be built first (`cargo build --release`); the
//! README's test command does that.

use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// target/<profile>, found from this test binary's own location.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test>-<hash>
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn built(name: &str) -> PathBuf {
    let p = profile_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: build the workspace first (cargo build --release --workspace)",
        p.display()
    );
    p
}

pub fn agent() -> PathBuf {
    built("librtprof.so")
}

pub fn rtprof() -> PathBuf {
    built("rtprof")
}

pub fn scratch(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "rtprof-e2e-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        name
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[derive(Clone, Debug)]
pub struct Variant {
    pub opt: &'static str,
    pub cf_protection: bool,
    pub pie: bool,
    pub strip: bool,
}

impl Variant {
    pub fn all() -> Vec<Variant> {
        let mut v = Vec::new();
        for opt in ["-O0", "-O2", "-O3", "-Os"] {
            for cf_protection in [false, true] {
                for pie in [true, false] {
                    for strip in [false, true] {
                        v.push(Variant {
                            opt,
                            cf_protection,
                            pie,
                            strip,
                        });
                    }
                }
            }
        }
        v
    }

    pub fn tag(&self) -> String {
        format!(
            "{}{}{}{}",
            &self.opt[1..],
            if self.cf_protection { "-cf" } else { "" },
            if self.pie { "-pie" } else { "-nopie" },
            if self.strip { "-stripped" } else { "" }
        )
    }
}

/// Compiles `src` (from tests/c) with gcc or g++; returns the binary and, if
/// stripped, the unstripped copy its symbols are looked up in.
pub fn compile(src: &str, v: &Variant, extra: &[&str], dir: &Path) -> (PathBuf, PathBuf) {
    let path = root().join("tests/c").join(src);
    let cxx = src.ends_with(".cpp");
    let out = dir.join(format!("{}-{}", src.replace('.', "_"), v.tag()));
    let mut c = Command::new(if cxx { "g++" } else { "gcc" });
    c.arg(v.opt).arg("-g0").arg("-o").arg(&out).arg(&path);
    c.arg(if v.cf_protection {
        "-fcf-protection=full"
    } else {
        "-fcf-protection=none"
    });
    if v.pie {
        c.args(["-fPIE", "-pie"]);
    } else {
        c.args(["-fno-pie", "-no-pie"]);
    }
    c.args(extra);
    let o = c.output().expect("compiler runs");
    assert!(
        o.status.success(),
        "compile {src} {}: {}",
        v.tag(),
        String::from_utf8_lossy(&o.stderr)
    );
    if !v.strip {
        return (out.clone(), out);
    }
    let stripped = dir.join(format!("{}-s", out.file_name().unwrap().to_string_lossy()));
    let o = Command::new("strip")
        .arg("-o")
        .arg(&stripped)
        .arg(&out)
        .output()
        .expect("strip runs");
    assert!(
        o.status.success(),
        "strip: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    (stripped, out)
}

/// The plain build most single-purpose tests use: -O2, PIE, no CET, with
/// symbols.
pub fn compile_o2(src: &str, extra: &[&str], dir: &Path) -> PathBuf {
    let v = Variant {
        opt: "-O2",
        cf_protection: false,
        pie: true,
        strip: false,
    };
    compile(src, &v, extra, dir).0
}

/// Function name -> ELF virtual address, from the unstripped binary.
pub fn symbol_addrs(bin: &Path) -> HashMap<String, u64> {
    let data = std::fs::read(bin).unwrap();
    let elf = goblin::elf::Elf::parse(&data).unwrap();
    elf.syms
        .iter()
        .filter(|s| s.is_function() && s.st_value != 0)
        .filter_map(|s| Some((elf.strtab.get_at(s.st_name)?.to_string(), s.st_value)))
        .collect()
}

pub struct Profiled {
    pub output: Output,
    pub report: Value,
}

pub fn run_plain(bin: &Path, args: &[&str]) -> Output {
    Command::new(bin).args(args).output().expect("program runs")
}

/// Runs `bin` under `rtprof run --all-functions --json`.
pub fn run_profiled(bin: &Path, args: &[&str], env: &[(&str, &str)], dir: &Path) -> Profiled {
    run_profiled_with_input(bin, args, env, b"", dir)
}

/// Runs `bin` under `rtprof run --all-functions --json` (every function
/// listed, with its patch status), feeding `stdin` to it.
pub fn run_profiled_with_input(
    bin: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: &[u8],
    dir: &Path,
) -> Profiled {
    use std::io::Write;
    use std::process::Stdio;
    let json = dir.join(format!(
        "{}.json",
        bin.file_name().unwrap().to_string_lossy()
    ));
    let _ = std::fs::remove_file(&json);
    let mut c = Command::new(rtprof());
    c.arg("run")
        .arg("--all-functions")
        .arg("--json")
        .arg(&json)
        .arg("--")
        .arg(bin)
        .args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("rtprof runs");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let output = child.wait_with_output().unwrap();
    let text = std::fs::read_to_string(&json).unwrap_or_else(|e| {
        panic!(
            "no report from {}: {e}; stderr: {}",
            bin.display(),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    Profiled {
        output,
        report: serde_json::from_str(&text).expect("report is JSON"),
    }
}

/// What a corpus program declares about itself.
pub struct Expectations {
    /// `EXPECT name count`: the function is called exactly `count` times.
    pub counts: Vec<(String, u64)>,
    /// `EXPECT_REFUSED name reason`: the function must be left unpatched.
    pub refused: Vec<(String, String)>,
}

/// The `EXPECT` and `EXPECT_REFUSED` lines of a program's output.
pub fn expectations(stdout: &[u8]) -> Expectations {
    let text = String::from_utf8_lossy(stdout);
    let mut counts = Vec::new();
    let mut refused = Vec::new();
    for l in text.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.as_slice() {
            ["EXPECT", name, n] => counts.push((name.to_string(), n.parse().unwrap())),
            ["EXPECT_REFUSED", name, r] => refused.push((name.to_string(), r.to_string())),
            _ => {}
        }
    }
    Expectations { counts, refused }
}

/// The report's process whose executable is `bin`.
pub fn process<'a>(report: &'a Value, bin: &Path) -> &'a Value {
    let want = bin.canonicalize().unwrap();
    report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| Path::new(p["exe"].as_str().unwrap()) == want)
        .unwrap_or_else(|| panic!("no process for {} in {report}", want.display()))
}

/// The main module's function at ELF address `vaddr`.
pub fn function_at(proc_: &Value, vaddr: u64) -> Option<&Value> {
    let main = proc_["modules"][0]["path"].as_str()?;
    let main = main.rsplit('/').next()?;
    proc_["functions"]
        .as_array()?
        .iter()
        .find(|f| f["vaddr"].as_u64() == Some(vaddr) && f["module"].as_str() == Some(main))
}

/// Asserts that two runs behaved identically.
pub fn assert_same_behaviour(what: &str, plain: &Output, prof: &Output) {
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        String::from_utf8_lossy(&prof.stdout),
        "{what}: stdout differs"
    );
    assert_eq!(
        String::from_utf8_lossy(&plain.stderr),
        String::from_utf8_lossy(&prof.stderr),
        "{what}: stderr differs"
    );
    assert_eq!(
        plain.status.code(),
        prof.status.code(),
        "{what}: exit status differs"
    );
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&plain.status),
        std::os::unix::process::ExitStatusExt::signal(&prof.status),
        "{what}: terminating signal differs"
    );
}

/// The function called `name` in a report's process section.
pub fn function_named<'a>(proc_: &'a Value, name: &str) -> &'a Value {
    proc_["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no function {name} in {proc_}"))
}

/// Asks an interpreter for its real binary (not a pyenv shim, a shell
/// script) and whether libpython is shared.
fn probe_python(cmd: &str) -> Option<(PathBuf, bool)> {
    let out = Command::new(cmd)
        .args(["-c", "import sys, sysconfig; print(sys.executable); print(sysconfig.get_config_var('Py_ENABLE_SHARED'))"])
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let mut lines = text.lines();
    Some((PathBuf::from(lines.next()?), lines.next() == Some("1")))
}

/// An interpreter linked against a shared libpython: `$RTPROF_TEST_PYTHON`,
/// else `python3` on PATH, else a pyenv installation (newest first); or
/// what was tried.
pub fn shared_python() -> Result<PathBuf, Vec<String>> {
    let mut tried = Vec::new();
    let mut candidates: Vec<String> = std::env::var("RTPROF_TEST_PYTHON").into_iter().collect();
    candidates.push("python3".into());
    let pyenv = std::env::var("PYENV_ROOT")
        .unwrap_or_else(|_| format!("{}/.pyenv", std::env::var("HOME").unwrap_or_default()));
    if let Ok(rd) = std::fs::read_dir(format!("{pyenv}/versions")) {
        let mut v: Vec<String> = rd
            .flatten()
            .map(|e| format!("{}/bin/python3", e.path().display()))
            .collect();
        v.sort();
        candidates.extend(v.into_iter().rev());
    }
    for c in candidates {
        match probe_python(&c) {
            Some((exe, true)) => return Ok(exe),
            Some((exe, false)) => tried.push(format!("{c} ({}: static libpython)", exe.display())),
            None => tried.push(format!("{c} (does not run)")),
        }
    }
    Err(tried)
}

/// Polls `f` every 20 ms until it gives a value; panics saying `what`
/// after `limit` (generous: machines may be busy, and nothing polled is
/// about speed).
pub fn poll<T>(what: &str, limit: std::time::Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t = std::time::Instant::now();
    loop {
        if let Some(x) = f() {
            return x;
        }
        assert!(t.elapsed() < limit, "timed out: {what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Polls until `ready()` holds (see [`poll`]).
pub fn wait_until(what: &str, limit: std::time::Duration, mut ready: impl FnMut() -> bool) {
    poll(what, limit, || ready().then_some(()))
}

/// `rtprofd` on a private socket (`dir/sock`) and presentation segment
/// (`dir/present`), killed on drop.
pub struct Rtprofd {
    pub child: std::process::Child,
    pub socket: PathBuf,
    pub present: PathBuf,
}

impl Rtprofd {
    /// Starts `cmd` (rtprofd with its other options and its stderr set) on
    /// `dir`'s socket and segment; returns once the socket is there and the
    /// segment is a new one (not a previous daemon's).
    pub fn start(mut cmd: Command, dir: &Path) -> Rtprofd {
        use std::os::unix::fs::MetadataExt;
        let (socket, present) = (dir.join("sock"), dir.join("present"));
        let inode = || std::fs::metadata(&present).ok().map(|m| (m.dev(), m.ino()));
        let before = inode();
        let child = cmd
            .arg("--socket")
            .arg(&socket)
            .arg("--present")
            .arg(&present)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("rtprofd starts");
        wait_until(
            "rtprofd did not start",
            std::time::Duration::from_secs(20),
            || {
                let now = inode();
                socket.exists() && now.is_some() && now != before
            },
        );
        Rtprofd {
            child,
            socket,
            present,
        }
    }

    /// Kills the daemon and waits for it.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Rtprofd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs `script` with /bin/sh; panics with its stderr if it fails.
pub fn sh_ok(script: &str) {
    let o = Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Gives the calling thread (and every process it starts) a private mount
/// namespace, so a test can change the machine's own paths: /etc is a
/// copy (without /etc/ld.so.preload and /etc/rtprof), each of `overlays`
/// (e.g. `/usr/lib`) a writable overlay whose changes stay in memory, /run
/// is empty. The machine's systemd is out of reach (its sockets
/// are in the hidden /run). It ends with the thread (the test). Needs
/// root, and fails without it.
pub fn private_machine(overlays: &[&str]) {
    assert_eq!(
        // SAFETY: geteuid takes nothing and cannot fail.
        unsafe { libc::geteuid() },
        0,
        "this test needs root: it switches a (private) machine on and off"
    );
    let ns = || std::fs::read_link("/proc/thread-self/ns/mnt").unwrap();
    let before = ns();
    // SAFETY: unshare takes flags only; CLONE_NEWNS gives this thread a
    // copy of the mount table (processes it starts inherit that copy).
    let r = unsafe { libc::unshare(libc::CLONE_NEWNS) };
    assert_eq!(r, 0, "unshare: {}", std::io::Error::last_os_error());
    assert_ne!(ns(), before, "a new mount namespace");
    // Nothing mounted from here on propagates back to the machine. The
    // namespace's own files (the copy of /etc, the overlays' upper layers)
    // are in a tmpfs of its own; /tmp itself stays as it is, since the
    // repository and its build may live there.
    sh_ok("mount --make-rprivate /");
    let ws = scratch("private-machine");
    let ws = ws.display();
    sh_ok(&format!(
        "set -e
         mount -t tmpfs -o mode=0700 tmpfs {ws}
         mkdir -p {ws}/etc
         cp -a /etc/. {ws}/etc/
         mount --bind {ws}/etc /etc
         mount -t tmpfs -o mode=0755 tmpfs /run"
    ));
    // /etc is the copy: only now is anything removed from it.
    std::fs::write(format!("{ws}/etc/rtprof-private-check"), "").unwrap();
    assert!(Path::new("/etc/rtprof-private-check").exists());
    std::fs::remove_file("/etc/rtprof-private-check").unwrap();
    sh_ok("rm -f /etc/ld.so.preload && rm -rf /etc/rtprof");
    for (i, dir) in overlays.iter().enumerate() {
        sh_ok(&format!(
            "set -e
             mkdir -p {ws}/up{i} {ws}/work{i}
             mount -t overlay overlay -o lowerdir={dir},upperdir={ws}/up{i},workdir={ws}/work{i} {dir}"
        ));
    }
}

/// A child killed and reaped on drop (also when a test fails).
pub struct Killed(pub std::process::Child);

impl std::ops::Deref for Killed {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for Killed {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A TCP port on 127.0.0.1 free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An HTTP answer: status, head (status line and headers) and body.
pub struct Answer {
    pub status: u16,
    pub head: String,
    pub body: String,
}

/// `GET path` from 127.0.0.1:`port` with `headers` (each a whole
/// `Name: value` line), or None if nothing answers.
pub fn http_get(port: u16, path: &str, headers: &[&str]) -> Option<Answer> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .ok()?;
    let mut req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n");
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some(Answer {
        status,
        head: head.to_string(),
        body: body.to_string(),
    })
}

/// `rtprof route PID FUNCTION TO` through `d`, retried while rtprofd does
/// not follow the process yet; its output.
pub fn route_when_followed(d: &Rtprofd, pid: u32, function: &str, to: &str) -> Output {
    poll(
        "rtprofd to follow the program",
        std::time::Duration::from_secs(20),
        || {
            let o = std::process::Command::new(rtprof())
                .args(["route", "--socket"])
                .arg(&d.socket)
                .args([&pid.to_string(), function, to])
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            (!err.contains("not a process rtprofd follows") && !err.contains("not filled"))
                .then_some(o)
        },
    )
}
