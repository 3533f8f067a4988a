//! The plan cache: a hit profiles exactly as a miss, a rebuilt program is
//! never patched from its old entry, a hostile cache is refused with its
//! reason, processes racing on an empty cache each count exactly, and
//! `rtprof cache` fills, shows and empties it.

use rtprof_e2e::*;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A private cache directory for one test.
fn cache_dir(dir: &Path) -> PathBuf {
    let c = dir.join("cache");
    std::fs::create_dir_all(&c).unwrap();
    std::fs::set_permissions(&c, std::fs::Permissions::from_mode(0o700)).unwrap();
    c
}

/// The entries for the module file `of` (libraries that are only sampled
/// have entries of their own; page images, `NAME-HASH.imageN.rtc`, are not
/// counted here).
fn entries_of(cache: &Path, of: &Path) -> Vec<PathBuf> {
    let prefix = format!("{}-", of.file_name().unwrap().to_string_lossy());
    let mut v: Vec<PathBuf> = std::fs::read_dir(cache)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "rtc"))
        .filter(|p| !p.to_string_lossy().contains(".image"))
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&prefix)
        })
        .collect();
    v.sort();
    v
}

/// Runs `bin` under `rtprof run` with the cache in `cache` and verbose
/// diagnostics; returns the profile and the agent's lines about `bin`.
fn profiled(bin: &Path, cache: &Path, dir: &Path) -> (Profiled, String) {
    let cache = cache.to_str().unwrap();
    let p = run_profiled(
        bin,
        &[],
        &[("RTPROF_CACHE", cache), ("RTPROF_VERBOSE", "1")],
        dir,
    );
    let name = bin.file_name().unwrap().to_string_lossy().into_owned();
    let lines: String = String::from_utf8_lossy(&p.output.stderr)
        .lines()
        .filter(|l| l.starts_with("rtprof[") && (l.contains(&name) || l.contains("cache")))
        .map(|l| format!("{l}\n"))
        .collect();
    (p, lines)
}

/// The program's stdout and status equal the plain run's, and every
/// `EXPECT` count holds.
fn check(what: &str, bin: &Path, plain: &std::process::Output, p: &Profiled) {
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        String::from_utf8_lossy(&p.output.stdout),
        "{what}: stdout"
    );
    assert_eq!(
        plain.status.code(),
        p.output.status.code(),
        "{what}: status"
    );
    let proc_ = process(&p.report, bin);
    let mut checked = 0;
    for (name, n) in expectations(&plain.stdout).counts {
        let f = function_named(proc_, &name);
        // Entries too small to patch (-Os) are refused, with their reason.
        if f["patched"] != true {
            assert!(f["refused"].is_string(), "{what}: {f}");
            continue;
        }
        assert_eq!(f["calls"].as_u64(), Some(n), "{what}: calls of {name}: {f}");
        checked += 1;
    }
    assert!(checked > 0, "{what}: no count checked");
}

/// Each function of the main module as (name, vaddr, patched, refused, calls).
/// The executable's functions, by address (the report orders equal
/// counts by samples, which differ between runs).
fn table(p: &Profiled, bin: &Path) -> Vec<(String, u64, bool, String, u64)> {
    let main = process(&p.report, bin)["modules"][0]["path"]
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_string();
    let mut t: Vec<_> = process(&p.report, bin)["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["module"] == main.as_str())
        .map(|f: &Value| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["vaddr"].as_u64().unwrap(),
                f["patched"] == true,
                f["refused"].as_str().unwrap_or("").to_string(),
                f["calls"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    t.sort_by_key(|r| r.1);
    t
}

#[test]
fn hit_and_miss_give_identical_reports() {
    let dir = scratch("cache-hit");
    let cache = cache_dir(&dir);
    for src in ["calls.c", "workload.c"] {
        for opt in ["-O0", "-O2", "-Os"] {
            let v = Variant {
                opt,
                cf_protection: true,
                pie: true,
                strip: false,
            };
            let (bin, _) = compile(src, &v, &[], &dir);
            let what = format!("{src} {opt}");
            let plain = run_plain(&bin, &[]);
            let (miss, lines) = profiled(&bin, &cache, &dir);
            assert!(
                lines.contains(": analysed in"),
                "{what}: first run analyses:\n{lines}"
            );
            let (hit, lines) = profiled(&bin, &cache, &dir);
            assert!(
                lines.contains(": cached in"),
                "{what}: second run hits:\n{lines}"
            );
            check(&format!("{what} (miss)"), &bin, &plain, &miss);
            check(&format!("{what} (hit)"), &bin, &plain, &hit);
            assert_eq!(
                table(&miss, &bin),
                table(&hit, &bin),
                "{what}: reports differ"
            );
        }
    }
}

#[test]
fn rebuilt_program_is_not_patched_from_its_old_entry() {
    let dir = scratch("cache-rebuilt");
    let cache = cache_dir(&dir);
    let first = compile_o2("calls.c", &[], &dir);
    let bin = dir.join("prog");
    std::fs::copy(&first, &bin).unwrap();
    let (_, lines) = profiled(&bin, &cache, &dir);
    assert!(lines.contains(": analysed in"), "{lines}");
    // Another program at the same path, as `make` leaves it.
    let second = compile_o2("workload.c", &[], &dir);
    std::fs::copy(&second, &bin).unwrap();
    let plain = run_plain(&bin, &[]);
    let (p, lines) = profiled(&bin, &cache, &dir);
    assert!(
        lines.contains(": analysed in"),
        "rebuilt: analysed again:\n{lines}"
    );
    check("rebuilt", &bin, &plain, &p);
}

/// Each way a cache can be hostile or damaged is refused with its reason,
/// and the program is profiled exactly as without a cache.
#[test]
fn hostile_cache_is_refused_with_its_reason() {
    let dir = scratch("cache-hostile");
    let bin = compile_o2("workload.c", &[], &dir);
    let other = compile_o2("calls.c", &[], &dir);
    let plain = run_plain(&bin, &[]);
    let fresh = |name: &str| {
        let c = dir.join(name);
        std::fs::create_dir_all(&c).unwrap();
        std::fs::set_permissions(&c, std::fs::Permissions::from_mode(0o700)).unwrap();
        profiled(&bin, &c, &dir);
        let e = entries_of(&c, &bin);
        assert_eq!(e.len(), 1, "one entry: {e:?}");
        // The entry is what is damaged here: a page image, when there is
        // one, is used without reading the entry's plans (tests/images.rs
        // damages images).
        for f in std::fs::read_dir(&c).unwrap().flatten() {
            if f.file_name().to_string_lossy().contains(".image") {
                std::fs::remove_file(f.path()).unwrap();
            }
        }
        (c, e[0].clone())
    };
    type Damage = Box<dyn Fn(&Path, &Path)>;
    let other_bin = other.clone();
    let dir2 = dir.clone();
    let cases: Vec<(&str, Damage, &str)> = vec![
        (
            "world-writable directory",
            Box::new(|c, _| {
                std::fs::set_permissions(c, std::fs::Permissions::from_mode(0o777)).unwrap()
            }),
            "writable only by them",
        ),
        (
            "entry owned by another user",
            Box::new(|_, e| std::os::unix::fs::chown(e, Some(65534), Some(65534)).unwrap()),
            "not owned by this user or root",
        ),
        (
            "group-writable entry",
            Box::new(|_, e| {
                std::fs::set_permissions(e, std::fs::Permissions::from_mode(0o620)).unwrap()
            }),
            "not owned by this user or root, or writable by others",
        ),
        (
            "truncated entry",
            Box::new(|_, e| {
                let b = std::fs::read(e).unwrap();
                std::fs::write(e, &b[..b.len() - 7]).unwrap()
            }),
            "truncated or padded",
        ),
        (
            "flipped byte",
            Box::new(|_, e| {
                let mut b = std::fs::read(e).unwrap();
                let i = b.len() - 100;
                b[i] ^= 0x40;
                std::fs::write(e, &b).unwrap()
            }),
            "checksum mismatch",
        ),
        (
            "another program's entry under this one's name",
            Box::new(move |c, e| {
                let o = dir2.join("other-cache");
                std::fs::create_dir_all(&o).unwrap();
                std::fs::set_permissions(&o, std::fs::Permissions::from_mode(0o700)).unwrap();
                profiled(&other_bin, &o, &dir2);
                let theirs = entries_of(&o, &other_bin).remove(0);
                std::fs::copy(theirs, e).unwrap();
                let _ = c;
            }),
            "made for another file",
        ),
        (
            "a plan whose bytes are not the code's (checksum made right)",
            Box::new(|_, e| {
                let mut b = std::fs::read(e).unwrap();
                tamper_first_plan(&mut b);
                std::fs::write(e, &b).unwrap()
            }),
            "plan not made from this file's bytes",
        ),
    ];
    for (i, (what, damage, reason)) in cases.into_iter().enumerate() {
        let (c, e) = fresh(&format!("c{i}"));
        damage(&c, &e);
        let (p, lines) = profiled(&bin, &c, &dir);
        assert!(
            lines.contains(reason),
            "{what}: reason {reason:?} in:\n{lines}"
        );
        assert!(
            lines.contains(": analysed in"),
            "{what}: analysed afresh:\n{lines}"
        );
        check(what, &bin, &plain, &p);
    }
}

/// Changes the last original byte of the entry's first plan and seals the
/// entry again, as someone who can write it would (layout: see the agent's
/// `plan::cache`).
fn tamper_first_plan(b: &mut [u8]) {
    let u32_at =
        |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    let n = u32_at(b, 68);
    let plans = rtprof_shared::cachedir::ENTRY_HEADER + n * 40;
    let r = (0..n)
        .map(|i| rtprof_shared::cachedir::ENTRY_HEADER + i * 40)
        .find(|&r| u32_at(b, r + 20) == 0 && u32_at(b, r + 36) > 0)
        .expect("a planned function");
    let plan = plans + u32_at(b, r + 32);
    let original_len = b[plan + 3] as usize;
    b[plan + 6 + original_len - 1] ^= 0x5a;
    rtprof_shared::cachedir::seal(b);
}

/// A hundred processes start the same program on an empty cache: each
/// counts exactly, and one whole entry is left.
#[test]
fn processes_racing_on_an_empty_cache() {
    let dir = scratch("cache-race");
    let cache = cache_dir(&dir);
    let bin = compile_o2("workload.c", &[], &dir);
    let plain = run_plain(&bin, &[]);
    let want = expectations(&plain.stdout).counts;
    let children: Vec<_> = (0..100)
        .map(|i| {
            Command::new(&bin)
                .env("LD_PRELOAD", agent())
                .env("RTPROF_CACHE", &cache)
                .env("RTPROF_REPORT", dir.join(format!("r{i}.json")))
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (i, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        assert_eq!(out.stdout, plain.stdout, "process {i}");
        let report: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(format!("r{i}.json"))).unwrap())
                .unwrap();
        let p = &report["processes"][0];
        for (name, n) in &want {
            assert_eq!(
                function_named(p, name)["calls"].as_u64(),
                Some(*n),
                "process {i}"
            );
        }
    }
    let e = entries_of(&cache, &bin);
    assert_eq!(e.len(), 1, "{e:?}");
    // Racing processes each wrote a whole image too, renamed over one
    // another: one per distance at most.
    let images = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().contains(".image"))
        .count();
    assert!((1..=2).contains(&images), "{images} images");
    let left: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
    let (_, lines) = profiled(&bin, &cache, &dir);
    assert!(
        lines.contains(": cached in"),
        "the entry is whole:\n{lines}"
    );
}

#[test]
fn cache_off_and_the_default_place() {
    let dir = scratch("cache-off");
    let bin = compile_o2("calls.c", &[], &dir);
    let xdg = dir.join("xdg");
    std::fs::create_dir_all(&xdg).unwrap();
    let plain = run_plain(&bin, &[]);
    let run = |cache: Option<&str>| {
        let mut c = Command::new(&bin);
        c.env("LD_PRELOAD", agent()).env("XDG_CACHE_HOME", &xdg);
        if let Some(v) = cache {
            c.env("RTPROF_CACHE", v);
        }
        assert_eq!(c.output().unwrap().stdout, plain.stdout);
    };
    run(Some("off"));
    assert!(!xdg.join("rtprof").exists(), "off writes nothing");
    run(None);
    assert_eq!(
        entries_of(&xdg.join("rtprof"), &bin).len(),
        1,
        "default: $XDG_CACHE_HOME/rtprof"
    );
    let mode = std::fs::metadata(xdg.join("rtprof"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
}

#[test]
fn rtprof_cache_warms_shows_and_clears() {
    let dir = scratch("cache-cmd");
    let bin = compile_o2("calls.c", &[], &dir);
    let xdg = dir.join("xdg");
    let rtprof_cache = |args: &[&str]| {
        let o = Command::new(rtprof())
            .arg("cache")
            .args(args)
            .env("XDG_CACHE_HOME", &xdg)
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let out = rtprof_cache(&["warm", bin.to_str().unwrap()]);
    assert!(out.contains("warmed"), "{out}");
    let stats = rtprof_cache(&["stats"]);
    let user = stats
        .lines()
        .find(|l| l.starts_with("user: "))
        .unwrap_or("");
    assert!(
        user.contains(" entries") && !user.contains(" 0 entries"),
        "{stats}"
    );
    assert_eq!(entries_of(&xdg.join("rtprof"), &bin).len(), 1);
    // The warmed program did not run its main: no output from it.
    assert!(!out.contains("EXPECT"), "{out}");
    let (_, lines) = profiled(&bin, &xdg.join("rtprof"), &dir);
    assert!(lines.contains(": cached in"), "{lines}");
    let out = rtprof_cache(&["clear"]);
    assert!(out.contains("removed "), "{out}");
    assert!(entries_of(&xdg.join("rtprof"), &bin).is_empty());
}

/// Each process's account of its instrumented modules in a run of `argv`
/// under the agent (every module, verbose, no sampling) with the cache in
/// `cache`: the lines `PATH: cached in` and `PATH: analysed in`.
fn module_accounts(argv: &[&str], cache: &Path, cwd: &Path) -> (Vec<String>, Vec<String>) {
    let o = Command::new(argv[0])
        .args(&argv[1..])
        .current_dir(cwd)
        .env("LD_PRELOAD", agent())
        .env("RTPROF_CACHE", cache)
        .env("RTPROF_MODULES", "all")
        .env("RTPROF_VERBOSE", "1")
        .env("RTPROF_SAMPLE_HZ", "0")
        .output()
        .unwrap();
    assert!(o.status.success(), "{argv:?}: {o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    let module = |l: &str, how: &str| {
        let l = l.split_once("]: ")?.1;
        l.split_once(&format!(": {how} in "))
            .map(|(path, _)| path.to_string())
    };
    let cached = err.lines().filter_map(|l| module(l, "cached")).collect();
    let analysed = err.lines().filter_map(|l| module(l, "analysed")).collect();
    (cached, analysed)
}

/// Warm starts stay warm: on the second start of gcc compiling (gcc, cc1
/// and as), of `ls -l` and of python3 with every module instrumented,
/// every module the first start analysed comes from the cache, libc and
/// cc1 among them, and none is analysed again (a short entry's
/// trampoline inside a multi-byte fill instruction once made the cache
/// reject cc1's, gcc's, as's and libc's entries at every start).
#[test]
fn second_starts_take_every_module_from_the_cache() {
    let dir = scratch("warm-starts");
    let cache = cache_dir(&dir);
    std::fs::write(dir.join("one.c"), "int f(int x) { return x + 1; }\n").unwrap();
    let python = shared_python().unwrap_or_else(|tried| panic!("no shared libpython: {tried:?}"));
    let python = python.to_str().unwrap();
    let runs: [&[&str]; 3] = [
        &["gcc", "-O2", "-c", "one.c", "-o", "one.o"],
        &["ls", "-l", "/usr/bin"],
        &[python, "-c", "pass"],
    ];
    for argv in runs {
        let (_, first) = module_accounts(argv, &cache, &dir);
        assert!(
            !first.is_empty(),
            "{argv:?}: nothing analysed at the first start"
        );
        let (cached, analysed) = module_accounts(argv, &cache, &dir);
        assert!(
            analysed.is_empty(),
            "{argv:?}: analysed again: {analysed:?}"
        );
        for m in &first {
            assert!(
                cached.contains(m),
                "{argv:?}: {m} not from the cache: {cached:?}"
            );
        }
        assert!(
            cached.iter().any(|m| m.contains("libc.so")),
            "{argv:?}: {cached:?}"
        );
    }
    let (cached, _) = module_accounts(runs[0], &cache, &dir);
    for tool in ["cc1", "x86_64-linux-gnu-as", "gcc"] {
        assert!(
            cached
                .iter()
                .any(|m| m.rsplit('/').next().unwrap().contains(tool)),
            "{tool}: {cached:?}"
        );
    }
}
