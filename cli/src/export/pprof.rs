//! pprof's format: a gzipped `perftools.profiles.Profile` message
//! (github.com/google/pprof, proto/profile.proto), read by `go tool pprof`,
//! pprof's web UI and the tools that import it.
//!
//! Three sample types: `samples/count`, `cpu/nanoseconds` (samples x the
//! process's period, the default) and `calls/count` (exact where counted).
//! One Location per process and function at the function's entry address,
//! one Function per readable name and symbol (`name` merges a function's
//! compiler copies, `system_name` is the symbol), one Mapping per process
//! and module with its build ID, and a `pid` label on every sample.
//!
//! The messages are the structs of `proto`, encoded by prost.

use super::build_id;
use super::model::{Frame, Process, Profile};
use prost::Message as _;
use std::collections::HashMap;
use std::path::Path;

/// The messages of profile.proto that rtprof writes, with the fields it
/// sets (field numbers and types as in profile.proto; fields left out are
/// never written, and readers take them as zero).
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        /// Index 0 is "": every other string field is an index here.
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// The leaf first.
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// The sample types, in the order of every sample's values.
pub const SAMPLE_TYPES: [(&str, &str); 3] = [
    ("samples", "count"),
    ("cpu", "nanoseconds"),
    ("calls", "count"),
];

/// The string table: index 0 is "", every string once.
struct Strings {
    index: HashMap<String, i64>,
    table: Vec<String>,
}

impl Strings {
    fn new() -> Strings {
        Strings {
            index: HashMap::from([(String::new(), 0)]),
            table: vec![String::new()],
        }
    }

    fn id(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.index.insert(s.to_string(), i);
        self.table.push(s.to_string());
        i
    }

    fn value_type(&mut self, (kind, unit): (&str, &str)) -> proto::ValueType {
        proto::ValueType {
            r#type: self.id(kind),
            unit: self.id(unit),
        }
    }
}

struct Encoder<'a> {
    out: proto::Profile,
    strings: Strings,
    /// Function ids by (name, symbol, module path).
    functions: HashMap<(&'a str, &'a str, &'a str), u64>,
    /// Build IDs by module path: a library is read once for all processes.
    build_ids: HashMap<&'a str, Option<String>>,
    read_build_ids: bool,
}

impl<'a> Encoder<'a> {
    fn function(&mut self, f: &'a Frame, module: &'a str) -> u64 {
        let key = (f.name.as_str(), f.symbol.as_deref().unwrap_or(""), module);
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        let file = f.source.as_ref().map_or("", |s| s.file.as_str());
        let function = proto::Function {
            id,
            name: self.strings.id(key.0),
            system_name: self.strings.id(key.1),
            filename: self.strings.id(file),
            start_line: f.source.as_ref().map_or(0, |s| s.line as i64),
        };
        self.out.function.push(function);
        self.functions.insert(key, id);
        id
    }

    /// The process's mappings (ids by module index, for the modules its
    /// frames are in) and locations (ids by frame index).
    fn process(&mut self, p: &'a Process) -> Vec<u64> {
        let mut mappings = vec![0u64; p.modules.len()];
        for f in &p.frames {
            let Some(i) = f.module.filter(|&i| mappings[i] == 0) else {
                continue;
            };
            let module = &p.modules[i];
            let id = self.out.mapping.len() as u64 + 1;
            mappings[i] = id;
            let (memory_start, memory_limit) = module.range.unwrap_or((0, 0));
            let filename = self.strings.id(&module.path);
            // Only paths: rtprofd's rows name a module by its file name,
            // which would be looked up in the current directory.
            let read = self.read_build_ids && module.path.starts_with('/');
            let build_id = self.build_ids.entry(&module.path).or_insert_with(|| {
                if read {
                    build_id::read(Path::new(&module.path))
                } else {
                    None
                }
            });
            let build_id = build_id.clone().map_or(0, |id| self.strings.id(&id));
            let mapping = proto::Mapping {
                id,
                memory_start,
                memory_limit,
                filename,
                build_id,
                // Locations carry their functions: pprof has nothing to
                // look up.
                has_functions: true,
            };
            self.out.mapping.push(mapping);
        }
        let mut locations = Vec::with_capacity(p.frames.len());
        for f in &p.frames {
            let module = f.module.map_or("", |i| p.modules[i].path.as_str());
            let function_id = self.function(f, module);
            let id = self.out.location.len() as u64 + 1;
            self.out.location.push(proto::Location {
                id,
                mapping_id: f.module.map_or(0, |i| mappings[i]),
                address: f.address.unwrap_or(0),
                line: vec![proto::Line {
                    function_id,
                    line: f.source.as_ref().map_or(0, |s| s.line as i64),
                }],
            });
            locations.push(id);
        }
        locations
    }
}

/// `profile` as a pprof file (gzipped). `read_build_ids`: look the
/// modules' build IDs up in their files (they are the run's, still on
/// disk).
pub fn pprof(profile: &Profile, read_build_ids: bool) -> Vec<u8> {
    use std::io::Write as _;
    let raw = encode(profile, read_build_ids).encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writes into a Vec cannot fail.
    gz.write_all(&raw).expect("gzip into memory");
    gz.finish().expect("gzip into memory")
}

/// The Profile message.
fn encode(profile: &Profile, read_build_ids: bool) -> proto::Profile {
    let mut e = Encoder {
        out: proto::Profile::default(),
        strings: Strings::new(),
        functions: HashMap::new(),
        build_ids: HashMap::new(),
        read_build_ids,
    };
    e.out.sample_type = SAMPLE_TYPES
        .iter()
        .map(|&t| e.strings.value_type(t))
        .collect();
    let pid = e.strings.id("pid");
    for p in &profile.processes {
        let locations = e.process(p);
        for s in &p.stacks {
            e.out.sample.push(proto::Sample {
                // The leaf first.
                location_id: s.frames.iter().rev().map(|&f| locations[f]).collect(),
                value: [s.samples, p.cpu_ns(s.samples), s.calls.unwrap_or(0)]
                    .map(|v| v as i64)
                    .to_vec(),
                label: vec![proto::Label {
                    key: pid,
                    num: p.pid as i64,
                }],
            });
        }
    }
    e.out.time_nanos = profile.start_ns as i64;
    e.out.duration_nanos = profile.duration_ns as i64;
    e.out.period_type = Some(e.strings.value_type(SAMPLE_TYPES[1]));
    // One period for the file: the processes of a run share theirs.
    let period = profile
        .processes
        .iter()
        .map(|p| p.period_ns)
        .find(|&n| n > 0);
    e.out.period = period.unwrap_or(0) as i64;
    let comment = e.strings.id(&format!(
        "rtprof {}: {}",
        env!("CARGO_PKG_VERSION"),
        profile.name
    ));
    e.out.comment = vec![comment];
    e.out.default_sample_type = e.strings.id(SAMPLE_TYPES[1].0);
    e.out.string_table = e.strings.table;
    e.out
}

#[cfg(test)]
mod tests {
    use super::super::model::tests::sample as model_sample;
    use super::*;

    /// Decodes what `pprof` wrote (gunzipped) back into the profile it
    /// describes: per sample, the leaf's function name, system name,
    /// mapping file and pid, and the values.
    #[test]
    fn samples_decode_to_the_profile_they_came_from() {
        use std::io::Read as _;
        let model = model_sample();
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&pprof(&model, false)[..])
            .read_to_end(&mut raw)
            .unwrap();
        let top = proto::Profile::decode(&raw[..]).unwrap();
        let strings = &top.string_table;
        assert_eq!(strings[0], "");
        let s = |i: i64| strings[i as usize].as_str();
        let types: Vec<(&str, &str)> = top
            .sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect();
        assert_eq!(types, SAMPLE_TYPES);
        assert_eq!(s(top.default_sample_type), "cpu");
        let period_type = top.period_type.as_ref().unwrap();
        assert_eq!(
            (s(period_type.r#type), s(period_type.unit)),
            SAMPLE_TYPES[1]
        );
        assert_eq!(top.period, 1_000_000);
        assert_eq!(top.time_nanos as u64, model.start_ns);
        assert_eq!(top.duration_nanos as u64, model.duration_ns);
        let comments: Vec<&str> = top.comment.iter().map(|&c| s(c)).collect();
        assert_eq!(
            comments,
            [format!("rtprof {}: prog --fast", env!("CARGO_PKG_VERSION"))]
        );

        let functions: HashMap<u64, (&str, &str)> = top
            .function
            .iter()
            .map(|f| (f.id, (s(f.name), s(f.system_name))))
            .collect();
        let mappings: HashMap<u64, (&str, u64)> = top
            .mapping
            .iter()
            .map(|m| {
                assert!(m.has_functions);
                (m.id, (s(m.filename), m.memory_start))
            })
            .collect();
        // Two processes, the executable and libc each.
        assert_eq!(mappings.len(), 4);
        let locations: HashMap<u64, (u64, u64, u64)> = top
            .location
            .iter()
            .map(|l| (l.id, (l.mapping_id, l.address, l.line[0].function_id)))
            .collect();
        let mut got = Vec::new();
        for sample in &top.sample {
            assert_eq!(sample.location_id.len(), 1);
            let (mapping, address, function) = locations[&sample.location_id[0]];
            let (name, system) = functions[&function];
            let file = mappings.get(&mapping).map_or("", |m| m.0);
            let [l] = &sample.label[..] else {
                panic!("one label: {:?}", sample.label)
            };
            assert_eq!(s(l.key), "pid");
            got.push((l.num, name, system, file, address, &sample.value));
        }
        let hot_copy = got
            .iter()
            .find(|g| g.0 == 100 && g.2 == "hot.constprop.0")
            .unwrap();
        assert_eq!(hot_copy.1, "hot");
        assert_eq!(hot_copy.3, "/usr/bin/prog");
        assert_eq!(hot_copy.4, 0x5000_1200);
        assert_eq!(*hot_copy.5, [2, 2_000_000, 7]);
        let libc = got.iter().find(|g| g.0 == 101 && g.1 == "[libc.so.6]");
        assert_eq!(libc.unwrap().3, "/lib/libc.so.6");
        // Every stack is a sample, zeros included, and the totals agree.
        assert_eq!(got.len(), 12);
        let total = |i: usize| got.iter().map(|g| g.5[i] as u64).sum::<u64>();
        assert_eq!(total(0), model.samples());
        assert_eq!(total(1), model.samples() * 1_000_000);
        assert_eq!(total(2), 2 * (1 + 300 + 7 + 5));
        // A function is one Function for both processes.
        assert_eq!(functions.values().filter(|f| f.1 == "hot").count(), 1);
    }

    /// A stack's locations are the leaf first; a frame's source line is its
    /// Function's file and start line and its Location's line; a module
    /// without an address range is mapped at 0.
    #[test]
    fn stacks_and_source_lines_decode() {
        let mut model = model_sample();
        let p = &mut model.processes[0];
        p.frames[1].source = Some(rtprof_abi::reader::SourceLine {
            file: "prog.c".into(),
            line: 42,
        });
        p.modules[1].range = None;
        p.stacks.push(super::super::model::Stack {
            frames: vec![0, 1, 2],
            samples: 5,
            calls: None,
        });
        let top = encode(&model, false);
        let s = |i: i64| top.string_table[i as usize].as_str();
        let deep = top.sample.iter().find(|s| s.location_id.len() > 1);
        let deep = deep.unwrap();
        let leaf_first: Vec<&str> = deep
            .location_id
            .iter()
            .map(|&id| {
                let l = &top.location[id as usize - 1];
                assert_eq!(l.id, id);
                let f = &top.function[l.line[0].function_id as usize - 1];
                s(f.system_name)
            })
            .collect();
        assert_eq!(leaf_first, ["hot.constprop.0", "hot", "main"]);
        assert_eq!(deep.value, [5, 5_000_000, 0]);
        let hot = &top.location[1];
        assert_eq!(hot.line[0].line, 42);
        let f = &top.function[hot.line[0].function_id as usize - 1];
        assert_eq!((s(f.filename), f.start_line), ("prog.c", 42));
        let libc = top
            .mapping
            .iter()
            .find(|m| s(m.filename) == "/lib/libc.so.6");
        let libc = libc.unwrap();
        assert_eq!((libc.memory_start, libc.memory_limit), (0, 0));
        // Every string once.
        let mut table = top.string_table.clone();
        table.sort();
        table.dedup();
        assert_eq!(table.len(), top.string_table.len());
    }
}
