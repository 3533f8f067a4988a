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
mod routes;
mod slots;
mod spans;
mod table;
mod thread_spans;
mod token;

use accept::{Acceptor, Outcome};
use clap::Parser;
use log::{Kind, Limiter};
use registry::Registered;
use rtprof_abi::present::{now_ns, PresentError, PresentWriter};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::ExitCode;
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
    /// MiB the segments of one user may have read each tick, counted in
    /// the pages of them those reads touch (all of which must have memory
    /// already); a segment beyond it is refused.
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    read_mib_per_user: u64,
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

/// Every tick builds tables of about the same size: malloc keeps freed
/// memory rather than giving it back to the kernel and faulting it in
/// again. Called first, before any other thread exists.
fn keep_freed_memory() {
    // SAFETY: tuning malloc before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

/// The tick (at least 50 ms) and the span in ns (at least the tick asked
/// for) of the arguments.
fn timing(a: &Args) -> (Duration, u64) {
    let tick = Duration::from_millis(a.tick.max(50));
    let span_ns = a.span.max(a.tick) * 1_000_000;
    (tick, span_ns)
}

/// Connections that may wait in all with `fds` descriptors: followed
/// segments hold no descriptor; waiting connections do, and a few are
/// needed besides (the present file, /proc while discovering).
fn waiting_total(fds: u64) -> usize {
    WAITING_TOTAL.min((fds.saturating_sub(32) / 2) as usize)
}

/// Opens the socket agents register at and creates the presentation
/// segment (its mapping must outlive the writer); says why not, and the
/// exit code, if either cannot be.
fn open_endpoints(a: &Args) -> Result<(UnixListener, memmap2::MmapMut, PresentWriter), ExitCode> {
    if let Some(dir) = a.socket.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let listener = match registry::listen(&a.socket) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("rtprofd: cannot listen at {}: {e}", a.socket.display());
            return Err(ExitCode::from(1));
        }
    };
    match present_file::create(&a.present, a.group.as_deref(), a.buffer_mib, a.tick) {
        Ok((map, writer)) => Ok((listener, map, writer)),
        Err(e) => {
            eprintln!("rtprofd: cannot create {}: {e}", a.present.display());
            Err(ExitCode::from(1))
        }
    }
}

/// The bearer token `/metrics` asks for: none without `--metrics` or
/// with `--metrics-public`; says why not, and the exit code, if it
/// cannot be read or made.
fn metrics_token(a: &Args) -> Result<Option<Vec<u8>>, ExitCode> {
    match a.metrics {
        Some(_) if !a.metrics_public => match token::load_or_create(&a.metrics_token_file) {
            Ok(t) => Ok(Some(t)),
            Err(e) => {
                eprintln!("rtprofd: metrics token: {e}");
                Err(ExitCode::from(1))
            }
        },
        _ => Ok(None),
    }
}

/// Serves `/metrics` if `--metrics` asks for it, saying to whom; says
/// why not, and the exit code, if it cannot.
fn start_metrics(a: &Args) -> Result<Option<metrics::Metrics>, ExitCode> {
    let token = metrics_token(a)?;
    let Some(addr) = a.metrics else {
        return Ok(None);
    };
    match metrics::Metrics::serve(addr, token.clone(), a.metrics_top, a.metrics_per_process) {
        Ok(m) => {
            match &token {
                Some(_) => eprintln!(
                    "rtprofd: serving http://{addr}/metrics to holders of the token in {}",
                    a.metrics_token_file.display()
                ),
                None => {
                    eprintln!("rtprofd: serving http://{addr}/metrics to anyone (--metrics-public)")
                }
            }
            Ok(Some(m))
        }
        Err(e) => {
            eprintln!("rtprofd: cannot serve metrics at {addr}: {e}");
            Err(ExitCode::from(1))
        }
    }
}

/// What the daemon keeps from one tick to the next.
struct Daemon {
    table: Table,
    acceptor: Acceptor,
    log: Limiter,
    writer: PresentWriter,
    metrics: Option<metrics::Metrics>,
    span_ns: u64,
    /// Said once: thread rows did not fit the buffer.
    warned_threads: bool,
    /// Route requests waiting for their agents.
    routes: routes::Routes,
}

impl Daemon {
    /// Follows the agents that register at `listener` (at most
    /// `waiting_total` connections waiting) and those already running,
    /// publishing spans of `span_ns` through `writer`.
    fn new(
        a: &Args,
        listener: UnixListener,
        writer: PresentWriter,
        waiting_total: usize,
        span_ns: u64,
    ) -> Daemon {
        let mut log = Limiter::to_stderr(LOG_LINES, Duration::from_secs(a.log_interval.max(1)));
        let mut table = Table::new(table::Caps {
            per_user: a.max_segments_per_user,
            total: a.max_segments,
            read_per_user: a.read_mib_per_user << 20,
        });
        table.set_thread_rows(a.thread_rows);
        let acceptor = Acceptor::new(
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
        Daemon {
            table,
            acceptor,
            log,
            writer,
            metrics: None,
            span_ns,
            warned_threads: false,
            routes: routes::Routes::default(),
        }
    }

    /// A tick every `tick`, taking registrations in between; never ends.
    fn run(mut self, tick: Duration) -> ! {
        let mut outcomes = Vec::new();
        let mut due = Instant::now();
        loop {
            self.accept_until(due, &mut outcomes);
            self.tick();
            // The next tick a period after this one was due; at once if
            // late, but never several at once to catch up.
            due = (due + tick).max(Instant::now());
        }
    }

    /// Registrations and switch requests until `due` (through
    /// `outcomes`): the acceptor never blocks past it, whatever
    /// connections do.
    fn accept_until(&mut self, due: Instant, outcomes: &mut Vec<Outcome>) {
        loop {
            // Waiting routes are answered as soon as their agents have.
            let until = match self.routes.any() {
                true => due.min(Instant::now() + routes::POLL),
                false => due,
            };
            self.acceptor.wait(until, outcomes);
            let now = Instant::now();
            for o in outcomes.drain(..) {
                match o {
                    Outcome::Registered(reg) => admit(&mut self.table, reg, &mut self.log),
                    Outcome::Switch(req, conn) => answer(&mut self.table, &req, conn),
                    Outcome::Route(req, conn) => self.routes.ask(&mut self.table, req, conn, now),
                    Outcome::Closed { peer, why } => {
                        self.log.log(Some(peer.uid), Kind::Connection, now, || {
                            format!("rtprofd: pid {} (uid {}): {why}", peer.pid, peer.uid)
                        })
                    }
                    Outcome::Starved(e) => self.log.log(None, Kind::Cap, now, || {
                        format!("rtprofd: cannot accept connections: {e}")
                    }),
                }
            }
            self.routes.poll(&mut self.table, now);
            if now >= due {
                break;
            }
        }
    }

    /// Reads every followed process, publishes the span's rows and the
    /// metrics, then lets the ended processes go.
    fn tick(&mut self) {
        let (now, started) = (now_ns(), Instant::now());
        self.table.observe(now, self.span_ns, &mut self.log);
        self.publish(now);
        if let Some(m) = &mut self.metrics {
            m.tick(now, &self.table, started);
        }
        // Ended processes were published once more, with their last counts.
        self.table.drop_ended();
        self.log.flush(Instant::now());
    }

    /// Publishes the rows of the span ending at `now` (ns). Rows carry
    /// ids; the table's slots name them. Thread rows are the first to go
    /// when the buffer cannot hold everything.
    fn publish(&mut self, now: u64) {
        let span_ns = self.span_ns;
        let mut tables = self.table.tables();
        let mut published = self
            .writer
            .publish_rows(now, span_ns, &tables, self.table.slots());
        if matches!(published, Err(PresentError::TooLarge { .. }))
            && tables.iter().any(|t| !t.threads.is_empty())
        {
            if !self.warned_threads {
                eprintln!(
                    "rtprofd: the buffer cannot hold every thread's rows; published without them (--buffer-mib)"
                );
                self.warned_threads = true;
            }
            tables.iter_mut().for_each(|t| t.threads = &[]);
            published = self
                .writer
                .publish_rows(now, span_ns, &tables, self.table.slots());
        }
        if let Err(e) = published {
            eprintln!("rtprofd: cannot publish: {e}");
            if let Some(m) = &self.metrics {
                m.publish_failed();
            }
        }
    }
}

fn main() -> ExitCode {
    let a = Args::parse();
    keep_freed_memory();
    let (tick, span_ns) = timing(&a);
    let fds = raise_descriptor_limit();
    let (listener, _map, writer) = match open_endpoints(&a) {
        Ok(x) => x,
        Err(code) => return code,
    };
    eprintln!(
        "rtprofd: listening at {}, publishing {} every {} ms over {} ms",
        a.socket.display(),
        a.present.display(),
        tick.as_millis(),
        span_ns / 1_000_000
    );
    let mut daemon = Daemon::new(&a, listener, writer, waiting_total(fds), span_ns);
    daemon.metrics = match start_metrics(&a) {
        Ok(m) => m,
        Err(code) => return code,
    };
    daemon.run(tick)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("rtprofd").chain(line.iter().copied())).unwrap()
    }

    /// The tick is never under 50 ms; the span never under the tick asked
    /// for (not the tick in force).
    #[test]
    fn the_tick_has_a_floor_and_the_span_covers_the_tick_asked_for() {
        let t = |line: &[&str]| timing(&args(line));
        assert_eq!(t(&[]), (Duration::from_millis(1000), 5_000_000_000));
        assert_eq!(
            t(&["--tick", "10", "--span", "5"]),
            (Duration::from_millis(50), 10_000_000)
        );
        assert_eq!(
            t(&["--tick", "2000", "--span", "1000"]),
            (Duration::from_millis(2000), 2_000_000_000)
        );
    }

    /// Waiting connections get half the descriptors beyond a reserve, up
    /// to the cap.
    #[test]
    fn waiting_connections_leave_descriptors_to_spare() {
        assert_eq!(waiting_total(1024), WAITING_TOTAL);
        assert_eq!(waiting_total(100), 34);
        assert_eq!(waiting_total(10), 0);
    }

    /// No token is read or made unless metrics are served to its holders.
    #[test]
    fn a_token_only_for_metrics_that_are_not_public() {
        // A directory: refused as a token, without anything written.
        let file = "/";
        let none = |line: &[&str]| {
            let a = args(&[line, &["--metrics-token-file", file]].concat());
            matches!(metrics_token(&a), Ok(None))
        };
        assert!(none(&[]));
        assert!(none(&["--metrics", "127.0.0.1:0", "--metrics-public"]));
        assert!(!none(&["--metrics", "127.0.0.1:0"]));
    }
}
