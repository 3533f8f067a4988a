//! Prometheus exposition (`--metrics`). Every tick adds what each process
//! did since the last tick to running totals per (executable, function,
//! module): a process that ends has added its last counts, one that starts
//! adds from zero, so a total never goes down whatever comes and goes. Of
//! each executable only the functions hottest over the last span in which
//! it ran are exposed, so the series stay few. The tick swaps in what is
//! to be exposed (names shared, not copied); the HTTP thread encodes it
//! when a scrape comes, so ticks pay no encoding and a slow scraper cannot
//! stall them.

use crate::http;
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
use std::time::Instant;

/// Running totals of one function.
#[derive(Default, Clone, Copy, Debug, PartialEq)]
pub struct Totals {
    pub calls: u64,
    pub cpu_ns: u64,
}

/// One (executable, function, module): its running totals, and its sums
/// over this tick's span (for ranking).
struct Entry {
    exe: u32,
    function: Arc<str>,
    module: Arc<str>,
    totals: Totals,
    span: (u64, u64),
}

/// One executable: its entries by `function \0 module`, those with span
/// sums this tick, and those exposed (hottest first).
#[derive(Default)]
struct Exe {
    name: Arc<str>,
    entries: HashMap<String, u32>,
    ranked: Vec<u32>,
    exposed: Vec<u32>,
}

/// Running totals of every function, and which are exposed.
pub struct Accumulator {
    top: usize,
    entries: Vec<Entry>,
    exes: Vec<Exe>,
    exe_index: HashMap<Box<str>, u32>,
    /// The entry of each daemon row id (tagged with the id's generation,
    /// so a reused id is looked up again): a tick's hundred thousand
    /// changes cost no string hashing.
    by_id: Vec<(u32, u32)>,
    key: String,
}

impl Accumulator {
    pub fn new(top: usize) -> Accumulator {
        Accumulator {
            top,
            entries: Vec::new(),
            exes: Vec::new(),
            exe_index: HashMap::new(),
            by_id: Vec::new(),
            key: String::new(),
        }
    }

    /// The entry of (`exe`, `function`, `module`), made on first sight.
    fn entry(&mut self, exe: &str, function: &str, module: &str) -> u32 {
        let x = match self.exe_index.get(exe) {
            Some(&x) => x,
            None => {
                let x = self.exes.len() as u32;
                self.exes.push(Exe {
                    name: exe.into(),
                    ..Exe::default()
                });
                self.exe_index.insert(exe.into(), x);
                x
            }
        };
        self.key.clear();
        self.key.push_str(function);
        self.key.push('\0');
        self.key.push_str(module);
        let e = &mut self.exes[x as usize];
        if let Some(&i) = e.entries.get(self.key.as_str()) {
            return i;
        }
        let i = self.entries.len() as u32;
        e.entries.insert(self.key.clone(), i);
        self.entries.push(Entry {
            exe: x,
            function: function.into(),
            module: module.into(),
            totals: Totals::default(),
            span: (0, 0),
        });
        i
    }

    /// The entry of daemon row `id` (generation `gen`), whose names are
    /// `exe`, `function`, `module`. Functions of one name in two modules
    /// of an executable share a row id, and so an entry (the first
    /// module's), as they share the presentation's global row.
    fn entry_of_id(&mut self, id: u32, gen: u32, exe: &str, function: &str, module: &str) -> u32 {
        if let Some(&(g, i)) = self.by_id.get(id as usize) {
            if g == gen {
                return i;
            }
        }
        let i = self.entry(exe, function, module);
        if self.by_id.len() <= id as usize {
            self.by_id.resize(id as usize + 1, (u32::MAX, 0));
        }
        self.by_id[id as usize] = (gen, i);
        i
    }

    fn add_at(&mut self, i: u32, calls: u64, cpu_ns: u64) {
        let t = &mut self.entries[i as usize].totals;
        t.calls = t.calls.saturating_add(calls);
        t.cpu_ns = t.cpu_ns.saturating_add(cpu_ns);
    }

    fn rank_at(&mut self, i: u32, calls: u64, cpu_ns: u64) {
        let e = &mut self.entries[i as usize];
        if e.span == (0, 0) {
            self.exes[e.exe as usize].ranked.push(i);
        }
        e.span.0 = e.span.0.saturating_add(cpu_ns);
        e.span.1 = e.span.1.saturating_add(calls);
    }

    /// Adds one tick's change of one function of a process of `exe`.
    #[cfg(test)]
    pub fn add(&mut self, exe: &str, function: &str, module: &str, calls: u64, cpu_ns: u64) {
        let i = self.entry(exe, function, module);
        self.add_at(i, calls, cpu_ns);
    }

    /// Counts one function's span sums of a process of `exe` towards this
    /// tick's ranking.
    #[cfg(test)]
    pub fn rank(&mut self, exe: &str, function: &str, module: &str, calls: u64, cpu_ns: u64) {
        let i = self.entry(exe, function, module);
        self.rank_at(i, calls, cpu_ns);
    }

    /// Exposes, of each executable that did anything over the span, its
    /// hottest functions; the others keep what they exposed last (their
    /// totals no longer move).
    pub fn finish(&mut self) {
        let entries = &mut self.entries;
        for e in self.exes.iter_mut().filter(|e| !e.ranked.is_empty()) {
            // Hottest first, ties by name; only the first `top` sorted.
            let order = |a: &u32, b: &u32| {
                let (x, y) = (&entries[*a as usize], &entries[*b as usize]);
                y.span
                    .cmp(&x.span)
                    .then_with(|| x.function.cmp(&y.function))
            };
            if e.ranked.len() > self.top && self.top > 0 {
                e.ranked.select_nth_unstable_by(self.top - 1, order);
                e.ranked[..self.top].sort_unstable_by(order);
            } else {
                e.ranked.sort_unstable_by(order);
            }
            e.exposed.clear();
            e.exposed.extend(e.ranked.iter().take(self.top).copied());
            for i in e.ranked.drain(..) {
                entries[i as usize].span = (0, 0);
            }
        }
    }

    /// Entry `i`: (executable, function, module, totals).
    fn series(&self, i: u32) -> Series {
        let e = &self.entries[i as usize];
        let exe = &self.exes[e.exe as usize].name;
        (exe.clone(), e.function.clone(), e.module.clone(), e.totals)
    }

    /// The exposed functions: (executable, function, module, totals).
    pub fn exposed(&self) -> impl Iterator<Item = Series> + '_ {
        self.exes
            .iter()
            .flat_map(move |x| x.exposed.iter().map(move |&i| self.series(i)))
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FunctionLabels {
    executable: String,
    function: String,
    module: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProcessLabels {
    pid: u32,
    executable: String,
    function: String,
    module: String,
}

/// (executable, function, module, totals).
pub type Series = (Arc<str>, Arc<str>, Arc<str>, Totals);

/// What a scrape exposes, swapped in whole by every tick: the functions
/// of the executables, and with `--metrics-per-process` those of each live
/// process (pid, and its totals since it started).
#[derive(Default)]
struct Exposition {
    series: Vec<Series>,
    per_process: bool,
    processes: Vec<(u32, Series)>,
    /// Live processes' offered functions and implementations: (labels,
    /// whether it runs the function's calls now).
    routes: Vec<(RouteLabels, bool)>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    pid: u32,
    executable: String,
    function: String,
    implementation: String,
}

/// The daemon's own health, kept across ticks (clones share the values).
#[derive(Clone)]
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

pub struct Metrics {
    acc: Accumulator,
    health: Health,
    shown: Arc<Mutex<Arc<Exposition>>>,
    /// Functions exposed per live process (`--metrics-per-process`), 0:
    /// no per-process series.
    per_process: usize,
}

impl Metrics {
    /// Listens at `addr` and serves `GET /metrics` from its own thread.
    /// Only requests with `token` are served, if there is one.
    pub fn serve(
        addr: SocketAddr,
        token: Option<Vec<u8>>,
        top: usize,
        per_process: usize,
    ) -> Result<Metrics, String> {
        let listener = std::net::TcpListener::bind(addr).map_err(|e| e.to_string())?;
        let shown: Arc<Mutex<Arc<Exposition>>> = Arc::default();
        let health = Health::new();
        let (x, h) = (shown.clone(), health.clone());
        std::thread::Builder::new()
            .name("rtprofd-metrics".into())
            .spawn(move || {
                http::serve(listener, token, || {
                    // The newest exposition, encoded without the lock held.
                    let x = x.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    encode(&x, &h)
                })
            })
            .map_err(|e| e.to_string())?;
        Ok(Metrics {
            acc: Accumulator::new(top),
            health,
            shown,
            per_process,
        })
    }

    pub fn publish_failed(&self) {
        self.health.publish_failures.inc();
    }

    /// Adds the tick at `now_ns` of every followed process, and publishes
    /// the text; `started` is when the tick began.
    pub fn tick(&mut self, now_ns: u64, table: &Table, started: Instant) {
        let mut followed = 0;
        let mut x = Exposition {
            per_process: self.per_process > 0,
            ..Exposition::default()
        };
        for t in table.tracked() {
            if self.per_process > 0 && !t.ended {
                let (rows, acc, slots) = (&mut x.processes, &mut self.acc, table.slots());
                t.hottest_totals(slots, self.per_process, |id, f, m, calls, ns| {
                    let i = acc.entry_of_id(id, slots.generation(id), &t.exe, f, m);
                    let (exe, function, module, _) = acc.series(i);
                    let totals = Totals { calls, cpu_ns: ns };
                    rows.push((t.pid, (exe, function, module, totals)));
                });
            }
            if !t.ended {
                t.each_route(table.slots(), |function, implementation, active| {
                    let labels = RouteLabels {
                        pid: t.pid,
                        executable: t.exe.clone(),
                        function: function.to_string(),
                        implementation: implementation.to_string(),
                    };
                    x.routes.push((labels, active));
                });
            }
            followed += !t.ended as i64;
            let acc = &mut self.acc;
            let slots = table.slots();
            t.each_change(now_ns, slots, |id, f, m, calls, ns| {
                let i = acc.entry_of_id(id, slots.generation(id), &t.exe, f, m);
                acc.add_at(i, calls, ns)
            });
            t.each_in_span(slots, |id, f, m, calls, ns| {
                let i = acc.entry_of_id(id, slots.generation(id), &t.exe, f, m);
                acc.rank_at(i, calls, ns)
            });
        }
        self.acc.finish();
        let h = &self.health;
        h.followed.set(followed);
        h.rejected
            .inc_by(table.rejected.saturating_sub(h.rejected.get()));
        h.tick.observe(started.elapsed().as_secs_f64());
        x.series.extend(self.acc.exposed());
        *self.shown.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(x);
    }
}

/// The exposition text of `x` and the daemon's health.
fn encode(x: &Exposition, h: &Health) -> String {
    let calls = Family::<FunctionLabels, Counter>::default();
    let cpu = Family::<FunctionLabels, Counter<f64, AtomicU64>>::default();
    for (exe, function, module, t) in &x.series {
        let labels = FunctionLabels {
            executable: exe.to_string(),
            function: function.to_string(),
            module: module.to_string(),
        };
        calls.get_or_create(&labels).inc_by(t.calls);
        cpu.get_or_create(&labels).inc_by(t.cpu_ns as f64 / 1e9);
    }
    let mut r = Registry::default();
    if x.per_process {
        let calls = Family::<ProcessLabels, Counter>::default();
        let cpu = Family::<ProcessLabels, Counter<f64, AtomicU64>>::default();
        for (pid, (exe, function, module, t)) in &x.processes {
            let labels = ProcessLabels {
                pid: *pid,
                executable: exe.to_string(),
                function: function.to_string(),
                module: module.to_string(),
            };
            calls.get_or_create(&labels).inc_by(t.calls);
            cpu.get_or_create(&labels).inc_by(t.cpu_ns as f64 / 1e9);
        }
        r.register(
                "rtprof_process_function_calls",
                "Calls counted in the function since the process started (live processes, their hottest functions over the last span)",
                calls,
            );
        r.register_with_unit(
                "rtprof_process_function_cpu",
                "CPU time sampled in the function since the process started (live processes, their hottest functions over the last span)",
                Unit::Seconds,
                cpu,
            );
    }
    r.register(
        "rtprof_function_calls",
        "Calls counted in the function, over every process of the executable",
        calls,
    );
    let routes = Family::<RouteLabels, Gauge>::default();
    for (labels, active) in &x.routes {
        routes.get_or_create(labels).set(*active as i64);
    }
    r.register(
        "rtprof_route_active",
        "1 for the implementation that runs an offered function's calls now (original: its own code), 0 for the others offered (live processes)",
        routes,
    );
    r.register_with_unit(
        "rtprof_function_cpu",
        "CPU time sampled in the function, over every process of the executable",
        Unit::Seconds,
        cpu,
    );
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

#[cfg(test)]
mod tests {
    use super::*;

    const EXE: &str = "/bin/app";

    /// (calls, CPU ns) of an exposed function.
    fn totals(acc: &Accumulator, function: &str) -> Option<(u64, u64)> {
        acc.exposed()
            .find(|(e, f, _, _)| &**e == EXE && &**f == function)
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
        let mut names: Vec<String> = acc.exposed().map(|x| x.1.to_string()).collect();
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
        let main = acc.entry(EXE, "main", "app");
        let (exe, function, module, _) = acc.series(main);
        let totals = Totals {
            calls: 7,
            cpu_ns: 500_000_000,
        };
        let x = Exposition {
            series: acc.exposed().collect(),
            per_process: true,
            processes: vec![(42, (exe, function, module, totals))],
            routes: vec![(
                RouteLabels {
                    pid: 42,
                    executable: "/bin/app".into(),
                    function: "f".into(),
                    implementation: "fast".into(),
                },
                true,
            )],
        };
        let s = encode(&x, &Health::new());
        assert!(
            s.contains(
                "rtprof_route_active{pid=\"42\",executable=\"/bin/app\",function=\"f\",implementation=\"fast\"} 1\n"
            ),
            "{s}"
        );
        let labels = r#"{executable="/bin/app",function="f<\"x\\y\">",module="app"}"#;
        assert!(
            s.contains(&format!("rtprof_function_calls_total{labels} 3\n")),
            "{s}"
        );
        assert!(
            s.contains(&format!("rtprof_function_cpu_seconds_total{labels} 2.0\n")),
            "{s}"
        );
        let labels = r#"{pid="42",executable="/bin/app",function="main",module="app"}"#;
        assert!(
            s.contains(&format!("rtprof_process_function_calls_total{labels} 7\n")),
            "{s}"
        );
        assert!(
            s.contains(&format!(
                "rtprof_process_function_cpu_seconds_total{labels} 0.5\n"
            )),
            "{s}"
        );
        assert!(s.ends_with("# EOF\n"), "{s}");
    }
}
