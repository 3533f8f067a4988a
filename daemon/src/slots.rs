//! Row identities shared by every process of an executable: one id per
//! (executable, row name), with the name, its readable form and its hash
//! key stored once. Processes of one program hold the same ids, so the
//! presentation writer merges their rows into global rows by id, and a
//! tick never compares or copies a name that did not change.
//!
//! An id lives while a followed process uses it (a count per id), so what
//! the daemon keeps is bounded by the segments it follows, however many
//! names come and go.

use rtprof_abi::present::{key_hash, RowNames};
use std::collections::HashMap;

#[derive(Default)]
pub struct Slots {
    /// Names end to end, those of one executable mostly together (a
    /// process's are taken at once), so the writer copies them from few
    /// cache lines. Freed names stay as garbage until it outweighs the
    /// rest.
    arena: String,
    garbage: usize,
    /// Moves whenever `arena` does: the writer copies it only then.
    version: u64,
    /// Per id: where its name is in `arena`, its hash key, its readable
    /// form (compiler copies merged into their function: metrics'
    /// labels), and the followed processes using it (0: free).
    spans: Vec<(u32, u32)>,
    keys: Vec<u32>,
    readable: Vec<Box<str>>,
    users: Vec<u32>,
    /// Bumped each time an id is taken anew: who caches by id can tell a
    /// reused id from the one it saw.
    generations: Vec<u32>,
    free: Vec<u32>,
    /// Per executable: row name -> id.
    exes: HashMap<Box<str>, HashMap<Box<str>, u32>>,
}

impl Slots {
    /// The id of `name` in `exe`, taken once more.
    pub fn acquire(&mut self, exe: &str, name: &str) -> u32 {
        let names = match self.exes.get_mut(exe) {
            Some(n) => n,
            None => self.exes.entry(exe.into()).or_default(),
        };
        if let Some(&id) = names.get(name) {
            self.users[id as usize] += 1;
            return id;
        }
        let span = (self.arena.len() as u32, name.len() as u32);
        self.arena.push_str(name);
        self.version += 1;
        let readable = rtprof_shared::names::function(name).into();
        let key = key_hash(exe, name);
        let id = match self.free.pop() {
            Some(id) => {
                let i = id as usize;
                (self.spans[i], self.keys[i], self.readable[i], self.users[i]) =
                    (span, key, readable, 1);
                self.generations[i] = self.generations[i].wrapping_add(1);
                id
            }
            None => {
                self.spans.push(span);
                self.keys.push(key);
                self.readable.push(readable);
                self.users.push(1);
                self.generations.push(0);
                (self.spans.len() - 1) as u32
            }
        };
        names.insert(name.into(), id);
        id
    }

    /// Gives back one use of `id` (of `exe`); the last frees it.
    pub fn release(&mut self, exe: &str, id: u32) {
        let i = id as usize;
        match self.users.get_mut(i) {
            Some(n) if *n > 1 => {
                *n -= 1;
                return;
            }
            Some(n) if *n == 1 => *n = 0,
            _ => return,
        }
        let (off, len) = self.spans[i];
        let name = &self.arena[off as usize..(off + len) as usize];
        if let Some(names) = self.exes.get_mut(exe) {
            // Only if the name is this id's there.
            if names.get(name) == Some(&id) {
                names.remove(name);
            }
            if names.is_empty() {
                self.exes.remove(exe);
            }
        }
        self.garbage += self.spans[i].1 as usize;
        self.spans[i] = (0, 0);
        self.readable[i] = Box::default();
        self.free.push(id);
        if self.garbage > 4096 && self.garbage > self.arena.len() / 2 {
            self.compact();
        }
    }

    /// Rewrites the arena with the names in use only.
    fn compact(&mut self) {
        let mut arena = String::with_capacity(self.arena.len() - self.garbage);
        for (span, _) in self
            .spans
            .iter_mut()
            .zip(&self.users)
            .filter(|(_, &u)| u > 0)
        {
            let (off, len) = (span.0 as usize, span.1 as usize);
            *span = (arena.len() as u32, span.1);
            arena.push_str(&self.arena[off..off + len]);
        }
        self.arena = arena;
        self.garbage = 0;
        self.version += 1;
    }

    pub fn generation(&self, id: u32) -> u32 {
        self.generations[id as usize]
    }

    pub fn readable(&self, id: u32) -> &str {
        &self.readable[id as usize]
    }

    /// Ids in use.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.spans.len() - self.free.len()
    }
}

impl Slots {
    pub fn name(&self, id: u32) -> &str {
        let (off, len) = self.spans[id as usize];
        &self.arena[off as usize..(off + len) as usize]
    }
}

impl RowNames for Slots {
    fn strings(&self) -> &str {
        &self.arena
    }

    fn span(&self, id: u32) -> (u32, u32) {
        self.spans[id as usize]
    }

    fn key(&self, id: u32) -> u32 {
        self.keys[id as usize]
    }

    fn version(&self) -> Option<u64> {
        Some(self.version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_of_one_executable_share_ids_until_the_last_leaves() {
        let mut s = Slots::default();
        let a = s.acquire("/bin/app", "hot");
        let b = s.acquire("/bin/app", "hot");
        let other = s.acquire("/bin/other", "hot");
        assert_eq!(a, b);
        assert_ne!(a, other);
        assert_eq!(s.name(a), "hot");
        assert_eq!(s.key(a), key_hash("/bin/app", "hot"));
        s.release("/bin/app", a);
        assert_eq!(s.acquire("/bin/app", "hot"), a, "still used once");
        s.release("/bin/app", a);
        s.release("/bin/app", a);
        assert_eq!(s.len(), 1);
        // A freed id is reused, under its new name.
        let gen = s.generation(a);
        let c = s.acquire("/bin/app", "_ZN3app4mainE.constprop.0");
        assert_eq!(c, a);
        assert_ne!(s.generation(c), gen, "a reused id is told apart");
        assert_eq!(s.readable(c), rtprof_shared::names::function(s.name(c)));
        // Releasing more than was taken changes nothing.
        s.release("/bin/other", other);
        s.release("/bin/other", other);
        assert_eq!(s.len(), 1);
        assert!(!s.exes.contains_key("/bin/other"));
    }

    /// Names freed by processes that left are dropped from the arena once
    /// they outweigh the rest; the names in use read the same.
    #[test]
    fn the_arena_keeps_names_in_use_only() {
        let mut s = Slots::default();
        let kept: Vec<u32> = (0..10)
            .map(|i| s.acquire("/bin/app", &format!("kept_{i}")))
            .collect();
        for round in 0..50 {
            let ids: Vec<u32> = (0..100)
                .map(|i| s.acquire("/bin/tmp", &format!("gone_{round}_{i}")))
                .collect();
            for id in ids {
                s.release("/bin/tmp", id);
            }
        }
        assert!(s.arena.len() < 20_000, "{} bytes", s.arena.len());
        for (i, &id) in kept.iter().enumerate() {
            assert_eq!(s.name(id), format!("kept_{i}"));
            assert_eq!(s.key(id), key_hash("/bin/app", &format!("kept_{i}")));
        }
        assert_eq!(s.len(), 10);
    }
}
