//! The C reader of the presentation segment (`abi/c/rtprof_present.c`),
//! built with AddressSanitizer and UndefinedBehaviorSanitizer, against
//! segments written by the Rust writer and then broken one field at a
//! time: every malformed segment gets a clean error (the same verdict as
//! the Rust reader's), and no read strays outside what the reader was
//! given.

use rtprof_abi::present::{
    lookup, read_process_into, read_view, segment_bytes, BufferHeader, PresentError, PresentHeader,
    PresentWriter, ProcEntry, ProcTable, ProcessRows, Row, RowIn,
};
use rtprof_e2e::*;
use std::mem::offset_of;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `present_check` built with both sanitizers; any error they find ends
/// the program with a report instead of carrying on.
fn build_checker(dir: &Path) -> PathBuf {
    let out = dir.join("present_check");
    let o = Command::new("gcc")
        .args([
            "-O1",
            "-g",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer",
            "-o",
        ])
        .arg(&out)
        .arg(format!("-I{}", root().join("abi/include").display()))
        .arg(root().join("abi/c/present_check.c"))
        .arg(root().join("abi/c/rtprof_present.c"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// Runs the checker; its stdout. It must finish (a FIFO must not block
/// it), exit 0 and leave stderr empty (no sanitizer report, no leak).
fn check(checker: &Path, args: &[&str], what: &str) -> String {
    let mut child = Command::new(checker)
        .args(args)
        .env("ASAN_OPTIONS", "detect_leaks=1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("{what}: present_check {args:?} hangs");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.is_empty(),
        "{what}: present_check {args:?}: {:?}\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

fn rows(names: &[&'static str], k: u64) -> Vec<RowIn<'static>> {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| RowIn {
            name: n,
            module: "app",
            counted: true,
            estimated: i == 1,
            accelerated: false,
            counting_off: false,
            calls: k * (i as u64 + 1),
            samples: k,
            time_ns: k * 1_000_000,
            total_calls: k * 10,
        })
        .collect()
}

/// A segment with two publishes (buffer 0 is current).
fn good_segment() -> Vec<u8> {
    let len = segment_bytes(8 * 1024);
    let mut mem = vec![0u64; len as usize / 8];
    // SAFETY: `mem` holds `len` zeroed, 8-aligned bytes and outlives `w`.
    let mut w = unsafe { PresentWriter::init(mem.as_mut_ptr().cast(), len, 200_000_000) };
    for k in 1..=2 {
        let procs = [
            ProcTable {
                pid: 10,
                exe: "/bin/app",
                span_ns: 1_000_000_000,
                rows: rows(&["main", "hot", "cold"], k),
                ..Default::default()
            },
            ProcTable {
                pid: 11,
                exe: "/bin/other",
                ended: true,
                rows: rows(&["hot"], k),
                ..Default::default()
            },
        ];
        w.publish(k, 1_000_000_000, &procs).unwrap();
    }
    mem.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn put(b: &mut [u8], at: usize, v: &[u8]) {
    b[at..at + v.len()].copy_from_slice(v);
}

/// Offset of the current buffer.
fn current(b: &[u8]) -> usize {
    let at = offset_of!(PresentHeader, generation);
    let gen = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let at = offset_of!(PresentHeader, buffer_off) + 8 * (gen & 1) as usize;
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize
}

/// Offset of a field of the current buffer's header.
fn bfield(b: &[u8], field: usize) -> usize {
    current(b) + field
}

/// Offset of row `i` of the current buffer.
fn row_at(b: &[u8], i: usize) -> usize {
    current(b) + u32_at(b, bfield(b, offset_of!(BufferHeader, rows_off))) as usize + i * 64
}

/// Changes row `i` with `f` and stores it again.
fn edit_row(b: &mut [u8], i: usize, f: impl FnOnce(&mut Row)) {
    let at = row_at(b, i);
    // SAFETY: 64 bytes of the buffer (a `Row` is 64 bytes of integers,
    // valid for any bit pattern), read without alignment assumptions.
    let mut r: Row = unsafe { std::ptr::read_unaligned(b[at..at + 64].as_ptr().cast()) };
    f(&mut r);
    // SAFETY: as above, written back to the same 64 bytes.
    unsafe { std::ptr::write_unaligned(b[at..at + 64].as_mut_ptr().cast(), r) };
}

/// Runs `f` on a copy of `b` that is 8-aligned, as a mapping is.
fn aligned<T>(b: &[u8], f: impl FnOnce(&[u8]) -> T) -> T {
    let mut words = vec![0u64; b.len().div_ceil(8)];
    // SAFETY: `words` has room for `b.len()` bytes, and any byte is a valid u8.
    let buf = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), b.len()) };
    buf.copy_from_slice(b);
    f(buf)
}

/// The Rust reader's verdict, for comparison.
fn rust_verdict(b: &[u8]) -> Result<(), PresentError> {
    aligned(b, |buf| {
        read_view(buf)?;
        for (exe, name) in [
            ("/bin/app", "hot"),
            ("/bin/other", "hot"),
            ("/bin/app", "main"),
        ] {
            lookup(buf, exe, name)?;
        }
        Ok(())
    })
}

#[test]
fn c_reader_gives_a_clean_error_for_every_malformed_segment() {
    let dir = scratch("present-c");
    let checker = build_checker(&dir);
    let good = good_segment();

    // The intact segment: the C reader sees what the Rust reader sees.
    let file = dir.join("good");
    std::fs::write(&file, &good).unwrap();
    let v = aligned(&good, read_view).unwrap();
    for mode in ["open", "copy"] {
        let out = check(&checker, &[mode, file.to_str().unwrap()], "intact");
        let first = out.lines().next().unwrap();
        assert!(
            first.starts_with(&format!(
                "ok generation 2 procs 2 rows {} globals {} publish_ns {} tick_ns 200000000 ",
                v.rows.len(),
                v.global_rows().len(),
                v.publish_ns
            )),
            "{out}"
        );
        assert!(out.contains("row 10 hot app calls 4\n"), "{out}");
        assert!(out.contains("row 11 hot app calls 2\n"), "{out}");
        assert!(
            out.contains("global /bin/app hot calls 4 found 1\n"),
            "{out}"
        );
        assert!(
            out.contains("global /bin/other hot calls 2 found 1\n"),
            "{out}"
        );
    }

    // One process at a time, copying only its rows: the same rows, names
    // and order as the Rust reader's.
    for pid in [10u32, 11] {
        let out = check(
            &checker,
            &["process", file.to_str().unwrap(), &pid.to_string()],
            "one process",
        );
        let mut rows = ProcessRows::default();
        assert!(aligned(&good, |b| read_process_into(b, pid, &mut rows)).unwrap());
        let mut want = format!(
            "process {pid} {} generation 2 rows {} ended {}\n",
            rows.exe(),
            rows.len(),
            rows.ended as u32
        );
        for r in rows.rows() {
            want += &format!("row {} {} calls {}\n", r.name, r.module, r.calls);
        }
        assert_eq!(out, want);
    }
    let out = check(
        &checker,
        &["process", file.to_str().unwrap(), "12"],
        "absent",
    );
    assert_eq!(out, "error -10: no such process in the table\n");

    type Edit = Box<dyn Fn(&mut Vec<u8>)>;
    /// What is broken, how, the C reader's error, the Rust reader's.
    type Case = (&'static str, Edit, i32, fn(&PresentError) -> bool);
    let hdr = |field: usize, v: Vec<u8>| -> Edit { Box::new(move |b| put(b, field, &v)) };
    let buf = |field: usize, v: Vec<u8>| -> Edit {
        Box::new(move |b| {
            let at = bfield(b, field);
            put(b, at, &v)
        })
    };
    let le32 = |v: u32| v.to_le_bytes().to_vec();
    let le64 = |v: u64| v.to_le_bytes().to_vec();
    let cur_off = offset_of!(PresentHeader, buffer_off); // buffer 0: current
    let first_row = offset_of!(ProcEntry, first_row);
    let cases: Vec<Case> = vec![
        ("8 bytes", Box::new(|b| b.truncate(8)), -5, |e| {
            *e == PresentError::TooShort
        }),
        ("63 bytes", Box::new(|b| b.truncate(63)), -5, |e| {
            *e == PresentError::TooShort
        }),
        ("empty", Box::new(|b| b.clear()), -5, |e| {
            *e == PresentError::TooShort
        }),
        ("bad magic", hdr(0, b"RTPROFX\0".to_vec()), -6, |e| {
            *e == PresentError::BadMagic
        }),
        (
            "version 1",
            hdr(offset_of!(PresentHeader, version), le32(1)),
            -7,
            |e| *e == PresentError::UnsupportedVersion(1),
        ),
        (
            "buffer length 8",
            hdr(offset_of!(PresentHeader, buffer_len), le64(8)),
            -8,
            |e| matches!(e, PresentError::BadRegion(_)),
        ),
        (
            "buffer length 0",
            hdr(offset_of!(PresentHeader, buffer_len), le64(0)),
            -8,
            |e| matches!(e, PresentError::BadRegion(_)),
        ),
        (
            "buffer length past the end",
            hdr(offset_of!(PresentHeader, buffer_len), le64(1 << 40)),
            -8,
            |e| matches!(e, PresentError::BadRegion(_)),
        ),
        (
            "buffer past the end",
            hdr(cur_off, le64(1 << 40)),
            -8,
            |e| matches!(e, PresentError::BadRegion(_)),
        ),
        (
            "buffer at the very end",
            Box::new(|b| {
                let end = b.len() as u64 - 64;
                put(b, offset_of!(PresentHeader, buffer_off), &end.to_le_bytes())
            }),
            -8,
            |e| matches!(e, PresentError::BadRegion(_)),
        ),
        (
            // Its header would run past the end of the segment.
            "8-byte buffer at the end of the segment",
            Box::new(|b| {
                let end = b.len() as u64 - 8;
                put(b, offset_of!(PresentHeader, buffer_off), &end.to_le_bytes());
                put(
                    b,
                    offset_of!(PresentHeader, buffer_len),
                    &8u64.to_le_bytes(),
                );
            }),
            -8,
            |e| matches!(e, PresentError::BadRegion(_)),
        ),
        ("buffer misaligned", hdr(cur_off, le64(68)), -8, |e| {
            matches!(e, PresentError::BadRegion(_))
        }),
        (
            "buffer inside the header",
            hdr(cur_off, le64(16)),
            -8,
            |e| matches!(e, PresentError::BadRegion(_)),
        ),
        (
            "never published",
            hdr(offset_of!(PresentHeader, generation), le64(0)),
            -3,
            |e| *e == PresentError::NotPublished,
        ),
        ("always being written", buf(0, le64(7)), -2, |e| {
            *e == PresentError::Busy
        }),
        (
            "processes past the end",
            buf(offset_of!(BufferHeader, procs_off), le32(u32::MAX - 8)),
            -8,
            |e| matches!(e, PresentError::BadRegion(_)),
        ),
        (
            "huge row count",
            buf(offset_of!(BufferHeader, row_count), le32(1 << 30)),
            -8,
            |e| matches!(e, PresentError::BadRegion(_)),
        ),
        (
            "strings past the end",
            buf(offset_of!(BufferHeader, strings_len), le32(1 << 20)),
            -8,
            |e| matches!(e, PresentError::BadRegion(_)),
        ),
        (
            "hash size not a power of two",
            buf(offset_of!(BufferHeader, hash_cap), le32(3)),
            -8,
            |e| matches!(e, PresentError::BadRegion(_)),
        ),
        (
            "global rows do not add up",
            buf(offset_of!(BufferHeader, global_count), le32(1)),
            -8,
            |e| matches!(e, PresentError::BadRegion(_)),
        ),
        (
            "row name past the strings",
            Box::new(|b| edit_row(b, 0, |r| r.name_off = 1 << 20)),
            -8,
            |e| matches!(e, PresentError::BadRegion(_)),
        ),
        (
            "row name length overflows",
            Box::new(|b| {
                edit_row(b, 2, |r| {
                    r.name_off = 4;
                    r.name_len = u32::MAX;
                })
            }),
            -8,
            |e| matches!(e, PresentError::BadRegion(_)),
        ),
        (
            "row of no process",
            Box::new(|b| edit_row(b, 1, |r| r.proc_index = 99)),
            -8,
            |e| matches!(e, PresentError::BadRegion(_)),
        ),
        (
            "process rows past the globals",
            Box::new(move |b| {
                let at =
                    current(b) + u32_at(b, bfield(b, offset_of!(BufferHeader, procs_off))) as usize;
                put(b, at + first_row, &50u32.to_le_bytes())
            }),
            -8,
            |e| matches!(e, PresentError::BadRegion(_)),
        ),
        (
            "executable past the strings",
            Box::new(|b| {
                let at =
                    current(b) + u32_at(b, bfield(b, offset_of!(BufferHeader, procs_off))) as usize;
                put(
                    b,
                    at + offset_of!(ProcEntry, exe_off),
                    &(1u32 << 20).to_le_bytes(),
                )
            }),
            -8,
            |e| matches!(e, PresentError::BadRegion(_)),
        ),
        (
            "hash entry outside the global rows",
            Box::new(|b| {
                let at =
                    current(b) + u32_at(b, bfield(b, offset_of!(BufferHeader, hash_off))) as usize;
                let cap = u32_at(b, bfield(b, offset_of!(BufferHeader, hash_cap))) as usize;
                for i in 0..cap {
                    put(b, at + 4 * i, &0u32.to_le_bytes());
                }
            }),
            -8,
            |e| matches!(e, PresentError::BadRegion(_)),
        ),
    ];
    for (i, (what, edit, want_c, rust_ok)) in cases.iter().enumerate() {
        let mut b = good.clone();
        edit(&mut b);
        let rust = rust_verdict(&b);
        assert!(
            rust.as_ref().is_err_and(rust_ok),
            "{what}: the Rust reader says {rust:?}"
        );
        let file = dir.join(format!("case-{i}"));
        std::fs::write(&file, &b).unwrap();
        for mode in ["open", "copy"] {
            let out = check(&checker, &[mode, file.to_str().unwrap()], what);
            // rtprof_open itself refuses a file shorter than the header.
            assert!(
                out.starts_with(&format!("error {want_c}: ")) && out.lines().count() == 1,
                "{what} ({mode}): {out}"
            );
        }
        // The per-process read looks at less of the table: it may find
        // nothing wrong in what it reads, but never reads outside it.
        let out = check(&checker, &["process", file.to_str().unwrap(), "10"], what);
        assert!(
            out.starts_with("error -") || out.starts_with("process 10 "),
            "{what} (process): {out}"
        );
    }

    // What is not a segment file at all, refused by rtprof_open (a FIFO
    // without blocking on it).
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for (what, path, want) in [
        ("a FIFO", fifo.clone(), "error -4: not a regular file"),
        ("a directory", dir.clone(), "error -4: not a regular file"),
        (
            "missing",
            dir.join("missing"),
            "error -1: No such file or directory",
        ),
    ] {
        let out = check(&checker, &["open", path.to_str().unwrap()], what);
        assert!(out.starts_with(want), "{what}: {out}");
    }

    // Random corruption of header and current buffer: never a stray read,
    // and both outcomes occur.
    let out = check(
        &checker,
        &["fuzz", file.to_str().unwrap(), "20000", "12345"],
        "fuzz",
    );
    let counts: Vec<(i32, u32)> = out
        .trim()
        .strip_prefix("fuzzed 20000:")
        .unwrap_or_else(|| panic!("{out}"))
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.parse().unwrap(), v.parse().unwrap())
        })
        .collect();
    assert_eq!(counts.iter().map(|c| c.1).sum::<u32>(), 20000, "{out}");
    assert!(counts.iter().any(|c| c.0 == 0), "some stay readable: {out}");
    assert!(counts.iter().any(|c| c.0 == -8), "bounds catch some: {out}");
    let _ = std::fs::remove_dir_all(&dir);
}
