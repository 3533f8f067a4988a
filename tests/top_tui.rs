//! `rtprof top` in a real terminal: tmux runs it against a private rtprofd
//! while two copies of a program with functions of very different calls
//! and costs run under the agent; keys are typed with `send-keys` and the
//! screen is read with `capture-pane`. Covers waiting for the daemon,
//! sorting, filtering, drilling into a process, the markers, pausing,
//! help, resizing, a restarted daemon, and quitting with the terminal
//! given back.

use rtprof_abi::present::read_view;
use rtprof_e2e::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TMUX: &str = "/usr/bin/tmux";
const WAIT: Duration = Duration::from_secs(60);

/// A tmux server of its own (`-L`, no configuration file) with one
/// window; killed on drop.
struct Tmux {
    socket: String,
    /// The server's socket file, removed on drop.
    socket_path: Option<PathBuf>,
}

impl Tmux {
    /// Runs `command` (through sh) in a `width` x `height` window.
    fn start(command: &str, width: u16, height: u16) -> Tmux {
        assert!(
            Path::new(TMUX).exists(),
            "{TMUX} is missing: install tmux (apt-get install -y tmux)"
        );
        // One server per Tmux: tests run at once.
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut t = Tmux {
            socket: format!("rtprof-top-tui-{}-{n}", std::process::id()),
            socket_path: None,
        };
        let (w, h) = (width.to_string(), height.to_string());
        t.run(&["new-session", "-d", "-x", &w, "-y", &h, "sh", "-c", command]);
        t.socket_path = Some(t.display("#{socket_path}").into());
        t
    }

    fn run(&self, args: &[&str]) -> String {
        let o = Command::new(TMUX)
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .output()
            .expect("tmux runs");
        assert!(
            o.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Presses keys, by tmux's names ("Enter", "Escape", "q").
    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "0"];
        args.extend_from_slice(keys);
        self.run(&args);
    }

    /// Types `text` as it is.
    fn type_text(&self, text: &str) {
        self.run(&["send-keys", "-t", "0", "-l", text]);
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "0"])
    }

    fn display(&self, format: &str) -> String {
        self.run(&["display-message", "-p", "-t", "0", format])
            .trim()
            .to_string()
    }

    /// Waits for a screen that `ok` accepts and returns it; on timeout,
    /// fails showing the last screen.
    fn wait(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let t = Instant::now();
        loop {
            let s = self.screen();
            if ok(&s) {
                return s;
            }
            assert!(
                t.elapsed() < WAIT,
                "timed out waiting for {what}; the screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new(TMUX)
            .args(["-L", &self.socket, "kill-server"])
            .stderr(Stdio::null())
            .status();
        if let Some(p) = &self.socket_path {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The first line of `screen` containing `text`.
fn line_of(screen: &str, text: &str) -> Option<usize> {
    screen.lines().position(|l| l.contains(text))
}

/// Whether `a` is listed above `b` (both listed).
fn above(screen: &str, a: &str, b: &str) -> bool {
    matches!((line_of(screen, a), line_of(screen, b)), (Some(x), Some(y)) if x < y)
}

/// The generation the header shows.
fn shown_generation(screen: &str) -> Option<u64> {
    let rest = screen.lines().next()?.split("generation ").nth(1)?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// The generation the daemon has published.
fn published_generation(present: &Path) -> Option<u64> {
    let f = std::fs::File::open(present).ok()?;
    // SAFETY: the daemon never truncates a segment it publishes in, and
    // read_view validates every byte it uses.
    let map = unsafe { memmap2::Mmap::map(&f) }.ok()?;
    read_view(&map).ok().map(|v| v.generation)
}

fn daemon(dir: &Path) -> Rtprofd {
    let mut cmd = Command::new(rtprof().with_file_name("rtprofd"));
    cmd.args(["--tick", "200", "--span", "1000", "--buffer-mib", "4"])
        .stderr(Stdio::null());
    Rtprofd::start(cmd, dir)
}

fn profiled(bin: &Path, socket: &Path) -> Killed {
    Killed(
        Command::new(bin)
            .arg("300")
            .env("LD_PRELOAD", agent())
            .env("RTPROF_DAEMON_SOCKET", socket)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// The program, as two executables of their own names.
fn programs(dir: &Path) -> (PathBuf, PathBuf) {
    let inc = format!("-I{}", root().join("abi/include").display());
    let bin = compile_o2("top_mix.c", &[&inc], dir);
    let (one, two) = (dir.join("top_one"), dir.join("top_two"));
    std::fs::copy(&bin, &one).unwrap();
    std::fs::copy(&bin, &two).unwrap();
    (one, two)
}

#[test]
fn top_is_interactive_in_a_terminal_and_gives_it_back() {
    let dir = scratch("top-tui");
    let (one, two) = programs(&dir);
    let present = dir.join("present");
    let status = dir.join("status");
    let command = format!(
        "'{}' top --present '{}'; echo $? > '{}'; echo rtprof-top-exited; exec sleep 600",
        rtprof().display(),
        present.display(),
        status.display()
    );
    let tmux = Tmux::start(&command, 120, 40);

    // No daemon yet: it says so and waits.
    tmux.wait("the notice that there is no daemon", |s| {
        s.contains(&format!("waiting for rtprofd at {}", present.display()))
    });
    assert_eq!(tmux.display("#{alternate_on}"), "1", "the alternate screen");

    let mut d = daemon(&dir);
    let p1 = profiled(&one, &d.socket);
    let p2 = profiled(&two, &d.socket);
    let (pid1, pid2) = (p1.0.id(), p2.0.id());
    let s = tmux.wait("both processes listed", |s| {
        s.contains(&format!("{pid1} ")) && s.contains(&format!("{pid2} "))
    });
    assert!(s.contains("top_one") && s.contains("top_two"), "{s}");
    assert!(!s.contains("waiting for rtprofd"), "{s}");
    // The footer names the sort keys.
    for k in ["t time", "c calls", "r calls/s", "n ns/call", "q quit"] {
        assert!(s.contains(k), "footer without {k:?}:\n{s}");
    }

    // A filter typed after `/` narrows the list once Enter applies it.
    tmux.keys(&["/"]);
    tmux.wait("the filter prompt", |s| s.contains("filter: ▏"));
    tmux.type_text("top_two");
    let s = tmux.wait("the typed filter", |s| s.contains("filter: top_two▏"));
    assert!(s.contains("top_one"), "not in force while typed:\n{s}");
    tmux.keys(&["Enter"]);
    let s = tmux.wait("only top_two", |s| {
        s.contains("processes (1)") && !s.contains("top_one")
    });
    assert!(s.contains(&format!("{pid2} ")), "{s}");
    // Esc while typing cancels: the filter in force stays.
    tmux.keys(&["/"]);
    tmux.wait("the filter prompt", |s| s.contains("filter: top_two▏"));
    tmux.type_text("x");
    tmux.wait("the typed filter", |s| s.contains("filter: top_twox▏"));
    tmux.keys(&["Escape"]);
    let s = tmux.wait("the prompt gone", |s| !s.contains("▏"));
    assert!(
        s.contains("filter: top_two") && !s.contains("top_twox"),
        "{s}"
    );
    assert!(!s.contains("top_one"), "{s}");

    // Enter opens the selected process's functions.
    tmux.keys(&["Enter"]);
    let functions = |s: &str| {
        s.contains(&format!("pid {pid2} "))
            && [
                "many_cheap",
                "few_costly",
                "some_middle",
                "offloaded_kernel",
            ]
            .iter()
            .all(|f| s.contains(f))
    };
    tmux.wait("top_two's functions", functions);

    // Sort keys reorder them: few_costly has the most time, many_cheap the
    // most calls, few_costly the most time per call.
    tmux.keys(&["c"]);
    tmux.wait("sorted by calls", |s| {
        s.contains("sort: calls ")
            && above(s, "many_cheap", "some_middle")
            && above(s, "some_middle", "few_costly")
    });
    tmux.keys(&["t"]);
    tmux.wait("sorted by time", |s| {
        s.contains("sort: time ")
            && above(s, "few_costly", "some_middle")
            && above(s, "some_middle", "many_cheap")
    });
    tmux.keys(&["r"]);
    tmux.wait("sorted by calls per second", |s| {
        s.contains("sort: calls/s ") && above(s, "many_cheap", "few_costly")
    });
    tmux.keys(&["n"]);
    let s = tmux.wait("sorted by time per call", |s| {
        s.contains("sort: ns/call ") && above(s, "few_costly", "some_middle")
    });
    // The function the program adds calls to through the C API is marked
    // accelerated, the ones it calls itself are not; the legend says so.
    let marker = |s: &str, f: &str| {
        let l = s.lines().find(|l| l.contains(f)).unwrap_or_default();
        l.split_whitespace().next().unwrap_or_default().to_string()
    };
    assert_eq!(marker(&s, "offloaded_kernel"), "A", "{s}");
    assert!(marker(&s, "few_costly").parse::<f64>().is_ok(), "{s}");
    assert!(
        s.contains("A accelerated (calls added through the C API)"),
        "{s}"
    );
    assert!(s.contains("E estimated"), "{s}");

    // Paused, the view stays while the daemon publishes on.
    tmux.keys(&["p"]);
    let s = tmux.wait("PAUSED", |s| s.contains("PAUSED"));
    let frozen = shown_generation(&s).expect("a generation in the header");
    wait_until("two more publishes", WAIT, || {
        published_generation(&present).is_some_and(|g| g >= frozen + 2)
    });
    let s = tmux.screen();
    assert_eq!(shown_generation(&s), Some(frozen), "paused:\n{s}");
    tmux.keys(&["p"]);
    tmux.wait("updates again", |s| {
        !s.contains("PAUSED") && shown_generation(s).is_some_and(|g| g > frozen)
    });

    // Esc goes back to the process list, the filter still in force; Esc
    // there drops it.
    tmux.keys(&["Escape"]);
    tmux.wait("the process list", |s| s.contains("processes (1)"));
    tmux.keys(&["Escape"]);
    tmux.wait("both processes again", |s| {
        s.contains("processes (2)") && s.contains("top_one")
    });

    // Help, closed by any key.
    tmux.keys(&["?"]);
    let s = tmux.wait("the help", |s| s.contains("rtprof top: help"));
    assert!(s.contains("sort by calls") && s.contains("quit"), "{s}");
    tmux.keys(&["Escape"]);
    tmux.wait("the help closed", |s| !s.contains("rtprof top: help"));

    // A narrower terminal: redrawn to fit, the keys wrapped onto two lines.
    tmux.run(&["resize-window", "-t", "0", "-x", "80", "-y", "24"]);
    let s = tmux.wait("the view at 80 columns", |s| {
        s.lines().count() <= 24
            && line_of(s, "t time").is_some()
            && line_of(s, "q quit").is_some_and(|q| Some(q) != line_of(s, "t time"))
    });
    assert!(s.contains("top_one") && s.contains("top_two"), "{s}");

    // The daemon stops: the view says how old its numbers are; a new one
    // at the same path is followed.
    d.stop();
    tmux.wait("the stale notice", |s| s.contains("STALE"));
    let d2 = daemon(&dir);
    let p3 = profiled(&one, &d2.socket);
    let pid3 = p3.0.id();
    tmux.wait("the restart notice", |s| s.contains("rtprofd restarted"));
    tmux.wait("the new daemon's process", |s| {
        s.contains(&format!("{pid3} ")) && !s.contains("STALE")
    });

    // q quits with status 0 and gives the terminal back.
    tmux.keys(&["q"]);
    let s = tmux.wait("the shell's screen", |s| s.contains("rtprof-top-exited"));
    assert!(!s.contains("rtprof top"), "the view is gone:\n{s}");
    let code = std::fs::read_to_string(&status).unwrap();
    assert_eq!(code.trim(), "0");
    assert_eq!(tmux.display("#{alternate_on}"), "0", "the alternate screen");
    assert_eq!(tmux.display("#{cursor_flag}"), "1", "the cursor shown");
    let tty = tmux.display("#{pane_tty}");
    let stty = Command::new("stty")
        .args(["-a", "-F", &tty])
        .output()
        .unwrap();
    let modes = String::from_utf8_lossy(&stty.stdout);
    assert!(stty.status.success(), "stty: {modes}");
    let has = |m: &str| modes.split_whitespace().any(|w| w == m);
    assert!(
        has("icanon") && has("echo") && has("isig"),
        "raw mode left on: {modes}"
    );

    drop((p1, p2, p3));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Into a pipe `rtprof top` prints plain screens, as before.
#[test]
fn top_into_a_pipe_is_plain_text() {
    let dir = scratch("top-plain");
    let (one, _) = programs(&dir);
    let d = daemon(&dir);
    let p = profiled(&one, &d.socket);
    let pid = p.0.id();
    let out = poll("a plain screen with the process", WAIT, || {
        let o = Command::new(rtprof())
            .args(["top", "--iterations", "1", "--sort", "calls", "--present"])
            .arg(&d.present)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        // rtprofd's first tick may not have come yet.
        if err.contains("nothing published yet") {
            return None;
        }
        assert!(o.status.success(), "{err}");
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        text.contains("few_costly").then_some(text)
    });
    assert!(out.starts_with("\x1b[H\x1b[2Jrtprof top: "), "{out}");
    assert!(out.contains(&format!("pid {pid} ")), "{out}");
    // No terminal: no alternate screen, no cursor hidden.
    assert!(
        !out.contains("\x1b[?1049h") && !out.contains("\x1b[?25l"),
        "{out}"
    );
    assert!(above(&out, "many_cheap", "few_costly"), "{out}");
    // The function given calls through the C API is marked in the report
    // too; the ones the program calls are not.
    let pid_s = pid.to_string();
    let report = poll("a report with offloaded_kernel", WAIT, || {
        let o = Command::new(rtprof())
            .args(["report", "--json", "--pid", &pid_s, "--present"])
            .arg(&d.present)
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
        let funcs = v["processes"][0]["functions"].as_array()?;
        funcs
            .iter()
            .any(|f| f["name"] == "offloaded_kernel")
            .then_some(v)
    });
    let p0 = &report["processes"][0];
    assert_eq!(function_named(p0, "offloaded_kernel")["accelerated"], true);
    assert!(function_named(p0, "few_costly")
        .get("accelerated")
        .is_none());
    drop(p);
    let _ = std::fs::remove_dir_all(&dir);
}

/// With rtprofd publishing rows per thread, `H` lists a process's
/// threads by name with their CPU time and hottest function, and Enter
/// shows one thread's functions with its own calls; plain output lists
/// them with `--threads`.
#[test]
fn top_shows_each_threads_rows() {
    use std::io::BufRead;
    let dir = scratch("top-threads");
    let bin = compile_o2("thread_rows.c", &["-pthread"], &dir);
    let mut cmd = Command::new(rtprof().with_file_name("rtprofd"));
    // A span longer than the test: the threads' work stays in it.
    cmd.args(["--tick", "200", "--span", "600000", "--buffer-mib", "4"])
        .args(["--thread-rows", "4"])
        .stderr(Stdio::null());
    let d = Rtprofd::start(cmd, &dir);
    let mut child = Killed(
        Command::new(&bin)
            .env("LD_PRELOAD", agent())
            .env("RTPROF_DAEMON_SOCKET", &d.socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    std::io::BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    let pid = child.0.id();

    let command = format!(
        "'{}' top --present '{}' --pid {pid}; exec sleep 600",
        rtprof().display(),
        d.present.display(),
    );
    let tmux = Tmux::start(&command, 120, 40);
    tmux.wait("the process's functions", |s| s.contains("burn_2"));
    tmux.keys(&["H"]);
    let s = tmux.wait("its threads", |s| {
        (0..3).all(|k| s.contains(&format!("worker-{k}")))
    });
    assert!(s.contains("4 thread(s)"), "{s}");
    for k in 0..3 {
        let l = s
            .lines()
            .find(|l| l.contains(&format!("worker-{k}")))
            .unwrap();
        // Its hottest function is the one it burned CPU time in.
        assert!(l.trim_end().ends_with(&format!("burn_{k}")), "{l}\n{s}");
    }
    assert!(s.contains("Enter its functions"), "{s}");
    tmux.type_text("/worker-1");
    tmux.keys(&["Enter"]);
    tmux.wait("worker-1 alone", |s| {
        s.contains("1 thread(s)") && !s.contains("worker-2")
    });
    tmux.keys(&["Enter"]);
    let s = tmux.wait("worker-1's functions", |s| {
        s.contains(" worker-1: ") && s.contains("function(s)")
    });
    let calls = |f: &str| {
        s.lines()
            .find(|l| l.trim_end().ends_with(&format!(" {f}")) || l.contains(&format!(" {f} ")))
            .unwrap_or_else(|| panic!("no {f} in\n{s}"))
            .to_string()
    };
    assert!(calls("work").contains(" 2000 "), "{s}");
    assert!(calls("tick").contains(" 2 "), "{s}");
    assert!(s.contains("burn_1") && !s.contains("burn_0"), "{s}");
    // One Esc at a time (two at once read as Alt-Esc).
    tmux.keys(&["Escape"]);
    tmux.wait("back to the threads", |s| s.contains("1 thread(s)"));
    tmux.keys(&["Escape"]);
    tmux.wait("back to the functions", |s| {
        s.contains("function(s)") && !s.contains("thread(s)")
    });

    let o = Command::new(rtprof())
        .args(["top", "--iterations", "1", "--threads", "--pid"])
        .arg(pid.to_string())
        .arg("--present")
        .arg(&d.present)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    for k in 0..3 {
        let at = out
            .find(&format!(" worker-{k}: "))
            .unwrap_or_else(|| panic!("no worker-{k} in\n{out}"));
        // The thread's rows follow it, its burn first (by time).
        let next = out[at..].lines().nth(1).unwrap_or("");
        assert!(next.contains(&format!("burn_{k}")), "{out}");
    }
    drop(child.0.stdin.take());
    let _ = std::fs::remove_dir_all(&dir);
}
