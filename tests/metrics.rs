//! rtprofd as a Prometheus target: a real Prometheus scrapes a private
//! daemon's `/metrics`, with the daemon's bearer token, while a program
//! calls a function at a known rate, and the rate it computes is the
//! program's; the counter ends at the program's exact count and stays
//! there. Without the token (or with another) nothing is served, unless
//! the daemon was started with `--metrics-public`.

use rtprof_e2e::*;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const PROMETHEUS: &str = "/usr/bin/prometheus";
/// Calls a second of the paced program.
const RATE: f64 = 200_000.0;
const WAIT: Duration = Duration::from_secs(60);

/// `GET path` from 127.0.0.1:`port` with `headers`: (status, body), or
/// None if nothing answers.
fn get_with(port: u16, path: &str, headers: &[&str]) -> Option<(u16, String)> {
    http_get(port, path, headers).map(|a| (a.status, a.body))
}

/// `GET path` without credentials (Prometheus's own API).
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    get_with(port, path, &[])
}

/// `rtprof_function_calls_total` of `function` in a scrape of `/metrics`,
/// checking its executable label.
fn calls_total(port: u16, auth: &str, function: &str, exe: &str) -> Option<u64> {
    let (status, body) = get_with(port, "/metrics", &[auth])?;
    assert_eq!(status, 200, "{body}");
    let line = body.lines().find(|l| {
        l.starts_with("rtprof_function_calls_total{")
            && l.contains(&format!("function=\"{function}\""))
    })?;
    assert!(line.contains(&format!("executable=\"{exe}\"")), "{line}");
    line.rsplit(' ').next()?.parse().ok()
}

/// Percent-encodes a PromQL query for a URL.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The single value of an instant query, if it has one.
fn query(port: u16, q: &str) -> Option<f64> {
    let (status, body) = get(port, &format!("/api/v1/query?query={}", encode(q)))?;
    assert_eq!(status, 200, "query {q}: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let result = v["data"]["result"].as_array()?;
    assert!(result.len() <= 1, "query {q}: several series: {body}");
    result.first()?["value"][1].as_str()?.parse().ok()
}

/// A Prometheus scraping 127.0.0.1:`target` every second with the
/// bearer token in `token_file`.
fn prometheus(dir: &Path, port: u16, target: u16, token_file: &Path) -> Killed {
    assert!(
        Path::new(PROMETHEUS).exists(),
        "{PROMETHEUS} is missing: install Prometheus (apt-get install -y prometheus)"
    );
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: rtprofd\n    \
             authorization:\n      credentials_file: {}\n    static_configs:\n      \
             - targets: ['127.0.0.1:{target}']\n",
            token_file.display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new(PROMETHEUS)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("prometheus starts");
    let p = Killed(child);
    wait_until(
        "Prometheus ready (see prometheus.log in the scratch directory)",
        WAIT,
        || get(port, "/-/ready").is_some_and(|(s, _)| s == 200),
    );
    p
}

#[test]
fn prometheus_sees_the_programs_call_rate_and_counters_never_fall() {
    let dir = scratch("metrics");
    let bin = compile_o2("paced.c", &[], &dir);
    let exe = bin.canonicalize().unwrap().to_string_lossy().into_owned();
    let port = free_port();
    // No token file yet: the daemon makes one.
    let token_file = dir.join("token/metrics.token");
    let mut cmd = Command::new(rtprof().with_file_name("rtprofd"));
    cmd.args(["--tick", "100", "--span", "1000", "--buffer-mib", "4"])
        .args(["--metrics", &format!("127.0.0.1:{port}")])
        .arg("--metrics-token-file")
        .arg(&token_file)
        .args(["--metrics-per-process", "5"])
        .stderr(Stdio::null());
    let d = Rtprofd::start(cmd, &dir);
    wait_until("rtprofd serving /metrics", WAIT, || {
        get(port, "/metrics").is_some()
    });
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&token_file).expect("the daemon made a token file");
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        assert_eq!((m.mode() & 0o777, m.uid()), (0o600, me));
    }
    let token = std::fs::read_to_string(&token_file).unwrap();
    assert!(token.trim().len() >= 32, "{token:?}");
    let auth = format!("Authorization: Bearer {}", token.trim());
    // Without the token, or with another, nothing but a challenge.
    let wrong = format!("Authorization: Bearer {}x", token.trim());
    for headers in [
        &[][..],
        &[wrong.as_str()][..],
        &["Authorization: Basic cm9vdDo="][..],
    ] {
        let a = http_get(port, "/metrics", headers).expect("an answer");
        assert_eq!(a.status, 401, "{headers:?}: {}", a.body);
        assert!(
            a.head.lines().any(|l| l
                .to_ascii_lowercase()
                .starts_with("www-authenticate: bearer")),
            "{}",
            a.head
        );
        assert!(!a.body.contains("rtprof_"), "{}", a.body);
    }
    assert_eq!(get_with(port, "/metrics", &[&auth]).map(|x| x.0), Some(200));
    assert_eq!(get(port, "/nothing").map(|x| x.0), Some(404));
    let prom_port = free_port();
    let _prom = prometheus(&dir, prom_port, port, &token_file);
    let program = Killed(
        Command::new(&bin)
            .args([&(RATE as u64).to_string(), "25"])
            .env("LD_PRELOAD", agent())
            .env("RTPROF_DAEMON_SOCKET", &d.socket)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let series = "rtprof_function_calls_total{function=\"paced_tick\"}";
    // A window of scrapes all taken while the program ran.
    wait_until("eight scrapes of the program's counter", WAIT, || {
        query(prom_port, &format!("count_over_time({series}[8s])")).is_some_and(|n| n >= 8.0)
    });
    let rate = poll("a rate from Prometheus", WAIT, || {
        query(prom_port, &format!("rate({series}[5s])"))
    });
    assert!(
        (rate - RATE).abs() <= 0.1 * RATE,
        "Prometheus's rate {rate:.0}/s, the program's {RATE}/s"
    );
    eprintln!("rate from Prometheus: {rate:.0}/s (program: {RATE}/s)");
    // Asked for, the process's own series: labelled with its pid, at its
    // rate too.
    let pid = program.0.id();
    let own =
        format!("rtprof_process_function_calls_total{{function=\"paced_tick\",pid=\"{pid}\"}}");
    let rate = poll("the process's own rate", WAIT, || {
        query(prom_port, &format!("rate({own}[5s])"))
    });
    assert!(
        (rate - RATE).abs() <= 0.1 * RATE,
        "the process's series: rate {rate:.0}/s, the program's {RATE}/s"
    );

    // The program ends: the counter reaches its exact count, and stays.
    let out = program_output(program);
    let text = String::from_utf8_lossy(&out);
    let exact: u64 = text.trim().strip_prefix("calls ").unwrap().parse().unwrap();
    let first = poll("the counter at the program's exact count", WAIT, || {
        calls_total(port, &auth, "paced_tick", &exe).filter(|&n| n >= exact)
    });
    assert_eq!(first, exact, "the counter went past the program's count");
    std::thread::sleep(Duration::from_millis(500));
    let t = std::time::Instant::now();
    let second = calls_total(port, &auth, "paced_tick", &exe).expect("the series stays");
    let bytes = get_with(port, "/metrics", &[&auth]).map_or(0, |(_, body)| body.len());
    eprintln!("scrape of /metrics: {:?}, {bytes} bytes", t.elapsed());
    assert_eq!(second, exact, "the counter moved after the program ended");
    // Per-process series are for live processes only.
    let (_, body) = get_with(port, "/metrics", &[&auth]).unwrap();
    assert!(
        !body.contains(&format!("pid=\"{pid}\"")),
        "an ended process's series stays: {body}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn program_output(mut p: Killed) -> Vec<u8> {
    let mut out = Vec::new();
    p.0.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    let status = p.0.wait().unwrap();
    assert!(status.success(), "the paced program failed: {status}");
    out
}

/// rtprofd on `dir` serving metrics at `port` with `extra` options, its
/// stderr in `dir/rtprofd.log`.
fn metrics_daemon(dir: &Path, port: u16, extra: &[&std::ffi::OsStr]) -> Command {
    let mut cmd = Command::new(rtprof().with_file_name("rtprofd"));
    cmd.args(["--tick", "100", "--span", "500", "--buffer-mib", "4"])
        .args(["--metrics", &format!("127.0.0.1:{port}")])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("rtprofd.log")).unwrap());
    cmd
}

/// `--metrics-public` serves anyone; a token file others may read, or
/// that is a link, keeps the daemon from starting at all.
#[test]
fn metrics_are_public_only_when_asked_and_a_loose_token_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("metrics-public");
    let port = free_port();
    let d = Rtprofd::start(
        metrics_daemon(&dir, port, &["--metrics-public".as_ref()]),
        &dir,
    );
    let (status, body) = poll("rtprofd serving /metrics", WAIT, || get(port, "/metrics"));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("rtprofd_processes_followed"), "{body}");
    drop(d);

    let loose = dir.join("loose.token");
    std::fs::write(&loose, "0123456789abcdef0123456789abcdef").unwrap();
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o640)).unwrap();
    let link = dir.join("link.token");
    let private = dir.join("private.token");
    std::fs::write(&private, "0123456789abcdef0123456789abcdef").unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&private, &link).unwrap();
    for (file, why) in [
        (&loose, "group or others may read or write it"),
        (&link, "not a regular file"),
    ] {
        let out = metrics_daemon(
            &dir,
            free_port(),
            &["--metrics-token-file".as_ref(), file.as_os_str()],
        )
        .args(["--socket".as_ref(), dir.join("sock2").as_os_str()])
        .args(["--present".as_ref(), dir.join("present2").as_os_str()])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", file.display());
        assert!(err.contains(why), "{}: {err}", file.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
