//! A routed call changes nothing its caller can observe but the result.
//! A caller built with plain `gcc -O2` (so `-fipa-ra`) keeps values in
//! call-clobbered registers across calls of a function whose code leaves
//! them alone (checked in its disassembly first, so that the test cannot
//! pass for want of such a caller); the implementations it offers
//! overwrite every call-clobbered register. Four threads check every
//! round's hash while the calls are routed to each implementation in turn
//! and back: no signal, no wrong result, and the program's own counts per
//! implementation are rtprof's. A timer's signal handler calls the
//! function too, inside routed calls or not. Built again with `-mavx2`
//! where the machine has it, with a whole ymm register live across the
//! calls.

use rtprof_e2e::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn compile(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let bin = dir.join(name);
    let out = Command::new("gcc")
        .args(["-O2", "-pthread"])
        .arg(format!("-I{}", root().join("abi/include").display()))
        .args(extra)
        .arg("-o")
        .arg(&bin)
        .arg(root().join("tests/c/route_registers.c"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    bin
}

/// The register a name in Intel syntax is part of (`r8d` is `r8`, `ymm3`
/// and `xmm3` are `v3`), with whether it names a whole ymm register.
fn register(name: &str) -> Option<(String, bool)> {
    let gpr = [
        ("rcx", &["rcx", "ecx", "cx", "cl", "ch"][..]),
        ("rsi", &["rsi", "esi", "si", "sil"]),
        ("rdi", &["rdi", "edi", "di", "dil"]),
    ];
    for (full, names) in gpr {
        if names.contains(&name) {
            return Some((full.into(), false));
        }
    }
    for n in 8..12 {
        let r = format!("r{n}");
        if [r.clone(), format!("{r}d"), format!("{r}w"), format!("{r}b")].contains(&name.into()) {
            return Some((r, false));
        }
    }
    for (prefix, wide) in [("xmm", false), ("ymm", true)] {
        if let Some(n) = name.strip_prefix(prefix).and_then(|n| n.parse::<u8>().ok()) {
            return Some((format!("v{n}"), wide));
        }
    }
    None
}

/// The call-clobbered registers live across a call: in the instructions
/// after each `call <callee>` in `function`'s disassembly, each register
/// whose first mention reads it (`(register, read as a whole ymm)`).
fn live_across(disassembly: &str, function: &str, callee: &str) -> Vec<(String, bool)> {
    let start = format!("<{function}>:");
    let body: Vec<&str> = disassembly
        .lines()
        .skip_while(|l| !l.ends_with(&start))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .collect();
    let insns: Vec<(String, Vec<String>)> = body
        .iter()
        .filter_map(|l| {
            let text = l.split('\t').nth(1)?.split('#').next()?.trim();
            let (m, ops) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
            let ops = ops.split(',').map(|o| o.trim().to_string()).collect();
            Some((m.to_string(), ops))
        })
        .collect();
    let mut live = Vec::new();
    for (k, (m, ops)) in insns.iter().enumerate() {
        if m != "call" || !ops[0].contains(&format!("<{callee}>")) {
            continue;
        }
        let mut decided: Vec<String> = Vec::new();
        for (m, ops) in &insns[k + 1..] {
            if m == "call" || m == "ret" {
                break;
            }
            // Only written: the destination of a move, of a load of an
            // address, of a three-operand (AVX) form, of a zeroing xor.
            let zeroing = ops.len() == 2 && ops[0] == ops[1] && m.contains("xor");
            let writes = m.starts_with("mov")
                || m.starts_with("vmov")
                || m.starts_with("cvt")
                || m.starts_with("vpbroadcast")
                || m == "lea"
                || ops.len() == 3
                || zeroing;
            let dest = (!ops[0].contains('[')).then(|| register(&ops[0])).flatten();
            // Sources first: `vpxor ymm4,ymm4,ymm5` reads ymm4.
            let mut mentions: Vec<((String, bool), bool)> = Vec::new();
            for (i, op) in ops.iter().enumerate() {
                if i == 0 && dest.is_some() || zeroing {
                    continue;
                }
                for w in op.split(|c: char| !c.is_ascii_alphanumeric()) {
                    mentions.extend(register(w).map(|r| (r, true)));
                }
            }
            mentions.extend(dest.map(|r| (r, !writes)));
            for ((r, wide), read) in mentions {
                if !decided.contains(&r) {
                    decided.push(r.clone());
                    if read {
                        live.push((r, wide));
                    }
                }
            }
        }
    }
    live.sort();
    live.dedup();
    live
}

/// One program under the agent at a time: the tests share two cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn daemon(dir: &Path) -> Rtprofd {
    let mut cmd = Command::new(rtprof().with_file_name("rtprofd"));
    cmd.args(["--tick", "100", "--span", "500"])
        .stderr(Stdio::null());
    Rtprofd::start(cmd, dir)
}

/// Routes `function` to `to`, retried while rtprofd does not follow the
/// process yet.
fn route(d: &Rtprofd, pid: u32, function: &str, to: &str) {
    let said = poll(
        "a route",
        Duration::from_secs(20),
        || match rtprof_abi::protocol::route(&d.socket, pid, function, to) {
            Ok(s) => Some(s),
            Err(e) if e.contains("not a process rtprofd follows") || e.contains("not filled") => {
                std::thread::sleep(Duration::from_millis(20));
                None
            }
            Err(e) => panic!("route {function} {to}: {e}"),
        },
    );
    assert!(
        said.contains(&format!("calls of {function} go to {to}")),
        "{said}"
    );
}

fn row<'a>(report: &'a Value, name: &str) -> &'a Value {
    function_named(&report["processes"][0], name)
}

/// Runs `bin` under the agent, routing crc32c to each implementation in
/// turn and back while its threads check their results.
fn routed_run(dir: &Path, bin: &Path) {
    let d = daemon(dir);
    let json = dir.join(format!(
        "{}.json",
        bin.file_name().unwrap().to_string_lossy()
    ));
    let mut child = Killed(
        Command::new(bin)
            .arg("4")
            .env("LD_PRELOAD", agent())
            .env("RTPROF_DAEMON_SOCKET", &d.socket)
            .env("RTPROF_REPORT", &json)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let pid = child.id();
    for round in 0..12 {
        for to in ["slice8", "original", "table", "slice8", "table", "original"] {
            route(&d, pid, "crc32c", to);
            std::thread::sleep(Duration::from_millis(if round == 0 { 100 } else { 15 }));
        }
    }
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    line.clear();
    out.read_line(&mut line).unwrap();
    let status = child.0.wait().unwrap();
    let mut stderr = String::new();
    use std::io::Read;
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "{status:?}: {stderr}");
    // crc32c original A slice8 B table C rounds R wrong W signals S wrong X
    let n: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(n.len(), 7, "{line}");
    assert!(n[0] > 0 && n[1] > 0 && n[2] > 0 && n[3] > 0, "{line}");
    assert_eq!(n[4], 0, "wrong rounds: {line}");
    assert!(n[5] > 100, "calls in signal handlers: {line}");
    assert_eq!(n[6], 0, "wrong results in signal handlers: {line}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let calls = |name: &str| row(&r, name)["calls"].as_u64();
    assert_eq!(calls("crc32c"), Some(n[0]), "{line}");
    assert_eq!(calls("crc32c [slice8]"), Some(n[1]), "{line}");
    assert_eq!(calls("crc32c [table]"), Some(n[2]), "{line}");
}

#[test]
fn a_routed_call_keeps_every_register_its_caller_keeps() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("route-registers");
    let mut builds = vec![("plain", compile(&dir, "route_registers", &[]), false)];
    let avx2 = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap()
        .split_whitespace()
        .any(|w| w == "avx2");
    if avx2 {
        let bin = compile(&dir, "route_registers_avx2", &["-mavx2"]);
        builds.push(("avx2", bin, true));
    }
    for (what, bin, wide) in &builds {
        let dis = Command::new("objdump")
            .args(["-d", "--no-show-raw-insn", "-M", "intel"])
            .arg(bin)
            .output()
            .unwrap();
        assert!(dis.status.success());
        let live = live_across(
            &String::from_utf8_lossy(&dis.stdout),
            "round_hash",
            "crc32c",
        );
        let gpr = live.iter().any(|(r, _)| !r.starts_with('v'));
        let vector = live
            .iter()
            .any(|(r, w)| r.starts_with('v') && (*w || !wide));
        assert!(
            gpr && vector,
            "{what}: gcc kept no call-clobbered register live across crc32c: {live:?}"
        );
        routed_run(&dir, bin);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// An exception thrown in the implementation reaches the caller's
/// handler through the route stub (more of them than a thread's side
/// stack has frames: each releases its own), and `backtrace()` inside
/// the implementation finds the caller. Counts are still the program's.
#[test]
fn exceptions_and_backtraces_go_through_a_routed_call() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("route-unwind");
    let bin = dir.join("route_unwind");
    let out = Command::new("g++")
        .args(["-O2", "-rdynamic"])
        .arg(format!("-I{}", root().join("abi/include").display()))
        .arg("-o")
        .arg(&bin)
        .arg(root().join("tests/c/route_unwind.cpp"))
        .arg("-ldl")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let d = daemon(&dir);
    let json = dir.join("r.json");
    let mut child = Killed(
        Command::new(&bin)
            .env("LD_PRELOAD", agent())
            .env("RTPROF_DAEMON_SOCKET", &d.socket)
            .env("RTPROF_REPORT", &json)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let pid = child.id();
    route(&d, pid, "parse", "fast");
    std::thread::sleep(Duration::from_millis(700));
    route(&d, pid, "parse", "original");
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    line.clear();
    out.read_line(&mut line).unwrap();
    let status = child.0.wait().unwrap();
    assert!(status.success(), "{status:?} {line}");
    // parse original A fast B thrown T wrong W traced K of M
    let n: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(n.len(), 6, "{line}");
    assert!(n[1] > 0 && n[2] > 20_000 && n[5] > 0, "{line}");
    assert_eq!(n[3], 0, "wrong results: {line}");
    assert_eq!(n[4], n[5], "backtraces that missed the caller: {line}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(row(&r, "parse")["calls"].as_u64(), Some(n[0]), "{line}");
    assert_eq!(
        row(&r, "parse [fast]")["calls"].as_u64(),
        Some(n[1]),
        "{line}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn live_registers_are_found_in_a_disassembly() {
    let dis = "0000000000001970 <f>:
    19b8:\tmov    rsi,rbp
    19cd:\tcall   1910 <g>
    19d2:\tlea    rdx,[rbx+r11*1]
    19d6:\tmulsd  xmm0,xmm2
    19de:\tmov    ecx,eax
    19e9:\tcvtsi2sd xmm1,eax
    19ed:\txor    r8,rcx
    19ee:\tpxor   xmm3,xmm3
    19ef:\tvpxor  ymm4,ymm4,ymm5
    19f0:\tmov    r9,QWORD PTR [r10+0x8]
    1a36:\tret

";
    let live = live_across(dis, "f", "g");
    let names: Vec<&str> = live.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(names, ["r10", "r11", "r8", "v0", "v2", "v4", "v5"]);
    assert!(live.contains(&("v5".into(), true)));
}
