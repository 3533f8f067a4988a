//! Loop profiles: where in their functions samples landed (the file the
//! agent writes beside its segment at exit, `<segment>.offsets`), and the
//! loops a reader finds in those functions' code, each with the samples
//! of its own instructions and of the loops nested in it; and, for the
//! functions a user names (`RTPROF_LOOPS`), each loop's exact entries and
//! branches back (`<segment>.loops`).

use crate::reader::{side_file, SourceLine};
use crate::{SegmentError, Snapshot};

/// Samples by where in its function each one landed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Offsets {
    /// (function slot, offset from its first byte, samples).
    pub samples: Vec<(u32, u32, u64)>,
    /// Samples the agent's table had no room for (they count for their
    /// function all the same).
    pub dropped: u64,
}

impl Offsets {
    /// Reads the offsets file the agent writes: `rtprof-offsets 1
    /// <dropped>`, then `<slot> <offset> <samples>` lines. A slot out of
    /// range, or an offset outside its function, refuses the file.
    pub fn parse(text: &str, s: &Snapshot) -> Result<Offsets, SegmentError> {
        let bad = SegmentError::BadReference("offsets file");
        let ([dropped], lines) = side_file(text, "rtprof-offsets", &bad)?;
        let mut samples = Vec::new();
        for line in lines.filter(|l| !l.is_empty()) {
            let mut it = line.split(' ');
            let mut num = || it.next().and_then(|v| v.parse::<u64>().ok());
            let (Some(slot), Some(offset), Some(n), None) = (num(), num(), num(), num()) else {
                return Err(bad);
            };
            let f = usize::try_from(slot)
                .ok()
                .and_then(|i| s.functions.get(i))
                .ok_or(bad.clone())?;
            if offset >= f.size as u64 {
                return Err(bad);
            }
            samples.push((slot as u32, offset as u32, n));
        }
        Ok(Offsets { samples, dropped })
    }
}

/// Why a loop of a function named in `RTPROF_LOOPS` is not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopRefusal {
    /// The function's code does not decode to its end.
    Undecoded = 1,
    /// The function jumps through a table or register: where to is not
    /// all known, so no bytes of it can be taken over safely.
    JumpTable = 2,
    /// The loop's header is in the function's patched entry bytes.
    AtEntry = 3,
    /// The header's block has too few bytes for a jump before a branch
    /// or another block begins.
    ShortHeader = 4,
    /// A block that branches back to the header has too few bytes for a
    /// jump before its branch.
    ShortLatch = 5,
    /// An instruction the probe would move cannot run elsewhere (a call,
    /// a branch of a kind with no long form, a target out of reach).
    Unmovable = 6,
    /// Code outside the function branches into bytes a probe would take.
    BranchInside = 7,
    /// No memory within jump range for its probes.
    NoMemory = 8,
    /// The process's loop counter table is full.
    TooMany = 9,
    /// Its code could not be written.
    WriteFailed = 10,
    /// The bytes a probe would take are not in memory what the file has
    /// (the loader or a debugger changed them).
    Changed = 11,
    /// Part of the loop is code outside the function (a `.cold` part it
    /// jumps to), or it leaves by a jump to another function.
    Split = 12,
}

impl LoopRefusal {
    pub const ALL: [LoopRefusal; 12] = [
        LoopRefusal::Undecoded,
        LoopRefusal::JumpTable,
        LoopRefusal::AtEntry,
        LoopRefusal::ShortHeader,
        LoopRefusal::ShortLatch,
        LoopRefusal::Unmovable,
        LoopRefusal::BranchInside,
        LoopRefusal::NoMemory,
        LoopRefusal::TooMany,
        LoopRefusal::WriteFailed,
        LoopRefusal::Changed,
        LoopRefusal::Split,
    ];

    /// The name the side file and the report use.
    pub fn name(self) -> &'static str {
        match self {
            LoopRefusal::Undecoded => "undecoded",
            LoopRefusal::JumpTable => "jump_table",
            LoopRefusal::AtEntry => "at_entry",
            LoopRefusal::ShortHeader => "short_header",
            LoopRefusal::ShortLatch => "short_latch",
            LoopRefusal::Unmovable => "unmovable",
            LoopRefusal::BranchInside => "branch_inside",
            LoopRefusal::NoMemory => "no_memory",
            LoopRefusal::TooMany => "too_many",
            LoopRefusal::WriteFailed => "write_failed",
            LoopRefusal::Changed => "changed",
            LoopRefusal::Split => "split",
        }
    }

    pub fn from_name(n: &str) -> Option<LoopRefusal> {
        Self::ALL.into_iter().find(|r| r.name() == n)
    }
}

/// One loop's exact counts, or why it has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopCount {
    /// Times control came into the loop from outside (executions), times
    /// a branch went back to its header, and times it left from its top
    /// (a loop that tests there runs its header once more than its body).
    Counted {
        entries: u64,
        back: u64,
        top_exits: u64,
    },
    Refused(LoopRefusal),
}

/// The loops the agent counted exactly (the file it writes beside its
/// segment at exit, `<segment>.loops`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoopCounts {
    /// (function slot, header's offset from the function's first byte,
    /// count).
    pub loops: Vec<(u32, u32, LoopCount)>,
}

impl LoopCount {
    /// Iterations: runs of the loop's body (its header's runs, less those
    /// that left the loop right there).
    pub fn iterations(&self) -> Option<u64> {
        match *self {
            LoopCount::Counted {
                entries,
                back,
                top_exits,
            } => Some(entries.saturating_add(back).saturating_sub(top_exits)),
            LoopCount::Refused(_) => None,
        }
    }
}

impl LoopCounts {
    /// Reads `rtprof-loops 1`, then `<slot> <header offset> <entries>
    /// <back> <top exits>` or `<slot> <header offset> - <reason>` lines. A slot out of
    /// range, an offset outside its function or an unknown reason refuses
    /// the file.
    pub fn parse(text: &str, s: &Snapshot) -> Result<LoopCounts, SegmentError> {
        let bad = SegmentError::BadReference("loops file");
        let ([], lines) = side_file(text, "rtprof-loops", &bad)?;
        let mut loops = Vec::new();
        for line in lines.filter(|l| !l.is_empty()) {
            let f: Vec<&str> = line.split(' ').collect();
            let (slot, offset, a, b, c) = match f[..] {
                [slot, offset, "-", why] => (slot, offset, "-", why, "0"),
                [slot, offset, a, b, c] if a != "-" => (slot, offset, a, b, c),
                _ => return Err(bad),
            };
            let num = |v: &str| v.parse::<u64>().map_err(|_| bad.clone());
            let (slot, offset) = (num(slot)?, num(offset)?);
            let func = usize::try_from(slot)
                .ok()
                .and_then(|i| s.functions.get(i))
                .ok_or(bad.clone())?;
            if offset >= func.size as u64 {
                return Err(bad);
            }
            let count = if a == "-" {
                LoopCount::Refused(LoopRefusal::from_name(b).ok_or(bad.clone())?)
            } else {
                LoopCount::Counted {
                    entries: num(a)?,
                    back: num(b)?,
                    top_exits: num(c)?,
                }
            };
            loops.push((slot as u32, offset as u32, count));
        }
        Ok(LoopCounts { loops })
    }
}

/// A natural loop of a sampled function, found from its code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopStats {
    /// Index in `Snapshot::functions`.
    pub function: u32,
    /// Its header (where every way in enters), and the lowest and past the
    /// highest byte of its code (out-of-line parts included), as file
    /// addresses (`FunctionStats::vaddr`'s).
    pub header: u64,
    pub start: u64,
    pub end: u64,
    /// 1 for a loop in no other loop of its function.
    pub depth: u32,
    /// Samples in it, nested loops included, and in it but in none of them.
    pub samples: u64,
    pub self_samples: u64,
    /// Where its header is, if debug information says.
    pub source: Option<SourceLine>,
    /// Its exact counts, if its function is named in `RTPROF_LOOPS`.
    pub count: Option<LoopCount>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::tests::sample_snapshot as snap;

    #[test]
    fn offsets_files_are_read_and_hostile_ones_refused() {
        let mut s = snap();
        s.functions[0].size = 100;
        let o = Offsets::parse("rtprof-offsets 1 4\n0 10 7\n0 99 1\n", &s).unwrap();
        assert_eq!(o.samples, [(0, 10, 7), (0, 99, 1)]);
        assert_eq!(o.dropped, 4);
        for bad in [
            "",
            "rtprof-offsets 2 0\n",
            "rtprof-offsets 1\n",
            "rtprof-offsets 1 0\n0 100 1\n",
            "rtprof-offsets 1 0\n99 0 1\n",
            "rtprof-offsets 1 0\n0 1\n",
            "rtprof-offsets 1 0\n0 1 2 3\n",
            "rtprof-offsets 1 0\n-1 1 2\n",
            "rtprof-offsets 1 0\n0 1 x\n",
        ] {
            assert!(Offsets::parse(bad, &s).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn loop_count_files_are_read_and_hostile_ones_refused() {
        let mut s = snap();
        s.functions[0].size = 100;
        let c =
            LoopCounts::parse("rtprof-loops 1\n0 10 8 7992 8\n0 40 - short_latch\n", &s).unwrap();
        let counted = LoopCount::Counted {
            entries: 8,
            back: 7992,
            top_exits: 8,
        };
        assert_eq!(
            c.loops,
            [
                (0, 10, counted),
                (0, 40, LoopCount::Refused(LoopRefusal::ShortLatch))
            ]
        );
        assert_eq!(counted.iterations(), Some(7992));
        for bad in [
            "",
            "rtprof-loops 2\n",
            "rtprof-loops 1 0\n",
            "rtprof-loops 1\n0 100 1 1\n",
            "rtprof-loops 1\n99 0 1 1\n",
            "rtprof-loops 1\n0 1 1\n",
            "rtprof-loops 1\n0 1 - nonsense\n",
            "rtprof-loops 1\n0 1 x 1\n",
            "rtprof-loops 1\n0 1 1 1\n",
            "rtprof-loops 1\n0 1 1 1 1 1\n",
            "rtprof-loops 1\n0 1 - 1 1\n",
        ] {
            assert!(LoopCounts::parse(bad, &s).is_err(), "{bad:?}");
        }
        for r in LoopRefusal::ALL {
            assert_eq!(LoopRefusal::from_name(r.name()), Some(r));
        }
    }
}
