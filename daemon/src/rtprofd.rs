//! `rtprofd`: follows every registered process and publishes, every tick,
//! per-span statistics in the presentation segment that schedulers read.
//! It only aggregates: agents count and sample.

mod accept;
mod error;
mod http;
mod log;
mod metrics;
mod present_file;
mod registry;
mod slots;
mod spans;
mod table;
mod thread_spans;
mod token;

use accept::{Acceptor, Outcome};
use clap::Parser;
use log::{Kind, Limiter};
use registry::Registered;
use rtprof_abi::present::{now_ns, PresentError};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use table::{RegistrationRefusal, Table};

/// Connections of one user that may wait for their registration at once.
const WAITING_PER_USER: usize = 8;
/// Connections that may wait in all.
const WAITING_TOTAL: usize = 64;
/// How long a connection may stay silent; agents send at once.
const WAITING_DEADLINE: Duration = Duration::from_secs(1);
/// Log lines per user and kind of message per interval.
const LOG_LINES: u32 = 10;

#[derive(Parser)]
#[command(
    name = "rtprofd",
    version,
    about = "Publishes per-span statistics of every profiled process"
)]
struct Args {
    /// Unix socket agents register at.
    #[arg(long, default_value = rtprof_abi::protocol::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Presentation segment schedulers map.
    #[arg(long, default_value = rtprof_abi::protocol::DEFAULT_PRESENT)]
    present: PathBuf,
    /// Milliseconds between snapshots (at least 50).
    #[arg(long, default_value_t = 1000)]
    tick: u64,
    /// Milliseconds a span covers.
    #[arg(long, default_value_t = 5000)]
    span: u64,
    /// Group allowed to read the presentation segment (besides root).
    #[arg(long)]
    group: Option<String>,
    /// Size of each of the segment's two buffers, in MiB.
    #[arg(long, default_value_t = 64)]
    buffer_mib: u64,
    /// Segments followed at most, in all.
    #[arg(long, default_value_t = 16384)]
    max_segments: usize,
    /// Segments followed at most per user (at most half of --max-segments).
    #[arg(long, default_value_t = 4096)]
    max_segments_per_user: usize,
    /// Seconds over which each user's refusals of one kind are logged at
    /// most ten times; the rest are counted in one summary line.
    #[arg(long, default_value_t = 10)]
    log_interval: u64,
    /// Serve Prometheus metrics over HTTP at ADDR:PORT (`GET /metrics`).
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<std::net::SocketAddr>,
    /// File of the bearer token `/metrics` asks for (Prometheus:
    /// `authorization: {credentials_file: ...}`). Made, mode 0600, with
    /// random bytes if missing; refused if anyone but root or this
    /// daemon's user owns it or may read it.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/var/lib/rtprof/metrics.token"
    )]
    metrics_token_file: PathBuf,
    /// Serve `/metrics` to anyone who can connect, without a token: the
    /// metrics name the executables and functions of every user's
    /// processes, root's included.
    #[arg(long)]
    metrics_public: bool,
    /// Functions exposed per executable: the hottest over the last span.
    #[arg(long, default_value_t = 20)]
    metrics_top: usize,
    /// Also expose per-process series (`rtprof_process_function_*`, with a
    /// `pid` label): this many functions of each live process, its hottest
    /// over the last span. Off (0) by default: pids make many series.
    #[arg(long, value_name = "N", default_value_t = 0)]
    metrics_per_process: usize,
    /// Publish rows per live thread too: each thread's N hottest functions
    /// by calls over the span (exact: each thread counts in a stripe of
    /// its own). Off (0) by default.
    #[arg(long, value_name = "N", default_value_t = 0)]
    thread_rows: usize,
}

/// Raises the soft limit on descriptors to the hard one (connections wait
/// in descriptors of their own); returns the limit in force.
fn raise_descriptor_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is valid for writes; setrlimit only reads it.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        if r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: r.rlim_max,
                ..r
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                r = raised;
            }
        }
    }
    r.rlim_cur
}

/// Queues a switch request and says how it went, in one line, on its
/// connection (non-blocking: a requester that does not read loses it).
fn answer(table: &mut Table, req: &registry::SwitchRequest, conn: std::os::fd::OwnedFd) {
    let line = match table.switch(req) {
        Ok(s) => format!("ok: {s}\n"),
        Err(e) => format!("error: {e}\n"),
    };
    let mut f = std::fs::File::from(conn);
    let _ = std::io::Write::write_all(&mut f, line.as_bytes());
}

/// Follows `reg` if the table takes it, saying why not (rate-limited).
fn admit(table: &mut Table, reg: Registered, log: &mut Limiter) {
    let (pid, uid) = (reg.pid, reg.uid);
    let now = Instant::now();
    match table.admit(reg) {
        Ok(a) if a.replaced => log.log(Some(uid), Kind::Replaced, now, || {
            format!(
                "rtprofd: pid {pid} (uid {uid}): more than {} registrations of one pid; the oldest is dropped",
                table::PER_PID
            )
        }),
        Ok(_) => {}
        Err(r) => {
            let kind = match r {
                RegistrationRefusal::Segment(_) => Kind::Segment,
                RegistrationRefusal::UserCap { .. } | RegistrationRefusal::Full { .. } => Kind::Cap,
            };
            log.log(Some(uid), kind, now, || {
                format!("rtprofd: pid {pid} (uid {uid}): {r}")
            });
        }
    }
}

fn main() -> std::process::ExitCode {
    let a = Args::parse();
    // Every tick builds tables of about the same size: keep freed memory
    // rather than giving it back to the kernel and faulting it in again.
    // SAFETY: tuning malloc before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
    let tick = Duration::from_millis(a.tick.max(50));
    let span_ns = a.span.max(a.tick) * 1_000_000;
    // Followed segments hold no descriptor; waiting connections do, and a
    // few are needed besides (the present file, /proc while discovering).
    let fds = raise_descriptor_limit();
    let waiting_total = WAITING_TOTAL.min((fds.saturating_sub(32) / 2) as usize);
    if let Some(dir) = a.socket.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let listener = match registry::listen(&a.socket) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("rtprofd: cannot listen at {}: {e}", a.socket.display());
            return std::process::ExitCode::from(1);
        }
    };
    let (_map, mut writer) =
        match present_file::create(&a.present, a.group.as_deref(), a.buffer_mib, a.tick) {
            Ok(x) => x,
            Err(e) => {
                eprintln!("rtprofd: cannot create {}: {e}", a.present.display());
                return std::process::ExitCode::from(1);
            }
        };
    eprintln!(
        "rtprofd: listening at {}, publishing {} every {} ms over {} ms",
        a.socket.display(),
        a.present.display(),
        tick.as_millis(),
        span_ns / 1_000_000
    );
    let mut log = Limiter::to_stderr(LOG_LINES, Duration::from_secs(a.log_interval.max(1)));
    let mut table = Table::new(table::Caps {
        per_user: a.max_segments_per_user,
        total: a.max_segments,
    });
    table.set_thread_rows(a.thread_rows);
    // Said once: thread rows did not fit the buffer.
    let mut warned_threads = false;
    let mut acceptor = Acceptor::new(
        listener,
        accept::Limits {
            per_user: WAITING_PER_USER,
            total: waiting_total,
            deadline: WAITING_DEADLINE,
        },
    );
    // Agents that started before us (root only: others' map_files are closed).
    for reg in registry::discover(&a.socket) {
        admit(&mut table, reg, &mut log);
    }
    if table.len() > 0 {
        eprintln!("rtprofd: found {} running agent(s)", table.len());
    }
    let token = match a.metrics {
        Some(_) if !a.metrics_public => match token::load_or_create(&a.metrics_token_file) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("rtprofd: metrics token: {e}");
                return std::process::ExitCode::from(1);
            }
        },
        _ => None,
    };
    let mut metrics = match a.metrics.map(|addr| {
        (
            addr,
            metrics::Metrics::serve(addr, token.clone(), a.metrics_top, a.metrics_per_process),
        )
    }) {
        None => None,
        Some((addr, Ok(m))) => {
            match &token {
                Some(_) => eprintln!(
                    "rtprofd: serving http://{addr}/metrics to holders of the token in {}",
                    a.metrics_token_file.display()
                ),
                None => {
                    eprintln!("rtprofd: serving http://{addr}/metrics to anyone (--metrics-public)")
                }
            }
            Some(m)
        }
        Some((addr, Err(e))) => {
            eprintln!("rtprofd: cannot serve metrics at {addr}: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    let mut outcomes = Vec::new();
    let mut due = Instant::now();
    loop {
        // Registrations until the tick is due: the acceptor never blocks
        // past it, whatever connections do.
        loop {
            acceptor.wait(due, &mut outcomes);
            let now = Instant::now();
            for o in outcomes.drain(..) {
                match o {
                    Outcome::Registered(reg) => admit(&mut table, reg, &mut log),
                    Outcome::Switch(req, conn) => answer(&mut table, &req, conn),
                    Outcome::Closed { peer, why } => {
                        log.log(Some(peer.uid), Kind::Connection, now, || {
                            format!("rtprofd: pid {} (uid {}): {why}", peer.pid, peer.uid)
                        })
                    }
                    Outcome::Starved(e) => log.log(None, Kind::Cap, now, || {
                        format!("rtprofd: cannot accept connections: {e}")
                    }),
                }
            }
            if now >= due {
                break;
            }
        }
        let (now, started) = (now_ns(), Instant::now());
        table.observe(now, span_ns, &mut log);
        // Rows carry ids; the table's slots name them. Thread rows are the
        // first to go when the buffer cannot hold everything.
        let mut tables = table.tables();
        let mut published = writer.publish_rows(now, span_ns, &tables, table.slots());
        if matches!(published, Err(PresentError::TooLarge { .. }))
            && tables.iter().any(|t| !t.threads.is_empty())
        {
            if !warned_threads {
                eprintln!(
                    "rtprofd: the buffer cannot hold every thread's rows; published without them (--buffer-mib)"
                );
                warned_threads = true;
            }
            tables.iter_mut().for_each(|t| t.threads = &[]);
            published = writer.publish_rows(now, span_ns, &tables, table.slots());
        }
        if let Err(e) = published {
            eprintln!("rtprofd: cannot publish: {e}");
            if let Some(m) = &metrics {
                m.publish_failed();
            }
        }
        if let Some(m) = &mut metrics {
            m.tick(now, &table, started);
        }
        // Ended processes were published once more, with their last counts.
        table.drop_ended();
        log.flush(Instant::now());
        // The next tick a period after this one was due; at once if late,
        // but never several at once to catch up.
        due = (due + tick).max(Instant::now());
    }
}
