//! speedscope's file format (www.speedscope.app/file-format-schema.json):
//! one "sampled" profile per process, each sample a stack of frames (root
//! first) weighted by its samples; the frames are shared by all profiles.
//! The process with the most samples opens first.

use super::model::Profile;
use rtprof_shared::json::JsonWriter;
use std::collections::HashMap;

pub const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

pub fn speedscope(profile: &Profile) -> String {
    // Frames by (name, module path): a function's copies are one frame.
    let mut index: HashMap<(&str, &str), usize> = HashMap::new();
    let mut frames: Vec<(&str, &str)> = Vec::new();
    let mut stacks: Vec<Vec<(Vec<usize>, u64)>> = Vec::new();
    for p in &profile.processes {
        let mut samples = Vec::new();
        for s in p.stacks.iter().filter(|s| s.samples > 0) {
            let stack = p
                .frames_of(s)
                .map(|f| {
                    let module = f.module.map_or("", |i| p.modules[i].path.as_str());
                    *index.entry((&f.name, module)).or_insert_with(|| {
                        frames.push((&f.name, module));
                        frames.len() - 1
                    })
                })
                .collect();
            samples.push((stack, s.samples));
        }
        stacks.push(samples);
    }
    let busiest = (0..profile.processes.len())
        .max_by_key(|&i| (profile.processes[i].samples(), std::cmp::Reverse(i)))
        .unwrap_or(0);

    let mut w = JsonWriter::new();
    w.begin_object();
    w.string_field("$schema", SCHEMA);
    w.string_field("exporter", concat!("rtprof ", env!("CARGO_PKG_VERSION")));
    w.string_field("name", &profile.name);
    w.uint_field("activeProfileIndex", busiest as u64);
    w.key("shared");
    w.begin_object();
    w.key("frames");
    w.begin_array();
    for (name, file) in frames {
        w.begin_object();
        w.string_field("name", name);
        if !file.is_empty() {
            w.string_field("file", file);
        }
        w.end_object();
    }
    w.end_array();
    w.end_object();
    w.key("profiles");
    w.begin_array();
    for (p, samples) in profile.processes.iter().zip(&stacks) {
        w.begin_object();
        w.string_field("type", "sampled");
        w.string_field("name", &format!("{} (pid {})", p.exe, p.pid));
        // Weights count samples; each is `period_ns` of CPU time.
        w.string_field("unit", "none");
        w.uint_field("startValue", 0);
        w.uint_field("endValue", p.samples());
        w.key("samples");
        w.begin_array();
        for (stack, _) in samples {
            w.begin_array();
            for &f in stack {
                w.uint(f as u64);
            }
            w.end_array();
        }
        w.end_array();
        w.key("weights");
        w.begin_array();
        for &(_, n) in samples {
            w.uint(n);
        }
        w.end_array();
        w.end_object();
    }
    w.end_array();
    w.end_object();
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::super::model::tests::sample;
    use super::*;

    #[test]
    fn one_sampled_profile_per_process_over_shared_frames() {
        let mut p = sample();
        p.processes[1].pid = 101;
        let text = speedscope(&p);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["$schema"], SCHEMA);
        let frames = v["shared"]["frames"].as_array().unwrap();
        let names: Vec<&str> = frames.iter().map(|f| f["name"].as_str().unwrap()).collect();
        // hot and its copy are one frame; idle was never sampled.
        assert_eq!(names, ["main", "hot", "[libc.so.6]", "[unknown]"]);
        assert_eq!(frames[0]["file"], "/usr/bin/prog");
        assert!(frames[3].get("file").is_none());
        assert_eq!(v["activeProfileIndex"], 0);
        let profiles = v["profiles"].as_array().unwrap();
        assert_eq!(profiles.len(), 2);
        assert_eq!(profiles[1]["name"], "/usr/bin/prog (pid 101)");
        for (q, model) in profiles.iter().zip(&p.processes) {
            assert_eq!(q["type"], "sampled");
            let weights: Vec<u64> = serde_json::from_value(q["weights"].clone()).unwrap();
            assert_eq!(weights.len(), q["samples"].as_array().unwrap().len());
            assert_eq!(weights.iter().sum::<u64>(), model.samples());
            assert_eq!(q["endValue"], model.samples());
        }
        assert_eq!(profiles[0]["samples"][1], serde_json::json!([1]));
        assert_eq!(profiles[0]["samples"][2], serde_json::json!([1]));
    }
}
