//! Page images: a warm start maps each instrumented module's patched code
//! and its stubs from the cache, writes no page of code, and counts
//! exactly as a start that writes them; where an image cannot be used the
//! module is installed the usual way and says why.

use rtprof_e2e::*;
use std::collections::BTreeMap;
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

/// `CODE <anon kB> <file>` lines: private kB of each executable mapping.
fn code_pages(stderr: &[u8]) -> Vec<(u64, String)> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("CODE ")?.splitn(2, ' ');
            Some((w.next()?.parse().ok()?, w.next()?.to_string()))
        })
        .collect()
}

/// The agent's lines (`RTPROF_VERBOSE`) of a run.
fn agent_lines(stderr: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter(|l| l.starts_with("rtprof["))
        .map(str::to_string)
        .collect()
}

/// Each module the agent patched functions of, with whether its code was
/// mapped from an image, by process.
fn mapped_modules(lines: &[String]) -> BTreeMap<(String, String), bool> {
    let mut m = BTreeMap::new();
    for l in lines {
        let Some((pid, rest)) = l.split_once("]: ") else {
            continue;
        };
        if let Some((path, tail)) = rest.split_once(": ") {
            if tail.contains(" patched, ") && !tail.starts_with("0 functions") {
                m.entry((pid.to_string(), path.to_string()))
                    .or_insert(false);
            }
            if tail.starts_with("code mapped from its image") {
                m.insert((pid.to_string(), path.to_string()), true);
            }
        }
    }
    m
}

fn counts_hold(what: &str, bin: &Path, plain: &std::process::Output, p: &Profiled) {
    assert_eq!(plain.stdout, p.output.stdout, "{what}: stdout");
    assert_eq!(
        plain.status.code(),
        p.output.status.code(),
        "{what}: status"
    );
    let proc_ = process(&p.report, bin);
    for (name, n) in expectations(&plain.stdout).counts {
        let f = function_named(proc_, &name);
        assert_eq!(f["calls"].as_u64(), Some(n), "{what}: calls of {name}: {f}");
    }
}

#[test]
fn a_warm_start_maps_patched_code_and_writes_no_code_page() {
    let dir = scratch("images-warm");
    let cache = cache_dir(&dir);
    let bin = compile_o2("own_code.c", &[], &dir);
    let plain = run_plain(&bin, &[]);
    let c = cache.to_str().unwrap();
    let env = [("RTPROF_CACHE", c), ("RTPROF_VERBOSE", "1")];
    let name = bin.to_string_lossy().into_owned();
    let own = |v: &[(u64, String)]| -> u64 {
        v.iter().filter(|(_, f)| *f == name).map(|(kb, _)| kb).sum()
    };

    let cold = run_profiled(&bin, &[], &env, &dir);
    counts_hold("cold", &bin, &plain, &cold);
    let lines = agent_lines(&cold.output.stderr).join("\n");
    assert!(
        lines.contains("image") && lines.contains("written"),
        "{lines}"
    );

    let warm = run_profiled(&bin, &[], &env, &dir);
    counts_hold("warm", &bin, &plain, &warm);
    let code_of = |p: &Profiled| process(&p.report, &bin)["modules"][0]["code"].clone();
    assert_eq!(
        code_of(&cold),
        "written",
        "the report says where code came from"
    );
    assert_eq!(code_of(&warm), "image");
    let lines = agent_lines(&warm.output.stderr);
    let mapped = mapped_modules(&lines);
    assert!(
        mapped.iter().any(|((_, p), m)| *p == name && *m),
        "not mapped from an image: {lines:#?}"
    );
    assert!(!lines.iter().any(|l| l.contains("analysed")), "{lines:#?}");
    let code = code_pages(&warm.output.stderr);
    // The program's code comes from the image (the file a mapping names)
    // and none of its pages is a private copy; its stubs too.
    assert!(
        !code.iter().any(|(_, f)| *f == name),
        "the program's code still maps its own file: {code:?}"
    );
    let images: Vec<_> = code.iter().filter(|(_, f)| f.contains(".image")).collect();
    assert!(images.len() >= 2, "code and stubs from the image: {code:?}");
    assert!(images.iter().all(|(kb, _)| *kb == 0), "{code:?}");

    // Without images the same start writes its code: the measure above
    // sees private pages where they are.
    let written = run_profiled(
        &bin,
        &[],
        &[("RTPROF_CACHE", c), ("RTPROF_IMAGES", "0")],
        &dir,
    );
    counts_hold("images off", &bin, &plain, &written);
    assert_eq!(code_of(&written), "written");
    let code = code_pages(&written.output.stderr);
    assert!(own(&code) > 0, "a written page is private: {code:?}");
}

#[test]
fn a_taken_place_falls_back_and_still_counts() {
    let dir = scratch("images-taken");
    let cache = cache_dir(&dir);
    let bin = compile_o2("own_code.c", &[], &dir);
    let lib = dir.join("libtake.so");
    let st = Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(root().join("tests/c/take_places.c"))
        .status()
        .unwrap();
    assert!(st.success());
    let plain = run_plain(&bin, &[]);
    let c = cache.to_str().unwrap();
    let env = [("RTPROF_CACHE", c), ("RTPROF_VERBOSE", "1")];
    // An image made first, where the places were free.
    let first = run_profiled(&bin, &[], &env, &dir);
    counts_hold("first", &bin, &plain, &first);
    // rtprof run preloads the agent; the program's own LD_PRELOAD comes
    // after it.
    let preload = lib.to_str().unwrap();
    let taken = run_profiled(
        &bin,
        &[],
        &[
            ("RTPROF_CACHE", c),
            ("RTPROF_VERBOSE", "1"),
            ("LD_PRELOAD", preload),
        ],
        &dir,
    );
    counts_hold("places taken", &bin, &plain, &taken);
    assert_eq!(
        process(&taken.report, &bin)["modules"][0]["code"],
        "written"
    );
    let lines = agent_lines(&taken.output.stderr);
    let name = bin.to_string_lossy().into_owned();
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&name) && l.contains("its place is taken")),
        "{lines:#?}"
    );
    assert!(
        !mapped_modules(&lines)
            .iter()
            .any(|((_, p), m)| *p == name && *m),
        "{lines:#?}"
    );
    let code = code_pages(&taken.output.stderr);
    assert!(
        code.iter().any(|(kb, f)| *f == name && *kb > 0),
        "written the usual way: {code:?}"
    );
}

/// Warm starts of third-party programs: every module the agent patches
/// is mapped from its image, none is analysed, and the program's output
/// is unchanged.
#[test]
fn warm_starts_of_python_ls_and_gcc_map_every_module() {
    let dir = scratch("images-programs");
    let cache = cache_dir(&dir);
    let c = cache.to_str().unwrap().to_string();
    let py = shared_python().unwrap_or_else(|t| panic!("no shared libpython: {t:?}"));
    let src = dir.join("one.c");
    std::fs::write(&src, "int one(int x) { return x + 1; }\n").unwrap();
    let script = "import re\n\
        s = open('/proc/self/smaps').read()\n\
        for b in re.split(r'\\n(?=[0-9a-f]+-[0-9a-f]+ )', s):\n\
        \x20   h = b.split('\\n')[0]\n\
        \x20   if 'x' in h.split()[1] and '/' in h:\n\
        \x20       kb = re.search(r'Anonymous:\\s+(\\d+)', b).group(1)\n\
        \x20       print('CODE', kb, h[h.index('/'):])\n";
    let runs: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "python3",
            vec![py.to_string_lossy().into(), "-c".into(), script.into()],
            "libpython*",
        ),
        (
            "ls -l",
            vec!["ls".into(), "-l".into(), "/usr/bin".into()],
            "all",
        ),
        (
            "gcc -c",
            vec![
                "gcc".into(),
                "-O2".into(),
                "-c".into(),
                src.to_string_lossy().into(),
                "-o".into(),
                dir.join("one.o").to_string_lossy().into(),
            ],
            "main",
        ),
    ];
    for (what, argv, modules) in runs {
        let run = |images: &str| {
            let out = Command::new(&argv[0])
                .args(&argv[1..])
                .current_dir(&dir)
                .env("LD_PRELOAD", agent())
                .env("RTPROF_CACHE", &c)
                .env("RTPROF_MODULES", modules)
                .env("RTPROF_VERBOSE", "1")
                .env("RTPROF_IMAGES", images)
                .output()
                .unwrap();
            assert!(out.status.success(), "{what}: {out:?}");
            out
        };
        let plain = Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir(&dir)
            .output()
            .unwrap();
        run("1");
        let warm = run("1");
        let lines = agent_lines(&warm.stderr);
        let mapped = mapped_modules(&lines);
        assert!(!mapped.is_empty(), "{what}: nothing patched: {lines:#?}");
        let unmapped: Vec<_> = mapped.iter().filter(|(_, m)| !**m).collect();
        assert!(
            unmapped.is_empty(),
            "{what}: not from images: {unmapped:?}\n{lines:#?}"
        );
        assert!(
            !lines.iter().any(|l| l.contains("analysed")),
            "{what}: {lines:#?}"
        );
        // Nor any plan decoded: each module's functions alone were read.
        for (pid, path) in mapped.keys() {
            let said = format!("{pid}]: {path}: no plan read: its code comes from its image");
            assert!(
                lines.iter().any(|l| l.ends_with(&said)),
                "{what}: {said}\n{lines:#?}"
            );
        }
        if what == "python3" {
            let code = code_pages(&warm.stdout);
            let lib: Vec<_> = code
                .iter()
                .filter(|(_, f)| f.contains("libpython"))
                .collect();
            assert!(
                !lib.is_empty() && lib.iter().all(|(kb, _)| *kb == 0),
                "{code:?}"
            );
            let off = code_pages(&run("0").stdout);
            assert!(
                off.iter().any(|(kb, f)| f.contains("libpython") && *kb > 0),
                "without images libpython's code is written: {off:?}"
            );
        } else {
            assert_eq!(plain.stdout, warm.stdout, "{what}: output");
        }
    }
}

/// `rtprof cache warm` writes images too: the first start after it maps
/// the program's code, as a warm start does.
#[test]
fn cache_warm_writes_images_for_the_first_start() {
    let dir = scratch("images-cache-warm");
    let home = cache_dir(&dir);
    let bin = compile_o2("own_code.c", &[], &dir);
    let out = Command::new(rtprof())
        .args(["cache", "warm"])
        .arg(&bin)
        .env("XDG_CACHE_HOME", &home)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let cache = home.join("rtprof");
    let plain = run_plain(&bin, &[]);
    let env = [
        ("RTPROF_CACHE", cache.to_str().unwrap()),
        ("RTPROF_VERBOSE", "1"),
    ];
    let first = run_profiled(&bin, &[], &env, &dir);
    counts_hold("first start", &bin, &plain, &first);
    let lines = agent_lines(&first.output.stderr);
    let name = bin.to_string_lossy().into_owned();
    assert!(
        mapped_modules(&lines)
            .iter()
            .any(|((_, p), m)| *p == name && *m),
        "{lines:#?}"
    );
    assert!(!lines.iter().any(|l| l.contains("written")), "{lines:#?}");
}

/// perf names the functions of a module whose code came from an image,
/// both when it saw the process start (its mmap events) and when it
/// attaches to it later (from /proc/PID/maps, which names the image, a
/// whole copy of the file).
#[test]
fn perf_finds_the_symbols_of_mapped_code() {
    let dir = scratch("images-perf");
    let cache = cache_dir(&dir);
    let bin = compile_o2("own_code.c", &[], &dir);
    let c = cache.to_str().unwrap().to_string();
    let with_agent = |c2: &mut Command| {
        c2.env("LD_PRELOAD", agent())
            .env("RTPROF_CACHE", &c)
            .env("RTPROF_VERBOSE", "1");
    };
    // An image first.
    let mut first = Command::new(&bin);
    with_agent(&mut first);
    assert!(first.output().unwrap().status.success());
    let report = |data: &Path| -> String {
        let out = Command::new("perf")
            .args(["report", "--stdio", "--sort", "sym", "-i"])
            .arg(data)
            .output()
            .expect("perf runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Seen from the start.
    let data = dir.join("start.data");
    let mut rec = Command::new("perf");
    rec.args(["record", "-q", "-e", "cpu-clock", "-F", "2000", "-o"])
        .arg(&data)
        .arg("--")
        .arg(&bin)
        .arg("30000000");
    with_agent(&mut rec);
    let out = rec.output().expect("perf runs");
    assert!(out.status.success(), "{out:?}");
    let lines = agent_lines(&out.stderr);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("code mapped from its image")),
        "{lines:#?}"
    );
    let text = report(&data);
    assert!(text.contains("] three") || text.contains("] two"), "{text}");
    // Attached later. perf's build-id cache links the file it recorded,
    // which changes its identity (its change time): an image for the file
    // as it is now first.
    let mut again = Command::new(&bin);
    with_agent(&mut again);
    assert!(again.output().unwrap().status.success());
    let mut prog = Command::new(&bin);
    prog.arg("400000000")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    with_agent(&mut prog);
    let mut child = prog.spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
    assert!(
        maps.lines()
            .any(|l| l.contains(" r-xp ") && l.contains(".image")),
        "{maps}"
    );
    let data = dir.join("attach.data");
    let out = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-F", "2000", "-o"])
        .arg(&data)
        .arg("-p")
        .arg(child.id().to_string())
        .args(["--", "sleep", "1"])
        .output()
        .expect("perf runs");
    let _ = child.kill();
    let _ = child.wait();
    assert!(out.status.success(), "{out:?}");
    let text = report(&data);
    assert!(text.contains("] three") || text.contains("] two"), "{text}");
}

/// An image another user could have written, or one whose trailer does
/// not hold, is not used: the module is installed the usual way, says
/// why, and counts exactly.
#[test]
fn a_hostile_or_damaged_image_is_refused() {
    let dir = scratch("images-hostile");
    let cache = cache_dir(&dir);
    let bin = compile_o2("own_code.c", &[], &dir);
    let plain = run_plain(&bin, &[]);
    let c = cache.to_str().unwrap();
    let env = [("RTPROF_CACHE", c), ("RTPROF_VERBOSE", "1")];
    let first = run_profiled(&bin, &[], &env, &dir);
    counts_hold("first", &bin, &plain, &first);
    let image = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains(".image"))
        .expect("an image written");
    let name = bin.to_string_lossy().into_owned();
    let original = std::fs::read(&image).unwrap();
    type Damage = Box<dyn Fn(&Path)>;
    let damages: Vec<(&str, Damage, &str)> = vec![
        (
            "writable by the group",
            Box::new(|p| {
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o660)).unwrap()
            }),
            "writable by others",
        ),
        (
            "another user's",
            Box::new(|p| std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap()),
            "writable by others",
        ),
        (
            "trailer cut short",
            Box::new(|p| {
                let b = std::fs::read(p).unwrap();
                std::fs::write(p, &b[..b.len() - 40]).unwrap();
            }),
            "not one for this file",
        ),
        (
            "a trailer byte changed",
            Box::new(|p| {
                let mut b = std::fs::read(p).unwrap();
                let n = b.len();
                b[n - 30] ^= 0x40;
                std::fs::write(p, &b).unwrap();
            }),
            "not one for this file",
        ),
    ];
    for (what, damage, said) in damages {
        std::fs::write(&image, &original).unwrap();
        std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o600)).unwrap();
        damage(&image);
        let p = run_profiled(&bin, &[], &env, &dir);
        counts_hold(what, &bin, &plain, &p);
        let lines = agent_lines(&p.output.stderr);
        assert!(
            lines
                .iter()
                .any(|l| l.contains("image") && l.contains(said)),
            "{what}: {lines:#?}"
        );
        assert!(
            !mapped_modules(&lines)
                .iter()
                .any(|((_, m), on)| *m == name && *on),
            "{what}: mapped anyway: {lines:#?}"
        );
        let _ = std::fs::remove_file(&image);
    }
}

/// A program on an overlay filesystem (a container's root, say) is mapped
/// from the layer beneath it, so its mapping names another device than
/// its file's status does. It is still the file the process runs (the
/// same build is mapped): instrumented, counted exactly, and warm starts
/// map its image.
#[test]
fn a_program_on_an_overlay_is_instrumented_and_maps_its_image() {
    let dir = scratch("images-overlay");
    let cache = cache_dir(&dir);
    let progs = dir.join("progs");
    std::fs::create_dir_all(&progs).unwrap();
    let bin = compile_o2("own_code.c", &[], &progs);
    let plain = run_plain(&bin, &[]);
    let dev = |p: &Path| std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(p).unwrap());
    let beneath = dev(&bin);
    private_machine(&[progs.to_str().unwrap()]);
    assert_ne!(
        dev(&bin),
        beneath,
        "the overlay's files have a device of their own"
    );
    let c = cache.to_str().unwrap();
    let env = [("RTPROF_CACHE", c), ("RTPROF_VERBOSE", "1")];
    let name = bin.to_string_lossy().into_owned();
    for start in ["cold", "warm"] {
        let p = run_profiled(&bin, &[], &env, &dir);
        counts_hold(start, &bin, &plain, &p);
        let lines = agent_lines(&p.output.stderr);
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&name) && l.contains(" patched, ")),
            "{start}: {lines:#?}"
        );
        let code = &process(&p.report, &bin)["modules"][0]["code"];
        if start == "warm" {
            assert_eq!(code, "image", "{lines:#?}");
            assert!(
                mapped_modules(&lines)
                    .iter()
                    .any(|((_, p), m)| *p == name && *m),
                "{lines:#?}"
            );
        }
    }
}
