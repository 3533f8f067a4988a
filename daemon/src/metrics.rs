//! Prometheus exposition (`--metrics`). Every tick adds what each process
//! did since the last tick to running totals per (executable, function,
//! module): a process that ends has added its last counts, one that starts
//! adds from zero, so a total never goes down whatever comes and goes. Of
//! each executable only the functions hottest over the last span in which
//! it ran are exposed, so the series stay few. The tick encodes the text
//! and swaps it in; the HTTP thread only ever takes the newest text, so a
//! slow scraper cannot stall the tick.

use crate::table::Table;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Running totals of one function.
#[derive(Default, Clone, Copy, Debug, PartialEq)]
pub struct Totals {
    pub calls: u64,
    pub cpu_ns: u64,
}

/// One executable's functions, keyed `function \0 module`.
#[derive(Default)]
struct Exe {
    totals: HashMap<String, Totals>,
    /// The keys exposed, hottest first.
    exposed: Vec<String>,
}

/// Running totals of every function, and which are exposed.
pub struct Accumulator {
    top: usize,
    exes: HashMap<String, Exe>,
    /// This tick's span sums by executable, for ranking: (CPU ns, calls).
    span: HashMap<String, HashMap<String, (u64, u64)>>,
    key: String,
}

fn key_into(buf: &mut String, function: &str, module: &str) {
    buf.clear();
    buf.push_str(function);
    buf.push('\0');
    buf.push_str(module);
}

fn split_key(key: &str) -> (&str, &str) {
    key.split_once('\0').unwrap_or((key, ""))
}

impl Accumulator {
    pub fn new(top: usize) -> Accumulator {
        Accumulator {
            top,
            exes: HashMap::new(),
            span: HashMap::new(),
            key: String::new(),
        }
    }

    /// Adds one tick's change of one function of a process of `exe`.
    pub fn add(&mut self, exe: &str, function: &str, module: &str, calls: u64, cpu_ns: u64) {
        key_into(&mut self.key, function, module);
        let e = match self.exes.get_mut(exe) {
            Some(e) => e,
            None => self.exes.entry(exe.to_string()).or_default(),
        };
        let t = match e.totals.get_mut(self.key.as_str()) {
            Some(t) => t,
            None => e.totals.entry(self.key.clone()).or_default(),
        };
        t.calls = t.calls.saturating_add(calls);
        t.cpu_ns = t.cpu_ns.saturating_add(cpu_ns);
    }

    /// Counts one function's span sums of a process of `exe` towards this
    /// tick's ranking.
    pub fn rank(&mut self, exe: &str, function: &str, module: &str, calls: u64, cpu_ns: u64) {
        key_into(&mut self.key, function, module);
        let r = self
            .span
            .entry(exe.to_string())
            .or_default()
            .entry(self.key.clone())
            .or_default();
        r.0 += cpu_ns;
        r.1 += calls;
    }

    /// Exposes, of each executable that did anything over the span, its
    /// hottest functions; the others keep what they exposed last (their
    /// totals no longer move).
    pub fn finish(&mut self) {
        for (exe, span) in self.span.drain() {
            let mut ranked: Vec<(String, (u64, u64))> = span.into_iter().collect();
            ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            ranked.truncate(self.top);
            let e = self.exes.entry(exe).or_default();
            e.exposed = ranked
                .into_iter()
                .map(|(k, _)| k)
                .filter(|k| e.totals.contains_key(k))
                .collect();
        }
    }

    /// The exposed functions: (executable, function, module, totals).
    pub fn exposed(&self) -> impl Iterator<Item = (&str, &str, &str, Totals)> {
        self.exes.iter().flat_map(|(exe, e)| {
            e.exposed.iter().map(move |k| {
                let (function, module) = split_key(k);
                (exe.as_str(), function, module, e.totals[k])
            })
        })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FunctionLabels {
    executable: String,
    function: String,
    module: String,
}

/// The daemon's own health, kept across ticks.
struct Health {
    tick: Histogram,
    followed: Gauge,
    rejected: Counter,
    publish_failures: Counter,
}

impl Health {
    fn new() -> Health {
        Health {
            // 100 µs to 6.5 s.
            tick: Histogram::new(exponential_buckets(0.0001, 4.0, 9)),
            followed: Gauge::default(),
            rejected: Counter::default(),
            publish_failures: Counter::default(),
        }
    }
}

/// The newest exposition text, shared with the HTTP thread.
type Shared = Arc<Mutex<Arc<String>>>;

pub struct Metrics {
    acc: Accumulator,
    health: Health,
    text: Shared,
}

/// How long the HTTP thread waits for a request before looking again.
const POLL: Duration = Duration::from_secs(1);
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

impl Metrics {
    /// Listens at `addr` and serves `GET /metrics` from its own thread.
    pub fn serve(addr: SocketAddr, top: usize) -> Result<Metrics, String> {
        let server = tiny_http::Server::http(addr).map_err(|e| e.to_string())?;
        let text: Shared = Arc::new(Mutex::new(Arc::new(String::from("# EOF\n"))));
        let shared = text.clone();
        std::thread::Builder::new()
            .name("rtprofd-metrics".into())
            .spawn(move || handle(&server, &shared))
            .map_err(|e| e.to_string())?;
        Ok(Metrics {
            acc: Accumulator::new(top),
            health: Health::new(),
            text,
        })
    }

    pub fn publish_failed(&self) {
        self.health.publish_failures.inc();
    }

    /// Adds the tick at `now_ns` of every followed process, and publishes
    /// the text; `started` is when the tick began.
    pub fn tick(&mut self, now_ns: u64, table: &Table, started: Instant) {
        let mut followed = 0;
        for t in table.tracked() {
            followed += !t.ended as i64;
            let acc = &mut self.acc;
            let slots = table.slots();
            t.each_change(now_ns, slots, |f, m, calls, ns| {
                acc.add(&t.exe, f, m, calls, ns)
            });
            t.each_in_span(slots, |f, m, calls, ns| acc.rank(&t.exe, f, m, calls, ns));
        }
        self.acc.finish();
        let h = &self.health;
        h.followed.set(followed);
        h.rejected
            .inc_by(table.rejected.saturating_sub(h.rejected.get()));
        h.tick.observe(started.elapsed().as_secs_f64());
        let text = Arc::new(self.encode());
        *self.text.lock().unwrap_or_else(|e| e.into_inner()) = text;
    }

    fn encode(&self) -> String {
        let calls = Family::<FunctionLabels, Counter>::default();
        let cpu = Family::<FunctionLabels, Counter<f64, AtomicU64>>::default();
        for (exe, function, module, t) in self.acc.exposed() {
            let labels = FunctionLabels {
                executable: exe.to_string(),
                function: function.to_string(),
                module: module.to_string(),
            };
            calls.get_or_create(&labels).inc_by(t.calls);
            cpu.get_or_create(&labels).inc_by(t.cpu_ns as f64 / 1e9);
        }
        let mut r = Registry::default();
        r.register(
            "rtprof_function_calls",
            "Calls counted in the function, over every process of the executable",
            calls,
        );
        r.register_with_unit(
            "rtprof_function_cpu",
            "CPU time sampled in the function, over every process of the executable",
            Unit::Seconds,
            cpu,
        );
        let h = &self.health;
        r.register_with_unit(
            "rtprofd_tick_duration",
            "Time a tick took to read every segment and publish",
            Unit::Seconds,
            h.tick.clone(),
        );
        r.register(
            "rtprofd_processes_followed",
            "Processes whose segments are followed",
            h.followed.clone(),
        );
        r.register(
            "rtprofd_segments_rejected",
            "Segments refused or dropped as unreadable or not their sender's",
            h.rejected.clone(),
        );
        r.register(
            "rtprofd_publish_failures",
            "Ticks whose presentation segment could not be published",
            h.publish_failures.clone(),
        );
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut s, &r);
        s
    }
}

/// Serves requests one at a time: `GET /metrics` gets the newest text,
/// anything else 404.
fn handle(server: &tiny_http::Server, text: &Shared) {
    loop {
        let req = match server.recv_timeout(POLL) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(_) => return,
        };
        let path = req.url().split('?').next().unwrap_or("");
        if *req.method() != tiny_http::Method::Get || path != "/metrics" {
            let _ = req.respond(tiny_http::Response::empty(404));
            continue;
        }
        let body = text.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let header =
            tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE).expect("a valid header");
        let _ = req.respond(tiny_http::Response::from_data(body.as_bytes()).with_header(header));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXE: &str = "/bin/app";

    /// (calls, CPU ns) of an exposed function.
    fn totals(acc: &Accumulator, function: &str) -> Option<(u64, u64)> {
        acc.exposed()
            .find(|&(e, f, _, _)| e == EXE && f == function)
            .map(|x| (x.3.calls, x.3.cpu_ns))
    }

    /// One tick of a process: its change, and its span sums.
    fn tick(acc: &mut Accumulator, procs: &[(u64, u64, u64, u64)]) {
        for &(calls, ns, span_calls, span_ns) in procs {
            if calls | ns != 0 {
                acc.add(EXE, "hot", "app", calls, ns);
            }
            if span_calls | span_ns != 0 {
                acc.rank(EXE, "hot", "app", span_calls, span_ns);
            }
        }
        acc.finish();
    }

    #[test]
    fn totals_never_go_down_as_processes_end_and_restart() {
        let mut acc = Accumulator::new(5);
        // Two processes of one executable.
        tick(&mut acc, &[(100, 10, 100, 10), (50, 5, 50, 5)]);
        assert_eq!(totals(&acc, "hot"), Some((150, 15)));
        // The second ends: its last change counts once; its span goes.
        tick(&mut acc, &[(100, 10, 200, 20), (20, 2, 70, 7)]);
        tick(&mut acc, &[(100, 10, 300, 30)]);
        assert_eq!(totals(&acc, "hot").unwrap().0, 370);
        // It restarts (a new process counting from zero) while the first
        // ends: nothing is subtracted.
        tick(&mut acc, &[(0, 0, 300, 30), (5, 1, 5, 1)]);
        assert_eq!(totals(&acc, "hot"), Some((375, 38)));
        // Nothing runs: the last totals stay exposed.
        tick(&mut acc, &[]);
        assert_eq!(totals(&acc, "hot").unwrap().0, 375);
    }

    #[test]
    fn only_the_hottest_are_exposed_and_keep_counting() {
        let mut acc = Accumulator::new(2);
        for (f, ns) in [("a", 30), ("b", 20), ("c", 10)] {
            acc.add(EXE, f, "app", 1, ns);
            acc.rank(EXE, f, "app", 1, ns);
        }
        acc.finish();
        let mut names: Vec<&str> = acc.exposed().map(|x| x.1).collect();
        names.sort_unstable();
        assert_eq!(names, ["a", "b"]);
        // `c` was counted while hidden: when it shows, it has all of it.
        acc.add(EXE, "c", "app", 1, 100);
        acc.rank(EXE, "c", "app", 1, 100);
        acc.finish();
        assert_eq!(totals(&acc, "c"), Some((2, 110)));
        assert!(totals(&acc, "a").is_none());
    }

    #[test]
    fn the_text_escapes_names() {
        let mut acc = Accumulator::new(2);
        acc.add(EXE, "f<\"x\\y\">", "app", 3, 2_000_000_000);
        acc.rank(EXE, "f<\"x\\y\">", "app", 3, 2_000_000_000);
        acc.finish();
        let m = Metrics {
            acc,
            health: Health::new(),
            text: Arc::default(),
        };
        let s = m.encode();
        let labels = r#"{executable="/bin/app",function="f<\"x\\y\">",module="app"}"#;
        assert!(
            s.contains(&format!("rtprof_function_calls_total{labels} 3\n")),
            "{s}"
        );
        assert!(
            s.contains(&format!("rtprof_function_cpu_seconds_total{labels} 2.0\n")),
            "{s}"
        );
        assert!(s.ends_with("# EOF\n"), "{s}");
    }
}
