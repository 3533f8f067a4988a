//! Where the agent's plan cache lives, for the agent and `rtprof cache`.

use std::path::{Path, PathBuf};

/// The machine-wide cache: written by root only, readable by all.
pub const SYSTEM_DIR: &str = "/var/cache/rtprof";
/// Entries end with this; temporary files start with a dot.
pub const ENTRY_SUFFIX: &str = ".rtc";

/// Exit status of a process started to fill the cache (`RTPROF_WARM`)
/// where the agent did not act (switched off, sandboxed, unable to start):
/// it ends the process before `main` all the same.
pub const WARM_NOT_DONE: i32 = 3;

/// The user's cache directory: `$XDG_CACHE_HOME/rtprof`, else
/// `$HOME/.cache/rtprof` (relative values are ignored, as XDG says).
pub fn user_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| Path::new(v).is_absolute())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| Path::new(v).is_absolute())
                .map(|h| Path::new(&h).join(".cache"))
        })?;
    Some(base.join("rtprof"))
}

/// Bytes of an entry's header; its checksum is the last 8 of them.
pub const ENTRY_HEADER: usize = 88;
const SUM_AT: usize = ENTRY_HEADER - 8;

/// FNV-1a, for short byte strings.
pub fn fnv(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}
pub const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// A checksum of `bytes` eight at a time, in four independent lanes (an
/// entry of a large module is megabytes, read by every process). Against
/// torn or flipped bytes, not against someone who may write the entry (the
/// ownership checks are).
fn wide_sum(bytes: &[u8], seed: u64) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut lanes = [seed, seed ^ 1, seed ^ 2, seed ^ 3];
    let mut chunks = bytes.chunks_exact(32);
    for c in &mut chunks {
        for (k, lane) in lanes.iter_mut().enumerate() {
            let w = u64::from_le_bytes(c[k * 8..k * 8 + 8].try_into().unwrap());
            *lane = (*lane ^ w).wrapping_mul(K).rotate_left(29);
        }
    }
    let mut h = (bytes.len() as u64).wrapping_mul(K) ^ fnv(chunks.remainder(), FNV_START);
    for lane in lanes {
        h = (h ^ lane).wrapping_mul(K).rotate_left(31);
    }
    h
}

/// The checksum of a whole entry (all of it but the checksum's own bytes).
/// `None` if it is shorter than a header.
pub fn entry_checksum(b: &[u8]) -> Option<u64> {
    let head = b.get(..SUM_AT)?;
    Some(wide_sum(b.get(ENTRY_HEADER..)?, fnv(head, FNV_START)))
}

/// The checksum an entry carries.
pub fn stored_checksum(b: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(SUM_AT..ENTRY_HEADER)?.try_into().ok()?,
    ))
}

/// Writes the entry's checksum into its header.
pub fn seal(b: &mut [u8]) {
    if let Some(sum) = entry_checksum(b) {
        b[SUM_AT..ENTRY_HEADER].copy_from_slice(&sum.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flipped_bit_changes_the_checksum() {
        let mut b: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        seal(&mut b);
        assert_eq!(entry_checksum(&b), stored_checksum(&b));
        for i in (0..b.len()).filter(|i| !(SUM_AT..ENTRY_HEADER).contains(i)) {
            for bit in 0..8 {
                let mut c = b.clone();
                c[i] ^= 1 << bit;
                assert_ne!(
                    entry_checksum(&c),
                    stored_checksum(&c),
                    "byte {i} bit {bit}"
                );
            }
        }
        assert_eq!(entry_checksum(&b[..40]), None);
    }
}
