//! Configuration from `RTPROF_*` environment variables (documented in docs/agent.md).

use std::ffi::OsString;

/// Which sampler `RTPROF_SAMPLER` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SamplerChoice {
    /// perf events, else CPU-time timers.
    Auto,
    Perf,
    Timer,
    Off,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Name globs of extra modules to instrument (the main executable always is).
    pub modules: Vec<String>,
    /// Instrument every eligible module.
    pub all_modules: bool,
    pub verbose: bool,
    /// Write a report here at exit (`%p` becomes the pid; `.json` selects JSON).
    pub report: Option<String>,
    /// `RTPROF_ALL_FUNCTIONS=1`: that report's JSON lists every function,
    /// called or not.
    pub all_functions: bool,
    /// Directory where `rtprof run` collects counter segments.
    pub run_dir: Option<String>,
    /// Threads that get a stripe of their own; later ones share stripe 0.
    pub max_threads: u32,
    /// Extra function slots reserved for modules loaded later.
    pub spare_functions: u32,
    pub disabled: bool,
    /// Samples per second of CPU time, per thread (0: no sampling).
    pub sample_hz: u32,
    pub sampler: SamplerChoice,
    /// Patch function entries (`RTPROF_INSTRUMENT=0`: sampling only).
    pub instrument: bool,
    /// Where rtprofd listens (empty: do not register).
    pub daemon_socket: String,
    /// `RTPROF_CACHE`: `off`, `user`, `system` or a directory (unset: the
    /// user's cache, then root's).
    pub cache: Option<String>,
    /// `RTPROF_WARM=1` (set by `rtprof cache warm`): fill the cache, then
    /// end the process before `main`.
    pub warm_only: bool,
    /// `RTPROF_COUNT`: name globs of the patched functions counted from
    /// the start (empty: all of them).
    pub count: Vec<String>,
    /// `RTPROF_NOCOUNT`: name globs of patched functions not counted from
    /// the start.
    pub nocount: Vec<String>,
    /// `RTPROF_BUDGET`: the share of CPU time, in percent, counting may
    /// cost before the hottest functions are counted in bursts (unset:
    /// exact counting whatever it costs).
    pub budget: Option<f64>,
    /// `RTPROF_STACKS=0`: samples without their call stacks.
    pub stacks: bool,
    /// `RTPROF_CALLERS=1`: every patched function's callers counted exactly.
    pub callers: bool,
    /// `RTPROF_DEBUG_DIR`: where separate debug files are looked for
    /// (colon-separated; default `/usr/lib/debug`).
    pub debug_dirs: Vec<std::path::PathBuf>,
    /// `RTPROF_EVENTS=page-faults,cycles:100000`: events sampled besides
    /// CPU time, each with its period if given.
    pub events: Vec<(String, Option<u64>)>,
    /// `RTPROF_TRAPS=1`: functions whose entry can take no jump get a
    /// trap instead (see `patch::traps`).
    pub traps: bool,
    /// `RTPROF_LOOPS`: name globs of functions whose loops are counted
    /// exactly (see `patch::loop_probes`).
    pub loops: Vec<String>,
    /// `RTPROF_IMAGES=0`: patched code is written in every process, never
    /// mapped from page images (see `patch::image`).
    pub images: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            modules: Vec::new(),
            all_modules: false,
            verbose: false,
            report: None,
            all_functions: false,
            run_dir: None,
            max_threads: 1024,
            spare_functions: 1 << 18,
            disabled: false,
            sample_hz: 1000,
            sampler: SamplerChoice::Auto,
            instrument: true,
            daemon_socket: crate::count::register::DEFAULT_SOCKET.to_string(),
            cache: None,
            warm_only: false,
            count: Vec::new(),
            events: Vec::new(),
            traps: false,
            loops: Vec::new(),
            images: true,
            nocount: Vec::new(),
            budget: None,
            stacks: true,
            callers: false,
            debug_dirs: vec![rtprof_shared::debuginfo::DEFAULT_DIR.into()],
        }
    }
}

/// A budget in percent (`1`, `0.5%`); `None` for none or nonsense.
pub fn parse_budget(v: &str) -> Option<f64> {
    let p: f64 = v.trim().trim_end_matches('%').trim().parse().ok()?;
    (p.is_finite() && p > 0.0 && p < 100.0).then_some(p)
}

/// `RTPROF_DISABLE` set (read from the environment alone: no system call,
/// no allocation, so a switched-off agent costs the process no heap).
pub fn disabled_by_env() -> bool {
    set_in_env(c"RTPROF_DISABLE")
}

/// `RTPROF_VERBOSE` set (from the environment alone, before the full
/// configuration is read: a seccomp filter's trial is said too).
pub fn verbose_by_env() -> bool {
    set_in_env(c"RTPROF_VERBOSE")
}

/// `RTPROF_WARM` set: the process was started to fill the cache, not to
/// run (`rtprof cache warm`).
pub fn warming_by_env() -> bool {
    set_in_env(c"RTPROF_WARM")
}

/// Whether `name` is set to a true value, read in place.
fn set_in_env(name: &std::ffi::CStr) -> bool {
    // SAFETY: getenv reads the environment; nothing changes it before
    // `main` (or while the agent's constructor runs).
    let v = unsafe { libc::getenv(name.as_ptr()) };
    if v.is_null() {
        return false;
    }
    // SAFETY: a non-null getenv result is a NUL-terminated string.
    let v = unsafe { std::ffi::CStr::from_ptr(v) };
    std::str::from_utf8(v.to_bytes()).is_ok_and(truthy)
}

fn truthy(v: &str) -> bool {
    !matches!(v.trim(), "" | "0" | "no" | "false" | "off")
}

/// `name[:period]` items, comma-separated; at most
/// [`crate::options::events::MAX_EVENTS`], each name once.
pub fn parse_events(v: &str) -> Vec<(String, Option<u64>)> {
    let mut out: Vec<(String, Option<u64>)> = Vec::new();
    for item in v.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (name, period) = match item.split_once(':') {
            Some((n, p)) => (n.trim(), p.trim().parse::<u64>().ok().filter(|&p| p > 0)),
            None => (item, None),
        };
        if out.len() < crate::options::events::MAX_EVENTS && !out.iter().any(|(n, _)| n == name) {
            out.push((name.chars().take(64).collect(), period));
        }
    }
    out
}

impl Config {
    /// Builds the configuration from a variable lookup, so tests can feed it.
    pub fn from_lookup(get: impl Fn(&str) -> Option<OsString>) -> Config {
        let s = |k: &str| get(k).map(|v| v.to_string_lossy().into_owned());
        let mut c = Config::default();
        if let Some(m) = s("RTPROF_MODULES") {
            for part in m.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                match part {
                    "all" | "*" => c.all_modules = true,
                    "main" => {}
                    p => c.modules.push(p.to_string()),
                }
            }
        }
        c.verbose = s("RTPROF_VERBOSE").is_some_and(|v| truthy(&v));
        c.disabled = s("RTPROF_DISABLE").is_some_and(|v| truthy(&v));
        c.report = s("RTPROF_REPORT").filter(|v| !v.is_empty());
        c.all_functions = s("RTPROF_ALL_FUNCTIONS").is_some_and(|v| truthy(&v));
        c.run_dir = s("RTPROF_RUN_DIR").filter(|v| !v.is_empty());
        if let Some(n) = s("RTPROF_MAX_THREADS").and_then(|v| v.trim().parse::<u32>().ok()) {
            c.max_threads = n.clamp(1, 1 << 16);
        }
        if let Some(n) = s("RTPROF_SPARE_FUNCTIONS").and_then(|v| v.trim().parse::<u32>().ok()) {
            c.spare_functions = n.min(1 << 22);
        }
        if let Some(n) = s("RTPROF_SAMPLE_HZ").and_then(|v| v.trim().parse::<u32>().ok()) {
            // Above 10 kHz the timer's own cost dominates what it measures.
            c.sample_hz = n.min(10_000);
        }
        if let Some(v) = s("RTPROF_DAEMON_SOCKET") {
            c.daemon_socket = v;
        }
        if let Some(v) = s("RTPROF_EVENTS") {
            c.events = parse_events(&v);
        }
        c.instrument = s("RTPROF_INSTRUMENT").is_none_or(|v| truthy(&v));
        let globs = |v: Option<String>| -> Vec<String> {
            v.map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
        };
        c.count = globs(s("RTPROF_COUNT"));
        c.nocount = globs(s("RTPROF_NOCOUNT"));
        c.loops = globs(s("RTPROF_LOOPS"));
        c.budget = s("RTPROF_BUDGET").and_then(|v| parse_budget(&v));
        c.stacks = s("RTPROF_STACKS").is_none_or(|v| truthy(&v));
        c.callers = s("RTPROF_CALLERS").is_some_and(|v| truthy(&v));
        c.traps = s("RTPROF_TRAPS").is_some_and(|v| truthy(&v));
        c.images = s("RTPROF_IMAGES").is_none_or(|v| truthy(&v));
        c.debug_dirs = rtprof_shared::debuginfo::dirs_from(s("RTPROF_DEBUG_DIR").as_deref());
        c.warm_only = s("RTPROF_WARM").is_some_and(|v| truthy(&v));
        c.cache = s("RTPROF_CACHE")
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty());
        if let Some(v) = s("RTPROF_SAMPLER") {
            c.sampler = match v.trim() {
                "perf" => SamplerChoice::Perf,
                "timer" => SamplerChoice::Timer,
                "off" | "none" | "0" => SamplerChoice::Off,
                _ => SamplerChoice::Auto,
            };
        }
        c
    }

    pub fn from_env() -> Config {
        Config::from_lookup(|k| std::env::var_os(k))
    }

    /// Whether a patched function named `name` counts from the start
    /// (`RTPROF_COUNT`, `RTPROF_NOCOUNT`).
    pub fn counts_from_start(&self, name: &[u8]) -> bool {
        let any = |globs: &[String]| globs.iter().any(|g| glob_match(g.as_bytes(), name));
        (self.count.is_empty() || any(&self.count)) && !any(&self.nocount)
    }

    /// Whether the module with file name `name` is selected by `RTPROF_MODULES`.
    pub fn selects(&self, name: &str) -> bool {
        self.all_modules
            || self
                .modules
                .iter()
                .any(|g| glob_match(g.as_bytes(), name.as_bytes()))
    }
}

pub use rtprof_shared::glob_match;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The switches read before anything else are read without allocating.
    #[test]
    fn switches_from_the_environment_are_read_in_place() {
        let before = crate::test_alloc::allocs();
        let path = set_in_env(c"PATH");
        let unset = set_in_env(c"RTPROF_NEVER_SET_BY_ANYONE");
        assert_eq!(crate::test_alloc::allocs(), before);
        assert!(path && !unset);
    }

    #[test]
    fn count_and_nocount_choose_functions() {
        let get = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        let all = Config::from_lookup(get(&[]));
        assert!(all.counts_from_start(b"anything"));
        let c = Config::from_lookup(get(&[("RTPROF_COUNT", "lua_*, luaV_execute")]));
        assert!(c.counts_from_start(b"lua_gettop"));
        assert!(c.counts_from_start(b"luaV_execute"));
        assert!(!c.counts_from_start(b"luaH_get"));
        let c = Config::from_lookup(get(&[
            ("RTPROF_COUNT", "lua_*"),
            ("RTPROF_NOCOUNT", "lua_settop,lua_type"),
        ]));
        assert!(c.counts_from_start(b"lua_gettop"));
        assert!(!c.counts_from_start(b"lua_settop"));
        let c = Config::from_lookup(get(&[("RTPROF_NOCOUNT", "*alloc*")]));
        assert!(!c.counts_from_start(b"l_alloc"));
        assert!(c.counts_from_start(b"main"));
    }

    #[test]
    fn globs() {
        assert!(glob_match(b"libpython*", b"libpython3.11.so.1.0"));
        assert!(glob_match(b"*", b"x"));
        assert!(glob_match(b"lib?.so", b"libm.so"));
        assert!(!glob_match(b"libc.so*", b"libcrypt.so.1"));
        assert!(glob_match(b"*crypt*", b"libcrypt.so.1"));
    }

    #[test]
    fn events_are_listed_once_with_their_periods() {
        let e = parse_events(" page-faults, cycles:1000 ,page-faults,x:0,,y:z");
        assert_eq!(
            e,
            [
                ("page-faults".to_string(), None),
                ("cycles".to_string(), Some(1000)),
                ("x".to_string(), None),
                ("y".to_string(), None),
            ]
        );
        let many: Vec<String> = (0..20).map(|i| format!("e{i}")).collect();
        assert_eq!(
            parse_events(&many.join(",")).len(),
            crate::options::events::MAX_EVENTS
        );
    }

    #[test]
    fn parses_variables() {
        let env: HashMap<&str, &str> = [
            ("RTPROF_MODULES", "main, libpython*,libfoo.so"),
            ("RTPROF_VERBOSE", "1"),
            ("RTPROF_REPORT", "/tmp/r-%p.json"),
            ("RTPROF_MAX_THREADS", "0"),
            ("RTPROF_SAMPLE_HZ", "99999"),
            ("RTPROF_SAMPLER", "timer"),
        ]
        .into();
        let c = Config::from_lookup(|k| env.get(k).map(OsString::from));
        assert_eq!(c.modules, vec!["libpython*", "libfoo.so"]);
        assert!(!c.all_modules && c.verbose && !c.disabled);
        assert_eq!(c.max_threads, 1);
        assert_eq!((c.sample_hz, c.sampler), (10_000, SamplerChoice::Timer));
        assert_eq!(Config::default().sample_hz, 1000);
        assert!(c.instrument);
        let sampling_only = Config::from_lookup(|k| (k == "RTPROF_INSTRUMENT").then(|| "0".into()));
        assert!(!sampling_only.instrument);
        assert!(c.selects("libpython3.11.so.1.0"));
        assert!(!c.selects("libc.so.6"));
        let c = Config::from_lookup(|k| (k == "RTPROF_MODULES").then(|| "all".into()));
        assert!(c.selects("libc.so.6"));
        let c = Config::from_lookup(|k| (k == "RTPROF_VERBOSE").then(|| "0".into()));
        assert!(!c.verbose);
    }
}
