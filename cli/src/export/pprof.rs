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

use super::build_id;
use super::model::{Frame, Process, Profile};
use super::protobuf::Message;
use std::collections::HashMap;
use std::path::Path;

// Field numbers of profile.proto.
mod profile {
    pub const SAMPLE_TYPE: u32 = 1;
    pub const SAMPLE: u32 = 2;
    pub const MAPPING: u32 = 3;
    pub const LOCATION: u32 = 4;
    pub const FUNCTION: u32 = 5;
    pub const STRING_TABLE: u32 = 6;
    pub const TIME_NANOS: u32 = 9;
    pub const DURATION_NANOS: u32 = 10;
    pub const PERIOD_TYPE: u32 = 11;
    pub const PERIOD: u32 = 12;
    pub const COMMENT: u32 = 13;
    pub const DEFAULT_SAMPLE_TYPE: u32 = 14;
}
mod value_type {
    pub const TYPE: u32 = 1;
    pub const UNIT: u32 = 2;
}
mod sample {
    pub const LOCATION_ID: u32 = 1;
    pub const VALUE: u32 = 2;
    pub const LABEL: u32 = 3;
}
mod label {
    pub const KEY: u32 = 1;
    pub const NUM: u32 = 3;
}
mod mapping {
    pub const ID: u32 = 1;
    pub const MEMORY_START: u32 = 2;
    pub const MEMORY_LIMIT: u32 = 3;
    pub const FILENAME: u32 = 5;
    pub const BUILD_ID: u32 = 6;
    pub const HAS_FUNCTIONS: u32 = 7;
}
mod location {
    pub const ID: u32 = 1;
    pub const MAPPING_ID: u32 = 2;
    pub const ADDRESS: u32 = 3;
    pub const LINE: u32 = 4;
}
mod line {
    pub const FUNCTION_ID: u32 = 1;
    pub const LINE: u32 = 2;
}
mod function {
    pub const ID: u32 = 1;
    pub const NAME: u32 = 2;
    pub const SYSTEM_NAME: u32 = 3;
    pub const FILENAME: u32 = 4;
    pub const START_LINE: u32 = 5;
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
}

struct Encoder<'a> {
    out: Message,
    strings: Strings,
    /// Function ids by (name, symbol, module path).
    functions: HashMap<(&'a str, &'a str, &'a str), u64>,
    /// Build IDs by module path: a library is read once for all processes.
    build_ids: HashMap<&'a str, Option<String>>,
    next_mapping: u64,
    next_location: u64,
    read_build_ids: bool,
}

impl<'a> Encoder<'a> {
    fn value_type(&mut self, field: u32, (kind, unit): (&str, &str)) {
        let mut m = Message::new();
        m.int(value_type::TYPE, self.strings.id(kind))
            .int(value_type::UNIT, self.strings.id(unit));
        self.out.message(field, &m);
    }

    fn function(&mut self, f: &'a Frame, module: &'a str) -> u64 {
        let key = (f.name.as_str(), f.symbol.as_deref().unwrap_or(""), module);
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        let mut m = Message::new();
        let file = f.source.as_ref().map_or("", |s| s.file.as_str());
        m.uint(function::ID, id)
            .int(function::NAME, self.strings.id(key.0))
            .int(function::SYSTEM_NAME, self.strings.id(key.1))
            .int(function::FILENAME, self.strings.id(file));
        if let Some(s) = &f.source {
            m.int(function::START_LINE, s.line as i64);
        }
        self.out.message(profile::FUNCTION, &m);
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
            self.next_mapping += 1;
            mappings[i] = self.next_mapping;
            let mut m = Message::new();
            m.uint(mapping::ID, self.next_mapping);
            if let Some((start, limit)) = module.range {
                m.uint(mapping::MEMORY_START, start)
                    .uint(mapping::MEMORY_LIMIT, limit);
            }
            m.int(mapping::FILENAME, self.strings.id(&module.path));
            // Only paths: rtprofd's rows name a module by its file name,
            // which would be looked up in the current directory.
            let read = self.read_build_ids && module.path.starts_with('/');
            let id = self.build_ids.entry(&module.path).or_insert_with(|| {
                if read {
                    build_id::read(Path::new(&module.path))
                } else {
                    None
                }
            });
            if let Some(id) = id.clone() {
                m.int(mapping::BUILD_ID, self.strings.id(&id));
            }
            // Locations carry their functions: pprof has nothing to look up.
            m.uint(mapping::HAS_FUNCTIONS, 1);
            self.out.message(profile::MAPPING, &m);
        }
        let mut locations = Vec::with_capacity(p.frames.len());
        for f in &p.frames {
            let module = f.module.map_or("", |i| p.modules[i].path.as_str());
            let function = self.function(f, module);
            self.next_location += 1;
            let mut line = Message::new();
            line.uint(line::FUNCTION_ID, function);
            if let Some(s) = &f.source {
                line.int(line::LINE, s.line as i64);
            }
            let mut m = Message::new();
            m.uint(location::ID, self.next_location)
                .uint(location::MAPPING_ID, f.module.map_or(0, |i| mappings[i]))
                .uint(location::ADDRESS, f.address.unwrap_or(0))
                .message(location::LINE, &line);
            self.out.message(profile::LOCATION, &m);
            locations.push(self.next_location);
        }
        locations
    }
}

/// `profile` as a pprof file (gzipped). `read_build_ids`: look the
/// modules' build IDs up in their files (they are the run's, still on
/// disk).
pub fn pprof(profile: &Profile, read_build_ids: bool) -> Vec<u8> {
    use std::io::Write as _;
    let raw = encode(profile, read_build_ids);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writes into a Vec cannot fail.
    gz.write_all(&raw).expect("gzip into memory");
    gz.finish().expect("gzip into memory")
}

/// The Profile message, not compressed.
fn encode(profile: &Profile, read_build_ids: bool) -> Vec<u8> {
    let mut e = Encoder {
        out: Message::new(),
        strings: Strings::new(),
        functions: HashMap::new(),
        build_ids: HashMap::new(),
        next_mapping: 0,
        next_location: 0,
        read_build_ids,
    };
    for t in SAMPLE_TYPES {
        e.value_type(profile::SAMPLE_TYPE, t);
    }
    let pid = e.strings.id("pid");
    for p in &profile.processes {
        let locations = e.process(p);
        for s in &p.stacks {
            let mut m = Message::new();
            // The leaf first.
            m.packed(
                sample::LOCATION_ID,
                s.frames.iter().rev().map(|&f| locations[f]),
            );
            m.packed(
                sample::VALUE,
                [s.samples, p.cpu_ns(s.samples), s.calls.unwrap_or(0)],
            );
            let mut l = Message::new();
            l.int(label::KEY, pid).int(label::NUM, p.pid as i64);
            m.message(sample::LABEL, &l);
            e.out.message(profile::SAMPLE, &m);
        }
    }
    e.out
        .int(profile::TIME_NANOS, profile.start_ns as i64)
        .int(profile::DURATION_NANOS, profile.duration_ns as i64);
    e.value_type(profile::PERIOD_TYPE, SAMPLE_TYPES[1]);
    // One period for the file: the processes of a run share theirs.
    let period = profile
        .processes
        .iter()
        .map(|p| p.period_ns)
        .find(|&n| n > 0);
    e.out.int(profile::PERIOD, period.unwrap_or(0) as i64);
    let comment = e.strings.id(&format!(
        "rtprof {}: {}",
        env!("CARGO_PKG_VERSION"),
        profile.name
    ));
    e.out.packed(profile::COMMENT, [comment as u64]);
    let cpu = e.strings.id(SAMPLE_TYPES[1].0);
    e.out.int(profile::DEFAULT_SAMPLE_TYPE, cpu);
    let mut out = e.out;
    for s in &e.strings.table {
        out.bytes(profile::STRING_TABLE, s.as_bytes());
    }
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::super::model::tests::sample as model_sample;
    use super::super::protobuf::decode::{fields, packed, Value};
    use super::*;

    fn varint(v: &Value) -> u64 {
        match v {
            Value::Varint(n) => *n,
            Value::Bytes(_) => panic!("not a varint"),
        }
    }
    fn bytes<'a>(v: &Value<'a>) -> &'a [u8] {
        match v {
            Value::Bytes(b) => b,
            Value::Varint(_) => panic!("not bytes"),
        }
    }
    /// The varint `field` of a message, 0 when left out.
    fn get(m: &[(u32, Value)], field: u32) -> u64 {
        m.iter().find(|f| f.0 == field).map_or(0, |f| varint(&f.1))
    }
    fn all<'a>(m: &[(u32, Value<'a>)], field: u32) -> Vec<&'a [u8]> {
        m.iter()
            .filter(|f| f.0 == field)
            .map(|f| bytes(&f.1))
            .collect()
    }

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
        let top = fields(&raw);
        let strings: Vec<&str> = all(&top, profile::STRING_TABLE)
            .into_iter()
            .map(|b| std::str::from_utf8(b).unwrap())
            .collect();
        assert_eq!(strings[0], "");
        let s = |i: u64| strings[i as usize];
        let types: Vec<(&str, &str)> = all(&top, profile::SAMPLE_TYPE)
            .into_iter()
            .map(|b| {
                let f = fields(b);
                (s(get(&f, value_type::TYPE)), s(get(&f, value_type::UNIT)))
            })
            .collect();
        assert_eq!(types, SAMPLE_TYPES);
        assert_eq!(s(get(&top, profile::DEFAULT_SAMPLE_TYPE)), "cpu");
        assert_eq!(get(&top, profile::PERIOD), 1_000_000);
        assert_eq!(get(&top, profile::TIME_NANOS), model.start_ns);

        let functions: HashMap<u64, (&str, &str)> = all(&top, profile::FUNCTION)
            .into_iter()
            .map(|b| {
                let f = fields(b);
                let names = (
                    s(get(&f, function::NAME)),
                    s(get(&f, function::SYSTEM_NAME)),
                );
                (get(&f, function::ID), names)
            })
            .collect();
        let mappings: HashMap<u64, (&str, u64)> = all(&top, profile::MAPPING)
            .into_iter()
            .map(|b| {
                let f = fields(b);
                assert_eq!(get(&f, mapping::HAS_FUNCTIONS), 1);
                let at = (
                    s(get(&f, mapping::FILENAME)),
                    get(&f, mapping::MEMORY_START),
                );
                (get(&f, mapping::ID), at)
            })
            .collect();
        // Two processes, the executable and libc each.
        assert_eq!(mappings.len(), 4);
        let locations: HashMap<u64, (u64, u64, u64)> = all(&top, profile::LOCATION)
            .into_iter()
            .map(|b| {
                let f = fields(b);
                let line = fields(all(&f, location::LINE)[0]);
                let at = (
                    get(&f, location::MAPPING_ID),
                    get(&f, location::ADDRESS),
                    get(&line, line::FUNCTION_ID),
                );
                (get(&f, location::ID), at)
            })
            .collect();
        let mut got = Vec::new();
        for b in all(&top, profile::SAMPLE) {
            let f = fields(b);
            let locs = packed(all(&f, sample::LOCATION_ID)[0]);
            assert_eq!(locs.len(), 1);
            let (mapping, address, function) = locations[&locs[0]];
            let (name, system) = functions[&function];
            let file = mappings.get(&mapping).map_or("", |m| m.0);
            let values = packed(all(&f, sample::VALUE)[0]);
            let l = fields(all(&f, sample::LABEL)[0]);
            assert_eq!(s(get(&l, label::KEY)), "pid");
            got.push((get(&l, label::NUM), name, system, file, address, values));
        }
        let hot_copy = got
            .iter()
            .find(|g| g.0 == 100 && g.2 == "hot.constprop.0")
            .unwrap();
        assert_eq!(hot_copy.1, "hot");
        assert_eq!(hot_copy.3, "/usr/bin/prog");
        assert_eq!(hot_copy.4, 0x5000_1200);
        assert_eq!(hot_copy.5, [2, 2_000_000, 7]);
        let libc = got.iter().find(|g| g.0 == 101 && g.1 == "[libc.so.6]");
        assert_eq!(libc.unwrap().3, "/lib/libc.so.6");
        // Every stack is a sample, zeros included, and the totals agree.
        assert_eq!(got.len(), 12);
        let total = |i: usize| got.iter().map(|g| g.5[i]).sum::<u64>();
        assert_eq!(total(0), model.samples());
        assert_eq!(total(1), model.samples() * 1_000_000);
        assert_eq!(total(2), 2 * (1 + 300 + 7 + 5));
        // A function is one Function for both processes.
        assert_eq!(functions.values().filter(|f| f.1 == "hot").count(), 1);
    }
}
