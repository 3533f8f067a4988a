//! Benchmark: what the agent's start-up costs short-lived processes, in time
//! and memory (issue 13).
//!
//! usage: bench-startup [--runs N] [--system-runs N] [--only ROW] [--skip-system]
//! [--budget P]
//! (--budget: the system row's agents run under an overhead budget of P
//! percent, `budget = P` in the bound copy of /etc/rtprof/rtprof.conf.)
//! (--runs defaults to 11, --system-runs to 3; --only: rows whose name
//! contains ROW)
//! (build first: cargo build --release --workspace; the system row needs
//! root, `unshare`, gcc and make)
//!
//! Rows: `/bin/true`; `/bin/true` with the agent loaded and off
//! (`RTPROF_DISABLE=1`: what loading the agent alone costs); `ls -l /usr/bin`
//! with every module instrumented;
//! `python3 -c pass` with libpython instrumented, and again writing a
//! report at its end (`RTPROF_REPORT`); `gcc -c` of a one-line
//! file (gcc, cc1 and as each instrumented as their process's executable);
//! and a `make -j2` build of 30+ C files with the agent in
//! `/etc/ld.so.preload` (a copy of /etc bound over /etc in a private mount
//! namespace) and `rtprofd` following every process on a private socket.
//!
//! Each row runs plain, with the agent (`RTPROF_CACHE=off`) and with the
//! agent and a warm cache (`RTPROF_CACHE=user`, `XDG_CACHE_HOME` a fresh
//! directory one untimed run filled) and with the warm cache but its page
//! images not used (`RTPROF_IMAGES=0`: code written in every process, as
//! before images), alternating, N times: median wall
//! times around each child, the time added and the ratio. Then, in separate
//! untimed runs that write `RTPROF_REPORT` (writing reports costs time), the
//! agent's own set-up time (`setup_ns`, summed over the processes of a run).
//! For `/bin/sleep` and a sleeping python3, the memory of the process
//! (`/proc/PID/smaps_rollup`) while it sleeps: its own (anonymous and
//! counter segment: what every process with the agent adds) and all its
//! private pages (also the agent's code, private only while no other
//! process maps it).

#[path = "common.rs"]
mod common;

use common::{arg, arg_text, flag, here, median};
use rtprof_e2e::Rtprofd;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq)]
enum Col {
    Plain,
    Agent,
    Warm,
    /// The warm cache, its page images not used (`RTPROF_IMAGES=0`): code
    /// written in every process, as before images.
    WarmWritten,
}

const COLS: [Col; 4] = [Col::Plain, Col::Agent, Col::Warm, Col::WarmWritten];

/// A command run with `LD_PRELOAD`.
struct Row {
    name: String,
    argv: Vec<OsString>,
    modules: Option<&'static str>,
    cwd: PathBuf,
    /// More of the agent's settings, in every column with the agent.
    env: Vec<(&'static str, OsString)>,
}

struct Measured {
    name: String,
    ms: [f64; 4],
    setup_ms: [f64; 2],
    procs: usize,
}

struct Bench {
    agent: PathBuf,
    tmp: PathBuf,
    runs: usize,
}

/// A command without the benchmark's own `RTPROF_*` and `LD_PRELOAD`, so
/// only what a column sets reaches the child.
fn clean(prog: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(prog);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("RTPROF_") || k == "LD_PRELOAD" || k == "XDG_CACHE_HOME" {
            c.env_remove(&*k);
        }
    }
    c
}

impl Bench {
    fn fresh_dir(&self, name: &str) -> PathBuf {
        let d = self.tmp.join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn command(&self, row: &Row, col: Col, cache: &Path, report: Option<&Path>) -> Command {
        let mut c = clean(&row.argv[0]);
        c.args(&row.argv[1..]).current_dir(&row.cwd);
        if col != Col::Plain {
            c.env("LD_PRELOAD", &self.agent);
            if let Some(m) = row.modules {
                c.env("RTPROF_MODULES", m);
            }
            c.envs(row.env.iter().map(|(k, v)| (k, v)));
        }
        match col {
            Col::Plain => {}
            Col::Agent => {
                c.env("RTPROF_CACHE", "off");
            }
            Col::Warm => {
                c.env("RTPROF_CACHE", "user").env("XDG_CACHE_HOME", cache);
            }
            Col::WarmWritten => {
                c.env("RTPROF_CACHE", "user")
                    .env("XDG_CACHE_HOME", cache)
                    .env("RTPROF_IMAGES", "0");
            }
        }
        if let Some(r) = report {
            c.env("RTPROF_REPORT", r.join("r-%p.json"));
        }
        c
    }

    fn run_row(&self, row: &Row, idx: usize) -> Measured {
        let cache = self.fresh_dir(&format!("cache-{idx}"));
        // Untimed: fills the warm cache, and brings every file into the page
        // cache for all three columns.
        for col in COLS {
            run_quiet(&mut self.command(row, col, &cache, None), &row.name);
        }
        let mut ms: [Vec<f64>; 4] = Default::default();
        for _ in 0..self.runs {
            for (i, col) in COLS.into_iter().enumerate() {
                let mut c = self.command(row, col, &cache, None);
                let t = Instant::now();
                run_quiet(&mut c, &row.name);
                ms[i].push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        let mut setup: [Vec<f64>; 2] = Default::default();
        let mut procs = 0;
        // An agent that is off writes no report.
        let off = row.env.iter().any(|(k, _)| *k == "RTPROF_DISABLE");
        for _ in 0..if off { 0 } else { self.runs } {
            for (i, col) in [Col::Agent, Col::Warm].into_iter().enumerate() {
                let dir = self.fresh_dir("reports");
                run_quiet(&mut self.command(row, col, &cache, Some(&dir)), &row.name);
                let (s, n) = setup_ms(&dir);
                setup[i].push(s);
                procs = n;
            }
        }
        Measured {
            name: row.name.clone(),
            ms: ms.map(median),
            setup_ms: setup.map(|v| if v.is_empty() { f64::NAN } else { median(v) }),
            procs,
        }
    }

    /// Private memory of `argv` once it sleeps, per column (median of 3).
    fn memory(&self, name: &str, argv: &[&str], fill: &[&str], modules: Option<&'static str>) {
        let cache = self.fresh_dir("cache-mem");
        let row = |argv: &[&str]| Row {
            name: name.to_string(),
            argv: argv.iter().map(OsString::from).collect(),
            modules,
            cwd: self.tmp.clone(),
            env: Vec::new(),
        };
        run_quiet(&mut self.command(&row(fill), Col::Warm, &cache, None), name);
        let mut own: [Vec<f64>; 4] = Default::default();
        let mut all: [Vec<f64>; 4] = Default::default();
        for _ in 0..3 {
            for (i, col) in COLS.into_iter().enumerate() {
                let m = private_kib(self.command(&row(argv), col, &cache, None));
                own[i].push(m.own as f64);
                all[i].push(m.private as f64);
            }
        }
        let [p, a, w, ww] = own.map(median);
        let [pp, pa, pw, pww] = all.map(median);
        println!(
            "memory, {name}: its own (anonymous + counter segment) {p:.0} KiB plain, \
             {a:.0} KiB with the agent (+{:.0}), {w:.0} KiB warm (+{:.0}), {ww:.0} KiB warm \
             with code written (+{:.0}); all private pages (also the agent's code, shared once \
             other processes map it) {pp:.0} / {pa:.0} / {pw:.0} / {pww:.0} KiB; median of 3",
            a - p,
            w - p,
            ww - p
        );
    }
}

/// Runs a child to its end with its output discarded; it must succeed.
fn run_quiet(c: &mut Command, what: &str) {
    let st = c
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(st.success(), "{what}: {st}");
}

/// Every process image reported in `dir`: (pid, executable, setup_ns).
fn reports(dir: &Path) -> Vec<(u32, String, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e2| panic!("{}: {e2}", e.path().display()));
        for p in v["processes"].as_array().unwrap() {
            out.push((
                p["pid"].as_u64().unwrap() as u32,
                p["exe"].as_str().unwrap_or("").to_string(),
                p["setup_ns"].as_u64().unwrap(),
            ));
        }
    }
    assert!(!out.is_empty(), "no report in {}", dir.display());
    out
}

/// The agent's set-up time summed over every report in `dir`, in ms, and
/// how many process images reported.
fn setup_ms(dir: &Path) -> (f64, usize) {
    let r = reports(dir);
    (r.iter().map(|p| p.2).sum::<u64>() as f64 / 1e6, r.len())
}

/// A sleeping process's memory, KiB.
struct Memory {
    /// Pages no other process can share: anonymous (heap, stacks, copied
    /// code pages) and shared memory only it maps (the counter segment).
    own: u64,
    /// Every page only it maps, file pages included.
    private: u64,
}

/// Starts `c`, waits until its main thread sleeps (`clock_nanosleep` or
/// `nanosleep`: start-up is over), reads its memory, kills it.
fn private_kib(mut c: Command) -> Memory {
    let mut child = c.stdout(Stdio::null()).spawn().expect("sleeper starts");
    let pid = child.id();
    let t = Instant::now();
    loop {
        let sc = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        let nr = sc.split_whitespace().next().unwrap_or("");
        if nr == "230" || nr == "35" {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "pid {pid} never went to sleep"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from smaps_rollup"))
    };
    let m = Memory {
        own: field("Pss_Anon:") + field("Pss_Shmem:"),
        private: field("Private_Clean:") + field("Private_Dirty:"),
    };
    let _ = child.kill();
    let _ = child.wait();
    m
}

/// Lua 5.4's sources from the `lua-src` crate (as examples/bench/compare.py
/// fetches them), or None if cargo cannot get them.
fn lua_sources(tmp: &Path) -> Option<PathBuf> {
    let proj = tmp.join("fetch");
    std::fs::create_dir_all(proj.join("src")).ok()?;
    std::fs::write(proj.join("src/main.rs"), "fn main() {}\n").ok()?;
    std::fs::write(
        proj.join("Cargo.toml"),
        "[package]\nname = \"fetch\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
         [dependencies]\nlua-src = \"=547.1.0\"\n[workspace]\n",
    )
    .ok()?;
    let ok = Command::new("cargo")
        .args(["fetch", "-q"])
        .current_dir(&proj)
        .status()
        .ok()?
        .success();
    if !ok {
        return None;
    }
    let out = Command::new("cargo")
        .args(["metadata", "-q", "--format-version", "1"])
        .current_dir(&proj)
        .output()
        .ok()?;
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let manifest = meta["packages"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == "lua-src")?["manifest_path"]
        .as_str()?
        .to_string();
    let dir = Path::new(&manifest).parent()?.join("lua-5.4.7");
    dir.join("lvm.c").exists().then_some(dir)
}

/// The project the system row builds, in `dir`, with its Makefile; returns
/// its description. Lua if reachable, else 32 generated files.
fn make_project(tmp: &Path, dir: &Path) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let (what, defs) = match lua_sources(tmp) {
        Some(src) => {
            for e in std::fs::read_dir(&src).unwrap().flatten() {
                let p = e.path();
                if matches!(p.extension().and_then(|x| x.to_str()), Some("c" | "h")) {
                    std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
                }
            }
            ("Lua 5.4.7 (lua-src crate)", "-DLUA_USE_LINUX")
        }
        None => {
            for f in 0..32 {
                let mut s = String::from("#include <stddef.h>\n");
                for g in 0..60 {
                    s += &format!(
                        "unsigned long u{f}_{g}(const unsigned char *p, size_t n) {{\n\
                         \x20 unsigned long h = {}u;\n\
                         \x20 for (size_t i = 0; i < n; i++) {{ h = (h ^ p[i]) * 1099511628211u; if (h & {g}) h += i; else h -= {f}; }}\n\
                         \x20 switch (h % 7) {{ case 0: return h >> 3; case 1: return h * 5; case 2: return h ^ {g}; default: return h; }}\n}}\n",
                        f * 1000 + g
                    );
                }
                std::fs::write(dir.join(format!("unit{f:02}.c")), s).unwrap();
            }
            ("32 generated C files", "")
        }
    };
    std::fs::write(
        dir.join("Makefile"),
        format!(
            "OBJS := $(patsubst %.c,%.o,$(sort $(wildcard *.c)))\n\
             libproj.a: $(OBJS)\n\tar rcs $@ $^\n\
             %.o: %.c\n\tgcc -O2 {defs} -c -o $@ $<\n"
        ),
    )
    .unwrap();
    let n = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "c"))
        .count();
    assert!(n >= 30, "the project has {n} C files");
    format!("{what}, {n} C files, gcc -O2")
}

/// The objects of the last build, by name.
fn objects(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "o"))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// `rtprofd` on a private socket and presentation segment, its log in
/// `dir/log`.
fn start_daemon(dir: &Path) -> Rtprofd {
    let mut cmd = clean(here().join("rtprofd"));
    cmd.args(["--buffer-mib", "8"])
        .stderr(std::fs::File::create(dir.join("log")).unwrap());
    Rtprofd::start(cmd, dir)
}

/// Runs in a private mount namespace: binds `$1` over /etc, exports the
/// agent's variables (with /etc/ld.so.preload nothing else passes them to
/// every process) and builds `$2`.
const BUILD_SCRIPT: &str = r#"mount --bind "$1" /etc || exit 97
export RTPROF_DAEMON_SOCKET="$3"
if [ -n "$4" ]; then export RTPROF_CACHE="$4"; fi
if [ -n "$5" ]; then export XDG_CACHE_HOME="$5"; fi
if [ -n "$6" ]; then export RTPROF_REPORT="$6"; fi
if [ -n "$7" ]; then export RTPROF_IMAGES="$7"; fi
exec make -s -j2 -C "$2"
"#;

struct System<'a> {
    bench: &'a Bench,
    proj: PathBuf,
    etc_plain: PathBuf,
    etc_agent: PathBuf,
    cache: PathBuf,
    daemon: Rtprofd,
    reference: BTreeMap<String, Vec<u8>>,
    pending: Vec<BTreeMap<String, Vec<u8>>>,
}

impl System<'_> {
    fn build_command(&self, col: Col, report: Option<&Path>) -> Command {
        for e in std::fs::read_dir(&self.proj).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "o" || x == "a") {
                std::fs::remove_file(e.path()).unwrap();
            }
        }
        let (etc, cache_mode, xdg) = match col {
            Col::Plain => (&self.etc_plain, "", PathBuf::new()),
            Col::Agent => (&self.etc_agent, "off", PathBuf::new()),
            Col::Warm | Col::WarmWritten => (&self.etc_agent, "user", self.cache.clone()),
        };
        let images = if col == Col::WarmWritten { "0" } else { "" };
        let mut c = clean("unshare");
        c.args([
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            BUILD_SCRIPT,
            "sh",
        ])
        .arg(etc)
        .arg(&self.proj)
        .arg(&self.daemon.socket)
        .arg(cache_mode)
        .arg(xdg)
        .arg(report.map(|r| r.join("r-%p.json")).unwrap_or_default())
        .arg(images)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        c
    }

    /// Checks a finished build and compares its objects with the reference.
    fn check(&mut self, out: std::process::Output, col: Col) {
        assert!(
            out.status.success(),
            "build failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let objs = objects(&self.proj);
        if self.reference.is_empty() {
            if col != Col::Plain {
                // Compared once the first plain build has run.
                self.pending.push(objs);
                return;
            }
            self.reference = objs;
            for p in std::mem::take(&mut self.pending) {
                self.compare(&p);
            }
            return;
        }
        self.compare(&objs);
    }

    fn compare(&self, objs: &BTreeMap<String, Vec<u8>>) {
        let names: BTreeSet<&String> = self.reference.keys().chain(objs.keys()).collect();
        let differ: Vec<&str> = names
            .into_iter()
            .filter(|n| self.reference.get(*n) != objs.get(*n))
            .map(|n| n.as_str())
            .collect();
        assert!(
            differ.is_empty(),
            "objects built with the agent differ from the plain build: {}",
            differ.join(", ")
        );
    }

    fn build(&mut self, col: Col, report: Option<&Path>) -> f64 {
        let mut c = self.build_command(col, report);
        let t = Instant::now();
        let out = c.output().expect("unshare runs");
        let ms = t.elapsed().as_secs_f64() * 1e3;
        self.check(out, col);
        ms
    }

    /// An agent build with reports, watching the daemon's view meanwhile:
    /// (cc1 processes the daemon followed, cc1 processes of the build).
    fn build_watched(&mut self, report: &Path) -> (usize, usize) {
        let file = std::fs::File::open(&self.daemon.present).unwrap();
        // SAFETY: a read-only shared mapping of a file rtprofd never
        // shrinks; read_view validates every byte it uses.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let mut seen = BTreeSet::new();
        let look = |seen: &mut BTreeSet<u32>| {
            if let Ok(v) = rtprof_abi::present::read_view(&map) {
                seen.extend(
                    v.procs
                        .iter()
                        .filter(|p| p.exe.ends_with("/cc1"))
                        .map(|p| p.pid),
                );
            }
        };
        let child = self
            .build_command(Col::Agent, Some(report))
            .spawn()
            .unwrap();
        // Output read on a thread: a full pipe would stop the build.
        let waiter = std::thread::spawn(move || child.wait_with_output());
        while !waiter.is_finished() {
            look(&mut seen);
            std::thread::sleep(Duration::from_millis(100));
        }
        // Ended processes appear once more, at the next tick (1 s).
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(2500) {
            look(&mut seen);
            std::thread::sleep(Duration::from_millis(100));
        }
        self.check(waiter.join().unwrap().unwrap(), Col::Agent);
        // Pids from the reports: the view may still list the last build's.
        let built: BTreeSet<u32> = reports(report)
            .into_iter()
            .filter(|p| p.1.ends_with("/cc1"))
            .map(|p| p.0)
            .collect();
        (seen.intersection(&built).count(), built.len())
    }
}

fn run_system(bench: &Bench, runs: usize, budget: Option<f64>) -> Option<(Measured, String)> {
    let probe = Command::new("unshare")
        .args(["-m", "--propagation", "private", "true"])
        .stderr(Stdio::null())
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        println!("system row skipped: `unshare -m` failed (needs root)");
        return None;
    }
    let tmp = &bench.tmp;
    let proj = tmp.join("proj");
    let what = make_project(tmp, &proj);
    // Two copies of /etc: without and with ld.so.preload, bound over /etc
    // inside the namespace only, so both columns pay the same mount.
    let (etc_plain, etc_agent) = (tmp.join("etc-plain"), tmp.join("etc-agent"));
    for d in [&etc_plain, &etc_agent] {
        let st = Command::new("cp").arg("-a").arg("/etc").arg(d).status();
        assert!(st.is_ok_and(|s| s.success()), "copying /etc failed");
    }
    let _ = std::fs::remove_file(etc_plain.join("ld.so.preload"));
    std::fs::write(
        etc_agent.join("ld.so.preload"),
        format!("{}\n", bench.agent.display()),
    )
    .unwrap();
    if let Some(p) = budget {
        let conf = etc_agent.join("rtprof");
        std::fs::create_dir_all(&conf).unwrap();
        std::fs::write(conf.join("rtprof.conf"), format!("budget = {p}\n")).unwrap();
    }
    let mut sys = System {
        bench,
        proj,
        etc_plain,
        etc_agent,
        cache: bench.fresh_dir("cache-system"),
        daemon: start_daemon(&bench.fresh_dir("daemon")),
        reference: BTreeMap::new(),
        pending: Vec::new(),
    };
    // Untimed: fills the warm cache (the first plain build, timed, gives
    // the reference objects every other build must match).
    sys.build(Col::Warm, None);
    let mut ms: [Vec<f64>; 4] = Default::default();
    for _ in 0..runs {
        for (i, col) in COLS.into_iter().enumerate() {
            ms[i].push(sys.build(col, None));
        }
    }
    let dir = sys.bench.fresh_dir("reports");
    let (seen, cc1) = sys.build_watched(&dir);
    let (agent_setup, procs) = setup_ms(&dir);
    let dir = sys.bench.fresh_dir("reports");
    sys.build(Col::Warm, Some(&dir));
    let (warm_setup, _) = setup_ms(&dir);
    let note = format!(
        "system row: {what}, make -j2 under /etc/ld.so.preload, {} objects identical \
         in every build; rtprofd on a private socket followed {seen} of the {cc1} cc1 processes of one build; \
         set-up from one build per column{}",
        sys.reference.len(),
        budget.map_or(String::new(), |p| format!("; agents under `budget = {p}` in rtprof.conf"))
    );
    Some((
        Measured {
            name: "make -j2, ld.so.preload + rtprofd".into(),
            ms: ms.map(median),
            setup_ms: [agent_setup, warm_setup],
            procs,
        },
        note,
    ))
}

fn fmt_ms(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn main() {
    common::check_args(
        "usage: bench-startup [--runs N] [--system-runs N] [--only ROW] [--skip-system]\n[--budget P]\n(--budget: the system row's agents run under an overhead budget of P\npercent, `budget = P` in the bound copy of /etc/rtprof/rtprof.conf.)\n(--runs defaults to 11, --system-runs to 3; --only: rows whose name\ncontains ROW)\n(build first: cargo build --release --workspace; the system row needs\nroot, `unshare`, gcc and make)",
        &common::Takes {
            numbers: &["--runs", "--system-runs"],
            texts: &["--only", "--budget"],
            flags: &["--skip-system"],
        },
    );
    let runs = arg("--runs", 11.0) as usize;
    // A build with the agent takes ~16 s on two cores against ~5 s plain:
    // three rounds keep the whole run under five minutes, and the difference
    // dwarfs the spread.
    let system_runs = arg("--system-runs", runs.min(3) as f64) as usize;
    let only = arg_text("--only");
    let skip_system = flag("--skip-system");
    let budget = arg_text("--budget").map(|b| b.parse::<f64>().expect("--budget P: a percentage"));
    assert!(runs > 0 && system_runs > 0, "--runs must be at least 1");
    let agent = here().join("librtprof.so");
    assert!(
        agent.exists(),
        "{} missing: cargo build --release --workspace",
        agent.display()
    );
    let tmp = std::env::temp_dir().join(format!("rtprof-bench-startup-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let bench = Bench {
        agent,
        tmp: tmp.clone(),
        runs,
    };
    let wanted = |name: &str| match &only {
        Some(o) => name.contains(o.as_str()),
        None => true,
    };

    let c_file = tmp.join("gcc");
    std::fs::create_dir_all(&c_file).unwrap();
    std::fs::write(c_file.join("f.c"), "int f(void){return 1;}\n").unwrap();
    let py = rtprof_e2e::shared_python().ok();
    let mut rows = vec![
        Row {
            name: "/bin/true".into(),
            argv: vec!["/bin/true".into()],
            modules: None,
            cwd: tmp.clone(),
            env: Vec::new(),
        },
        Row {
            name: "/bin/true, agent loaded and off (RTPROF_DISABLE=1)".into(),
            argv: vec!["/bin/true".into()],
            modules: None,
            cwd: tmp.clone(),
            env: vec![("RTPROF_DISABLE", "1".into())],
        },
        Row {
            name: "ls -l /usr/bin, all modules".into(),
            argv: ["ls", "-l", "/usr/bin"].map(OsString::from).to_vec(),
            modules: Some("all"),
            cwd: tmp.clone(),
            env: Vec::new(),
        },
    ];
    match &py {
        Some(py) => {
            rows.push(Row {
                name: "python3 -c pass, libpython".into(),
                argv: vec![py.into(), "-c".into(), "pass".into()],
                modules: Some("libpython*"),
                cwd: tmp.clone(),
                env: Vec::new(),
            });
            let reports = tmp.join("row-reports");
            std::fs::create_dir_all(&reports).unwrap();
            rows.push(Row {
                name: "python3 -c pass, libpython, RTPROF_REPORT".into(),
                argv: vec![py.into(), "-c".into(), "pass".into()],
                modules: Some("libpython*"),
                cwd: tmp.clone(),
                env: vec![("RTPROF_REPORT", reports.join("r-%p.json").into())],
            });
        }
        None => println!("python3 -c pass skipped: no python3 with a shared libpython"),
    }
    rows.push(Row {
        name: "gcc -c (gcc, cc1, as)".into(),
        argv: ["gcc", "-c", "f.c", "-o", "f.o"]
            .map(OsString::from)
            .to_vec(),
        modules: None,
        cwd: c_file,
        env: Vec::new(),
    });

    println!(
        "agent {}; medians of {runs} alternating runs (system row: {system_runs}){}",
        bench.agent.display(),
        py.as_ref()
            .map(|p| format!("; python {}", p.display()))
            .unwrap_or_default()
    );
    let mut results = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        if wanted(&row.name) {
            eprintln!("bench-startup: {}", row.name);
            results.push(bench.run_row(row, i));
        }
    }
    let mut notes = Vec::new();
    if !skip_system && wanted("make -j2, ld.so.preload + rtprofd") {
        eprintln!("bench-startup: make -j2 under /etc/ld.so.preload");
        if let Some((r, note)) = run_system(&bench, system_runs, budget) {
            results.push(r);
            notes.push(note);
        }
    }

    println!();
    println!("| row | plain ms | agent ms | warm ms | added ms agent / warm / warm, code written | ratio agent / warm | setup ms agent / warm |");
    println!("|---|---|---|---|---|---|---|");
    for r in &results {
        let [p, a, w, ww] = r.ms;
        let procs = if r.procs > 1 {
            format!(" ({} processes)", r.procs)
        } else {
            String::new()
        };
        println!(
            "| {}{procs} | {} | {} | {} | {} / {} / {} | {:.2} / {:.2} | {} / {} |",
            r.name,
            fmt_ms(p),
            fmt_ms(a),
            fmt_ms(w),
            fmt_ms(a - p),
            fmt_ms(w - p),
            fmt_ms(ww - p),
            a / p,
            w / p,
            fmt_ms(r.setup_ms[0]),
            fmt_ms(r.setup_ms[1]),
        );
    }
    println!();
    println!("setup: the agent's own set-up time (setup_ns), summed over a run's processes, median of {runs} runs with RTPROF_REPORT");
    for n in notes {
        println!("{n}");
    }
    if wanted("/bin/true") {
        bench.memory(
            "/bin/sleep",
            &["/bin/sleep", "30"],
            &["/bin/sleep", "0"],
            None,
        );
    }
    if let (Some(py), true) = (&py, wanted("python3 -c pass, libpython")) {
        let py = py.to_str().unwrap();
        bench.memory(
            "python3 sleeping, libpython",
            &[py, "-c", "import time; time.sleep(30)"],
            &[py, "-c", "import time; time.sleep(0)"],
            Some("libpython*"),
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
