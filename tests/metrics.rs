//! rtprofd as a Prometheus target: a real Prometheus scrapes a private
//! daemon's `/metrics` while a program calls a function at a known rate,
//! and the rate it computes is the program's; the counter ends at the
//! program's exact count and stays there.

use rtprof_e2e::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const PROMETHEUS: &str = "/usr/bin/prometheus";
/// Calls a second of the paced program.
const RATE: f64 = 200_000.0;
const WAIT: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` from 127.0.0.1:`port`: (status, body), or None if nothing
/// answers.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// `rtprof_function_calls_total` of `function` in a scrape of `/metrics`,
/// checking its executable label.
fn calls_total(port: u16, function: &str, exe: &str) -> Option<u64> {
    let (status, body) = get(port, "/metrics")?;
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

fn prometheus(dir: &Path, port: u16, target: u16) -> Killed {
    assert!(
        Path::new(PROMETHEUS).exists(),
        "{PROMETHEUS} is missing: install Prometheus (apt-get install -y prometheus)"
    );
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: rtprofd\n    static_configs:\n      \
             - targets: ['127.0.0.1:{target}']\n"
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
    let mut cmd = Command::new(rtprof().with_file_name("rtprofd"));
    cmd.args(["--tick", "100", "--span", "1000", "--buffer-mib", "4"])
        .args(["--metrics", &format!("127.0.0.1:{port}")])
        .args(["--metrics-per-process", "5"])
        .stderr(Stdio::null());
    let d = Rtprofd::start(cmd, &dir);
    wait_until("rtprofd serving /metrics", WAIT, || {
        get(port, "/metrics").is_some()
    });
    assert_eq!(get(port, "/nothing").map(|x| x.0), Some(404));
    let prom_port = free_port();
    let _prom = prometheus(&dir, prom_port, port);
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
        calls_total(port, "paced_tick", &exe).filter(|&n| n >= exact)
    });
    assert_eq!(first, exact, "the counter went past the program's count");
    std::thread::sleep(Duration::from_millis(500));
    let t = std::time::Instant::now();
    let second = calls_total(port, "paced_tick", &exe).expect("the series stays");
    let bytes = get(port, "/metrics").map_or(0, |(_, body)| body.len());
    eprintln!("scrape of /metrics: {:?}, {bytes} bytes", t.elapsed());
    assert_eq!(second, exact, "the counter moved after the program ended");
    // Per-process series are for live processes only.
    let (_, body) = get(port, "/metrics").unwrap();
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
