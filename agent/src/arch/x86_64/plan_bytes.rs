//! A plan in a cache entry: a 6-byte head (skip, window, resume offset and
//! the lengths of its original bytes, code and fixups), the original bytes,
//! the code, and 8 bytes per fixup (at, end, kind, 0, target as i32).

use super::window::{FixKind, Fixup, Plan, MAX_FIXUPS};

const PLAN_HEAD: usize = 6;
const FIXUP: usize = 8;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// A plan from its bytes in an entry (the function at `start`).
pub fn decode(b: &[u8], start: u64) -> Option<Plan> {
    let head = b.get(..PLAN_HEAD)?;
    let (orig, code, nfix) = (head[3] as usize, head[4] as usize, head[5] as usize);
    if nfix > MAX_FIXUPS || b.len() != PLAN_HEAD + orig + code + nfix * FIXUP {
        return None;
    }
    let original = &b[PLAN_HEAD..PLAN_HEAD + orig];
    let code_bytes = &b[PLAN_HEAD + orig..PLAN_HEAD + orig + code];
    let mut fixups = [Fixup {
        at: 0,
        end: 0,
        kind: FixKind::Rel32,
        target: 0,
    }; MAX_FIXUPS];
    for (k, f) in fixups.iter_mut().take(nfix).enumerate() {
        let r = &b[PLAN_HEAD + orig + code + k * FIXUP..][..FIXUP];
        if r[3] != 0 {
            return None;
        }
        *f = Fixup {
            at: r[0],
            end: r[1],
            kind: FixKind::from_code(r[2])?,
            target: u32_at(r, 4) as i32,
        };
    }
    Plan::from_parts(
        start,
        head[0],
        head[1],
        head[2],
        original,
        code_bytes,
        &fixups[..nfix],
    )
}

/// Appends plan `p` in entry form.
pub fn encode(p: &Plan, out: &mut Vec<u8>) {
    out.extend_from_slice(&[
        (p.patch_at - p.start) as u8,
        p.window as u8,
        (p.resume_at - p.start) as u8,
        p.original().len() as u8,
        p.code().len() as u8,
        p.fixups().len() as u8,
    ]);
    out.extend_from_slice(p.original());
    out.extend_from_slice(p.code());
    for f in p.fixups() {
        out.extend_from_slice(&[f.at, f.end, f.kind as u8, 0]);
        out.extend_from_slice(&f.target.to_le_bytes());
    }
}
