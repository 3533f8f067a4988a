//! Rate-limited logging. Anyone may connect to the daemon, so anyone can
//! make it refuse things as fast as they like; they must not fill its log
//! (or block it on a full stderr pipe). Each user may print a few lines of
//! each kind per interval; the rest are counted, and one summary line says
//! how many were suppressed once the interval is over.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What a message is about; each kind has its own allowance.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Kind {
    /// A connection closed without a registration read from it: idle past
    /// its deadline, making room for the user's newer ones, or garbage.
    Connection,
    /// A segment refused, or dropped for what it holds.
    Segment,
    /// A registration that took the place of an earlier one of its pid.
    Replaced,
    /// A registration refused because its user, or the daemon, is full.
    Cap,
    /// A segment naming an executable other than the kernel's.
    Claim,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Connection => "connection",
            Kind::Segment => "bad-segment",
            Kind::Replaced => "re-registration",
            Kind::Cap => "over-limit",
            Kind::Claim => "claim",
        }
    }
}

/// One (user, kind)'s current interval.
struct Window {
    start: Instant,
    printed: u32,
    suppressed: u64,
}

pub struct Limiter {
    /// Lines each (user, kind) may print per interval.
    lines: u32,
    interval: Duration,
    windows: HashMap<(Option<u32>, Kind), Window>,
    out: Box<dyn FnMut(&str)>,
}

impl Limiter {
    /// A limiter writing to stderr.
    pub fn to_stderr(lines: u32, interval: Duration) -> Limiter {
        Limiter::new(lines, interval, Box::new(|l| eprintln!("{l}")))
    }

    pub fn new(lines: u32, interval: Duration, out: Box<dyn FnMut(&str)>) -> Limiter {
        Limiter {
            lines,
            interval,
            windows: HashMap::new(),
            out,
        }
    }

    /// Prints `msg` (made only if printed) unless `uid` (`None`: the
    /// daemon itself) used up its allowance of `kind` for this interval.
    pub fn log(
        &mut self,
        uid: Option<u32>,
        kind: Kind,
        now: Instant,
        msg: impl FnOnce() -> String,
    ) {
        let key = (uid, kind);
        if self
            .windows
            .get(&key)
            .is_some_and(|w| now.duration_since(w.start) >= self.interval)
        {
            let w = self.windows.remove(&key).unwrap();
            self.summarise(key, &w);
        }
        let w = self.windows.entry(key).or_insert(Window {
            start: now,
            printed: 0,
            suppressed: 0,
        });
        if w.printed < self.lines {
            w.printed += 1;
            (self.out)(&msg());
        } else {
            w.suppressed += 1;
        }
    }

    /// Ends the intervals that are over, summarising what they suppressed.
    pub fn flush(&mut self, now: Instant) {
        let over: Vec<_> = self
            .windows
            .iter()
            .filter(|(_, w)| now.duration_since(w.start) >= self.interval)
            .map(|(k, _)| *k)
            .collect();
        for key in over {
            let w = self.windows.remove(&key).unwrap();
            self.summarise(key, &w);
        }
    }

    fn summarise(&mut self, (uid, kind): (Option<u32>, Kind), w: &Window) {
        if w.suppressed == 0 {
            return;
        }
        let who = uid.map_or(String::new(), |u| format!("uid {u}: "));
        (self.out)(&format!(
            "rtprofd: {who}suppressed {} more {} messages in the last {} s",
            w.suppressed,
            kind.label(),
            self.interval.as_secs_f64()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    fn capture(lines: u32) -> (Limiter, Rc<RefCell<Vec<String>>>) {
        let seen = Rc::new(RefCell::new(Vec::new()));
        let sink = seen.clone();
        let l = Limiter::new(
            lines,
            Duration::from_secs(10),
            Box::new(move |l| sink.borrow_mut().push(l.to_string())),
        );
        (l, seen)
    }

    #[test]
    fn each_user_and_kind_has_its_own_allowance_then_a_summary() {
        let (mut l, seen) = capture(3);
        let t0 = Instant::now();
        for i in 0..100 {
            l.log(Some(7), Kind::Replaced, t0, || format!("seven {i}"));
        }
        l.log(Some(8), Kind::Replaced, t0, || "eight".into());
        l.log(Some(7), Kind::Cap, t0, || "seven cap".into());
        assert_eq!(
            *seen.borrow(),
            ["seven 0", "seven 1", "seven 2", "eight", "seven cap"]
        );
        // Nothing to summarise before the interval ends.
        l.flush(t0 + Duration::from_secs(9));
        assert_eq!(seen.borrow().len(), 5);
        l.flush(t0 + Duration::from_secs(10));
        assert_eq!(
            seen.borrow()[5],
            "rtprofd: uid 7: suppressed 97 more re-registration messages in the last 10 s"
        );
        assert_eq!(seen.borrow().len(), 6, "{:?}", seen.borrow());
    }

    #[test]
    fn a_new_interval_summarises_the_old_one_first() {
        let (mut l, seen) = capture(1);
        let t0 = Instant::now();
        l.log(None, Kind::Connection, t0, || "a".into());
        l.log(None, Kind::Connection, t0, || "b".into());
        l.log(None, Kind::Connection, t0 + Duration::from_secs(11), || {
            "c".into()
        });
        assert_eq!(
            *seen.borrow(),
            [
                "a",
                "rtprofd: suppressed 1 more connection messages in the last 10 s",
                "c"
            ]
        );
    }
}
