//! The acting scheduler's placement: every span, K slots (an accelerator's
//! capacity, shared by every process on the machine) go to the (process,
//! function) pairs whose move saves most, and their calls are routed to
//! the implementation the program offered.
//!
//! A move of function F of process P to implementation I saves, per
//! second, F's calls per second × (time per call of the implementation
//! running now − of I), each time per call measured from rtprofd's spans
//! of that implementation (its time over its calls, in a span it ran);
//! a move costs `move_cost` once. An implementation never measured is
//! tried for a span when its function is worth a slot: its saving is then
//! at most the function's whole time, counted at half. Hysteresis keeps
//! slots from flapping: a pair keeps its slot for `min_spans` spans, and
//! is displaced only by one whose saving is larger by `hysteresis`. The
//! rows' active implementation is the truth: a route someone else made
//! holds a slot, and one undone frees it.

use rtprof_abi::present::View;
use rtprof_abi::route::{implementation_in, ORIGINAL};
use std::collections::HashMap;

/// How the slots are given.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub slots: usize,
    /// What one move costs, in ns of the program's time.
    pub move_cost_ns: f64,
    /// A newcomer must save this much more than the pair it displaces
    /// (0.25: 25% more).
    pub hysteresis: f64,
    /// Spans a pair keeps its slot at least, while it saves anything.
    pub min_spans: u64,
}

/// One implementation of an offered function, as one span shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Implementation {
    /// Its name (`original`: the function's own code).
    pub name: String,
    pub calls: u64,
    pub time_ns: u64,
    /// It runs the function's calls now.
    pub active: bool,
}

/// A function of a process with implementations offered.
#[derive(Clone, Debug, PartialEq)]
pub struct Offered {
    pub pid: u32,
    pub function: String,
    /// `original` first.
    pub implementations: Vec<Implementation>,
}

/// The offered functions of every live process in `v`'s span.
pub fn offered_in(v: &View) -> Vec<Offered> {
    let mut out = Vec::new();
    for p in v.procs.iter().filter(|p| !p.ended) {
        let rows = &v.rows[p.rows.clone()];
        for own in rows.iter().filter(|r| r.offered) {
            let mut implementations = vec![Implementation {
                name: ORIGINAL.to_string(),
                calls: own.calls,
                time_ns: own.time_ns,
                active: own.active,
            }];
            for r in rows.iter().filter(|r| r.implementation) {
                if let Some(name) = implementation_in(&r.name, &own.name) {
                    implementations.push(Implementation {
                        name: name.to_string(),
                        calls: r.calls,
                        time_ns: r.time_ns,
                        active: r.active,
                    });
                }
            }
            out.push(Offered {
                pid: p.pid,
                function: own.name.clone(),
                implementations,
            });
        }
    }
    out
}

/// What the scheduler does with a function's calls.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub pid: u32,
    pub function: String,
    /// The implementation its calls go to (`original`: back).
    pub to: String,
    /// The one they went to.
    pub from: String,
    pub reason: String,
}

type Pair = (u32, String);

/// What the scheduler remembers from one span to the next.
pub struct Placer {
    opts: Options,
    /// Decisions so far: one per table rtprofd publishes, every tick, each
    /// showing the span that ends then (spans overlap when the span is
    /// longer than the tick).
    span: u64,
    /// Ticks in a span: `min_spans` spans are this many decisions.
    ticks_per_span: u64,
    /// Time per call, ns, of each (pid, function, implementation) as last
    /// measured.
    measured: HashMap<(u32, String, String), f64>,
    /// Pairs holding a slot: the implementation, and the span they got it.
    placed: HashMap<Pair, (String, u64)>,
    /// Spans each (pid, function, implementation) ran without a
    /// measurement (no samples of its code).
    unmeasured: HashMap<(u32, String, String), u32>,
}

/// Spans an implementation may run unmeasured before it counts as saving
/// nothing (its code has no row to measure it by).
const MAX_UNMEASURED: u32 = 3;

/// A pair's best move this span.
struct Candidate {
    pair: Pair,
    to: String,
    /// ns saved per second of the program's time.
    saves: f64,
    why: String,
}

impl Placer {
    pub fn new(opts: Options) -> Placer {
        Placer {
            opts,
            span: 0,
            ticks_per_span: 1,
            measured: HashMap::new(),
            placed: HashMap::new(),
            unmeasured: HashMap::new(),
        }
    }

    /// Says how many decisions (tables published, a tick apart) a span
    /// lasts, so that a pair keeps its slot `min_spans` spans, not ticks.
    pub fn set_ticks_per_span(&mut self, n: u64) {
        self.ticks_per_span = n.max(1);
    }

    /// Whether more pairs hold a slot than there are slots (a move back
    /// was refused).
    pub fn over_capacity(&self) -> bool {
        self.placed.len() > self.opts.slots
    }

    /// The moves for a span of `span_s` seconds showing `offered`.
    pub fn decide(&mut self, offered: &[Offered], span_s: f64) -> Vec<Decision> {
        self.span += 1;
        self.measure(offered);
        self.follow_rows(offered);
        let mut candidates: Vec<Candidate> = offered
            .iter()
            .filter_map(|o| self.candidate(o, span_s))
            .collect();
        candidates.sort_by(|a, b| b.saves.total_cmp(&a.saves));
        let chosen = self.choose(&candidates);
        let mut out = Vec::new();
        // Slots given up first, so that a newcomer never finds them full.
        let placed: Vec<Pair> = self.placed.keys().cloned().collect();
        for pair in placed {
            if chosen.iter().any(|c| c.pair == pair) {
                continue;
            }
            let why = match candidates.iter().find(|c| c.pair == pair) {
                Some(c) if c.saves > 0.0 => format!("displaced: {}", c.why),
                Some(c) => format!("no longer saves: {}", c.why),
                None => "no longer saves anything".to_string(),
            };
            let (from, _) = self.placed.remove(&pair).unwrap_or_default();
            out.push(Decision {
                pid: pair.0,
                function: pair.1,
                to: ORIGINAL.to_string(),
                from,
                reason: why,
            });
        }
        for c in chosen {
            if self.placed.get(&c.pair).is_some_and(|(to, _)| *to == c.to) {
                continue;
            }
            let from = self
                .placed
                .insert(c.pair.clone(), (c.to.clone(), self.span))
                .map_or(ORIGINAL.to_string(), |(f, _)| f);
            out.push(Decision {
                pid: c.pair.0,
                function: c.pair.1.clone(),
                to: c.to.clone(),
                from,
                reason: c.why.clone(),
            });
        }
        out
    }

    /// Takes the rows' word for where each function's calls go: a pair
    /// routed by someone else holds a slot, one routed back frees it, and
    /// a process gone frees its slot (nothing to route back). Forgets the
    /// measurements of processes gone (a pid is reused).
    fn follow_rows(&mut self, offered: &[Offered]) {
        let span = self.span;
        let mut seen = std::collections::HashSet::new();
        for o in offered {
            let pair = (o.pid, o.function.clone());
            seen.insert(pair.clone());
            match o.implementations.iter().find(|i| i.active) {
                Some(i) if i.name != ORIGINAL => {
                    let e = self.placed.entry(pair).or_insert((i.name.clone(), span));
                    e.0 = i.name.clone();
                }
                Some(_) => {
                    self.placed.remove(&pair);
                }
                None => {}
            }
        }
        self.placed.retain(|pair, _| seen.contains(pair));
        let live: std::collections::HashSet<u32> = offered.iter().map(|o| o.pid).collect();
        self.measured.retain(|k, _| live.contains(&k.0));
        self.unmeasured.retain(|k, _| live.contains(&k.0));
    }

    /// Undoes decision `d`, which rtprofd refused: the pair stays where
    /// it was (holding its slot if it had one).
    pub fn refused(&mut self, d: &Decision) {
        let pair = (d.pid, d.function.clone());
        if d.from == ORIGINAL {
            self.placed.remove(&pair);
        } else {
            self.placed.insert(pair, (d.from.clone(), self.span));
        }
    }

    /// Notes each implementation's time per call where the span ran it.
    /// One that ran for [`MAX_UNMEASURED`] spans without samples of its
    /// code counts as saving nothing: it is not tried again.
    fn measure(&mut self, offered: &[Offered]) {
        for o in offered {
            let own = self.per_call(o, ORIGINAL);
            for i in o.implementations.iter().filter(|i| i.calls > 0) {
                let key = (o.pid, o.function.clone(), i.name.clone());
                if i.time_ns > 0 {
                    self.measured.insert(key, i.time_ns as f64 / i.calls as f64);
                    continue;
                }
                let n = self.unmeasured.entry(key.clone()).or_insert(0);
                *n += 1;
                if *n >= MAX_UNMEASURED && !self.measured.contains_key(&key) {
                    if let Some(own) = own {
                        self.measured.insert(key, own);
                    }
                }
            }
        }
    }

    fn per_call(&self, o: &Offered, name: &str) -> Option<f64> {
        self.measured
            .get(&(o.pid, o.function.clone(), name.to_string()))
            .copied()
    }

    /// The pair's best move, if any saves time.
    fn candidate(&self, o: &Offered, span_s: f64) -> Option<Candidate> {
        let calls: u64 = o.implementations.iter().map(|i| i.calls).sum();
        let rate = calls as f64 / span_s.max(1e-9);
        let own = self.per_call(o, ORIGINAL)?;
        let pair = (o.pid, o.function.clone());
        let placed = self.placed.get(&pair);
        let best = o
            .implementations
            .iter()
            .filter(|i| i.name != ORIGINAL)
            .map(|i| {
                let (saves, how) = match self.per_call(o, &i.name) {
                    Some(t) => (
                        rate * (own - t),
                        format!("{rate:.0} calls/s x ({own:.1} - {t:.1} ns)"),
                    ),
                    // Never measured: tried, at half its best.
                    None => (
                        rate * own / 2.0,
                        format!(
                            "{rate:.0} calls/s x {own:.1} ns, {} not measured yet: tried",
                            i.name
                        ),
                    ),
                };
                // A newcomer pays the move within the span.
                let moving = placed.is_none_or(|(to, _)| *to != i.name);
                let cost = if moving {
                    self.opts.move_cost_ns / span_s.max(1e-9)
                } else {
                    0.0
                };
                (i, saves - cost, how)
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))?;
        let (i, saves, how) = best;
        Some(Candidate {
            pair,
            to: i.name.clone(),
            saves,
            why: format!("saves {:.1} ms/s: {how}", saves / 1e6),
        })
    }

    /// The pairs that get the slots: the largest savings, where a pair
    /// holding a slot keeps it within its first `min_spans` spans and
    /// against newcomers within `hysteresis` of it.
    fn choose<'c>(&self, candidates: &'c [Candidate]) -> Vec<&'c Candidate> {
        let held = |c: &Candidate| self.placed.get(&c.pair).map(|(_, since)| *since);
        let weight = |c: &Candidate| match held(c) {
            Some(since)
                if self.span - since < self.opts.min_spans.saturating_mul(self.ticks_per_span) =>
            {
                f64::INFINITY
            }
            Some(_) => c.saves * (1.0 + self.opts.hysteresis),
            None => c.saves,
        };
        let mut v: Vec<&Candidate> = candidates.iter().filter(|c| c.saves > 0.0).collect();
        v.sort_by(|a, b| weight(b).total_cmp(&weight(a)));
        v.truncate(self.opts.slots);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> Options {
        Options {
            slots: 1,
            move_cost_ns: 1e6,
            hysteresis: 0.25,
            min_spans: 2,
        }
    }

    /// `pid`'s `work` with `calls` calls of `ns` each on the implementation
    /// `on` (the other with none).
    fn span(pid: u32, on: &str, calls: u64, ns: u64) -> Offered {
        let i = |name: &str| Implementation {
            name: name.to_string(),
            calls: if name == on { calls } else { 0 },
            time_ns: if name == on { calls * ns } else { 0 },
            active: name == on,
        };
        Offered {
            pid,
            function: "work".into(),
            implementations: vec![i(ORIGINAL), i("fast")],
        }
    }

    /// `pid`'s `work`, measured at `own` ns a call and `fast` ns with its offer.
    fn measured(p: &mut Placer, pid: u32, own: f64, fast: f64) {
        p.measured
            .insert((pid, "work".into(), ORIGINAL.into()), own);
        p.measured.insert((pid, "work".into(), "fast".into()), fast);
    }

    fn measured_4x_faster(p: &mut Placer, pids: &[u32]) {
        for &pid in pids {
            measured(p, pid, 100.0, 25.0);
        }
    }

    #[test]
    fn an_unmeasured_offer_is_tried_then_kept_while_it_saves() {
        let mut p = Placer::new(opts());
        let d = p.decide(&[span(1, ORIGINAL, 1_000_000, 100)], 1.0);
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].pid, d[0].to.as_str()), (1, "fast"));
        assert!(d[0].reason.contains("not measured yet"), "{}", d[0].reason);
        // Measured 4x faster: kept, nothing to do.
        assert!(p.decide(&[span(1, "fast", 4_000_000, 25)], 1.0).is_empty());
        // Measured slower than the original: back.
        let d = p.decide(&[span(1, "fast", 1_000_000, 300)], 1.0);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].to, ORIGINAL);
    }

    /// `min_spans` counts spans: with a table published five times a
    /// span, a pair keeps its slot for 2 x 5 decisions against a newcomer
    /// that saves far more.
    #[test]
    fn a_slot_is_kept_for_min_spans_spans_not_ticks() {
        let mut p = Placer::new(opts());
        p.set_ticks_per_span(5);
        measured_4x_faster(&mut p, &[1, 2]);
        let d = p.decide(
            &[
                span(1, ORIGINAL, 10_000_000, 100),
                span(2, ORIGINAL, 1_000, 100),
            ],
            1.0,
        );
        assert_eq!((d.len(), d[0].pid), (1, 1));
        let hotter = [
            span(1, "fast", 10_000_000, 25),
            span(2, ORIGINAL, 1_000_000_000, 100),
        ];
        for tick in 1..10 {
            assert!(p.decide(&hotter, 1.0).is_empty(), "tick {tick}");
        }
        let d = p.decide(&hotter, 1.0);
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!((d[1].pid, d[1].to.as_str()), (2, "fast"));
    }

    #[test]
    fn one_slot_follows_the_hotter_program_without_flapping() {
        let mut p = Placer::new(opts());
        // Both measured: fast is 4x faster for either.
        measured_4x_faster(&mut p, &[1, 2]);
        let d = p.decide(
            &[
                span(1, ORIGINAL, 10_000_000, 100),
                span(2, ORIGINAL, 1_000, 100),
            ],
            1.0,
        );
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].pid, d[0].to.as_str()), (1, "fast"));
        // 2 is a little hotter for a while: within the hysteresis, 1 keeps it.
        for _ in 0..3 {
            let d = p.decide(
                &[
                    span(1, "fast", 10_000_000, 25),
                    span(2, ORIGINAL, 11_000_000, 100),
                ],
                1.0,
            );
            assert!(d.is_empty(), "{d:?}");
        }
        // 1's phase ends, 2's begins: the slot moves, 1 first.
        let d = p.decide(
            &[span(1, "fast", 0, 25), span(2, ORIGINAL, 10_000_000, 100)],
            1.0,
        );
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!((d[0].pid, d[0].to.as_str()), (1, ORIGINAL));
        assert_eq!((d[1].pid, d[1].to.as_str()), (2, "fast"));
        assert!(
            d[1].reason.contains("x (100.0 - 25.0 ns)"),
            "{}",
            d[1].reason
        );
    }

    #[test]
    fn a_move_that_saves_less_than_it_costs_is_not_made() {
        let mut p = Placer::new(opts());
        measured(&mut p, 1, 100.0, 99.0);
        // 1,000 calls/s x 1 ns saves 1 us/s; the move costs 1 ms.
        assert!(p.decide(&[span(1, ORIGINAL, 1000, 100)], 1.0).is_empty());
    }

    #[test]
    fn a_process_gone_frees_its_slot() {
        let mut p = Placer::new(opts());
        let _ = p.decide(&[span(1, ORIGINAL, 1_000_000, 100)], 1.0);
        assert!(p.placed.contains_key(&(1, "work".to_string())));
        let d = p.decide(&[span(2, ORIGINAL, 1_000_000, 100)], 1.0);
        assert!(!p.placed.contains_key(&(1, "work".to_string())));
        assert_eq!((d[0].pid, d[0].to.as_str()), (2, "fast"));
    }

    /// A move back that rtprofd refused keeps the pair's slot, and the
    /// newcomer waits; a route made by someone else holds a slot too.
    #[test]
    fn the_slots_are_those_the_rows_show() {
        let mut p = Placer::new(opts());
        measured_4x_faster(&mut p, &[1, 2]);
        // 1 was routed by another scheduler: it holds the one slot, for
        // its first spans whatever 2 does.
        for _ in 0..2 {
            let d = p.decide(
                &[span(1, "fast", 1_000, 25), span(2, ORIGINAL, 1_000, 100)],
                1.0,
            );
            assert!(d.is_empty(), "{d:?}");
        }
        let d = p.decide(
            &[span(1, "fast", 0, 25), span(2, ORIGINAL, 10_000_000, 100)],
            1.0,
        );
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!(
            (d[0].pid, d[0].from.as_str(), d[0].to.as_str()),
            (1, "fast", ORIGINAL)
        );
        p.refused(&d[0]);
        assert!(p.over_capacity(), "1 kept its slot: 2 must wait");
    }

    /// An implementation whose code has no samples (no row to measure it
    /// by) is tried for a few spans, then counts as saving nothing.
    #[test]
    fn an_unmeasurable_offer_is_given_up() {
        let mut p = Placer::new(opts());
        let d = p.decide(&[span(1, ORIGINAL, 1_000_000, 100)], 1.0);
        assert_eq!(d[0].to, "fast");
        let mut gave_up = false;
        for _ in 0..MAX_UNMEASURED + 2 {
            let d = p.decide(&[span(1, "fast", 1_000_000, 0)], 1.0);
            gave_up |= d.iter().any(|d| d.to == ORIGINAL);
        }
        assert!(
            gave_up,
            "the slot is not held for ever by an unmeasured offer"
        );
    }
}
