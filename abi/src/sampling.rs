//! Which sampler ran in a process and why: codes stored in the segment
//! header (`sampler`, `sampler_why`, `sampler_errno`).

use crate::codes::abi_codes;
use std::fmt;

abi_codes! {
/// The sampler that runs.
pub enum Sampler {
    Off = 0,
    /// Per-CPU `cpu-clock` perf events, drained by one agent thread.
    Perf = 1,
    /// Per-thread CPU-time timers (`timer_create`) and a signal handler.
    Timer = 2,
}
}

impl Sampler {
    pub fn name(self) -> &'static str {
        match self {
            Sampler::Off => "off",
            Sampler::Perf => "perf",
            Sampler::Timer => "timer",
        }
    }
}

abi_codes! {
/// Why the sampler in the header was chosen (or why none runs).
pub enum Why {
    /// Not recorded (a process that ended before choosing).
    Unknown = 0,
    /// The default choice worked.
    Default = 1,
    /// `RTPROF_SAMPLER` asked for it.
    Requested = 2,
    /// `RTPROF_SAMPLE_HZ=0` or `RTPROF_SAMPLER=off`.
    SwitchedOff = 3,
    /// `perf_event_open` was refused (errno): fell back.
    PerfRefused = 4,
    /// The perf ring buffer could not be mapped (errno; often the locked-memory limit).
    PerfMapFailed = 5,
    /// More CPUs or descriptors than the agent allows itself.
    TooManyCpus = 6,
    /// The drain thread could not be started (errno).
    NoDrainThread = 7,
    /// `timer_create` failed (errno).
    TimerFailed = 8,
    /// The profiling signal was in use by the program.
    SignalInUse = 9,
    /// The program took the profiling signal over; timer sampling stopped.
    SignalTaken = 10,
    /// A child made without `fork()` (for example `_Fork`, `daemon()`).
    ChildWithoutFork = 11,
    /// The process runs under a seccomp filter (from its start, or one it
    /// installed): the agent makes no system call the filter may forbid.
    Sandboxed = 12,
}
}

impl Why {
    pub fn name(self) -> &'static str {
        match self {
            Why::Unknown => "unknown",
            Why::Default => "default",
            Why::Requested => "requested",
            Why::SwitchedOff => "switched off",
            Why::PerfRefused => "perf_event_open refused",
            Why::PerfMapFailed => "perf ring buffer not mapped",
            Why::TooManyCpus => "too many CPUs for per-CPU events",
            Why::NoDrainThread => "drain thread not started",
            Why::TimerFailed => "timer_create failed",
            Why::SignalInUse => "SIGPROF in use by the program",
            Why::SignalTaken => "SIGPROF taken over by the program",
            Why::ChildWithoutFork => "child made without fork()",
            Why::Sandboxed => "seccomp filter",
        }
    }
}

/// The sampler as a report states it: "perf (default)", "timer
/// (perf_event_open refused: Permission denied)".
pub struct Described {
    pub sampler: Sampler,
    pub why: Why,
    pub errno: u32,
}

impl fmt::Display for Described {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}", self.sampler.name(), self.why.name())?;
        if self.errno != 0 {
            write!(
                f,
                ": {}",
                std::io::Error::from_raw_os_error(self.errno as i32)
            )?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for c in 0..13 {
            assert_eq!(Why::from_code(c).map(Why::code), Some(c));
        }
        assert_eq!(Why::from_code(999), None);
        for &s in Sampler::ALL {
            assert_eq!(Sampler::from_code(s.code()), Some(s));
        }
        let d = Described {
            sampler: Sampler::Timer,
            why: Why::PerfRefused,
            errno: libc_eacces(),
        };
        assert!(d
            .to_string()
            .starts_with("timer (perf_event_open refused: "));
    }

    fn libc_eacces() -> u32 {
        13
    }
}
