//! rtprof must never break a third-party program. Real programs from
//! Debian's packages run plain, under `rtprof run` (main executable
//! instrumented) and under `rtprof run --modules all`, and must print the
//! same bytes and end the same way; every report must list the program and
//! account for every function it found. gdb must debug a program that
//! carries the agent exactly as one that does not (the agent starts after
//! gdb has written its breakpoints). The JVM and rustc's libLLVM are the
//! largest modules a developer is likely to instrument.
//!
//! A missing program fails its test (`.ci/run` installs them all); nothing
//! here skips.

use rtprof_e2e::*;
use serde_json::Value;
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Debian's programs, not whatever else a developer's PATH finds first
/// (a pyenv shim, a git under /usr/local).
const SYSTEM_PATH: &str = "/usr/bin:/bin";

/// A run still going after this long has hung; it is killed and fails.
const HANG: Duration = Duration::from_secs(300);

/// `name` from Debian's package `package`, or a failure that says so.
fn program(name: &str, package: &str) -> PathBuf {
    for dir in ["/usr/bin", "/bin", "/usr/sbin", "/sbin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!(
        "{name} is not installed: this test needs Debian's package {package} \
         (`apt-get install {package}`; .ci/run installs it)"
    );
}

fn canonical(p: &Path) -> PathBuf {
    p.canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Whether two paths name one file; a report can name a file that is gone.
fn same_file(a: &Path, b: &Path) -> bool {
    a == b || (a.exists() && b.exists() && canonical(a) == canonical(b))
}

/// Runs `cmd` in a process group of its own, feeding `stdin`; a run that
/// outlives `HANG` is killed with its whole group and fails the test.
fn run_bounded(what: &str, mut cmd: Command, stdin: &[u8]) -> Output {
    cmd.process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Whatever the test runner's environment says about the agent must not
    // reach the plain runs, nor change the profiled ones.
    for (k, _) in std::env::vars() {
        if k.starts_with("RTPROF_") || k == "LD_PRELOAD" {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let pgid = child.id() as i32;
    let mut input = child.stdin.take().unwrap();
    let bytes = stdin.to_vec();
    std::thread::spawn(move || {
        let _ = input.write_all(&bytes);
    });
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(HANG) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: kills the process group this test made for the child.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            panic!("{what}: still running after {HANG:?}; killed it (a hang)");
        }
    }
}

fn describe(o: &Output) -> String {
    format!(
        "status {:?}, signal {:?}\n--- stdout:\n{}\n--- stderr:\n{}",
        o.status.code(),
        o.status.signal(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Byte-for-byte comparison of two runs (stdout, stderr, status), each
/// shown whole on failure. Every program here writes deterministic stderr.
fn assert_same(what: &str, plain: &Output, other: &Output) {
    let same = plain.stdout == other.stdout
        && plain.stderr == other.stderr
        && plain.status.code() == other.status.code()
        && plain.status.signal() == other.status.signal();
    assert!(
        same,
        "{what}: behaves differently from the plain run\n=== plain: {}\n=== {what}: {}",
        describe(plain),
        describe(other)
    );
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Plain,
    /// `rtprof run`: the main executable of every process.
    Main,
    /// `rtprof run --modules all`.
    All,
}

/// One program with everything it needs, run in a fresh directory (the
/// same path every time, so outputs that name files agree).
struct Case {
    name: &'static str,
    argv: Vec<String>,
    env: Vec<(&'static str, String)>,
    stdin: Vec<u8>,
    /// Written into the work directory before each run.
    files: Vec<(String, Vec<u8>)>,
    /// Executables that must each appear as a process in the reports.
    exes: Vec<PathBuf>,
    min_processes: usize,
    /// The plain run's exit status and the end of its stdout: a program
    /// that failed early, the same way every time, must not pass.
    status: i32,
    tail: &'static str,
}

impl Case {
    fn new(name: &'static str, argv: &[&str]) -> Case {
        Case {
            name,
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            stdin: Vec::new(),
            files: Vec::new(),
            exes: Vec::new(),
            min_processes: 1,
            status: 0,
            tail: "all steps done\n",
        }
    }

    /// A file from tests/programs, written into the work directory.
    fn file(mut self, from: &str, to: &str) -> Case {
        let text = std::fs::read(root().join("tests/programs").join(from))
            .unwrap_or_else(|e| panic!("tests/programs/{from}: {e}"));
        self.files.push((to.into(), text));
        self
    }

    fn data(mut self, to: &str, bytes: Vec<u8>) -> Case {
        self.files.push((to.into(), bytes));
        self
    }

    fn expect(mut self, exes: &[&Path], min_processes: usize) -> Case {
        self.exes = exes.iter().map(|p| canonical(p)).collect();
        self.min_processes = min_processes;
        self
    }

    fn ends(mut self, status: i32, tail: &'static str) -> Case {
        self.status = status;
        self.tail = tail;
        self
    }
}

/// Deterministic text of about `lines` x 40 bytes for the file tools.
fn text_data(lines: usize) -> Vec<u8> {
    let words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"];
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut out = String::new();
    for i in 0..lines {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push_str(&format!(
            "{i:06} {:016x} {} {}\n",
            x,
            words[(x % 6) as usize],
            x % 1000
        ));
    }
    out.into_bytes()
}

fn run_case(case: &Case, mode: Mode, dir: &Path) -> (Output, Option<Value>) {
    let work = dir.join("work");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    for (name, bytes) in &case.files {
        let p = work.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
    let json = dir.join(format!("{mode:?}.json"));
    let _ = std::fs::remove_file(&json);
    let mut cmd = match mode {
        Mode::Plain => {
            let mut c = Command::new(&case.argv[0]);
            c.args(&case.argv[1..]);
            c
        }
        Mode::Main | Mode::All => {
            let mut c = Command::new(rtprof());
            c.arg("run");
            if mode == Mode::All {
                c.args(["--modules", "all"]);
            }
            c.arg("--json").arg(&json).arg("--").args(&case.argv);
            c
        }
    };
    cmd.current_dir(&work)
        .env("PATH", SYSTEM_PATH)
        .env("LC_ALL", "C")
        .env("TZ", "UTC")
        .env("HOME", &work);
    for (k, v) in &case.env {
        cmd.env(k, v);
    }
    let what = format!("{} ({mode:?})", case.name);
    let out = run_bounded(&what, cmd, &case.stdin);
    if mode == Mode::Plain {
        return (out, None);
    }
    let text = std::fs::read_to_string(&json).unwrap_or_else(|e| {
        panic!(
            "{what}: no report {}: {e}\n{}",
            json.display(),
            describe(&out)
        )
    });
    let report =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: report is not JSON: {e}"));
    (out, Some(report))
}

/// Whether an ELF file has anything the agent finds functions in: function
/// symbols, or unwind entries beyond an empty `.eh_frame`.
fn has_functions(path: &Path, cache: &mut HashMap<PathBuf, bool>) -> bool {
    if let Some(&b) = cache.get(path) {
        return b;
    }
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let elf = goblin::elf::Elf::parse(&data).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let syms = elf
        .syms
        .iter()
        .chain(elf.dynsyms.iter())
        .any(|s| s.is_function() && s.st_value != 0 && s.st_size > 0);
    // A CIE and the terminator alone take well under 64 bytes.
    let unwind = elf
        .section_headers
        .iter()
        .any(|sh| elf.shdr_strtab.get_at(sh.sh_name) == Some(".eh_frame") && sh.sh_size > 64);
    cache.insert(path.to_path_buf(), syms || unwind);
    syms || unwind
}

fn uint(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no number {key} in {v}"))
}

/// Modules the agent never instruments, whatever `--modules` says.
fn never_instrumented(path: &str) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.starts_with("linux-vdso") || file.starts_with("ld-linux") || file == "librtprof.so"
}

/// Checks one report of `case` run in `mode` against its plain run.
fn check_report(case: &Case, mode: Mode, report: &Value, plain: &Output) {
    let what = format!("{} ({mode:?})", case.name);
    let procs = report["processes"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no processes in the report"));
    assert!(
        procs.len() >= case.min_processes,
        "{what}: {} processes reported, expected at least {}",
        procs.len(),
        case.min_processes
    );
    // The command itself comes first; its last image ends like the plain run.
    let first = &procs[0];
    assert_eq!(
        Path::new(first["exe"].as_str().unwrap()),
        canonical(Path::new(&case.argv[0])),
        "{what}: first process"
    );
    let last = procs.iter().rfind(|p| p["pid"] == first["pid"]).unwrap();
    if let Some(code) = plain.status.code() {
        assert_eq!(
            last["ended"], "exit",
            "{what}: how the command ended: {last}"
        );
        assert_eq!(
            last["exit_status"].as_i64(),
            Some(code as i64),
            "{what}: exit status in the report"
        );
    }
    let exes: Vec<&str> = procs.iter().map(|p| p["exe"].as_str().unwrap()).collect();
    for e in &case.exes {
        assert!(
            exes.iter().any(|x| Path::new(x) == e),
            "{what}: no process of {} in the report; processes: {exes:?}",
            e.display()
        );
    }
    let mut cache = HashMap::new();
    for p in procs {
        let exe = p["exe"].as_str().unwrap();
        let modules = p["modules"].as_array().unwrap();
        let main_module = modules[0]["path"].as_str().unwrap();
        assert!(
            same_file(Path::new(main_module), Path::new(exe)),
            "{what}: pid {}: first module {main_module} is not the executable {exe}",
            p["pid"]
        );
        let mut libc_patched = false;
        for (i, m) in modules.iter().enumerate() {
            let path = m["path"].as_str().unwrap();
            let sampled_only = m["sampled_only"].as_bool().unwrap();
            let should_instrument = i == 0 || (mode == Mode::All && !never_instrumented(path));
            assert_eq!(
                !sampled_only, should_instrument,
                "{what}: pid {} ({exe}): module {m} instrumented?",
                p["pid"]
            );
            if sampled_only {
                continue;
            }
            let functions = uint(m, "functions");
            let patched = uint(m, "patched");
            let refused: u64 = m["refused"]
                .as_object()
                .unwrap()
                .values()
                .map(|n| n.as_u64().unwrap())
                .sum();
            assert_eq!(
                functions,
                patched + refused,
                "{what}: pid {} ({exe}): every function patched or refused for a reason: {m}",
                p["pid"]
            );
            if has_functions(Path::new(path), &mut cache) {
                assert!(
                    functions > 0,
                    "{what}: pid {} ({exe}): {path} has symbols or unwind entries, \
                     but no functions are listed: {m}",
                    p["pid"]
                );
            }
            // A process killed while a library it had just loaded was being
            // instrumented (a pool worker terminated at shutdown) leaves its
            // functions `not_attempted`, as documented.
            let unfinished = m["refused"]["not_attempted"].as_u64().unwrap_or(0);
            if unfinished > 0 {
                assert_eq!(
                    p["ended"], "abrupt",
                    "{what}: pid {} ({exe}): {path}: functions not attempted, \
                     but the process ended normally: {m}",
                    p["pid"]
                );
                continue;
            }
            // A real program's entries are nearly all patchable; a stub
            // library's one or two may all be too small.
            let at_least = if i == 0 { 1 } else { functions.div_ceil(2) };
            assert!(
                functions < 20 || patched >= at_least,
                "{what}: pid {} ({exe}): {path}: {patched} of {functions} functions patched, \
                 expected at least {at_least}: {m}",
                p["pid"]
            );
            if path.rsplit('/').next() == Some("libc.so.6") && patched > 0 {
                libc_patched = true;
            }
        }
        if mode == Mode::All {
            assert!(
                libc_patched,
                "{what}: pid {} ({exe}): libc.so.6 not instrumented with --modules all: {}",
                p["pid"], p["modules"]
            );
        }
    }
}

/// Runs `case` plain, under `rtprof run` and under `rtprof run --modules
/// all`; returns the reports.
fn sweep(case: &Case) -> [Value; 2] {
    let dir = scratch(case.name);
    let t = Instant::now();
    let (plain, _) = run_case(case, Mode::Plain, &dir);
    let (main, main_report) = run_case(case, Mode::Main, &dir);
    let (all, all_report) = run_case(case, Mode::All, &dir);
    eprintln!("{}: three runs in {:.1?}", case.name, t.elapsed());
    assert!(
        plain.status.code() == Some(case.status) && plain.stdout.ends_with(case.tail.as_bytes()),
        "{}: the plain run did not end as it should (status {}, stdout ending {:?}): {}",
        case.name,
        case.status,
        case.tail,
        describe(&plain)
    );
    assert_same(&format!("{} under `rtprof run`", case.name), &plain, &main);
    assert_same(
        &format!("{} under `rtprof run --modules all`", case.name),
        &plain,
        &all,
    );
    let (main_report, all_report) = (main_report.unwrap(), all_report.unwrap());
    check_report(case, Mode::Main, &main_report, &plain);
    check_report(case, Mode::All, &all_report, &plain);
    let _ = std::fs::remove_dir_all(&dir);
    [main_report, all_report]
}

fn bash() -> PathBuf {
    program("bash", "bash")
}

fn script_case(name: &'static str, script: &str) -> Case {
    let b = bash();
    Case::new(name, &[b.to_str().unwrap(), "script.sh"]).file(script, "script.sh")
}

#[test]
fn perl_one_liners() {
    let perl = program("perl", "perl");
    // Hashes, regexes, sort, sprintf, a forked child with its own status,
    // and a non-zero exit.
    let script = r#"
        $| = 1; srand(42);
        my %h; $h{"k" . int(rand(5000))} += $_ for 1 .. 50000;
        my @top = (sort { $h{$b} <=> $h{$a} || $a cmp $b } keys %h)[0 .. 4];
        print join(",", map { sprintf("%s=%08.2f", $_, $h{$_} / 7) } @top), "\n";
        my $text = join(" ", map { "w$_" x ($_ % 3 + 1) } 1 .. 2000);
        my @m = $text =~ /\b(w1\d*)\b/g; my $n = () = $text =~ /(w(\d)\2)/g;
        (my $t = substr($text, 0, 60)) =~ s/(\d+)/<$1>/g;
        print scalar(@m), " $n $t\n";
        my @sorted = sort { $a <=> $b } map { ($_ * 7919) % 10007 } 1 .. 20000;
        printf "%d %d %d %.3e\n", $sorted[0], $sorted[-1], $sorted[10000], 1 / 3;
        my $pid = fork() // die "fork: $!";
        if ($pid == 0) { print "child ", length($text), "\n"; exit 3 }
        waitpid($pid, 0); print "child status ", $? >> 8, "\n";
        warn "to stderr\n"; exit 7;
    "#;
    let case = Case::new("perl", &[perl.to_str().unwrap(), "-e", script])
        .expect(&[&perl], 2)
        .ends(7, "child status 3\n");
    sweep(&case);
}

#[test]
fn python_threads_multiprocessing_ctypes() {
    let python = program("python3", "python3");
    let case = Case::new("python", &[python.to_str().unwrap(), "mix.py"])
        .file("mix.py", "mix.py")
        // fork pool (2) and spawn pool (2, plus its resource tracker).
        .expect(&[&python], 6)
        .ends(3, "snprintf 42-ctypes-2.500\n");
    sweep(&case);
}

#[test]
fn bash_pipes_and_subshells() {
    let case = script_case("bash", "mix.sh")
        .expect(
            &[
                &bash(),
                &program("seq", "coreutils"),
                &program("sort", "coreutils"),
            ],
            8,
        )
        .ends(5, "exit trap\n");
    sweep(&case);
}

#[test]
fn git_repository_lifecycle() {
    let git = program("git", "git");
    let mut case = script_case("git", "git.sh").expect(&[&git], 30);
    let date = "2020-02-03T04:05:06Z".to_string();
    case.env = vec![
        ("GIT_AUTHOR_NAME", "Ada".into()),
        ("GIT_AUTHOR_EMAIL", "ada@example.org".into()),
        ("GIT_COMMITTER_NAME", "Ada".into()),
        ("GIT_COMMITTER_EMAIL", "ada@example.org".into()),
        ("GIT_AUTHOR_DATE", date.clone()),
        ("GIT_COMMITTER_DATE", date),
        ("GIT_CONFIG_NOSYSTEM", "1".into()),
        ("GIT_CONFIG_GLOBAL", "/dev/null".into()),
    ];
    sweep(&case);
}

#[test]
fn sqlite3_create_insert_select() {
    let sqlite = program("sqlite3", "sqlite3");
    let mut case = Case::new("sqlite3", &[sqlite.to_str().unwrap(), "test.db"])
        .expect(&[&sqlite], 1)
        .ends(0, "\nok\n");
    case.stdin = std::fs::read(root().join("tests/programs/sqlite.sql")).unwrap();
    sweep(&case);
}

#[test]
fn openssl_digest_and_cipher() {
    let case = script_case("openssl", "openssl.sh")
        .data("data.txt", text_data(20000))
        .expect(&[&program("openssl", "openssl")], 9);
    sweep(&case);
}

#[test]
fn zstd_xz_gzip_round_trips() {
    let case = script_case("compress", "compress.sh")
        .data("data.txt", text_data(40000))
        .expect(
            &[
                &program("zstd", "zstd"),
                &program("xz", "xz-utils"),
                &program("gzip", "gzip"),
            ],
            12,
        );
    sweep(&case);
}

#[test]
fn make_and_gxx_build_then_run() {
    program("make", "make");
    let mut case = script_case("cxx", "cxx/build.sh");
    for f in ["Makefile", "main.cpp", "stats.cpp", "stats.h"] {
        case = case.file(&format!("cxx/{f}"), f);
    }
    // make, three g++ drivers with cc1plus, as and the linker below them,
    // the built program, sha256sum.
    let case = case.expect(&[&program("make", "make"), &program("g++", "g++")], 12);
    sweep(&case);
}

#[test]
fn sort_awk_sed_grep_find_tar() {
    let case = script_case("text", "text.sh").expect(
        &[
            &program("sort", "coreutils"),
            &program("awk", "mawk"),
            &program("sed", "sed"),
            &program("grep", "grep"),
            &program("find", "findutils"),
            &program("tar", "tar"),
        ],
        20,
    );
    sweep(&case);
}

// ---------------------------------------------------------------- java

#[test]
fn java_version_with_every_module() {
    let java = program("java", "openjdk-17-jre-headless");
    // java -version writes to stderr only; compared byte for byte.
    let case = Case::new("java", &[java.to_str().unwrap(), "-version"])
        .expect(&[&java], 1)
        .ends(0, "");
    let [_, all] = sweep(&case);
    let p = &all["processes"][0];
    let jvm = p["modules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["path"].as_str().unwrap().ends_with("/libjvm.so"))
        .unwrap_or_else(|| panic!("libjvm.so is not among the modules: {}", p["modules"]));
    let (functions, patched) = (uint(jvm, "functions"), uint(jvm, "patched"));
    assert!(
        functions > 0 && patched * 10 > functions * 9,
        "libjvm.so: {patched} of {functions} functions patched, expected over 90%: {jvm}"
    );
}

// ---------------------------------------------------------------- rustc

/// The real compiler of the toolchain on PATH (not rustup's proxy, which
/// would only add a process).
fn rustc() -> PathBuf {
    let out = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .unwrap_or_else(|e| {
            panic!("rustc is not installed ({e}): this test needs a Rust toolchain")
        });
    assert!(
        out.status.success(),
        "rustc --print sysroot: {}",
        describe(&out)
    );
    let sysroot = String::from_utf8(out.stdout).unwrap();
    let p = Path::new(sysroot.trim()).join("bin/rustc");
    assert!(p.exists(), "{} is missing", p.display());
    p
}

#[test]
fn rustc_with_libllvm_instrumented() {
    let rustc = rustc();
    let dir = scratch("rustc");
    let src = "use std::collections::BTreeMap;\n\
               fn main() {\n\
               \x20   let mut m = BTreeMap::new();\n\
               \x20   for i in 1..=20u64 { *m.entry(i % 7).or_insert(0) += i * i; }\n\
               \x20   println!(\"hello {:?}\", m);\n\
               \x20   std::process::exit((m.len() * 3) as i32);\n\
               }\n";
    let json = dir.join("rustc.json");
    // Compiles hello.rs in a directory of its own; returns rustc's output,
    // the program's output and the executable.
    let compile = |profiled: bool| {
        let work = dir.join(if profiled { "profiled" } else { "plain" });
        std::fs::create_dir_all(&work).unwrap();
        std::fs::write(work.join("hello.rs"), src).unwrap();
        let mut cmd = Command::new(if profiled { rtprof() } else { rustc.clone() });
        if profiled {
            cmd.args(["run", "--modules", "libLLVM*", "--json"])
                .arg(&json)
                .arg("--")
                .arg(&rustc);
        }
        cmd.args(["-O", "hello.rs", "-o", "hello"])
            .current_dir(&work);
        let t = Instant::now();
        let compiled = run_bounded("rustc", cmd, b"");
        // Reported, not asserted: how long libLLVM's ~130,000 functions
        // take to instrument in every process that loads it.
        eprintln!(
            "rustc -O hello.rs, {}: {:.1?}",
            if profiled {
                "libLLVM instrumented"
            } else {
                "plain"
            },
            t.elapsed()
        );
        let ran = compiled.status.success().then(|| {
            let mut run = Command::new(work.join("hello"));
            run.current_dir(&work);
            run_bounded("hello", run, b"")
        });
        (compiled, ran, std::fs::read(work.join("hello")).ok())
    };
    let plain = compile(false);
    let profiled = compile(true);
    assert_same(
        "rustc under rtprof --modules 'libLLVM*'",
        &plain.0,
        &profiled.0,
    );
    let plain_run = plain.1.as_ref().expect("plain rustc compiled hello");
    assert_eq!(
        String::from_utf8_lossy(&plain_run.stdout),
        "hello {0: 245, 1: 290, 2: 341, 3: 398, 4: 461, 5: 530, 6: 605}\n"
    );
    assert_eq!(plain_run.status.code(), Some(21));
    assert_same(
        "hello built under rtprof",
        plain_run,
        profiled.1.as_ref().unwrap(),
    );
    assert!(
        plain.2 == profiled.2,
        "rustc under rtprof wrote a different executable"
    );
    let text = std::fs::read_to_string(&json).expect("rustc's report");
    check_llvm(&serde_json::from_str(&text).unwrap(), &rustc);
    let _ = std::fs::remove_dir_all(&dir);
}

/// rustc's process has libLLVM instrumented, mostly patched.
fn check_llvm(report: &Value, rustc: &Path) {
    let procs = report["processes"].as_array().unwrap();
    let p = procs
        .iter()
        .find(|p| Path::new(p["exe"].as_str().unwrap()) == canonical(rustc))
        .unwrap_or_else(|| panic!("no rustc process in the report"));
    let llvm = p["modules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["path"].as_str().unwrap().contains("/libLLVM"))
        .unwrap_or_else(|| panic!("libLLVM is not among rustc's modules: {}", p["modules"]));
    assert_eq!(llvm["sampled_only"], false, "{llvm}");
    let (functions, patched) = (uint(llvm, "functions"), uint(llvm, "patched"));
    eprintln!(
        "libLLVM: {patched} of {functions} functions patched, setup {} ms",
        uint(p, "setup_ns") / 1_000_000
    );
    assert!(
        functions > 0 && patched * 10 > functions * 9,
        "libLLVM: {patched} of {functions} functions patched, expected over 90%: {llvm}"
    );
}

// ---------------------------------------------------------------- gdb

/// tests/c/debugged.c built with debug information at `opt`.
fn debugged(opt: &str, dir: &Path) -> PathBuf {
    let bin = dir.join(format!("debugged{opt}"));
    let o = Command::new("gcc")
        .arg(opt)
        .args(["-g", "-o"])
        .arg(&bin)
        .arg(root().join("tests/c/debugged.c"))
        .output()
        .expect("gcc runs");
    assert!(o.status.success(), "gcc: {}", describe(&o));
    bin
}

/// The line of debugged.c marked `call-work`.
fn call_work_line() -> usize {
    let src = std::fs::read_to_string(root().join("tests/c/debugged.c")).unwrap();
    1 + src
        .lines()
        .position(|l| l.contains("/* call-work */"))
        .unwrap()
}

/// What gdb printed, without what only the agent's presence changes: its
/// sampling thread ("[New Thread ...]", "Thread 1 "x" hit ..." instead of
/// "Breakpoint ..."), and addresses and pids, which differ anyway.
fn normalise(text: &[u8]) -> String {
    let mut out = String::new();
    for line in String::from_utf8_lossy(text).lines() {
        if line.starts_with("[New Thread ")
            || line.starts_with("[New process ")
            || line.starts_with("[Switching to ")
            || line.starts_with("[Current thread is ")
            || (line.starts_with("[Thread ") && line.ends_with(" exited]"))
        {
            continue;
        }
        let mut l = line.to_string();
        if let Some(rest) = l.strip_prefix("Thread ") {
            // Thread 1 "name" hit Breakpoint 1, ...  /  ... received signal
            if let Some(q) = rest.find("\" ") {
                let tail = &rest[q + 2..];
                if let Some(t) = tail.strip_prefix("hit ") {
                    l = t.to_string();
                } else if tail.starts_with("received signal") {
                    l = format!("Program {tail}");
                }
            }
        }
        out.push_str(&mask_numbers(&l));
        out.push('\n');
    }
    out
}

/// Hex addresses become `0x?`, the number after "process " or "LWP " `?`.
fn mask_numbers(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("0x") {
            let n = r.chars().take_while(|c| c.is_ascii_hexdigit()).count();
            if n > 0 {
                out.push_str("0x?");
                rest = &r[n..];
                continue;
            }
        }
        let mut matched = false;
        for word in ["process ", "LWP "] {
            if let Some(r) = rest.strip_prefix(word) {
                let n = r.chars().take_while(|c| c.is_ascii_digit()).count();
                if n > 0 {
                    out.push_str(word);
                    out.push('?');
                    rest = &r[n..];
                    matched = true;
                    break;
                }
            }
        }
        if matched {
            continue;
        }
        let c = rest.chars().next().unwrap();
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// One gdb batch session on `bin`; with `modules`, the program (and only
/// the program: gdb itself stays clean) gets the agent, with
/// RTPROF_MODULES set to `modules`' value when not empty.
fn gdb_session(bin: &Path, commands: &[String], modules: Option<&str>, report: &Path) -> Output {
    let mut cmd = Command::new(program("gdb", "gdb"));
    cmd.args(["-batch", "-nx"]);
    if let Some(modules) = modules {
        cmd.arg("-ex")
            .arg(format!("set environment LD_PRELOAD {}", agent().display()))
            .arg("-ex")
            .arg(format!(
                "set environment RTPROF_REPORT {}",
                report.display()
            ));
        if !modules.is_empty() {
            cmd.arg("-ex")
                .arg(format!("set environment RTPROF_MODULES {modules}"));
        }
    }
    for c in commands {
        cmd.arg("-ex").arg(c);
    }
    cmd.arg(bin)
        .env("PATH", SYSTEM_PATH)
        .env("SHELL", "/bin/sh")
        .env("LC_ALL", "C")
        .env("TERM", "dumb");
    run_bounded("gdb", cmd, b"")
}

/// Lines of `text` for which `keep` holds.
fn lines_where(text: &str, keep: impl Fn(&str) -> bool) -> Vec<String> {
    text.lines().filter(|l| keep(l)).map(String::from).collect()
}

/// Runs the session on debugged.c at -O0 and -O2, without and with the
/// agent (RTPROF_MODULES=`modules`), and requires gdb to see the same
/// thing: the program's output, where it stopped, how it exited, and
/// everything else gdb printed.
fn gdb_same(name: &str, commands: &[&str], modules: &str) {
    let dir = scratch(name);
    let line = call_work_line().to_string();
    let commands: Vec<String> = commands
        .iter()
        .map(|c| c.replace("CALL_WORK_LINE", &line))
        .collect();
    // Both builds are tried before failing, so a failure names each.
    let mut failures = Vec::new();
    for opt in ["-O0", "-O2"] {
        if let Err(e) = gdb_compare(name, opt, &commands, modules, &dir) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// One build of debugged.c through the session without and with the agent.
fn gdb_compare(
    name: &str,
    opt: &str,
    commands: &[String],
    modules: &str,
    dir: &Path,
) -> Result<(), String> {
    let bin = debugged(opt, dir);
    let what = format!("gdb {name} ({opt}, RTPROF_MODULES={modules:?})");
    let reports = dir.join(format!("report{opt}-%p.json"));
    let plain = gdb_session(&bin, commands, None, &reports);
    let with = gdb_session(&bin, commands, Some(modules), &reports);
    let (p_out, w_out) = (normalise(&plain.stdout), normalise(&with.stdout));
    let (p_err, w_err) = (normalise(&plain.stderr), normalise(&with.stderr));
    let context = format!(
        "=== without the agent:\n{p_out}{p_err}=== with the agent:\n{w_out}{w_err}=== end of {what}"
    );
    // The plain session itself must show what the test is about.
    assert!(
        p_out.contains("exited with code 05]") && p_out.contains("prog: end"),
        "{what}: unexpected plain session\n{context}"
    );
    let prog = |t: &str| lines_where(t, |l| l.starts_with("prog: "));
    let ends = |t: &str| {
        lines_where(t, |l| {
            l.contains("exited with code")
                || l.contains("exited normally")
                || l.contains("terminated with signal")
                || l.contains("received signal")
        })
    };
    let stops = |t: &str| {
        lines_where(t, |l| {
            l.contains("Breakpoint ") || l.contains("debugged.c:") || l.contains(" in ")
        })
    };
    let checks = [
        ("the program's output", prog(&p_out) == prog(&w_out)),
        ("signals or exit", ends(&p_out) == ends(&w_out)),
        ("where it stopped", stops(&p_out) == stops(&w_out)),
        ("gdb's output", p_out == w_out),
        ("gdb's messages", p_err == w_err),
        ("gdb's status", plain.status.code() == with.status.code()),
    ];
    let differ: Vec<&str> = checks.iter().filter(|c| !c.1).map(|c| c.0).collect();
    if !differ.is_empty() {
        return Err(format!(
            "{what}: with the agent, {} differ\n{context}",
            differ.join(", ")
        ));
    }
    check_debugged_report(dir, &bin, opt, modules);
    Ok(())
}

/// The agent really was loaded into the debugged program, saw the
/// debugger, and stayed inert: a debugger writes breakpoints where entries
/// would be rewritten, places later ones after a function's prologue and
/// steps through code it expects to find there, so the program is debugged
/// exactly as without the agent.
fn check_debugged_report(dir: &Path, bin: &Path, opt: &str, modules: &str) {
    let reports = dir.join(format!("inert{opt}-%p.json"));
    let mut cmd = Command::new(program("gdb", "gdb"));
    cmd.args(["-batch", "-nx"])
        .arg("-ex")
        .arg(format!("set environment LD_PRELOAD {}", agent().display()))
        .arg("-ex")
        .arg("set environment RTPROF_VERBOSE 1")
        .arg("-ex")
        .arg(format!("set environment RTPROF_MODULES {modules}"))
        .arg("-ex")
        .arg(format!(
            "set environment RTPROF_REPORT {}",
            reports.display()
        ))
        .arg("-ex")
        .arg("run")
        .arg(bin)
        .env("PATH", SYSTEM_PATH)
        .env("LC_ALL", "C");
    let out = run_bounded("gdb", cmd, b"");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("(a debugger?) at start-up; process left unprofiled"),
        "the agent did not say it stayed inert under gdb:\n{text}"
    );
    assert!(
        text.contains("prog: end"),
        "the program did not run to its end:\n{text}"
    );
    let left = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("inert"))
        .count();
    assert_eq!(left, 0, "an inert agent wrote a report");
}

/// gdb writes its breakpoint before the agent's constructor runs.
#[test]
fn gdb_breakpoint_set_before_run() {
    gdb_same(
        "before-run",
        &["break work", "run", "continue", "continue"],
        "",
    );
}

/// A breakpoint in libc, which `all` instruments, resolved when libc loads.
#[test]
fn gdb_libc_breakpoint_set_before_run() {
    gdb_same(
        "libc-before-run",
        &["break puts", "run", "continue", "continue"],
        "all",
    );
}

/// A breakpoint in a function set once the program runs.
#[test]
fn gdb_breakpoint_set_after_startup() {
    gdb_same(
        "after-startup",
        &[
            "break main",
            "run",
            "break leaf",
            "continue",
            "continue",
            "delete",
            "continue",
        ],
        "",
    );
}

/// A breakpoint on the exact entry of a libc function, set once the
/// program runs.
#[test]
fn gdb_libc_entry_breakpoint_set_after_startup() {
    gdb_same(
        "libc-after-startup",
        &[
            "break main",
            "run",
            "break *printf",
            "continue",
            "continue",
            "delete",
            "continue",
        ],
        "all",
    );
}

/// `step` from main into a function the agent would patch, then `finish`
/// back out.
#[test]
fn gdb_step_into_function_and_finish() {
    gdb_same(
        "step-finish",
        &[
            "break debugged.c:CALL_WORK_LINE",
            "run",
            "step",
            "step",
            "finish",
            "continue",
        ],
        "",
    );
}

/// What an operator meets on day one (run as root): runuser, su (PAM),
/// setpriv, a daemon dropping to a service user, man-db running its
/// filters under a seccomp filter as its own user.
#[test]
fn privilege_drops_and_sandboxes() {
    let case = script_case("privileges", "privileges.sh").expect(
        &[
            &program("runuser", "util-linux"),
            &program("su", "util-linux"),
            &program("setpriv", "util-linux"),
            &program("man", "man-db"),
        ],
        8,
    );
    sweep(&case);
}
