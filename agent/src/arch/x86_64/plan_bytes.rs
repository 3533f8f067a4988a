//! A plan in a cache entry: an 8-byte head (skip, window, resume offset,
//! the lengths of its original bytes, code, fixups and redirects, and a
//! short plan's trampoline offset as i8, 0 for none), the
//! original bytes, the code, 8 bytes per fixup (at, end, kind, 0, target
//! as i32) and 4 per redirect (the rel32 field's offset).

use super::window::{FixKind, Fixup, Plan, MAX_FIXUPS, MAX_REDIRECTS};

const PLAN_HEAD: usize = 8;
const REDIRECT: usize = 4;
const FIXUP: usize = 8;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// A plan from its bytes in an entry (the function at `start`).
pub fn decode(b: &[u8], start: u64) -> Option<Plan> {
    let head = b.get(..PLAN_HEAD)?;
    let (orig, code, nfix) = (head[3] as usize, head[4] as usize, head[5] as usize);
    let nred = head[6] as usize;
    let fixups_end = PLAN_HEAD + orig + code + nfix * FIXUP;
    if nfix > MAX_FIXUPS || nred > MAX_REDIRECTS || b.len() != fixups_end + nred * REDIRECT {
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
    let mut fields = [0u64; MAX_REDIRECTS];
    for (k, f) in fields.iter_mut().take(nred).enumerate() {
        *f = start + u32_at(b, fixups_end + k * REDIRECT) as u64;
    }
    Plan::from_parts(
        start,
        head[0],
        head[1],
        head[2],
        original,
        code_bytes,
        &fixups[..nfix],
    )?
    .with_redirects(&fields[..nred])
    .and_then(|p| match head[7] as i8 {
        0 if p.window >= super::window::MIN_WINDOW => Some(p),
        0 => None,
        t => p.with_trampoline(t),
    })
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
        p.redirects().len() as u8,
        p.tramp_offset() as u8,
    ]);
    out.extend_from_slice(p.original());
    out.extend_from_slice(p.code());
    for f in p.fixups() {
        out.extend_from_slice(&[f.at, f.end, f.kind as u8, 0]);
        out.extend_from_slice(&f.target.to_le_bytes());
    }
    for r in p.redirects() {
        out.extend_from_slice(&r.to_le_bytes());
    }
}
