//! An overhead budget (`RTPROF_BUDGET=PERCENT`, or `budget = PERCENT` in
//! root's `/etc/rtprof/rtprof.conf`): counting may cost the process at
//! most that share of its CPU time.
//!
//! The agent estimates its cost as calls counted per CPU second times a
//! measured cost per call. While exact counting fits, it stays exact. When
//! it does not, the hottest functions are counted in bursts: their entries
//! hold the jump to their stubs for a short burst, and their own original
//! bytes in between (costing nothing, not even the detour), switched with
//! the program's other threads stopped (`stopworld`). Calls between bursts
//! are extrapolated from the burst rates (calls per CPU second), and the
//! function is flagged `estimated` in the segment with a bound on the
//! error. An estimate is published (added to the shared stripe) once its
//! bound is within 5% of itself; until then the function's count is the
//! calls counted, marked "at least" (`AT_LEAST`): a bound of tens of
//! percent says nothing a user can act on. Where threads cannot be stopped (a
//! debugger attached, ptrace refused) the bursts switch the stubs' count
//! instead: the estimates hold, but the detour still costs.

use crate::error::Errno;
use crate::error::PatchError;
use crate::lifecycle::locked::Locked;
use crate::lifecycle::worker::{Next, Worker};
use crate::log::vlog;
use crate::patch::install::StubMap;
use crate::patch::stopworld::Stopper;
use crate::patch::switch::{set_counting, write_entries_stopped, EntrySwitch};
use crate::Agent;
use rtprof_abi::layout::{cost, function_flags};
use rtprof_abi::writer::Counters;
use rtprof_abi::SegmentWriter;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// Nanoseconds counting adds to a call on real code (Lua 1.3, SQLite 1.2,
/// cc1 2-3.7 on the development machine: see docs/budget.md).
const COST_PER_CALL_NS: f64 = 2.0;
/// The most a call's counting was seen to cost (cc1): what bounds the
/// share of a burst's CPU time that went to counting.
const MOST_COST_PER_CALL_NS: f64 = 4.0;
/// A cycle is one burst, then the functions' own code until the next.
/// Short cycles follow a program's phases closely, but each costs two
/// stops of the program: cycles are as short as a quarter of the budget
/// pays for, and no shorter than this.
const SHORTEST_CYCLE: Duration = Duration::from_millis(20);
const SHORTEST_BURST: Duration = Duration::from_micros(500);
/// How long exact counting is watched before the first decision, and
/// between looks while it fits.
const FIRST_LOOK: Duration = Duration::from_millis(20);
const LOOK_AGAIN: Duration = Duration::from_millis(500);
/// At most this many functions are counted in bursts (each switch writes
/// every one of them with the program stopped).
const MOST_ESTIMATED: usize = 4096;
/// An estimate is published (its extrapolated calls added to the count)
/// while the program runs once its bound is within this share of what
/// was extrapolated (not of the whole count, which the calls counted
/// exactly at first would make look sure early: later gaps carry the
/// extrapolation's own uncertainty); at exit once its bound is within
/// [`WIDEST_BOUND`] of the whole. Until then the function shows the calls
/// counted, marked "at least": a bound of tens of percent says nothing a
/// user can act on, and a published count cannot be taken back.
const PUBLISH_BOUND: f64 = 0.05;
const WIDEST_BOUND: f64 = 0.10;

static WORKER: Worker = Worker::new(c"rtprof-budget", cost::BUDGET_NS);

/// One function counted in bursts.
struct Estimated {
    entry: EntrySwitch,
    /// Calls counted (not extrapolated) when its current burst began.
    at_burst: u64,
    /// Its rates in the last burst that ended (or the watch before the
    /// first).
    last: Option<Rates>,
    /// Calls extrapolated between bursts, and how many of them are in
    /// the segment: none until the estimate is published, once its bound
    /// is narrow enough (until then its count is the calls counted, at
    /// least).
    added: f64,
    written: u64,
    published: bool,
    /// The bound on the error of what was added, in calls, from the
    /// bursts around each gap.
    error: f64,
    /// Its rates over every burst, in each unit, and the progress of the
    /// gaps extrapolated in each: how much the rate varies over the run
    /// bounds how wrong a gap can be that no burst saw.
    by_reference: Spread,
    by_cpu: Spread,
    gaps: Span,
    /// Chosen during a gap: counted exactly until switched off then, so
    /// its first gap starts there, not where the others' did.
    joined: Option<Clock>,
}

/// A running mean and standard deviation.
#[derive(Clone, Copy, Debug, Default)]
struct Spread {
    n: f64,
    sum: f64,
    sum2: f64,
}

impl Spread {
    fn add(&mut self, x: f64) {
        self.n += 1.0;
        self.sum += x;
        self.sum2 += x * x;
    }

    /// The standard deviation; with fewer than two values, as large as
    /// the mean (one burst says nothing of how the rate varies).
    fn sd(&self) -> f64 {
        if self.n < 2.0 {
            return self.sum / self.n.max(1.0);
        }
        let mean = self.sum / self.n;
        ((self.sum2 / self.n - mean * mean).max(0.0) * self.n / (self.n - 1.0)).sqrt()
    }

    /// How many standard deviations either way hold the rate 95 times in
    /// 100, for a deviation taken from this many values (Student's t, two
    /// sided): two bursts alike say little of the next, many say more.
    fn t95(&self) -> f64 {
        const T: [f64; 10] = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23];
        let dof = (self.n as usize).saturating_sub(1);
        match dof {
            0 => T[0],
            1..=10 => T[dof - 1],
            11..=30 => 2.1,
            _ => 2.0,
        }
    }

    /// The deviation times [`Spread::t95`].
    fn wide(&self) -> f64 {
        self.t95() * self.sd()
    }
}

/// A function's calls per unit of the program's progress, measured in a
/// burst, in two units:
/// - per call of the reference (the hottest functions still counted
///   exactly): counting slows the program during a burst, but the
///   reference as much as the estimated functions, so the ratio holds;
///   used when the reference is called often enough to measure by;
/// - per nanosecond of process CPU time. Counting's own share of a
///   burst's CPU time slows the program then, by an amount known only
///   within limits: the estimate lies between no slowing and the most
///   counting can cost, and the error covers both.
#[derive(Clone, Copy, Debug)]
struct Rates {
    per_reference: Option<f64>,
    per_cpu_ns: f64,
    /// The largest share of the burst's CPU time counting can have taken.
    most_cost: f64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// Everything counts exactly; cost is being watched.
    Watching,
    /// Estimated functions run their own code.
    Between,
    /// A burst: estimated functions count.
    Burst,
}

/// The program's progress at one instant.
#[derive(Clone, Copy, Default, Debug)]
struct Clock {
    cpu: u64,
    reference: u64,
}

/// Progress between two clocks.
#[derive(Clone, Copy, Default, Debug, PartialEq)]
struct Span {
    cpu: f64,
    reference: f64,
}

impl Span {
    fn plus(&self, o: &Span) -> Span {
        Span {
            cpu: self.cpu + o.cpu,
            reference: self.reference + o.reference,
        }
    }
}

impl Clock {
    fn since(&self, from: &Clock) -> Span {
        Span {
            cpu: self.cpu.saturating_sub(from.cpu) as f64,
            reference: self.reference.saturating_sub(from.reference) as f64,
        }
    }
}

/// A look at the costs over less CPU time than this (the program waited)
/// changes nothing.
const IDLE_LOOK_NS: u64 = 2_000_000;

/// Fewer reference calls than this in a burst: measure it in CPU time.
/// (The reference's own noise shows in the spread between bursts, which
/// the error bound includes.)
const DENSE_REFERENCE: f64 = 100.0;

impl Rates {
    /// Rates of a function that made `calls` in `span`, in which the
    /// estimated functions together made `all` calls.
    fn measure(calls: u64, all: u64, span: &Span) -> Rates {
        let cpu = span.cpu.max(1.0);
        Rates {
            per_reference: (span.reference >= DENSE_REFERENCE)
                .then(|| calls as f64 / span.reference),
            per_cpu_ns: calls as f64 / cpu,
            most_cost: (all as f64 * MOST_COST_PER_CALL_NS / cpu).min(0.8),
        }
    }
}

/// Calls in a gap of `gap` progress between bursts measured `before`
/// and `after` (the same when extrapolating past the last burst): the
/// estimate and its error bound.
fn interpolate(before: &Rates, after: &Rates, gap: &Span) -> Interpolated {
    let mid = |a: f64, b: f64| ((a + b) / 2.0, (a - b).abs() / 2.0);
    if let (Some(a), Some(b)) = (before.per_reference, after.per_reference) {
        if gap.reference > 0.0 {
            let (r, spread) = mid(a, b);
            return Interpolated {
                calls: r * gap.reference,
                error: spread * gap.reference,
                measured_in: Span {
                    cpu: 0.0,
                    reference: gap.reference,
                },
            };
        }
    }
    let (r, spread) = mid(before.per_cpu_ns, after.per_cpu_ns);
    let low = r * gap.cpu;
    let high = low / (1.0 - before.most_cost.max(after.most_cost));
    Interpolated {
        calls: (low + high) / 2.0,
        error: (high - low) / 2.0 + spread * gap.cpu,
        measured_in: Span {
            cpu: gap.cpu,
            reference: 0.0,
        },
    }
}

/// A gap's calls as interpolated: the estimate, the error from the bursts
/// around it, and the gap's progress in the unit it was measured in.
#[derive(Debug, PartialEq)]
struct Interpolated {
    calls: f64,
    error: f64,
    measured_in: Span,
}

pub(crate) struct Controller {
    /// Budget as a fraction of the process's CPU time.
    budget: f64,
    phase: Phase,
    /// Process CPU time and every function's calls at the last look.
    look_cpu: u64,
    look_calls: Vec<u64>,
    chosen: Vec<Estimated>,
    /// The reference: slots of the hottest functions counted exactly.
    reference: Vec<u32>,
    /// Share of each cycle spent in a burst.
    duty: f64,
    burst_from: Clock,
    gap_from: Clock,
    /// Progress between the last two bursts, interpolated once the burst
    /// after it has rates too.
    pending_gap: Option<Span>,
    cycles: u32,
    /// Threads cannot be stopped here: switch the stubs' count instead.
    stubs_only: bool,
    /// Kept from one switch to the next.
    stopper: Option<Stopper>,
    /// How long one stop of the program takes (wall ns, a running mean).
    stop_ns: f64,
    /// How long a look at every function's calls takes (ns, likewise).
    look_ns: f64,
    /// When the current gap ends.
    gap_ends: Instant,
    noise: u64,
}

/// Runs `f` on the controller, with the stub map and the records, under
/// the agent's state lock (which also keeps the modules, and so the
/// entries, in place while they are switched).
fn with_controller<T>(
    a: &Agent,
    f: impl FnOnce(&mut Controller, &StubMap, &mut SegmentWriter) -> T,
) -> Option<T> {
    let mut state = a.state.lock()?;
    let Locked {
        budget,
        stubs,
        writer,
        ..
    } = &mut *state;
    budget.as_mut().map(|c| f(c, stubs, writer))
}

/// The kernel's CPU clock id of this process (MAKE_PROCESS_CPUCLOCK of
/// its pid), once known; a forked child forgets its parent's.
static PROCESS_CLOCK: AtomicI32 = AtomicI32::new(0);

/// Process CPU time in nanoseconds (a system call; allocates nothing).
/// By the process's own clock, not the caller's: the helper that stops
/// the program reads it too, and is another process.
fn cpu_ns() -> u64 {
    let mut id = PROCESS_CLOCK.load(Ordering::Relaxed);
    if id == 0 {
        // SAFETY: a plain system call; an agent thread of this process
        // (never the helper) comes here first.
        id = (!unsafe { libc::getpid() } << 3) | 2;
        PROCESS_CLOCK.store(id, Ordering::Relaxed);
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the timespec on our stack.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Starts the budget's thread if a budget is set. After start-up, and in
/// a forked child once `fork()` has returned.
pub fn start(a: &'static Agent) {
    let Some(percent) = a.config.budget else {
        return;
    };
    // Its thread and the entries it rewrites take system calls a seccomp
    // filter may forbid.
    if crate::lifecycle::sandbox::on() {
        return;
    }
    let Some(mut state) = a.state.lock() else {
        return;
    };
    state.budget = Some(Controller::new(percent / 100.0));
    drop(state);
    let void = crate::sampling::void_stripe(a);
    if let Err(e) = WORKER.start(FIRST_LOOK.as_millis() as u64, void, tick) {
        vlog!("budget thread not started: {e}; counting stays exact");
    }
}

fn tick(gone: bool) -> Next {
    let Some(a) = crate::agent() else {
        return Next::Idle;
    };
    if gone {
        return Next::Idle;
    }
    crate::options::counting_requests::serve_control(a);
    with_controller(a, |c, stubs, w| c.step(a, stubs, w)).map_or(Next::In(LOOK_AGAIN), Next::In)
}

/// At exit: the calls since the last burst are extrapolated and every
/// estimate gets its final bound. The functions stay as they are.
pub fn at_exit(a: &Agent) {
    // Without a budget, no controller: the lock is not worth waiting for.
    if a.config.budget.is_none() {
        return;
    }
    with_controller(a, |c, _, w| c.settle(a, w));
}

/// The program's last thread has ended.
pub fn program_threads_gone() {
    WORKER.program_gone();
}

/// Stops the thread (a process entering a user namespace must be
/// single-threaded); returns whether to [`resume`].
pub fn pause() -> bool {
    WORKER.stop()
}

/// Restarts the thread after [`pause`], or starts the controller of a
/// forked child (which [`forget_in_child`] left without one).
pub fn resume() {
    let Some(a) = crate::agent() else { return };
    if a.state.lock().is_some_and(|s| s.budget.is_none()) {
        return start(a);
    }
    let void = crate::sampling::void_stripe(a);
    let _ = WORKER.start(FIRST_LOOK.as_millis() as u64, void, tick);
}

/// In a forked child, from the fork handler (one thread, allocation-free):
/// every estimated entry jumps to its stub again and counts exactly (the
/// child's counters start at zero), until the child's own controller
/// starts when `fork()` returns.
pub fn forget_in_child(a: &Agent) {
    WORKER.forget_in_child();
    PROCESS_CLOCK.store(0, Ordering::Relaxed);
    // The child's only thread; the lock was reset before.
    let Some(mut state) = a.state.lock() else {
        return;
    };
    let Locked { budget, writer, .. } = &mut *state;
    let Some(c) = budget.take() else {
        return;
    };
    if c.phase == Phase::Between {
        // The only thread: nothing else to stop. One entry at a time, and
        // the file opened by hand: a child made by `_Fork` may not
        // allocate.
        // SAFETY: a static path; the descriptor becomes the File's, which
        // closes it.
        let fd =
            unsafe { libc::open(c"/proc/self/mem".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
        // SAFETY: a descriptor just opened (or -1, not used).
        let mem = (fd >= 0)
            .then(|| unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) });
        for e in &c.chosen {
            if c.stubs_only {
                let _ = set_counting(std::slice::from_ref(&e.entry.stub), true);
            } else if let Some(mem) = &mem {
                write_entries_stopped(mem, std::slice::from_ref(&e.entry), true, &[], &mut [false]);
            }
        }
    }
    for e in &c.chosen {
        writer.set_estimated(e.entry.slot, None);
    }
    // Not freed: `free` is no safer than `malloc` here. The child's own
    // controller starts afresh.
    std::mem::forget(c);
}

impl Controller {
    fn new(budget: f64) -> Controller {
        Controller {
            budget,
            phase: Phase::Watching,
            look_cpu: cpu_ns(),
            look_calls: Vec::new(),
            chosen: Vec::new(),
            reference: Vec::new(),
            duty: 1.0,
            burst_from: Clock::default(),
            gap_from: Clock::default(),
            pending_gap: None,
            cycles: 0,
            stubs_only: false,
            stopper: None,
            stop_ns: 150_000.0,
            look_ns: 0.0,
            gap_ends: Instant::now(),
            noise: cpu_ns() | 1,
        }
    }

    /// One step of the cycle; returns how long until the next.
    fn step(&mut self, a: &Agent, stubs: &StubMap, w: &mut SegmentWriter) -> Duration {
        match self.phase {
            Phase::Watching => self.watch(a, stubs, w),
            Phase::Between => {
                // Long gaps are looked into: functions that turned hot
                // since stop costing now, not a cycle later.
                let left = self.gap_ends.saturating_duration_since(Instant::now());
                if left > 2 * self.look_every() {
                    self.choose_more(a, stubs, w);
                    return self.look_every();
                }
                if !left.is_zero() {
                    return left;
                }
                self.begin_burst(a);
                self.burst_len()
            }
            Phase::Burst => {
                self.end_burst(a, w);
                self.cycles += 1;
                // Exact counting's cost is what grows when the program
                // moves on to other functions: looked at every cycle.
                self.choose_more(a, stubs, w);
                let gap = self.gap_len();
                self.gap_ends = Instant::now() + gap;
                gap.min(self.look_every())
            }
        }
    }

    fn cycle(&self) -> Duration {
        let paid = Duration::from_nanos((2.0 * self.stop_ns / (self.budget / 4.0)) as u64);
        // A very small duty lengthens the cycle rather than the burst.
        SHORTEST_CYCLE
            .max(paid)
            .max(SHORTEST_BURST.div_f64(self.duty))
    }

    fn burst_len(&self) -> Duration {
        self.cycle().mul_f64(self.duty)
    }

    /// Gaps vary from half to one and a half times their mean, so that
    /// bursts do not keep landing in the same part of a program's own
    /// periodic phases.
    fn gap_len(&mut self) -> Duration {
        // xorshift64: a few bits of noise, no state worth more.
        self.noise ^= self.noise << 13;
        self.noise ^= self.noise >> 7;
        self.noise ^= self.noise << 17;
        let jitter = 0.5 + (self.noise >> 11) as f64 / (1u64 << 53) as f64;
        self.cycle().mul_f64((1.0 - self.duty) * jitter)
    }

    /// Calls per function since the last look, and the CPU time they took.
    fn look(&mut self, a: &Agent) -> (Vec<u64>, u64) {
        let started = Instant::now();
        let mut now = vec![0u64; a.segment.counters.func_count() as usize];
        // Stripe by stripe, as readers sum (a torn sum, while a thread's
        // stripe is folded, only blurs one look).
        if let Ok(h) = rtprof_abi::read_header(a.segment.bytes()) {
            let _ = rtprof_abi::reader::sum_calls(a.segment.bytes(), &h, &mut now);
        }
        let cpu = cpu_ns();
        let delta = now
            .iter()
            .enumerate()
            .map(|(i, &n)| n.saturating_sub(self.look_calls.get(i).copied().unwrap_or(0)))
            .collect();
        let spent = cpu.saturating_sub(self.look_cpu).max(1);
        self.look_calls = now;
        self.look_cpu = cpu;
        self.look_ns = 0.8 * self.look_ns + 0.2 * started.elapsed().as_nanos() as f64;
        (delta, spent)
    }

    /// Watching exact counting: does it fit the budget?
    fn watch(&mut self, a: &Agent, stubs: &StubMap, w: &mut SegmentWriter) -> Duration {
        self.choose_more(a, stubs, w);
        if self.chosen.is_empty() {
            return LOOK_AGAIN;
        }
        crate::patch::switch::prepare();
        self.gap_from = self.switch(a, false);
        self.phase = Phase::Between;
        let gap = self.gap_len();
        self.gap_ends = Instant::now() + gap;
        gap.min(self.look_every())
    }

    /// How often a gap is looked into: as often as an eighth of the budget
    /// pays for a look, and no more than every 50 ms.
    fn look_every(&self) -> Duration {
        Duration::from_nanos((self.look_ns / (self.budget / 8.0)) as u64)
            .max(Duration::from_millis(50))
    }

    /// Moves the hottest exactly counted functions to bursts until exact
    /// counting costs at most half the budget (bursts get a quarter, the
    /// stops the last), sets the bursts' duty, and the reference.
    fn choose_more(&mut self, a: &Agent, stubs: &StubMap, w: &mut SegmentWriter) {
        let (delta, spent) = self.look(a);
        if spent < IDLE_LOOK_NS {
            // The program waited: nothing to learn of its costs, and
            // its reference is not thin, only idle.
            return;
        }
        let cost = |calls: u64| calls as f64 * COST_PER_CALL_NS / spent as f64;
        let chosen: std::collections::HashSet<u32> =
            self.chosen.iter().map(|e| e.entry.slot).collect();
        let mut exact: Vec<(u32, u64)> = delta
            .iter()
            .enumerate()
            .map(|(s, &n)| (s as u32, n))
            .filter(|&(s, n)| n > 0 && !chosen.contains(&s))
            .collect();
        exact.sort_unstable_by_key(|e| std::cmp::Reverse(e.1));
        let mut exact_cost = cost(exact.iter().map(|e| e.1).sum());
        let mut added = Vec::new();
        for &(slot, n) in &exact {
            if exact_cost <= self.budget / 2.0 || self.chosen.len() + added.len() >= MOST_ESTIMATED
            {
                break;
            }
            let f = w.function(slot);
            if f.status != 0
                || f.reserved & function_flags::COUNTING_OFF != 0
                || self.reference.contains(&slot)
            {
                continue;
            }
            let Some(entry) = stubs.entry(slot) else {
                continue;
            };
            exact_cost -= cost(n);
            added.push(*entry);
        }
        // Bursts are best measured by calls of functions left exact: if
        // those are too rare for it, the least hot of the new ones stays
        // exact instead, as long as exact counting keeps within three
        // quarters of the budget.
        let mut left: u64 = exact.iter().map(|e| e.1).sum::<u64>()
            - added.iter().map(|e| delta[e.slot as usize]).sum::<u64>();
        while let Some(last) = added.last() {
            let n = delta[last.slot as usize];
            let per_burst = left as f64 / spent as f64 * SHORTEST_BURST.as_nanos() as f64;
            if per_burst >= 2.0 * DENSE_REFERENCE || exact_cost + cost(n) > self.budget * 0.75 {
                break;
            }
            exact_cost += cost(n);
            left += n;
            added.pop();
        }
        if !added.is_empty() {
            vlog!(
                "budget {:.2}%: counting {} more functions in bursts (the {} exactly counted cost {:.1}%)",
                self.budget * 100.0,
                added.len(),
                exact.len(),
                cost(exact.iter().map(|e| e.1).sum()) * 100.0
            );
        }
        if self.chosen.is_empty() && added.is_empty() {
            return;
        }
        self.choose_reference(a, &exact, &added, &delta, spent);
        let span = Span {
            cpu: spent as f64,
            reference: self
                .reference
                .iter()
                .map(|&s| delta[s as usize])
                .sum::<u64>() as f64,
        };
        let all: u64 = added.iter().map(|e| delta[e.slot as usize]).sum();
        for e in &added {
            let rates = Rates::measure(delta[e.slot as usize], all, &span);
            self.add_chosen(a, w, e, rates);
        }
        if self.phase == Phase::Between && !added.is_empty() {
            // Off now, like the others (whose entries are written again,
            // unchanged); their first gap starts here.
            let clock = self.switch(a, false);
            for e in &mut self.chosen {
                if added.iter().any(|n| n.slot == e.entry.slot) {
                    e.joined = Some(clock);
                }
            }
        }
        // The estimated functions' cost if counted throughout, from their
        // rates in bursts (their calls since the last look include
        // extrapolated ones, added all at once).
        let chosen_cost: f64 = self
            .chosen
            .iter()
            .filter_map(|e| e.last.map(|r| r.per_cpu_ns * COST_PER_CALL_NS))
            .sum();
        // Exact counting takes up to half, the stops a quarter.
        let room = (self.budget * 0.75 - exact_cost).max(self.budget / 4.0);
        self.duty = (room / chosen_cost.max(1e-9)).clamp(0.002, 0.5);
    }

    /// The reference: the hottest functions left exact, kept while they
    /// are called often enough to measure a burst by. A new reference
    /// starts its count from now, and rates measured against the old one
    /// no longer apply.
    fn choose_reference(
        &mut self,
        a: &Agent,
        exact: &[(u32, u64)],
        added: &[EntrySwitch],
        delta: &[u64],
        spent: u64,
    ) {
        const SIZE: usize = 256;
        let calls: u64 = self.reference.iter().map(|&s| delta[s as usize]).sum();
        let per_burst = calls as f64 / spent as f64 * SHORTEST_BURST.as_nanos() as f64;
        if per_burst >= 2.0 * DENSE_REFERENCE {
            return;
        }
        let reference: Vec<u32> = exact
            .iter()
            .map(|e| e.0)
            .filter(|s| !added.iter().any(|e| e.slot == *s))
            .take(SIZE)
            .collect();
        if reference == self.reference {
            return;
        }
        self.reference = reference;
        self.gap_from.reference = read_clock(a, &self.reference).reference;
        for e in &mut self.chosen {
            if let Some(r) = &mut e.last {
                r.per_reference = None;
            }
        }
    }

    /// Adds `e`, keeping the chosen in address order (entries are
    /// switched a page at a time).
    fn add_chosen(&mut self, a: &Agent, w: &mut SegmentWriter, e: &EntrySwitch, rates: Rates) {
        // Nothing extrapolated yet: the calls so far are the counted ones.
        w.set_estimated(e.slot, Some(function_flags::AT_LEAST));
        let at = self.chosen.partition_point(|c| c.entry.at < e.at);
        let mut est = Estimated {
            entry: *e,
            // Nothing added yet: every call so far was counted.
            at_burst: a.segment.counters.calls(e.slot),
            last: None,
            added: 0.0,
            written: 0,
            published: false,
            error: 0.0,
            by_reference: Spread::default(),
            by_cpu: Spread::default(),
            gaps: Span::default(),
            joined: None,
        };
        est.learn(&rates);
        self.chosen.insert(at, est);
    }

    /// Switches the chosen functions' counting on or off, stopping the
    /// other threads if possible; returns the program's progress at the
    /// switch, and notes each function's count then in `at`.
    fn switch_reading(&mut self, a: &Agent, on: bool, at: &mut [u64]) -> Clock {
        if !self.stubs_only {
            match self.switch_entries(a, on, at) {
                Ok(clock) => return clock,
                // Nothing was written: every entry still jumps to its stub.
                Err(e) => {
                    self.stubs_only = true;
                    vlog!("budget: threads cannot be stopped ({e}); bursts switch the stubs' count instead, and the detour still costs");
                }
            }
        }
        let mut stubs: Vec<u64> = self.chosen.iter().map(|e| e.entry.stub).collect();
        stubs.sort_unstable();
        if let Err(e) = set_counting(&stubs, on) {
            vlog!("budget: {e}");
        }
        let w = &a.segment.counters;
        for (e, n) in self.chosen.iter().zip(at.iter_mut()) {
            *n = w.calls(e.entry.slot);
        }
        read_clock(a, &self.reference)
    }

    /// [`Controller::switch_reading`], noting where each burst starts.
    fn switch(&mut self, a: &Agent, on: bool) -> Clock {
        let mut at = vec![0u64; self.chosen.len()];
        let clock = self.switch_reading(a, on, &mut at);
        if on {
            for (e, &n) in self.chosen.iter_mut().zip(&at) {
                e.at_burst = e.counted(n);
            }
        }
        clock
    }

    /// Writes every chosen entry with the other threads stopped, and reads
    /// the counts and the clock while they are. An entry whose original
    /// instructions a thread is part-way through keeps its own code until
    /// the next burst.
    fn switch_entries(&mut self, a: &Agent, on: bool, at: &mut [u64]) -> Result<Clock, PatchError> {
        let mem = std::fs::OpenOptions::new()
            .write(true)
            .open("/proc/self/mem")
            .map_err(|e| PatchError::NotPermitted(Errno::of(&e)))?;
        let entries: Vec<EntrySwitch> = self.chosen.iter().map(|e| e.entry).collect();
        let mut done = vec![false; entries.len()];
        let w = &a.segment.counters;
        let reference = &self.reference;
        let stopper = match &mut self.stopper {
            Some(s) => s,
            None => self.stopper.insert(Stopper::new()?),
        };
        let started = std::time::Instant::now();
        let mut held = 0;
        let clock = stopper.run(|pcs| {
            held = pcs.len() as u64;
            write_entries_stopped(&mem, &entries, on, pcs, &mut done);
            for (e, n) in entries.iter().zip(at.iter_mut()) {
                *n = w.calls(e.slot);
            }
            read_clock(a, reference)
        })?;
        // A running mean, each stop counted at most twice the mean: the
        // first stop pays one-time costs (mapping, first writes).
        let took = started.elapsed().as_nanos() as f64;
        self.stop_ns = 0.8 * self.stop_ns + 0.2 * took.min(2.0 * self.stop_ns);
        // Every thread held lost the whole stop.
        crate::count::cost::add(cost::HELD_NS, held * took as u64);
        let skipped = done.iter().filter(|d| !**d).count();
        if skipped > 0 {
            vlog!("budget: {skipped} entries not switched (a thread was inside)");
        }
        Ok(clock)
    }

    fn begin_burst(&mut self, a: &Agent) {
        let clock = self.switch(a, true);
        let gap = clock.since(&self.gap_from);
        // A gap before an idle burst is still waiting for rates.
        self.pending_gap = Some(match self.pending_gap.take() {
            Some(g) => g.plus(&gap),
            None => gap,
        });
        self.burst_from = clock;
        self.phase = Phase::Burst;
    }

    fn end_burst(&mut self, a: &Agent, w: &mut SegmentWriter) {
        let mut at = vec![0u64; self.chosen.len()];
        let clock = self.switch_reading(a, false, &mut at);
        self.close_burst(a, &clock, &at);
        self.gap_from = clock;
        self.phase = Phase::Between;
        self.publish_bounds(a, w, false);
    }

    /// The burst that ends at `clock` (with counts `at`): its rates, and
    /// the gap before it interpolated between the bursts on either side.
    fn close_burst(&mut self, a: &Agent, clock: &Clock, at: &[u64]) {
        let w = &a.segment.counters;
        let span = clock.since(&self.burst_from);
        let counted: Vec<u64> = self
            .chosen
            .iter()
            .zip(at)
            .map(|(e, &n)| e.counted(n).saturating_sub(e.at_burst))
            .collect();
        let all = counted.iter().sum();
        if all == 0 && span.reference < DENSE_REFERENCE {
            // Nothing estimated or in the reference was called (the
            // program waited, or the agent's own threads ran): no rates
            // to learn, and the gap waits for the next burst.
            return;
        }
        let gap = self.pending_gap.take().unwrap_or_default();
        let burst_from = self.burst_from;
        for (e, &c) in self.chosen.iter_mut().zip(&counted) {
            let now = Rates::measure(c, all, &span);
            let gap = e.joined.take().map_or(gap, |j| burst_from.since(&j));
            let i = interpolate(e.last.as_ref().unwrap_or(&now), &now, &gap);
            extrapolate(w, e, &i, 0.0);
            e.learn(&now);
        }
    }

    /// The exit: the gap since the last burst (or the burst under way)
    /// is extrapolated, and every bound published.
    fn settle(&mut self, a: &Agent, records: &mut SegmentWriter) {
        let w = &a.segment.counters;
        let at: Vec<u64> = self.chosen.iter().map(|e| w.calls(e.entry.slot)).collect();
        let clock = read_clock(a, &self.reference);
        match self.phase {
            Phase::Watching => return,
            // An idle burst leaves its gap pending.
            Phase::Burst => self.close_burst(a, &clock, &at),
            Phase::Between => {
                let gap = clock.since(&self.gap_from);
                self.pending_gap = Some(match self.pending_gap.take() {
                    Some(g) => g.plus(&gap),
                    None => gap,
                });
            }
        }
        if let Some(gap) = self.pending_gap.take() {
            for e in &mut self.chosen {
                let Some(last) = e.last else { continue };
                let gap = e.joined.take().map_or(gap, |j| clock.since(&j));
                let i = interpolate(&last, &last, &gap);
                // Past the last burst no later burst bounds the change:
                // as uncertain, relatively, as the gaps so far, and at
                // least 2%.
                let so_far = if e.added > 0.0 {
                    e.error / e.added
                } else {
                    0.1
                };
                let more = i.calls * so_far.max(0.02);
                extrapolate(w, e, &i, more);
            }
        }
        self.gap_from = clock;
        self.phase = Phase::Between;
        self.publish_bounds(a, records, true);
        vlog!(
            "budget: {} functions counted in {} bursts ({:.2}% of the time), stops of {:.0} µs{}",
            self.chosen.len(),
            self.cycles,
            self.duty * 100.0,
            self.stop_ns / 1e3,
            if self.stubs_only {
                " (stubs' count switched)"
            } else {
                ""
            }
        );
    }

    /// Each estimate's bound, in hundredths of a percent of the estimate:
    /// the errors of its gaps, plus 1% of what was extrapolated (for
    /// change faster than a cycle). An estimate is published as
    /// [`PUBLISH_BOUND`] says (`last`: at exit); until then the function's
    /// count is what was counted, marked "at least".
    fn publish_bounds(&mut self, a: &Agent, w: &mut SegmentWriter, last: bool) {
        let c = &a.segment.counters;
        for e in &mut self.chosen {
            let estimate = e.counted(c.calls(e.entry.slot)) as f64 + e.added;
            let bound = e.bound();
            let rel = bound / estimate.max(1.0);
            let sure = if last {
                rel <= WIDEST_BOUND
            } else {
                bound <= PUBLISH_BOUND * e.added
            };
            let publish = !e.published && sure;
            let units = if e.published || publish {
                (rel * 10_000.0)
                    .ceil()
                    .clamp(1.0, (function_flags::AT_LEAST - 1) as f64) as u16
            } else {
                function_flags::AT_LEAST
            };
            // The bound first: a reader never sees the estimate's calls
            // marked "at least". (Its whole backlog lands in one of
            // rtprofd's spans.)
            w.set_estimated(e.entry.slot, Some(units));
            if publish {
                e.published = true;
                e.written = e.added as u64;
                c.add_calls(e.entry.slot, e.written);
            }
        }
    }
}

/// The program's progress now; allocates nothing.
fn read_clock(a: &Agent, reference: &[u32]) -> Clock {
    let w = &a.segment.counters;
    Clock {
        cpu: cpu_ns(),
        reference: reference.iter().map(|&s| w.calls(s)).sum(),
    }
}

impl Estimated {
    /// Takes a burst's rates as the latest and into the run's spread.
    fn learn(&mut self, r: &Rates) {
        if let Some(x) = r.per_reference {
            self.by_reference.add(x);
        }
        self.by_cpu.add(r.per_cpu_ns);
        self.last = Some(*r);
    }

    /// The calls actually counted, of `total` read from the segment.
    fn counted(&self, total: u64) -> u64 {
        total.saturating_sub(self.written)
    }

    /// The bound on the error of what was added, in calls: the errors of
    /// its gaps; the rate's deviation over the whole run, widened for
    /// the few bursts it comes from (Student's t), for all the progress
    /// no burst saw (a program's phases between bursts); and 1% of what
    /// was added.
    fn bound(&self) -> f64 {
        let unseen =
            self.by_reference.wide() * self.gaps.reference + self.by_cpu.wide() * self.gaps.cpu;
        self.error + unseen + 0.01 * self.added + 1.0
    }
}

/// Adds a gap's interpolated calls (fractional) to the function's
/// estimate, and to its count once that is published (carrying
/// fractions), and its error (plus `more`) to its bound.
fn extrapolate(w: &Counters, e: &mut Estimated, i: &Interpolated, more: f64) {
    e.added += i.calls.max(0.0);
    e.error += i.error + more;
    e.gaps = e.gaps.plus(&i.measured_in);
    if e.published {
        let n = (e.added as u64).saturating_sub(e.written);
        e.written += n;
        if n > 0 {
            w.add_calls(e.entry.slot, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(cpu: f64, reference: f64) -> Span {
        Span { cpu, reference }
    }

    #[test]
    fn steady_reference_ratios_interpolate_exactly() {
        // 3 calls per reference call in both bursts, however slowed.
        let a = Rates::measure(3000, 3000, &span(1e6, 1000.0));
        let b = Rates::measure(6000, 6000, &span(4e6, 2000.0));
        let i = interpolate(&a, &b, &span(1e8, 50_000.0));
        assert_eq!((i.calls, i.error), (150_000.0, 0.0));
        assert_eq!(i.measured_in, span(0.0, 50_000.0));
    }

    #[test]
    fn thin_reference_falls_back_to_cpu_time_between_its_limits() {
        let a = Rates::measure(1000, 1000, &span(1e6, 10.0));
        assert!(a.per_reference.is_none());
        // 1000 calls at most 4 ns each: at most 0.4% of the burst.
        assert!((a.most_cost - 0.004).abs() < 1e-12);
        let Interpolated {
            calls,
            error,
            measured_in,
        } = interpolate(&a, &a, &span(1e8, 5000.0));
        assert_eq!(measured_in, span(1e8, 0.0));
        let low = 1000.0 / 1e6 * 1e8;
        let high = low / 0.996;
        assert!((calls - (low + high) / 2.0).abs() < 1e-6, "{calls}");
        assert!((error - (high - low) / 2.0).abs() < 1e-6, "{error}");
    }

    #[test]
    fn spread_is_the_sample_deviation_and_the_mean_alone() {
        let mut s = Spread::default();
        s.add(4.0);
        assert_eq!(s.sd(), 4.0, "one value: as uncertain as itself");
        s.add(6.0);
        assert!((s.sd() - 2f64.sqrt()).abs() < 1e-12);
    }

    #[test]
    fn few_bursts_give_wide_deviations() {
        let mut s = Spread::default();
        s.add(4.0);
        s.add(6.0);
        assert_eq!(s.t95(), 12.71, "two values");
        for _ in 0..40 {
            s.add(5.0);
        }
        assert_eq!(s.t95(), 2.0, "many");
    }

    #[test]
    fn changing_rates_widen_the_error() {
        let a = Rates::measure(1000, 1000, &span(1e6, 1000.0));
        let b = Rates::measure(3000, 3000, &span(1e6, 1000.0));
        let Interpolated { calls, error, .. } = interpolate(&a, &b, &span(1e8, 10_000.0));
        assert_eq!(calls, 20_000.0);
        assert_eq!(error, 10_000.0);
    }
}
