//! A plan in a cache entry: a 9-byte head (skip, window, resume offset,
//! the lengths of its original bytes, code, fixups and redirects, a
//! short plan's trampoline offset as i8 (0 for none, -128 for a trap
//! entry), and the count of
//! moved instructions), the original bytes, the code, 8 bytes per fixup
//! (at, end, kind, 0, target as i32), 6 per redirect (the rel32 field's
//! offset, its target's, its copy's in the code) and 2 per moved
//! instruction (its offset, its copy's).

use super::super::Redirect;
use super::window::{FixKind, Fixup, Plan, MAX_FIXUPS, MAX_REDIRECTS, MIN_WINDOW};

const PLAN_HEAD: usize = 9;
const REDIRECT: usize = 6;
const MOVED: usize = 2;
const FIXUP: usize = 8;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// A plan from its bytes in an entry (the function at `start`).
pub fn decode(b: &[u8], start: u64) -> Option<Plan> {
    let head = b.get(..PLAN_HEAD)?;
    let (orig, code, nfix) = (head[3] as usize, head[4] as usize, head[5] as usize);
    let (nred, nmoved) = (head[6] as usize, head[8] as usize);
    let fixups_end = PLAN_HEAD + orig + code + nfix * FIXUP;
    let redirects_end = fixups_end + nred * REDIRECT;
    if nfix > MAX_FIXUPS
        || nred > MAX_REDIRECTS
        || nmoved > MIN_WINDOW
        || b.len() != redirects_end + nmoved * MOVED
    {
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
    let mut redirects = [Redirect::default(); MAX_REDIRECTS];
    for (k, r) in redirects.iter_mut().take(nred).enumerate() {
        let at = fixups_end + k * REDIRECT;
        *r = Redirect {
            field: u32_at(b, at),
            target: b[at + 4],
            code: b[at + 5],
        };
    }
    let mut moved = [(0u8, 0u8); MIN_WINDOW];
    for (k, m) in moved.iter_mut().take(nmoved).enumerate() {
        let at = redirects_end + k * MOVED;
        *m = (b[at], b[at + 1]);
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
    .with_moved_at(&moved[..nmoved])?
    .with_resolved_redirects(&redirects[..nred])
    .and_then(|p| match head[7] as i8 {
        0 if p.window >= super::window::MIN_WINDOW => Some(p),
        0 => None,
        i8::MIN => p.with_trap(),
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
        p.moved_at().len() as u8,
    ]);
    out.extend_from_slice(p.original());
    out.extend_from_slice(p.code());
    for f in p.fixups() {
        out.extend_from_slice(&[f.at, f.end, f.kind as u8, 0]);
        out.extend_from_slice(&f.target.to_le_bytes());
    }
    for r in p.redirects() {
        out.extend_from_slice(&r.field.to_le_bytes());
        out.extend_from_slice(&[r.target, r.code]);
    }
    for &(o, c) in p.moved_at() {
        out.extend_from_slice(&[o, c]);
    }
}
