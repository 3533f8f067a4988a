//! The profile every export format is written from: per process, stacks of
//! frames (root first) with their samples and calls: one-frame stacks for
//! each function's calls and for samples without a call stack, and the
//! sampled call stacks the agent recorded.

use rtprof_abi::present::{ProcView, View};
use rtprof_abi::reader::Frame as StackFrame;
use rtprof_abi::Snapshot;
use rtprof_shared::names;
use std::collections::HashMap;

pub struct Profile {
    /// What was profiled: a flame graph's title, speedscope's file name.
    pub name: String,
    /// CLOCK_REALTIME nanoseconds when the profile starts, and how long it
    /// covers (0: unknown).
    pub start_ns: u64,
    pub duration_ns: u64,
    pub processes: Vec<Process>,
}

pub struct Process {
    pub pid: u32,
    pub exe: String,
    /// CPU time a sample stands for (0: not sampled).
    pub period_ns: u64,
    pub modules: Vec<Module>,
    /// The frames `stacks` refer to, by index.
    pub frames: Vec<Frame>,
    pub stacks: Vec<Stack>,
}

pub struct Module {
    /// A path when read from a run's segments; a file name from rtprofd.
    pub path: String,
    /// Where it is loaded and where its last known function ends, when
    /// known.
    pub range: Option<(u64, u64)>,
}

pub struct Frame {
    /// The readable name: a function's (its compiler copies share it), or
    /// `[module]` / `[unknown]` for samples outside every known function.
    pub name: String,
    /// The function's symbol as its binary names it; `None` for the
    /// `[...]` frames.
    pub symbol: Option<String>,
    /// Index in the process's modules.
    pub module: Option<usize>,
    /// The function's entry address in the process, when known.
    pub address: Option<u64>,
    /// Where the function is defined, where debug information says.
    pub source: Option<rtprof_abi::reader::SourceLine>,
}

pub struct Stack {
    /// Indices in the process's frames, root first.
    pub frames: Vec<usize>,
    pub samples: u64,
    /// Calls of the leaf; `None` where calls are not counted.
    pub calls: Option<u64>,
}

impl Process {
    /// The executable's file name.
    pub fn exe_name(&self) -> &str {
        self.exe.rsplit('/').next().unwrap_or(&self.exe)
    }
    pub fn samples(&self) -> u64 {
        self.stacks.iter().map(|s| s.samples).sum()
    }
    /// CPU time of `samples` of this process.
    pub fn cpu_ns(&self, samples: u64) -> u64 {
        samples.saturating_mul(self.period_ns)
    }
    /// The frames of `stack`, root first.
    pub fn frames_of<'a>(&'a self, stack: &'a Stack) -> impl Iterator<Item = &'a Frame> + 'a {
        stack.frames.iter().map(|&i| &self.frames[i])
    }
    fn add(&mut self, frame: Frame, samples: u64, calls: Option<u64>) {
        self.stacks.push(Stack {
            frames: vec![self.frames.len()],
            samples,
            calls,
        });
        self.frames.push(frame);
    }
}

impl Profile {
    pub fn samples(&self) -> u64 {
        self.processes.iter().map(Process::samples).sum()
    }
}

/// A bucket frame: samples in `module` (or none) outside its functions.
fn bucket(name: String, module: Option<usize>) -> Frame {
    Frame {
        name,
        symbol: None,
        module,
        address: None,
        source: None,
    }
}

/// A function frame named after the function `symbol` belongs to.
fn function(symbol: &str, module: Option<usize>, address: Option<u64>) -> Frame {
    Frame {
        name: names::function(symbol).into_owned(),
        symbol: Some(symbol.to_string()),
        module,
        address,
        source: None,
    }
}

/// The profile of a run: every process's called or sampled functions,
/// and the samples outside them.
pub fn from_snapshots(name: &str, procs: &[Snapshot]) -> Profile {
    let processes: Vec<Process> = procs.iter().map(process_of_snapshot).collect();
    let start = procs.iter().map(|s| s.start_ns).filter(|&t| t > 0).min();
    let end = procs.iter().map(|s| s.end_ns).max().unwrap_or(0);
    Profile {
        name: name.to_string(),
        start_ns: start.unwrap_or(0),
        duration_ns: start.map_or(0, |s| end.saturating_sub(s)),
        processes,
    }
}

fn process_of_snapshot(s: &Snapshot) -> Process {
    let mut ends = vec![0u64; s.modules.len()];
    for f in &s.functions {
        if let Some(e) = ends.get_mut(f.module as usize) {
            *e = (*e).max(f.vaddr.saturating_add(f.size as u64));
        }
    }
    let mut p = Process {
        pid: s.pid,
        exe: s.exe.clone(),
        period_ns: s.sample_period_ns,
        modules: s
            .modules
            .iter()
            .zip(ends)
            .map(|(m, end)| Module {
                path: m.path.clone(),
                range: Some((m.base, m.base.saturating_add(end))),
            })
            .collect(),
        frames: Vec::new(),
        stacks: Vec::new(),
    };
    // Samples with a call stack are counted in their stacks; what is left
    // of a function's (or bucket's) samples stays in its one-frame stack,
    // so the totals are the report's either way.
    let mut in_stacks: HashMap<StackFrame, u64> = HashMap::new();
    for st in &s.stacks.stacks {
        if let Some(&leaf) = st.frames.first() {
            *in_stacks.entry(leaf).or_default() += st.samples;
        }
    }
    let left = |leaf: StackFrame, samples: u64| {
        samples.saturating_sub(in_stacks.get(&leaf).copied().unwrap_or(0))
    };
    let mut index: HashMap<StackFrame, usize> = HashMap::new();
    for (slot, f) in s.functions.iter().enumerate() {
        if f.calls == 0 && f.samples == 0 {
            continue;
        }
        let leaf = StackFrame::Function(slot as u32);
        index.insert(leaf, p.frames.len());
        p.add(
            function_frame(s, slot),
            left(leaf, f.samples),
            f.instrumented.then_some(f.calls),
        );
    }
    for (i, m) in s.modules.iter().enumerate().filter(|(_, m)| m.samples > 0) {
        let leaf = StackFrame::Module(i as u32);
        index.insert(leaf, p.frames.len());
        p.add(
            bucket(format!("[{}]", m.name()), Some(i)),
            left(leaf, m.samples),
            None,
        );
    }
    if s.samples_unknown > 0 {
        index.insert(StackFrame::Unknown, p.frames.len());
        p.add(
            bucket("[unknown]".into(), None),
            left(StackFrame::Unknown, s.samples_unknown),
            None,
        );
    }
    for st in &s.stacks.stacks {
        let frames = st
            .frames
            .iter()
            .rev()
            .map(|&f| {
                *index.entry(f).or_insert_with(|| {
                    p.frames.push(match f {
                        StackFrame::Function(slot) => function_frame(s, slot as usize),
                        StackFrame::Module(i) => {
                            let name = s.modules.get(i as usize).map_or("?", |m| m.name());
                            bucket(format!("[{name}]"), Some(i as usize))
                        }
                        StackFrame::Unknown => bucket("[unknown]".into(), None),
                    });
                    p.frames.len() - 1
                })
            })
            .collect();
        p.stacks.push(Stack {
            frames,
            samples: st.samples,
            calls: None,
        });
    }
    p
}

/// The frame of function `slot` of `s`.
fn function_frame(s: &Snapshot, slot: usize) -> Frame {
    let f = &s.functions[slot];
    let base = s.modules.get(f.module as usize).map(|m| m.base);
    let address = base.map(|b| b.wrapping_add(f.vaddr));
    Frame {
        source: f.source.clone(),
        ..function(&f.name, base.map(|_| f.module as usize), address)
    }
}

/// The profile of rtprofd's last span, for the processes `procs` of `v`.
pub fn from_view(v: &View, procs: &[&ProcView]) -> Profile {
    let processes = procs
        .iter()
        .map(|pv| {
            let mut p = Process {
                pid: pv.pid,
                exe: pv.exe.clone(),
                period_ns: pv.period_ns,
                modules: Vec::new(),
                frames: Vec::new(),
                stacks: Vec::new(),
            };
            let mut modules: HashMap<&str, usize> = HashMap::new();
            for r in &v.rows[pv.rows.clone()] {
                let unknown = r.name == "[unknown]";
                let module = (!unknown).then(|| {
                    *modules.entry(&r.module).or_insert_with(|| {
                        p.modules.push(Module {
                            path: r.module.clone(),
                            range: None,
                        });
                        p.modules.len() - 1
                    })
                });
                // Samples outside a module's functions: rtprofd names the
                // row `[module]` and counts no calls in it.
                let is_bucket = !r.counted && r.name.starts_with('[') && r.name.ends_with(']');
                let frame = if is_bucket {
                    bucket(r.name.clone(), module)
                } else {
                    function(&r.name, module, None)
                };
                p.add(frame, r.samples, r.counted.then_some(r.calls));
            }
            p
        })
        .collect();
    Profile {
        name: format!("rtprofd span of {:.1} s", v.span_ns as f64 / 1e9),
        start_ns: v.span_end_ns.saturating_sub(v.span_ns),
        duration_ns: v.span_ns,
        processes,
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// Two processes of one program: `main` and `hot` (with a compiler
    /// copy), samples in libc outside its functions and in no module.
    pub fn sample() -> Profile {
        let modules = || {
            vec![
                Module {
                    path: "/usr/bin/prog".into(),
                    range: Some((0x5000_0000, 0x5000_2000)),
                },
                Module {
                    path: "/lib/libc.so.6".into(),
                    range: Some((0x7000_0000, 0x7010_0000)),
                },
            ]
        };
        let process = |pid: u32, hot: u64| {
            let mut p = Process {
                pid,
                exe: "/usr/bin/prog".into(),
                period_ns: 1_000_000,
                modules: modules(),
                frames: Vec::new(),
                stacks: Vec::new(),
            };
            p.add(function("main", Some(0), Some(0x5000_1000)), 1, Some(1));
            p.add(function("hot", Some(0), Some(0x5000_1100)), hot, Some(300));
            p.add(
                function("hot.constprop.0", Some(0), Some(0x5000_1200)),
                2,
                Some(7),
            );
            p.add(function("idle", Some(0), Some(0x5000_1300)), 0, Some(5));
            p.add(bucket("[libc.so.6]".into(), Some(1)), 3, None);
            p.add(bucket("[unknown]".into(), None), 1, None);
            p
        };
        Profile {
            name: "prog --fast".into(),
            start_ns: 1_700_000_000_000_000_000,
            duration_ns: 2_000_000_000,
            processes: vec![process(100, 30), process(101, 10)],
        }
    }

    #[test]
    fn names_merge_copies_and_keep_symbols() {
        let p = sample();
        let q = &p.processes[0];
        let copy = &q.frames[2];
        assert_eq!(
            (copy.name.as_str(), copy.symbol.as_deref()),
            ("hot", Some("hot.constprop.0"))
        );
        assert_eq!(q.samples(), 1 + 30 + 2 + 3 + 1);
        assert_eq!(q.cpu_ns(3), 3_000_000);
        assert_eq!(p.samples(), 37 + 17);
        assert_eq!(q.exe_name(), "prog");
    }
}
