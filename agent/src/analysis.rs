//! Deciding, for every function of a module, whether its entry can be
//! patched: the window plan plus the module-wide checks that no branch,
//! jump table or other function's entry lands inside the overwritten bytes.

use crate::arch::{jump_table_targets, plan_window, scan_function, Plan};
use crate::modules::Module;
use crate::symbols::FunctionList;
use rtprof_shared::Refusal;

/// Alignment fill considered after a function (GCC pads to 16 bytes).
const MAX_PAD: u64 = 32;

pub struct Candidate {
    pub name: String,
    pub vaddr: u64,
    pub size: u64,
    pub outcome: Result<Plan, Refusal>,
}

pub struct ModulePlan {
    pub module: Module,
    pub funcs: Vec<Candidate>,
    pub source: &'static str,
}

impl ModulePlan {
    pub fn patchable(&self) -> usize {
        self.funcs.iter().filter(|c| c.outcome.is_ok()).count()
    }
}

/// A function's code with its trailing fill: (bytes, size, fill), or why not.
type Code<'a> = Result<(&'a [u8], u64, u64), Refusal>;

/// Runtime bytes [addr, addr+len) of `m`, if mapped readable.
fn mem<'a>(m: &Module, addr: u64, len: u64) -> Option<&'a [u8]> {
    let l = m.load_containing(addr, len)?;
    l.readable()
        .then(|| unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) })
}

fn any_in(sorted: &[u64], lo: u64, hi: u64) -> bool {
    let i = sorted.partition_point(|&t| t < lo);
    i < sorted.len() && sorted[i] < hi
}

pub fn analyze(m: Module, list: FunctionList) -> ModulePlan {
    let funcs = list.funcs;
    let n = funcs.len();
    let starts: Vec<u64> = funcs.iter().map(|f| m.bias.wrapping_add(f.vaddr)).collect();

    // Per function: code (with trailing alignment fill) or why not.
    let mut code: Vec<Code> = Vec::with_capacity(n);
    for (i, f) in funcs.iter().enumerate() {
        let start = starts[i];
        if f.size == 0 {
            code.push(Err(Refusal::UnknownSize));
            continue;
        }
        let Some(load) = m
            .load_containing(start, f.size)
            .filter(|l| l.executable() && l.readable())
        else {
            code.push(Err(Refusal::OutsideText));
            continue;
        };
        let end = start + f.size;
        let load_end = m.bias + load.vaddr + load.memsz;
        let next = starts.get(i + 1).copied().unwrap_or(u64::MAX).min(load_end);
        let pad = next.saturating_sub(end).min(MAX_PAD);
        match mem(&m, start, f.size + pad) {
            Some(c) => code.push(Ok((c, f.size, pad))),
            None => code.push(Err(Refusal::OutsideText)),
        }
    }

    // One decode of every function: module-wide branch targets, which
    // include every function's entry (a second entry inside a window).
    let mut direct: Vec<u64> = starts.clone();
    let mut tables: Vec<u64> = Vec::new();
    let mut own: Vec<(Vec<u64>, Vec<u64>, bool)> = Vec::with_capacity(n);
    let read = |a: u64, len: usize| mem(&m, a, len as u64).map(|s| s.to_vec());
    for (i, c) in code.iter().enumerate() {
        let Ok((bytes, size, _)) = c else {
            own.push((Vec::new(), Vec::new(), false));
            continue;
        };
        let s = scan_function(&bytes[..*size as usize], starts[i]);
        let jt = jump_table_targets(&s, starts[i], starts[i] + size, &read);
        direct.extend_from_slice(&s.branch_targets);
        direct.extend_from_slice(&s.call_targets);
        tables.extend_from_slice(&jt);
        own.push((s.branch_targets, jt, s.decode_error));
    }
    direct.sort_unstable();
    tables.sort_unstable();

    let mut out = Vec::with_capacity(n);
    for (i, (f, c)) in funcs.into_iter().zip(code).enumerate() {
        let start = starts[i];
        let outcome = c.and_then(|(bytes, size, pad)| {
            let plan = plan_window(bytes, start, size as usize, pad as usize)?;
            let (own_branches, own_tables, decode_error) = &own[i];
            if *decode_error {
                return Err(Refusal::DecodeError);
            }
            // A loop back to the entry is not a call: it must not reach the stub.
            let entry_range = start..plan.resume_at.max(plan.patch_at + plan.window as u64);
            if own_branches.iter().any(|t| entry_range.contains(t)) {
                return Err(Refusal::BranchIntoWindow);
            }
            if own_tables.iter().any(|t| entry_range.contains(t)) {
                return Err(Refusal::JumpTableIntoWindow);
            }
            let (lo, hi) = (plan.patch_at + 1, plan.patch_at + plan.window as u64);
            if any_in(&direct, lo, hi) {
                return Err(Refusal::BranchIntoWindow);
            }
            if any_in(&tables, lo, hi) {
                return Err(Refusal::JumpTableIntoWindow);
            }
            Ok(plan)
        });
        out.push(Candidate {
            name: f.name,
            vaddr: f.vaddr,
            size: f.size,
            outcome,
        });
    }
    ModulePlan {
        module: m,
        funcs: out,
        source: list.source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_in_is_half_open() {
        let v = [1, 5, 9];
        assert!(any_in(&v, 5, 6));
        assert!(!any_in(&v, 6, 9));
        assert!(any_in(&v, 0, 2));
        assert!(!any_in(&v, 10, 100));
    }
}
