//! The segments the daemon follows, and how many any sender may hold. A
//! process image has one segment: a pid that registers again replaces its
//! earlier registration, except that an image replaced by exec keeps its
//! segment for one last span. A few registrations per pid are kept until
//! a tick sorts them out; beyond that the oldest goes at once. Each user
//! may hold a share of the table, never all of it, so there is always room
//! for other users' new processes.

use crate::error::Error;
use crate::log::{Kind, Limiter};
use crate::registry::{
    Charge, ExeError, Mapped, Registered, RouteRequest, SwitchRequest, UNVERIFIED_EXE,
};
use crate::slots::Slots;
use crate::spans::{self, Tracked};
use rtprof_abi::layout::{control, state};
use rtprof_abi::present::ProcRows;
use rtprof_abi::route::RequestState;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Instant;

/// Registrations kept per pid until a tick settles which image each is:
/// the live one and images replaced by exec within one tick.
pub const PER_PID: usize = 8;
/// Ticks a segment may stay unwritten (an agent still starting).
const UNFILLED_TICKS: u32 = 50;
/// Switch requests waiting for one agent; more are refused.
const MAX_PENDING: usize = 16;

#[derive(Clone, Copy, Debug)]
pub struct Caps {
    pub per_user: usize,
    pub total: usize,
    /// Bytes the segments of one user may have read each tick, counted
    /// in the pages those reads touch (`--read-mib-per-user`).
    pub read_per_user: u64,
}

/// What each user's segments have read each tick, against their budget.
#[derive(Default)]
struct Budget {
    per_user: u64,
    held: HashMap<u32, u64>,
}

impl Budget {
    /// Charges `new` bytes for a segment of `uid` that was charged
    /// `*charge` so far, if the user stays within the budget.
    fn take(&mut self, uid: u32, charge: &mut u64, new: u64) -> Result<(), Error> {
        let held = self.held.get(&uid).copied().unwrap_or(0) - *charge;
        if held.saturating_add(new) > self.per_user {
            return Err(Error::OverBudget {
                charge: new,
                held,
                budget: self.per_user,
            });
        }
        self.held.insert(uid, held + new);
        *charge = new;
        Ok(())
    }

    /// Gives back what a segment of `uid` was charged.
    fn give_back(&mut self, uid: u32, charge: u64) {
        if let Some(n) = self.held.get_mut(&uid) {
            *n -= charge;
            if *n == 0 {
                self.held.remove(&uid);
            }
        }
    }
}

/// Why a registration was not taken.
#[derive(Debug)]
pub enum RegistrationRefusal {
    /// Its user holds as many segments as a user may.
    UserCap { held: usize },
    /// The daemon follows as many segments as it may.
    Full { held: usize },
    /// The segment itself cannot be followed.
    Segment(Error),
}

impl std::fmt::Display for RegistrationRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistrationRefusal::UserCap { held } => write!(
                f,
                "registration refused: this user already has {held} segments followed (the limit)"
            ),
            RegistrationRefusal::Full { held } => write!(
                f,
                "registration refused: {held} segments followed in all (the limit)"
            ),
            RegistrationRefusal::Segment(e) => write!(f, "segment rejected: {e}"),
        }
    }
}

/// A registration taken, and whether it pushed out an earlier one of its
/// pid (the pid had [`PER_PID`]).
#[derive(Debug)]
pub struct Admitted {
    pub replaced: bool,
}

/// A segment being followed.
struct Entry {
    /// The sender, from the socket's credentials.
    pid: u32,
    uid: u32,
    /// Its executable, from the kernel at registration, or
    /// [`UNVERIFIED_EXE`] and why.
    exe: String,
    unverified: Option<ExeError>,
    /// The claim (see [`Tracked::claimed`]) last logged.
    logged_claim: Option<String>,
    map: Mapped,
    /// Bytes its reads touch each tick, charged to its user.
    charge: u64,
    tracked: Option<Tracked>,
    /// Ticks it has stayed unreadable (an agent still starting).
    unfilled: u32,
    /// Switch requests for its agent, oldest first: (on, pattern).
    pending: VecDeque<(bool, String)>,
    /// A route request whose answer is not collected yet: no switch is
    /// relayed over it (it would overwrite the answer).
    route_waiting: bool,
    /// A route request that was withdrawn before its agent took it: until
    /// the agent answers it (as withdrawn), the segment takes no other.
    withdrawn: Option<u32>,
}

impl Entry {
    /// Reads the segment at `now`: `Ok(None)` while the agent is still
    /// filling it in.
    fn observe(
        &mut self,
        now: u64,
        span_ns: u64,
        thread_top: usize,
        slots: &mut Slots,
        scratch: &mut spans::Counts,
        budget: &mut Budget,
    ) -> Result<Option<spans::Seen>, Error> {
        let Some(bytes) = self.map.look() else {
            return Ok(None);
        };
        let h = rtprof_abi::read_header(bytes).map_err(Error::Unreadable)?;
        self.map.check_size(&h)?;
        // Nothing but the header is read before every page the reads
        // touch is known to have memory, within the user's budget.
        match self.map.charge(&h)? {
            Charge::Unchanged => {}
            Charge::NotYet => return Ok(None),
            Charge::Resident(bytes) => budget.take(self.uid, &mut self.charge, bytes)?,
        }
        let Some(bytes) = self.map.bytes() else {
            return Ok(None);
        };
        let seen = match &mut self.tracked {
            Some(t) => t.observe(bytes, &h, now, span_ns, slots, scratch),
            None => Tracked::new(bytes, &h, &self.exe, now, span_ns, slots, scratch).map(
                |(mut t, seen)| {
                    if thread_top > 0 {
                        t.follow_threads(thread_top, (bytes, &h), (now, span_ns), scratch);
                    }
                    self.tracked = Some(t);
                    seen
                },
            ),
        };
        // One switch request at a time, once the agent answered the last
        // (and its answer, a route's, was collected).
        if let Some((on, pattern)) = self.pending.front().filter(|_| !self.route_waiting) {
            let kind = if *on { control::ON } else { control::OFF };
            if !self.map.takes_requests(&h) || self.map.request(kind, pattern.as_bytes()).is_some()
            {
                self.pending.pop_front();
            }
        }
        match seen {
            Ok(s) => {
                self.unfilled = 0;
                Ok(Some(s))
            }
            // Folds kept the counters moving: not this tick. A process
            // that keeps them so is dropped like one never filled in.
            Err(rtprof_abi::SegmentError::Busy) => Ok(None),
            // Still starting: filled in but not yet consistent.
            Err(_) if self.tracked.is_none() && h.state == state::STARTING => Ok(None),
            Err(e) => Err(Error::Unreadable(e)),
        }
    }

    fn start_ns(&self) -> Option<u64> {
        self.tracked.as_ref().map(|t| t.start_ns)
    }
}

/// Whether process `pid` runs (or is stopped): not a zombie, which has
/// ended though its parent has not reaped it yet.
fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only asks whether the process exists; errno is
    // this thread's.
    let exists =
        unsafe { libc::kill(pid as i32, 0) == 0 || *libc::__errno_location() == libc::EPERM };
    exists && !crate::routes::ProcState::of(pid).ended()
}

pub struct Table {
    caps: Caps,
    /// By admission order.
    entries: BTreeMap<u64, Entry>,
    next: u64,
    /// Each sender pid's entries, oldest first.
    by_pid: HashMap<u32, Vec<u64>>,
    by_uid: HashMap<u32, usize>,
    /// Segments refused or dropped as unreadable or not the sender's.
    pub rejected: u64,
    /// Row ids of the followed processes' functions.
    /// Rows per live thread: each thread's this many hottest functions
    /// (`--thread-rows`; 0: none).
    thread_top: usize,
    slots: Slots,
    /// What each process's counters are read into, in turn.
    scratch: spans::Counts,
    budget: Budget,
}

impl Table {
    pub fn new(caps: Caps) -> Table {
        Table {
            caps: Caps {
                // One user never fills the table.
                per_user: caps.per_user.min(caps.total / 2).max(1),
                total: caps.total.max(2),
                read_per_user: caps.read_per_user,
            },
            entries: BTreeMap::new(),
            next: 0,
            by_pid: HashMap::new(),
            by_uid: HashMap::new(),
            rejected: 0,
            thread_top: 0,
            slots: Slots::default(),
            scratch: spans::Counts::default(),
            budget: Budget {
                per_user: caps.read_per_user,
                held: HashMap::new(),
            },
        }
    }

    /// Publishes each live thread's `top` hottest functions too, for
    /// processes followed from now on (0: none).
    pub fn set_thread_rows(&mut self, top: usize) {
        self.thread_top = top;
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Takes a registration if its user and the table have room (a pid at
    /// [`PER_PID`] makes room by dropping its oldest), mapping its segment
    /// and closing its descriptor: a followed segment holds no descriptor.
    pub fn admit(&mut self, reg: Registered) -> Result<Admitted, RegistrationRefusal> {
        let victim = self.by_pid.get(&reg.pid).and_then(|seqs| {
            (seqs.len() >= PER_PID).then(|| {
                // Never read is least likely to be the live image.
                *seqs
                    .iter()
                    .find(|s| self.entries[s].tracked.is_none())
                    .unwrap_or(&seqs[0])
            })
        });
        let frees_own = victim.is_some_and(|v| self.entries[&v].uid == reg.uid);
        let held = self.by_uid.get(&reg.uid).copied().unwrap_or(0) - frees_own as usize;
        if held >= self.caps.per_user {
            return Err(RegistrationRefusal::UserCap { held });
        }
        if victim.is_none() && self.entries.len() >= self.caps.total {
            return Err(RegistrationRefusal::Full {
                held: self.entries.len(),
            });
        }
        let refused = |t: &mut Table, e| {
            t.rejected += 1;
            RegistrationRefusal::Segment(e)
        };
        let mut map = Mapped::open(&reg.fd).map_err(|e| refused(self, e))?;
        // While its descriptor is at hand (see `Mapped::verify`).
        let verified = map.verify(&reg.fd).map_err(|e| refused(self, e))?;
        if let Some(v) = victim {
            self.remove(v);
        }
        let mut charge = 0;
        if let Some(bytes) = verified {
            self.budget
                .take(reg.uid, &mut charge, bytes)
                .map_err(|e| refused(self, e))?;
        }
        let seq = self.next;
        self.next += 1;
        self.entries.insert(
            seq,
            Entry {
                pid: reg.pid,
                uid: reg.uid,
                exe: reg.exe.as_deref().unwrap_or(UNVERIFIED_EXE).to_string(),
                unverified: reg.exe.err(),
                logged_claim: None,
                map,
                charge,
                tracked: None,
                unfilled: 0,
                pending: VecDeque::new(),
                route_waiting: false,
                withdrawn: None,
            },
        );
        self.by_pid.entry(reg.pid).or_default().push(seq);
        *self.by_uid.entry(reg.uid).or_default() += 1;
        Ok(Admitted {
            replaced: victim.is_some(),
        })
    }

    /// The entry of followed process `pid` whose segment takes a request
    /// from user `uid` (its own user or root): the newest registration of
    /// the pid, its running image.
    fn requestable(&mut self, uid: u32, pid: u32) -> Result<u64, Error> {
        let key = self
            .by_pid
            .get(&pid)
            .and_then(|seqs| seqs.last())
            .copied()
            .ok_or(Error::NotFollowed { pid })?;
        let e = self
            .entries
            .get_mut(&key)
            .ok_or(Error::NotFollowed { pid })?;
        if uid != 0 && uid != e.uid {
            return Err(Error::OtherUser { pid });
        }
        // A request may come before the first tick has read the segment.
        let h = e
            .map
            .look()
            .and_then(|b| rtprof_abi::read_header(b).ok())
            .ok_or(Error::Starting { pid })?;
        if !e.map.takes_requests(&h) {
            return Err(Error::NoRelay { pid });
        }
        Ok(key)
    }

    /// Queues a request to switch counting in a followed process, from
    /// its own user or root: what to tell the requester.
    pub fn switch(&mut self, req: &SwitchRequest) -> Result<String, Error> {
        let pid = req.pid;
        let key = self.requestable(req.from.uid, pid)?;
        let e = self
            .entries
            .get_mut(&key)
            .ok_or(Error::NotFollowed { pid })?;
        let t = e.tracked.as_ref().ok_or(Error::Starting { pid })?;
        if t.ended {
            return Err(Error::Ended { pid });
        }
        let n = t.matching(&req.pattern, &self.slots);
        if n == 0 {
            return Err(Error::NoMatch {
                pid,
                pattern: req.pattern.clone(),
            });
        }
        if e.pending.len() >= MAX_PENDING {
            return Err(Error::Backlog {
                pid,
                waiting: MAX_PENDING,
            });
        }
        e.pending.push_back((req.on, req.pattern.clone()));
        Ok(format!(
            "pid {pid}: counting of {n} function(s) matching {:?} switched {} by its agent within a second (its drain or budget thread applies it)",
            req.pattern,
            if req.on { "on" } else { "off" }
        ))
    }

    /// Relays a request to route the calls of `req.function` to
    /// `req.implementation` to the process's agent, with the checks of
    /// [`Table::switch`], to be carried out only if its agent takes it
    /// before `expires_ns` ([`rtprof_abi::route::monotonic_ns`]); returns
    /// what to ask [`Table::route_state`] for. A process that is stopped
    /// is refused (its agent could not take it), a zombie is ended.
    pub fn route(&mut self, req: &RouteRequest, expires_ns: u64) -> Result<(u64, u32), Error> {
        use crate::routes::ProcState;
        let pid = req.pid;
        let key = self.requestable(req.from.uid, pid)?;
        let e = self
            .entries
            .get_mut(&key)
            .ok_or(Error::NotFollowed { pid })?;
        if e.tracked.as_ref().is_some_and(|t| t.ended) {
            return Err(Error::Ended { pid });
        }
        match ProcState::of(pid) {
            s if s.ended() => {
                if let Some(t) = &mut e.tracked {
                    t.ended = true;
                }
                return Err(Error::Ended { pid });
            }
            ProcState::Stopped { traced } => return Err(Error::Stopped { pid, traced }),
            _ => {}
        }
        if !e.pending.is_empty() {
            return Err(Error::Busy { pid });
        }
        let bytes =
            rtprof_abi::route::segment_request(&req.function, &req.implementation, expires_ns)
                .ok_or(Error::BadNames { pid })?;
        let Some(seq) = e.map.request(control::ROUTE, &bytes) else {
            return Err(match e.withdrawn {
                Some(_) => Error::Unserved { pid },
                None => Error::Busy { pid },
            });
        };
        e.withdrawn = None;
        e.route_waiting = true;
        Ok((key, seq))
    }

    /// Where route request `seq` of entry `key`, expiring at
    /// `expires_ns`, stands (see [`rtprof_abi::route::request_state`]); an
    /// error if the process is no longer followed. With `giving_up`, or
    /// once it is settled (answered, withdrawn), switches may be relayed
    /// again.
    pub fn route_state(
        &mut self,
        key: u64,
        seq: u32,
        pid: u32,
        expires_ns: u64,
        giving_up: bool,
    ) -> Result<RequestState, Error> {
        let e = self.entries.get_mut(&key).ok_or(Error::Ended { pid })?;
        let state = match (e.map.answer(seq), e.map.bytes()) {
            (Some(code), _) => RequestState::Answered(code),
            (None, Some(b)) => rtprof_abi::route::request_state(b, seq, expires_ns),
            (None, None) => RequestState::Replaced,
        };
        if giving_up || !matches!(state, RequestState::Waiting | RequestState::Taken) {
            e.route_waiting = false;
        }
        if state == RequestState::Withdrawn {
            e.withdrawn = Some(seq);
        }
        Ok(state)
    }

    fn remove(&mut self, seq: u64) -> Option<Entry> {
        let mut e = self.entries.remove(&seq)?;
        self.budget.give_back(e.uid, e.charge);
        if let Some(t) = &mut e.tracked {
            t.release(&mut self.slots);
        }
        if let Some(seqs) = self.by_pid.get_mut(&e.pid) {
            seqs.retain(|&s| s != seq);
            if seqs.is_empty() {
                self.by_pid.remove(&e.pid);
            }
        }
        if let Some(n) = self.by_uid.get_mut(&e.uid) {
            *n -= 1;
            if *n == 0 {
                self.by_uid.remove(&e.uid);
            }
        }
        Some(e)
    }

    /// Reads every segment at `now` (wall-clock ns), drops the bad ones,
    /// and settles each pid's registrations: one per image, and images
    /// replaced by exec marked ended.
    pub fn observe(&mut self, now: u64, span_ns: u64, log: &mut Limiter) {
        let t = Instant::now();
        let mut gone = Vec::new();
        for (&seq, e) in &mut self.entries {
            let top = self.thread_top;
            let seen = match e.observe(
                now,
                span_ns,
                top,
                &mut self.slots,
                &mut self.scratch,
                &mut self.budget,
            ) {
                Ok(Some(s)) => s,
                Ok(None) if e.unfilled < UNFILLED_TICKS => {
                    e.unfilled += 1;
                    continue;
                }
                Ok(None) => {
                    log.log(Some(e.uid), Kind::Segment, t, || {
                        format!(
                            "rtprofd: pid {} (uid {}): segment never filled in; dropped",
                            e.pid, e.uid
                        )
                    });
                    gone.push(seq);
                    continue;
                }
                Err(err) => {
                    log.log(Some(e.uid), Kind::Segment, t, || {
                        format!(
                            "rtprofd: pid {} (uid {}): segment rejected: {err}",
                            e.pid, e.uid
                        )
                    });
                    gone.push(seq);
                    continue;
                }
            };
            // A process may only speak for itself.
            if seen.pid != e.pid {
                log.log(Some(e.uid), Kind::Segment, t, || {
                    format!(
                        "rtprofd: pid {} registered a segment of pid {} ({}); rejected",
                        e.pid,
                        seen.pid,
                        e.tracked.as_ref().map_or("?", |t| t.exe.as_str())
                    )
                });
                gone.push(seq);
                continue;
            }
            let tr = e.tracked.as_mut().unwrap();
            if tr.claimed.is_some() && tr.claimed != e.logged_claim {
                log.log(Some(e.uid), Kind::Claim, t, || {
                    let claim = tr.claimed.as_deref().unwrap_or_default();
                    match &e.unverified {
                        None => format!(
                            "rtprofd: pid {} (uid {}): its segment claims executable {claim:?}; published as the kernel's {:?}",
                            e.pid, e.uid, tr.exe
                        ),
                        Some(why) => format!(
                            "rtprofd: pid {} (uid {}): its segment claims executable {claim:?}; published as {UNVERIFIED_EXE}: {why}",
                            e.pid, e.uid
                        ),
                    }
                });
                e.logged_claim = tr.claimed.clone();
            }
            // One that counted this tick was alive in it: asked next
            // time (a system call per process per tick adds up).
            if seen.state == state::EXITED || (!seen.moved && !alive(seen.pid)) {
                tr.ended = true;
            }
        }
        self.rejected += gone.len() as u64;
        for seq in gone {
            self.remove(seq);
        }
        self.settle(log, t);
    }

    /// One registration per image: of a pid's registrations, an image older
    /// than its newest has been replaced by exec (ended, so published once
    /// more); a registration superseded by a later one of the same image,
    /// or never filled in while a later one came, is dropped.
    fn settle(&mut self, log: &mut Limiter, t: Instant) {
        let (mut superseded, mut replaced_by_exec) = (Vec::new(), Vec::new());
        for seqs in self.by_pid.values().filter(|s| s.len() > 1) {
            let newest = seqs.iter().filter_map(|s| self.entries[s].start_ns()).max();
            for (k, s) in seqs.iter().enumerate() {
                let later = &seqs[k + 1..];
                match self.entries[s].start_ns() {
                    None if !later.is_empty() => superseded.push(*s),
                    None => {}
                    Some(start)
                        if later
                            .iter()
                            .any(|l| self.entries[l].start_ns() == Some(start)) =>
                    {
                        superseded.push(*s)
                    }
                    Some(start) if Some(start) < newest => replaced_by_exec.push(*s),
                    Some(_) => {}
                }
            }
        }
        for s in replaced_by_exec {
            if let Some(t) = self.entries.get_mut(&s).and_then(|e| e.tracked.as_mut()) {
                t.ended = true;
            }
        }
        for s in superseded {
            if let Some(e) = self.remove(s) {
                log.log(Some(e.uid), Kind::Replaced, t, || {
                    format!(
                        "rtprofd: pid {} (uid {}): registered again; the earlier registration is dropped",
                        e.pid, e.uid
                    )
                });
            }
        }
    }

    /// Each followed process's table for the span.
    pub fn tables(&self) -> Vec<ProcRows<'_>> {
        self.tracked().map(Tracked::table).collect()
    }

    /// The names of the rows the followed processes hold.
    pub fn slots(&self) -> &Slots {
        &self.slots
    }

    /// Every process read at least once.
    pub fn tracked(&self) -> impl Iterator<Item = &Tracked> {
        self.entries.values().filter_map(|e| e.tracked.as_ref())
    }

    /// Drops the processes that ended (published once more since).
    pub fn drop_ended(&mut self) {
        let ended: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| e.tracked.as_ref().is_some_and(|t| t.ended))
            .map(|(&s, _)| s)
            .collect();
        for s in ended {
            self.remove(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtprof_abi::layout::{Capacities, Layout};
    use rtprof_abi::SegmentWriter;
    use std::cell::RefCell;
    use std::os::fd::AsRawFd;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::rc::Rc;
    use std::time::Duration;

    /// A memfd holding `bytes`, sealed against shrinking if `seal`.
    fn memfd(bytes: &[u8], seal: bool) -> OwnedFd {
        // SAFETY: plain system calls on a descriptor we create and own.
        unsafe {
            let fd = libc::memfd_create(
                rtprof_abi::protocol::SEGMENT_MEMFD.as_ptr(),
                libc::MFD_ALLOW_SEALING,
            );
            assert!(fd >= 0);
            let n = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
            assert_eq!(n, bytes.len() as isize);
            if seal {
                assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
            }
            OwnedFd::from_raw_fd(fd)
        }
    }

    /// A complete, running segment of `pid` started at `start_ns`.
    fn segment(pid: u32, start_ns: u64) -> Vec<u8> {
        let layout = Layout::new(Capacities {
            modules: 1,
            functions: 4,
            strings: 64,
            stripes: 1,
        });
        let mut mem = vec![0u64; layout.total_size as usize / 8];
        // SAFETY: `mem` is the layout's size, 8-aligned, and outlives `w`.
        let mut w =
            unsafe { SegmentWriter::init(mem.as_mut_ptr().cast(), layout, pid, 1, start_ns) };
        w.set_exe(b"/bin/app").unwrap();
        w.counters().set_state(state::RUNNING);
        mem.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    fn reg(bytes: &[u8], pid: u32, uid: u32) -> Registered {
        Registered {
            fd: memfd(bytes, true),
            pid,
            uid,
            exe: Ok("/bin/app".into()),
        }
    }

    fn quiet() -> (Limiter, Rc<RefCell<Vec<String>>>) {
        let seen = Rc::new(RefCell::new(Vec::new()));
        let sink = seen.clone();
        let l = Limiter::new(
            100,
            Duration::from_secs(10),
            Box::new(move |l| sink.borrow_mut().push(l.to_string())),
        );
        (l, seen)
    }

    const CAPS: Caps = Caps {
        read_per_user: 1 << 30,
        per_user: 100,
        total: 1000,
    };
    const S: u64 = 1_000_000_000;

    #[test]
    fn a_pid_keeps_a_few_registrations_then_one() {
        let mut t = Table::new(CAPS);
        let me = std::process::id();
        let mut replaced = 0;
        for _ in 0..50 {
            replaced += t.admit(reg(&[0; 4096], me, 0)).unwrap().replaced as usize;
        }
        assert_eq!((t.len(), replaced), (PER_PID, 50 - PER_PID));
        // The newest is complete: every earlier one of the pid goes.
        t.admit(reg(&segment(me, 5), me, 0)).unwrap();
        let (mut log, seen) = quiet();
        t.observe(100 * S, 5 * S, &mut log);
        assert_eq!(t.len(), 1);
        assert_eq!(t.tables().len(), 1);
        assert_eq!(seen.borrow().len(), PER_PID - 1, "{:?}", seen.borrow());
        assert!(seen.borrow()[0].contains("registered again"));
    }

    #[test]
    fn an_image_replaced_by_exec_has_one_last_span() {
        let mut t = Table::new(CAPS);
        let me = std::process::id();
        let (mut log, _) = quiet();
        t.admit(reg(&segment(me, 5), me, 0)).unwrap();
        t.observe(100 * S, 5 * S, &mut log);
        // The same image again replaces it; a later image ends it.
        t.admit(reg(&segment(me, 5), me, 0)).unwrap();
        t.observe(101 * S, 5 * S, &mut log);
        assert_eq!(t.len(), 1);
        t.admit(reg(&segment(me, 9), me, 0)).unwrap();
        t.observe(102 * S, 5 * S, &mut log);
        let ended: Vec<bool> = t.tables().iter().map(|p| p.ended).collect();
        assert_eq!(ended, [true, false]);
        t.drop_ended();
        assert_eq!(t.len(), 1);
        assert!(!t.tables()[0].ended);
    }

    #[test]
    fn each_user_holds_at_most_its_share() {
        // Asked for all 10: a user gets half.
        let mut t = Table::new(Caps {
            read_per_user: 1 << 30,
            per_user: 10,
            total: 10,
        });
        for pid in 1..=5 {
            t.admit(reg(&[0; 4096], pid, 7)).unwrap();
        }
        let r = t.admit(reg(&[0; 4096], 6, 7));
        assert!(
            matches!(r, Err(RegistrationRefusal::UserCap { held: 5 })),
            "{r:?}"
        );
        // Not even from a pid it already has.
        t.admit(reg(&[0; 4096], 1, 7)).unwrap_err();
        for pid in 11..=15 {
            t.admit(reg(&[0; 4096], pid, 8)).unwrap();
        }
        let r = t.admit(reg(&[0; 4096], 16, 9));
        assert!(
            matches!(r, Err(RegistrationRefusal::Full { held: 10 })),
            "{r:?}"
        );
    }

    #[test]
    fn a_pid_at_its_limit_replaces_its_own_even_at_the_users_cap() {
        let mut t = Table::new(Caps {
            read_per_user: 1 << 30,
            per_user: PER_PID,
            total: 1000,
        });
        for _ in 0..PER_PID {
            t.admit(reg(&[0; 4096], 1, 7)).unwrap();
        }
        assert!(t.admit(reg(&[0; 4096], 2, 7)).is_err());
        assert!(t.admit(reg(&[0; 4096], 1, 7)).unwrap().replaced);
        assert_eq!(t.len(), PER_PID);
    }

    #[test]
    fn an_unsealed_file_is_refused_and_costs_no_room() {
        let mut t = Table::new(CAPS);
        let r = t.admit(Registered {
            fd: memfd(&[0; 4096], false),
            pid: 1,
            uid: 0,
            exe: Ok("/bin/app".into()),
        });
        assert!(
            matches!(&r, Err(RegistrationRefusal::Segment(Error::NotSealed))),
            "{r:?}"
        );
        assert_eq!(t.len(), 0);
    }

    /// A memfd of `bytes`' length holding only its non-zero pages, sealed.
    fn sparse(bytes: &[u8]) -> OwnedFd {
        // SAFETY: plain system calls on a descriptor we create and own;
        // every write is from inside `bytes`.
        unsafe {
            let fd = libc::memfd_create(
                rtprof_abi::protocol::SEGMENT_MEMFD.as_ptr(),
                libc::MFD_ALLOW_SEALING,
            );
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, bytes.len() as i64), 0);
            for (i, page) in bytes.chunks(4096).enumerate() {
                if page.iter().any(|&b| b != 0) {
                    let n = libc::pwrite(fd, page.as_ptr().cast(), page.len(), i as i64 * 4096);
                    assert_eq!(n, page.len() as isize);
                }
            }
            assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
            OwnedFd::from_raw_fd(fd)
        }
    }

    fn blocks(fd: &OwnedFd) -> i64 {
        // SAFETY: stat is plain data; fstat writes only it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let fd = fd.as_raw_fd();
        // SAFETY: `st` is valid for writes; fstat reads only the descriptor.
        assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
        st.st_blocks
    }

    /// A running segment of this process with room for 4,096 functions,
    /// whose header claims them all, as bytes.
    fn claiming_4096() -> Vec<u8> {
        let layout = Layout::new(Capacities {
            modules: 1,
            functions: 4096,
            strings: 64,
            stripes: 1,
        });
        let me = std::process::id();
        let mut mem = vec![0u64; layout.total_size as usize / 8];
        // SAFETY: `mem` is the layout's size, 8-aligned, and outlives `w`.
        let mut w = unsafe { SegmentWriter::init(mem.as_mut_ptr().cast(), layout, me, 1, 5) };
        w.set_exe(b"/bin/app").unwrap();
        w.add_module(b"/bin/app", 0).unwrap();
        w.counters().set_state(state::RUNNING);
        let mut bytes: Vec<u8> = mem.iter().flat_map(|w| w.to_le_bytes()).collect();
        let at = std::mem::offset_of!(rtprof_abi::layout::Header, func_count);
        bytes[at..at + 4].copy_from_slice(&4096u32.to_le_bytes());
        bytes
    }

    fn registered(fd: &OwnedFd) -> Registered {
        Registered {
            fd: fd.try_clone().unwrap(),
            pid: std::process::id(),
            uid: 0,
            exe: Ok("/bin/app".into()),
        }
    }

    #[test]
    fn counters_published_without_memory_are_refused_unread() {
        // 4,096 functions claimed, their records, samples and counters
        // never written: holes.
        let bytes = claiming_4096();
        let fd = sparse(&bytes);
        let before = blocks(&fd);
        let mut t = Table::new(CAPS);
        // At registration, when the header is there.
        let e = t.admit(registered(&fd)).unwrap_err();
        assert!(e.to_string().contains("never gave memory"), "{e}");
        assert_eq!((t.len(), t.rejected), (0, 1));
        // Or on reading, when it comes later.
        let page = 4096;
        let late = sparse(&vec![0; bytes.len()]);
        t.admit(registered(&late)).unwrap();
        // SAFETY: writes the header page into our own file.
        let n = unsafe { libc::pwrite(late.as_raw_fd(), bytes.as_ptr().cast(), page, 0) };
        assert_eq!(n, page as isize);
        let (mut log, seen) = quiet();
        for i in 0..crate::registry::ABSENT_TICKS as u64 {
            assert_eq!(t.len(), 1);
            t.observe((100 + i) * S, 5 * S, &mut log);
        }
        assert_eq!(t.len(), 0);
        let seen = seen.borrow();
        assert!(
            seen.iter().any(|l| l.contains("never gave memory")),
            "{seen:?}"
        );
        assert_eq!(blocks(&fd), before, "reading gave the file memory");
        assert_eq!(blocks(&late), 8, "reading gave the file memory");
        assert!(t.budget.held.is_empty());
    }

    /// As the agent of a forked child leaves its segment: counters
    /// allocated (fallocate) but never written, which `mincore` calls
    /// absent.
    #[test]
    fn counters_allocated_but_never_written_are_followed() {
        let layout = Layout::new(Capacities {
            modules: 1,
            functions: 4096,
            strings: 8 * 4096,
            stripes: 1,
        });
        let mut mem = vec![0u64; layout.total_size as usize / 8];
        // SAFETY: `mem` is the layout's size, 8-aligned, and outlives `w`.
        let mut w = unsafe {
            SegmentWriter::init(mem.as_mut_ptr().cast(), layout, std::process::id(), 1, 5)
        };
        w.set_exe(b"/bin/app").unwrap();
        w.add_module(b"/bin/app", 0).unwrap();
        for f in 0..4096u64 {
            w.add_function(format!("f{f}").as_bytes(), 16 * f, 16)
                .unwrap();
        }
        w.counters().set_state(state::RUNNING);
        // Records and names written; samples and counters all zero, so
        // holes in the file, then allocated only.
        let bytes: Vec<u8> = mem.iter().flat_map(|w| w.to_le_bytes()).collect();
        let h = rtprof_abi::read_header(&bytes).unwrap();
        let fd = sparse(&bytes);
        for (off, len) in [(h.samples_off, 4096 * 8), (h.stripes_off, 4096 * 8)] {
            // SAFETY: allocates blocks of our own file.
            let r = unsafe { libc::fallocate(fd.as_raw_fd(), 0, off as i64, len) };
            assert_eq!(r, 0);
        }
        let mut t = Table::new(CAPS);
        t.admit(registered(&fd)).unwrap();
        assert!(t.budget.held[&0] >= 2 * 4096 * 8);
        let (mut log, seen) = quiet();
        for i in 0..5 {
            t.observe((100 + i) * S, 5 * S, &mut log);
        }
        assert_eq!(t.len(), 1, "{:?}", seen.borrow());
    }

    #[test]
    fn what_a_users_segments_have_read_is_bounded() {
        let me = std::process::id();
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let (mut log, _) = quiet();
        // What one segment's reads touch, charged at registration.
        let mut t = Table::new(CAPS);
        t.admit(reg(&segment(me, 5), me, 7)).unwrap();
        let one = t.budget.held[&7];
        assert!((4096..=4 * 4096).contains(&one), "{one}");
        t.observe(100 * S, 5 * S, &mut log);
        assert_eq!(t.budget.held[&7], one);
        // Room for one and a half: the second of the same user is refused,
        // another user's is not.
        let mut t = Table::new(Caps {
            read_per_user: one + one / 2,
            ..CAPS
        });
        t.admit(reg(&segment(me, 5), me, 7)).unwrap();
        let e = t
            .admit(reg(&segment(other.id(), 5), other.id(), 7))
            .unwrap_err();
        assert!(e.to_string().contains("--read-mib-per-user"), "{e}");
        t.observe(100 * S, 5 * S, &mut log);
        assert_eq!(t.len(), 1);
        assert_eq!(t.budget.held[&7], one);
        t.admit(reg(&segment(other.id(), 5), other.id(), 8))
            .unwrap();
        t.observe(101 * S, 5 * S, &mut log);
        assert_eq!(t.len(), 2);
        assert_eq!(t.budget.held[&8], one);
        let _ = other.kill();
        let _ = other.wait();
    }
}
