//! Loop profiles: where in their functions samples landed (the file the
//! agent writes beside its segment at exit, `<segment>.offsets`), and the
//! loops a reader finds in those functions' code, each with the samples
//! of its own instructions and of the loops nested in it.

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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::snap;

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
}
