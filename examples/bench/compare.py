#!/usr/bin/env python3
"""rtprof next to gprof, uftrace, perf, callgrind and gperftools.

usage: python3 examples/bench/compare.py [--quick] [--runs N] [--out DIR] [--only NAME]

Builds the workloads (multiply; the Lua 5.4 interpreter and SQLite from
their real sources, fetched from crates.io, with gcc -O2 -g; Debian's
stripped xz/liblzma), runs every tool on every workload several times in
alternation, and writes RESULTS.md and results.json: overhead (medians,
min-max, ratios to the uninstrumented run in the same round), call-count
accuracy against callgrind, top-ten sample shares against perf and gprof,
and coverage (functions found, patched, refused by reason; start-up time;
extra resident memory). Installs missing peers with apt-get when root.

--quick: small inputs, one run, no SQLite (its build alone takes a
minute); writes to target/bench-quick unless --out says otherwise.
"""

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RELEASE = ROOT / "target" / "release"
AGENT = RELEASE / "librtprof.so"
PROFILER_LIB = "/usr/lib/x86_64-linux-gnu/libprofiler.so.0"
PEERS = {
    "gprof": "binutils",
    "uftrace": "uftrace",
    "perf": "linux-perf",
    "valgrind": "valgrind",
}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def ensure_peers():
    missing = [pkg for tool, pkg in PEERS.items() if shutil.which(tool) is None]
    if not os.path.exists(PROFILER_LIB):
        missing.append("libgoogle-perftools4")
    if not missing:
        return
    if os.geteuid() != 0:
        sys.exit(f"missing: {' '.join(missing)} (install them, or run as root)")
    log("installing:", *missing)
    run(["apt-get", "update", "-qq"])
    run(["apt-get", "install", "-y", "-qq", *missing],
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def fetch_sources(work):
    """Lua and SQLite sources, as shipped inside crates on crates.io."""
    proj = work / "fetch"
    (proj / "src").mkdir(parents=True, exist_ok=True)
    (proj / "src" / "main.rs").write_text("fn main() {}\n")
    (proj / "Cargo.toml").write_text(
        '[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n'
        '[dependencies]\nlua-src = "=547.1.0"\n'
        'libsqlite3-sys = { version = "=0.30.1", features = ["bundled"] }\n'
        "[workspace]\n")
    run(["cargo", "fetch", "-q"], cwd=proj)
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "-q", "--format-version", "1"], cwd=proj,
        check=True, capture_output=True, text=True).stdout)
    dirs = {p["name"]: Path(p["manifest_path"]).parent for p in meta["packages"]}
    return dirs["lua-src"] / "lua-5.4.7", dirs["libsqlite3-sys"] / "sqlite3"


def gcc(out, sources, extra=(), pg=False):
    flags = ["-O2", "-g"] + (["-pg"] if pg else [])
    run(["gcc", *flags, "-o", str(out), *map(str, sources), *extra])
    return out


# Tools that record or simulate every call run multiply with fewer calls
# (uftrace writes ~16 bytes per call and function exit: 3 GB at 10^8).
SLOW = ("uftrace -P", "callgrind")
SLOW_CALLS = 10**7


class Workload:
    def __init__(self, name, argv, plain, pg=None, modules=None, stripped=False,
                 calls=None, env=None, uftrace="."):
        self.name, self.argv, self.plain, self.pg = name, argv, plain, pg
        self.modules, self.stripped = modules, stripped
        # Calls of the measured function, when the program says (multiply):
        # argv[1] is that number.
        self.calls = calls
        # Environment every configuration gets (fixed hash seeds).
        self.env = env or {}
        # What `uftrace record -P` patches; None: uftrace cannot (no symbols).
        self.uftrace = None if stripped else uftrace


def build_workloads(work, quick):
    global PEAKRSS
    PEAKRSS = gcc(work / "peakrss", [HERE / "peakrss.c"])
    out = []
    src = ROOT / "examples" / "workloads" / "multiply.c"
    m = gcc(work / "multiply", [src], ["-pthread"])
    mpg = gcc(work / "multiply-pg", [src], ["-pthread"], pg=True)
    calls = 10**7 if quick else 10**8
    for threads in (1, 2):
        out.append(Workload(f"multiply, {threads} thread{'s' if threads > 1 else ''}",
                            ["{exe}", str(calls), str(threads)], m, mpg, calls=calls))
    lua_dir, sqlite_dir = fetch_sources(work)
    lua_src = sorted(p for p in lua_dir.glob("*.c") if p.name not in ("lua.c", "luac.c"))
    lua_src.append(HERE / "lua_main.c")
    # A fixed string-hash seed (Lua mixes time and addresses into it) makes
    # every run execute the same calls, so counts can be compared.
    lua_extra = ["-DLUA_USE_LINUX", "-Dluai_makeseed(L)=0x5eedu", f"-I{lua_dir}", "-lm", "-ldl"]
    log("building Lua")
    lua = gcc(work / "lua", lua_src, lua_extra)
    lua_pg = gcc(work / "lua-pg", lua_src, lua_extra, pg=True)
    out.append(Workload("Lua 5.4 interpreter (work.lua)",
                        ["{exe}", str(HERE / "work.lua"), "1" if quick else "3"], lua, lua_pg))
    if not quick:
        log("building SQLite")
        sq_src = [sqlite_dir / "sqlite3.c", HERE / "sqlite_main.c"]
        sq_extra = ["-DSQLITE_THREADSAFE=0", "-DSQLITE_OMIT_LOAD_EXTENSION", f"-I{sqlite_dir}"]
        sq = gcc(work / "sqlite", sq_src, sq_extra)
        sq_pg = gcc(work / "sqlite-pg", sq_src, sq_extra, pg=True)
        out.append(Workload("SQLite 3 (in-memory inserts, index, queries)",
                            ["{exe}", "200000"], sq, sq_pg))
    out.append(cpython_workload(work, quick))
    # Stripped distribution binary and library: functions from .eh_frame.
    data = work / "xz-input"
    words = [("w%x" % (i * 2654435761 % 4093)).encode() for i in range(4096)]
    size = (2 if quick else 4) << 20
    with open(data, "wb") as f:
        x, n = 1, 0
        while n < size:
            x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
            w = words[(x >> 33) % len(words)] + (b"\n" if x % 11 == 0 else b" ")
            f.write(w)
            n += len(w)
    out.append(Workload("xz -6 (Debian's stripped xz and liblzma)",
                        [shutil.which("xz"), "-T1", "-6", "-c", str(data)],
                        Path(shutil.which("xz")), modules="liblzma*", stripped=True))
    return out


PYPERFORMANCE = "pyperformance==1.14.0"
PY_BENCHMARKS = ["richards", "json_dumps", "deltablue", "regex_v8", "float", "hexiom"]
PY_BENCHMARKS_QUICK = ["richards", "json_dumps", "deltablue"]


def cpython_workload(work, quick):
    """This machine's CPython (built with --enable-shared) running scripts of
    the pyperformance suite, installed from PyPI; libpython instrumented."""
    probe = subprocess.run(
        ["python3", "-c", "import sys, sysconfig; print(sys.executable); "
         "print(sysconfig.get_config_var('INSTSONAME') or ''); "
         "print(sysconfig.get_config_var('Py_ENABLE_SHARED')); "
         "import platform; print(platform.python_version())"],
        check=True, capture_output=True, text=True).stdout.split("\n")
    exe, soname, shared, version = Path(os.path.realpath(probe[0])), *probe[1:4]
    if shared != "1" or not soname:
        sys.exit(f"{exe}: CPython without a shared libpython; the CPython workload "
                 "needs one (configure --enable-shared)")
    target = work / "pyperformance"
    log("installing", PYPERFORMANCE)
    run([str(exe), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
         "--target", str(target), PYPERFORMANCE],
        env={**os.environ, "PIP_ROOT_USER_ACTION": "ignore"})
    bench = target / "pyperformance" / "data-files" / "benchmarks"
    names = PY_BENCHMARKS_QUICK if quick else PY_BENCHMARKS
    scripts = [str(bench / f"bm_{n}" / "run_benchmark.py") for n in names]
    return Workload(f"CPython {version} (pyperformance: {', '.join(names)})",
                    ["{exe}", str(HERE / "pyperf_runner.py"), "1", *scripts], exe,
                    modules=soname.split(".so")[0] + "*", env={"PYTHONHASHSEED": "0"},
                    uftrace=f".@{soname}")


def configs():
    """name -> function(workload, scratch dir, run tag) -> (argv prefix, exe,
    env) or None when the tool cannot run the workload. Every tool writes
    its data, one file per run, as it would for a user."""
    def agent(extra):
        def f(w, d, tag):
            # Every function listed: counts are compared with callgrind's and
            # addresses named, called or not.
            env = {"LD_PRELOAD": str(AGENT), "RTPROF_REPORT": str(d / f"rtprof-{tag}.json"),
                   "RTPROF_ALL_FUNCTIONS": "1",
                   **extra}
            if w.modules:
                env["RTPROF_MODULES"] = w.modules
            return [], w.plain, env
        return f
    return {
        "baseline": lambda w, d, tag: ([], w.plain, {}),
        "rtprof calls": agent({"RTPROF_SAMPLE_HZ": "0"}),
        "rtprof samples": agent({"RTPROF_INSTRUMENT": "0", "RTPROF_SAMPLE_HZ": "1000"}),
        "rtprof both": agent({"RTPROF_SAMPLE_HZ": "1000"}),
        # Counting under a 1% overhead budget (sampling off: its cost is
        # `rtprof samples`'s).
        "rtprof budget 1%": agent({"RTPROF_SAMPLE_HZ": "0", "RTPROF_BUDGET": "1"}),
        # gmon.<pid> per run; gprof sums them.
        "gprof (-pg)": lambda w, d, tag: (
            [], w.pg, {"GMON_OUT_PREFIX": str(d / "gmon")}) if w.pg else None,
        "uftrace -P": lambda w, d, tag: (
            ["uftrace", "record", "-P", w.uftrace, "-d", str(d / f"uftrace-{tag}.data")],
            w.plain, {}) if w.uftrace else None,
        "perf record": lambda w, d, tag: (
            ["perf", "record", "-q", "-e", "cpu-clock:u", "-c", "1000000",
             "-o", str(d / f"perf-{tag}.data"), "--"], w.plain, {}),
        "gperftools": lambda w, d, tag: (
            [], w.plain, {"LD_PRELOAD": PROFILER_LIB, "CPUPROFILE": str(d / f"gperf-{tag}.prof"),
                          "CPUPROFILE_FREQUENCY": "1000"}),
        "callgrind": lambda w, d, tag: (
            ["valgrind", "-q", "--tool=callgrind",
             f"--callgrind-out-file={d / 'callgrind.out'}"], w.plain, {}),
    }


PEAKRSS = None


def command(w, exe, calls):
    """The workload's command line with `exe` as its program (and
    multiply's call count in argv[1])."""
    args = [str(exe) if a == "{exe}" else str(a) for a in w.argv]
    if w.calls:
        args[1] = str(calls)
    return args


def execute(w, cfg, d, tag, calls=None):
    """Runs one configuration; returns wall seconds, peak RSS KiB, stdout.
    `calls`: multiply's call count, if not the configuration's own."""
    made = configs()[cfg](w, d, tag)
    if made is None:
        return None
    prefix, exe, env = made
    settings = [f"{k}={v}" for k, v in {**w.env, **env}.items()]
    argv = [str(PEAKRSS), str(d / "peakrss"), *settings, "--"] + prefix + command(
        w, exe, calls or calls_for(w, cfg))
    with open(d / "stdout", "wb") as so, open(d / "stderr", "wb") as se:
        t = time.perf_counter()
        p = subprocess.Popen(argv, cwd=d, stdout=so, stderr=se)
        _, status, _ = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
    code = os.waitstatus_to_exitcode(status)
    # uftrace's record is gigabytes and nothing here reads it.
    shutil.rmtree(d / f"uftrace-{tag}.data", ignore_errors=True)
    if code != 0:
        err = (d / "stderr").read_text(errors="replace")[-500:]
        raise RuntimeError(f"{w.name} / {cfg} exited {code}: {err}")
    return wall, int((d / "peakrss").read_text()), (d / "stdout").read_bytes()


def callgrind_calls(path):
    """Calls per (object file name, function), summed over every call site,
    and those of them made by the dynamic loader (initialisers). Functions
    without a symbol valgrind could read are named by their address in the
    object ("0x...12b0")."""
    names, objs, calls, loader = {}, {}, {}, {}
    ob = cob = cfn = None
    pat = re.compile(r"^(c?fn|c?ob)=\((\d+)\)(?: (.*))?$")
    for line in open(path, errors="replace"):
        m = pat.match(line.rstrip("\n"))
        if m:
            kind, ident, name = m.groups()
            table = objs if kind.endswith("ob") else names
            if name:
                table[ident] = name
            value = table.get(ident)
            if kind == "ob":
                ob = value
            elif kind == "cob":
                cob = value
            elif kind == "cfn":
                cfn = value
            continue
        if line.startswith("calls=") and cfn:
            # The callee's object is the caller's unless cob= said otherwise
            # for this call; recursion levels are named f'2, f'3...
            key = (Path(cob or ob or "?").name, re.sub(r"'\d+$", "", cfn))
            n = int(line[6:].split()[0])
            calls[key] = calls.get(key, 0) + n
            if Path(ob or "").name.startswith("ld-linux"):
                loader[key] = loader.get(key, 0) + n
            cob = None
    return calls, loader


class Functions:
    """rtprof's functions of one report, keyed (module file name, function),
    and found by address for tools that only name addresses."""

    def __init__(self, rep):
        # rtprof names a module as loaded (liblzma.so.5), tools by the file.
        self.real = {Path(m["path"]).name: Path(os.path.realpath(m["path"])).name
                     for m in rep["modules"]}
        self.paths = {Path(os.path.realpath(m["path"])).name: os.path.realpath(m["path"])
                      for m in rep["modules"]}
        self.ranges = {}
        for f in rep["functions"]:
            self.ranges.setdefault(self.key(f)[0], []).append(
                (f["vaddr"], f["vaddr"] + f["size"], f["name"]))

    def key(self, f):
        return (self.real.get(f["module"], f["module"]), f["name"])

    def name(self, obj, sym):
        """A tool's symbol, or its address, as rtprof's function name."""
        if not sym.startswith("0x"):
            return sym
        addr = int(sym, 16)
        return next((n for lo, hi, n in self.ranges.get(obj, []) if lo <= addr < hi), sym)


def tail_jump_targets(fns, obj):
    """Functions of one object that another function enters with a jump
    (a tail call): rtprof counts every entry, callgrind only executed call
    instructions."""
    starts = {lo: (lo, hi, name) for lo, hi, name in fns.ranges.get(obj, [])}
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", fns.paths[obj]],
                         capture_output=True, text=True).stdout
    found = set()
    for m in re.finditer(r"^\s*([0-9a-f]+):\s+j[a-z]+\s+([0-9a-f]+)\b", out, re.M):
        src, dst = int(m.group(1), 16), int(m.group(2), 16)
        f = starts.get(dst)
        if f and not f[0] <= src < f[1]:
            found.add(f[2])
    return found


UPROBES = 40
# Entries the uprobe run may trap (each costs microseconds).
UPROBE_ENTRIES = 3 * 10**7


def uprobe_counts(w, d, fns, keys, expected):
    """Entries of the given functions counted by kernel uprobes (perf probe)
    in a native run without rtprof: a third, independent exact count.
    Returns {} where uprobes are not available (not root, no kernel support)."""
    group = "rtprofbench"
    subprocess.run(["perf", "probe", "-q", "-d", f"{group}:*"], capture_output=True)
    addrs = {(obj, name): lo for obj, rs in fns.ranges.items() for lo, _, name in rs}
    probes, budget = {}, UPROBE_ENTRIES
    for i, k in enumerate(keys[:UPROBES]):
        if k in addrs and k[0] in fns.paths and expected.get(k, 0) <= budget:
            budget -= expected.get(k, 0)
            r = subprocess.run(["perf", "probe", "-q", "-x", fns.paths[k[0]],
                                "-a", f"{group}:f{i}={addrs[k]:#x}"], capture_output=True)
            if r.returncode == 0:
                probes[f"{group}:f{i}"] = k
    if not probes:
        log(f"  {w.name}: uprobes unavailable, differences left unchecked")
        return {}
    try:
        out = d / "uprobes.csv"
        argv = command(w, w.plain, calls_for(w, "callgrind"))
        subprocess.run(["perf", "stat", "-x,", "-o", str(out), "-e", f"{group}:*", "--", *argv],
                       env={**os.environ, **w.env}, cwd=d, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        counts = {}
        for line in out.read_text().splitlines():
            f = line.split(",")
            if len(f) > 2 and f[2] in probes and f[0].isdigit():
                counts[probes[f[2]]] = int(f[0])
        return counts
    finally:
        subprocess.run(["perf", "probe", "-q", "-d", f"{group}:*"], capture_output=True)


def perf_samples(data, fns):
    """Samples per (module, function) in one perf.data, every sample's
    address placed in the function rtprof knows at that address (so names
    never need to agree: stripped code, a libc perf finds symbols for)."""
    out = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,dso",
                          "--show-mmap-events"], capture_output=True, text=True).stdout
    maps, samples = [], {}
    mmap = re.compile(r"PERF_RECORD_MMAP2? .*\[0x([0-9a-f]+)\((0x[0-9a-f]+)\) @ (0x[0-9a-f]+|0) "
                      r".*\]: [r-][w-]x\S* (/\S+)$")
    sample = re.compile(r"^\s*([0-9a-f]+) \((.*)\)$")
    for line in out.splitlines():
        m = mmap.search(line)
        if m:
            start, length, off = int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16)
            maps.append((start, start + length, off, Path(os.path.realpath(m.group(4))).name))
            continue
        m = sample.match(line)
        if not m:
            continue
        ip = int(m.group(1), 16)
        # Text segments map file offset = address in the file (GNU ld).
        hit = next(((lo, off, obj) for lo, hi, off, obj in reversed(maps) if lo <= ip < hi), None)
        if hit:
            lo, off, obj = hit
            key = (obj, fns.name(obj, hex(ip - lo + off)))
        else:
            key = ("?", m.group(2))
        samples[key] = samples.get(key, 0) + 1
    return samples


def gprof_shares(exe, gmons):
    out = subprocess.run(["gprof", "-b", "-p", str(exe), *map(str, gmons)],
                         capture_output=True, text=True).stdout
    shares = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 4 and re.match(r"^[\d.]+$", f[0]) and re.match(r"^[\d.]+$", f[1]):
            shares[f[-1]] = float(f[0])
    return shares


def stats(v):
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    return {"cpu": cpu, "cpus": os.cpu_count(), "kernel": platform.release(),
            "date": time.strftime("%Y-%m-%d"),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)}


def calls_for(w, cfg):
    """multiply's call count under `cfg`; None for other workloads."""
    return min(w.calls, SLOW_CALLS) if w.calls and cfg in SLOW else w.calls


def tag(cfg, r):
    return f"{re.sub(r'[^a-z]+', '-', cfg.lower()).strip('-')}-{r}"


def load_report(d, cfg, r):
    return json.load(open(d / f"rtprof-{tag(cfg, r)}.json"))["processes"][0]


def measure(w, runs, work):
    d = work / re.sub(r"\W+", "-", w.name).strip("-")[:40]
    d.mkdir(exist_ok=True)
    names = [c for c in configs() if c != "callgrind" and configs()[c](w, d, "") is not None]
    walls = {c: [] for c in names}
    loops = {c: [] for c in names}
    rss = {c: [] for c in names}
    expected = None
    for r in range(runs):
        order = names[r % len(names):] + names[:r % len(names)]
        for c in order:
            wall, peak, out = execute(w, c, d, tag(c, r))
            walls[c].append(wall)
            rss[c].append(peak)
            if w.calls:
                loops[c].append(float(out.split()[0]) / calls_for(w, c))
            elif expected is None:
                expected = out
            elif out != expected:
                raise RuntimeError(f"{w.name} / {c}: output differs from the other runs")
    log(f"  {w.name}: callgrind")
    cg_wall, _, _ = execute(w, "callgrind", d, "callgrind")
    res = {"workload": w.name, "configs": {}}
    base = statistics.median(walls["baseline"])
    for c in names:
        e = {"wall_s": stats(walls[c]), "ratio": statistics.median(walls[c]) / base,
             "max_rss_kib": statistics.median(rss[c])}
        if w.calls:
            e["ns_per_call"] = statistics.median(loops[c]) - statistics.median(loops["baseline"])
            if calls_for(w, c) != w.calls:
                # Fewer calls: the ratio is of loop time per call.
                e["calls"] = calls_for(w, c)
                e["ratio"] = statistics.median(loops[c]) / statistics.median(loops["baseline"])
        res["configs"][c] = e
    res["configs"]["callgrind"] = {"wall_s": stats([cg_wall]), "ratio": cg_wall / base}
    if w.calls and calls_for(w, "callgrind") != w.calls:
        res["configs"]["callgrind"].update(
            calls=calls_for(w, "callgrind"),
            ratio=cg_wall / base * w.calls / calls_for(w, "callgrind"))
    res["extra_rss_mib"] = (res["configs"]["rtprof calls"]["max_rss_kib"]
                            - res["configs"]["baseline"]["max_rss_kib"]) / 1024
    counts_and_coverage(w, d, runs, names, walls, base, res)
    budget_accuracy(d, runs, res)
    shares(w, d, runs, res)
    return res


def budget_accuracy(d, runs, res):
    """The budget runs' counts against the exact counts of the counting
    runs: of the functions carrying 90% of the calls, how many were
    estimated with a bound, how many of those lie within 5% of exact and
    within their own bound, the widest bound; and how many were too
    uncertain to estimate and show the calls counted, marked "at least"
    (and whether that held)."""
    exact = {}
    for f in load_report(d, "rtprof calls", runs - 1)["functions"]:
        if f.get("calls"):
            exact[(f["module"], f["name"])] = f["calls"]
    total = sum(exact.values())
    top, acc = [], 0
    for k in sorted(exact, key=lambda k: -exact[k]):
        if acc >= 0.9 * total:
            break
        top.append(k)
        acc += exact[k]
    rows = {"functions_90": len(top), "estimated": [], "within_5": [], "within_bound": [],
            "widest_bound_pct": [], "at_least": [], "at_least_held": []}
    for r in range(runs):
        got = {(f["module"], f["name"]): f for f in load_report(d, "rtprof budget 1%", r)["functions"]}
        est = [k for k in top if got.get(k, {}).get("error_bound") is not None]
        low = [k for k in top if got.get(k, {}).get("at_least")]
        near = [k for k in est if abs(got[k]["calls"] - exact[k]) <= 0.05 * exact[k]]
        bounded = [k for k in est if abs(got[k]["calls"] - exact[k]) <= got[k]["error_bound"]]
        rows["estimated"].append(len(est))
        rows["within_5"].append(len(near))
        rows["within_bound"].append(len(bounded))
        rows["widest_bound_pct"].append(round(max(
            (100 * got[k]["error_bound"] / max(got[k]["calls"], 1) for k in est), default=0), 1))
        rows["at_least"].append(len(low))
        rows["at_least_held"].append(sum(got[k]["calls"] <= exact[k] for k in low))
        worst = max(est, key=lambda k: abs(got[k]["calls"] - exact[k]) / exact[k], default=None)
        if worst:
            rows.setdefault("worst", []).append(
                {"name": worst[1], "exact": exact[worst], "estimate": got[worst]["calls"],
                 "bound": got[worst]["error_bound"]})
    res["budget"] = rows


def counts_and_coverage(w, d, runs, names, walls, base, res):
    """Counts and coverage from the counting runs, checked against each
    other (every run of a deterministic program counts the same) and
    against callgrind."""
    # Every run that counted: the counting-only and the counting+sampling ones.
    reps = [load_report(d, c, r) for c in ("rtprof calls", "rtprof both") for r in range(runs)]
    rep = reps[runs - 1]
    fns = Functions(rep)
    res["setup_ms"] = rep["setup_ns"] / 1e6
    res["modules"] = [{k: m[k] for k in ("path", "functions", "patched", "refused")}
                      for m in rep["modules"] if not m["sampled_only"]]
    def counted(rep):
        out = {}
        for f in rep["functions"]:
            if f["instrumented"] and f["patched"]:
                out[fns.key(f)] = out.get(fns.key(f), 0) + f["calls"]
        return out
    mine = counted(rep)
    res["calls_counted"] = sum(mine.values())
    # Functions whose count is not the same in every run: the program's
    # own behaviour varies (CPython's caches hash object addresses).
    seen = {}
    for other in reps:
        for k, n in counted(other).items():
            seen.setdefault(k, set()).add(n)
    varies = {k for k, v in seen.items() if len(v) > 1}
    res["counts_repeat"] = not varies
    if res["calls_counted"] and not w.calls:
        for c in names:
            extra = statistics.median(walls[c]) - base
            res["configs"][c]["ns_per_call"] = extra * 1e9 / res["calls_counted"]
    if w.calls and calls_for(w, "callgrind") != w.calls:
        # callgrind ran multiply with fewer calls: so does this count.
        execute(w, "rtprof calls", d, "cg", calls=calls_for(w, "callgrind"))
        mine = counted(json.load(open(d / "rtprof-cg.json"))["processes"][0])
    def by_rtprof_name(calls):
        """callgrind's (object, name or address) as rtprof's functions."""
        out = {}
        for (obj, name), n in calls.items():
            key = (obj, fns.name(obj, name))
            out[key] = out.get(key, 0) + n
        return out
    cg, by_loader = map(by_rtprof_name, callgrind_calls(d / "callgrind.out"))
    called = [k for k, n in mine.items() if n or cg.get(k)]
    differ = [k for k in called if mine[k] != cg.get(k, 0)]
    jumped = {}
    for obj in {k[0] for k in differ}:
        jumped[obj] = tail_jump_targets(fns, obj)
    def known(k):
        if mine[k] > cg.get(k, 0) and k[1] in jumped[k[0]]:
            return "tail-jump target"
        if mine[k] + by_loader.get(k, 0) == cg.get(k, 0):
            return "run by the loader before the agent"
        return None
    # The rest are counted a third way, natively.
    rest = sorted((k for k in differ if not known(k)), key=lambda k: -abs(mine[k] - cg.get(k, 0)))
    probed = uprobe_counts(w, d, fns, rest, mine) if rest else {}
    res["uprobes"] = [{"module": k[0], "name": k[1], "rtprof": mine[k], "uprobes": n,
                       "callgrind": cg.get(k, 0)} for k, n in probed.items()]

    def why(k):
        """Why a count differs where the tools define a call differently
        or the program itself differs between runs; None if unexplained."""
        if reason := known(k):
            return reason
        if probed.get(k) == mine[k]:
            return "uprobes agree with rtprof"
        if k in varies:
            return "varies between runs"
        return None
    reasons = {k: why(k) for k in differ}
    res["counts"] = {
        "functions": len(called), "exact": len(called) - len(differ),
        "explained": {r: sum(1 for v in reasons.values() if v == r) for r in
                      ("tail-jump target", "run by the loader before the agent",
                       "uprobes agree with rtprof", "varies between runs")},
        "differ": [{"module": k[0], "name": k[1], "rtprof": mine[k], "callgrind": cg.get(k, 0),
                    "why": reasons[k]}
                   for k in sorted(differ, key=lambda k: -abs(mine[k] - cg.get(k, 0)))],
        "worst_relative_error": max(
            (abs(mine[k] - cg.get(k, 0)) / max(1, cg.get(k, 0)) for k in differ), default=0.0),
        "worst_unexplained": max(
            (abs(mine[k] - cg.get(k, 0)) / max(1, cg.get(k, 0)) for k in differ
             if not reasons[k]), default=0.0),
    }


def shares(w, d, runs, res):
    """Top-ten sample shares of the sampling-only runs against perf's runs
    (the same program, the same 1 kHz), each summed over all runs, with the
    binomial noise of the difference; and against gprof for the program's
    own code."""
    mine, total, own, fns = {}, 0, 0, None
    for r in range(runs):
        rep = load_report(d, "rtprof samples", r)
        fns = fns or Functions(rep)
        for f in rep["functions"]:
            if f["samples"]:
                mine[fns.key(f)] = mine.get(fns.key(f), 0) + f["samples"]
        # The agent's own time (loader events) is not the program's: perf,
        # a separate process, does not see its own either.
        agent = [m for m in rep["modules"] if Path(m["path"]).name == AGENT.name]
        own += sum(m["samples"] for m in agent) + sum(
            f["samples"] for f in rep["functions"] if f["module"] == AGENT.name)
        total += sum(f["samples"] for f in rep["functions"]) + sum(
            m["samples"] for m in rep["modules"])
    total -= own
    perf = {}
    for r in range(runs):
        for k, n in perf_samples(d / f"perf-{tag('perf record', r)}.data", fns).items():
            perf[k] = perf.get(k, 0) + n
    perf_total = sum(perf.values())
    if not total or not perf_total:
        raise RuntimeError(f"{w.name}: no samples (rtprof {total}, perf {perf_total})")
    res["samples"] = {"rtprof": total, "perf": perf_total, "rtprof_agent": own}
    rows = []
    for k in sorted(mine, key=lambda k: -mine[k])[:10]:
        a, b = mine[k] / total, perf.get(k, 0) / perf_total
        q = (a + b) / 2
        rows.append({"module": k[0], "name": k[1], "rtprof": 100 * a, "perf": 100 * b,
                     "noise_2sigma": 200 * (q * (1 - q) * (1 / total + 1 / perf_total)) ** 0.5})
    res["shares"] = rows
    gmons = sorted(d.glob("gmon.*"))
    if w.pg and gmons:
        gp = gprof_shares(w.pg, gmons)
        exe = Path(w.plain).name
        own = {k: n for k, n in mine.items() if k[0] == exe}
        own_total = sum(own.values()) or 1
        res["gprof_shares"] = [
            {"name": k[1], "rtprof_own": 100 * own[k] / own_total, "gprof": gp.get(k[1], 0.0)}
            for k in sorted(own, key=lambda k: -own[k])[:10]]


def fmt_ms(s):
    return f"{s * 1000:.0f}" if s >= 0.1 else f"{s * 1000:.1f}"


def markdown(results, mach, runs, quick):
    L = ["# rtprof next to other profilers", "",
         f"Generated by `python3 examples/bench/compare.py{' --quick' if quick else ''}` "
         f"on {mach['date']}: {mach['cpu']}, {mach['cpus']} CPUs, {mach['memory_gib']} GiB, "
         f"Linux {mach['kernel']}. Every configuration ran {runs} time(s) per workload, in "
         "rotating order; times are medians with min-max, ratios against the uninstrumented "
         "median of the same runs. callgrind ran once (it is 20-100x slower). "
         "`rtprof calls`: counting only; `rtprof samples`: sampling only at 1 kHz; "
         "`rtprof both`: both. perf and gperftools sample at 1 kHz too.", ""]
    L += ["## Overhead", ""]
    for r in results:
        L += [f"### {r['workload']}", "",
              "| tool | wall ms (median) | min-max | ratio | ns added per call | peak RSS MiB |",
              "|---|---|---|---|---|---|"]
        for c, e in r["configs"].items():
            w = e["wall_s"]
            npc = e.get("ns_per_call")
            rssv = e.get("max_rss_kib")
            label = c + (f" ({e['calls']:.0e} calls; ratio per call)" if "calls" in e else "")
            L.append(f"| {label} | {fmt_ms(w['median'])} | {fmt_ms(w['min'])}-{fmt_ms(w['max'])} | "
                     f"{e['ratio']:.3f} | {'' if npc is None or c == 'baseline' else f'{npc:.2f}'} | "
                     f"{'' if rssv is None else f'{rssv / 1024:.1f}'} |")
        L.append("")
        if "calls_counted" in r and r["calls_counted"]:
            L += [f"Calls counted by rtprof: {r['calls_counted']:,} (ns per call = extra wall "
                  "time / these calls" + (", from the loop time the program reports" if "multiply" in r["workload"] else "") + ").", ""]
    L += ["## Call counts against callgrind", "",
          "Every function rtprof patched that either tool saw called, matched by module and "
          "name (by address where callgrind has no symbol: the crt helpers it reads no name "
          "for, every function of stripped code). `repeatable`: every counting run of rtprof "
          "gave the same counts for every function (counting-only and counting+sampling runs). A difference is "
          "explained when the two tools define the event differently or the program itself "
          "differs between runs: *tail-jump target* (another function enters it with a jump, "
          "objdump shows the jump: rtprof counts every entry into a function, callgrind only "
          "executed call instructions); *run by the loader before the agent* (a library's "
          "initialiser that ld.so ran before the preloaded agent's constructor; callgrind "
          "counts exactly the loader's calls more); *uprobes agree with rtprof* (the "
          "remaining differences are counted a third way, natively, with kernel uprobes "
          "(`perf probe` at each function's entry, `perf stat`): where that count equals "
          "rtprof's, callgrind either watched a different execution (the program behaves "
          "differently under valgrind) or missed entries it does not see as calls, such as "
          "indirect tail jumps through function pointers); *varies between runs* (rtprof's own "
          "runs disagree, so the program does not repeat itself: CPython's type-method cache "
          "hashes object addresses). `equal where defined alike` leaves explained differences "
          "out.", "",
          "| workload | functions called | equal counts | explained differences | "
          "equal where defined alike | worst relative error (all, unexplained) | repeatable |",
          "|---|---|---|---|---|---|---|"]
    for r in results:
        c = r["counts"]
        explained = sum(c["explained"].values())
        same = c["functions"] - explained
        why = ", ".join(f"{k}: {v}" for k, v in c["explained"].items() if v) or "none"
        L.append(f"| {r['workload']} | {c['functions']} | {c['exact']} "
                 f"({100.0 * c['exact'] / max(1, c['functions']):.1f}%) | {why} | "
                 f"{c['exact']} of {same} ({100.0 * c['exact'] / max(1, same):.1f}%) | "
                 f"{c['worst_relative_error']:.3g}, {c['worst_unexplained']:.3g} | "
                 f"{'yes' if r['counts_repeat'] else 'no'} |")
    L.append("")
    for r in results:
        c = r["counts"]
        if c["differ"]:
            more = len(c["differ"]) - 10
            L += [f"Differences, {r['workload']} (rtprof vs callgrind): " + "; ".join(
                f"`{x['name']}` {x['rtprof']:,} vs {x['callgrind']:,}"
                + (f" ({x['why']})" if x["why"] else " (unexplained)") for x in c["differ"][:10])
                + (f"; {more} more in results.json" if more > 0 else ""), ""]
    L += ["## Counting under a 1% budget", "",
          "`rtprof budget 1%` counts the hottest functions in bursts and estimates their calls "
          "in between, published while it runs once its bound is within 5% of the calls "
          "extrapolated, at exit once within 10% of the estimate; a function whose calls cannot "
          "be bounded that tightly shows the calls counted, marked \"at least\". Its counts "
          "against the exact ones of the `rtprof calls` runs, for the functions carrying 90% of "
          "the calls; one figure per run.", "",
          "| workload | functions with 90% of calls | estimated | within 5% of exact | "
          "within their bound | widest bound % | at least (held) | worst estimate (bound) |",
          "|---|---|---|---|---|---|---|---|"]
    for r in results:
        b = r.get("budget")
        if not b:
            continue
        worst = "; ".join(f"`{x['name']}` {x['estimate']:,} vs {x['exact']:,} (±{x['bound']:,})"
                          for x in b.get("worst", [])[:2])
        held = ", ".join(f"{n} ({h})" for n, h in zip(b["at_least"], b["at_least_held"]))
        L.append(f"| {r['workload']} | {b['functions_90']} | {b['estimated']} | {b['within_5']} | "
                 f"{b['within_bound']} | {b['widest_bound_pct']} | {held} | {worst} |")
    L.append("")
    L += ["## Sample shares, top ten", "",
          "rtprof's sampling-only runs against perf's runs of the same program at the same "
          "rate, each summed over all runs; perf's samples are placed by address into the "
          "functions rtprof knows, so names need not agree (stripped code, libc). `2σ`: twice the binomial standard deviation of the "
          "difference between two independent sample sets of these sizes; differences inside "
          "it are sampling noise. gprof is compared with rtprof's shares of the program's own "
          "code (gprof sees nothing else).", ""]
    for r in results:
        worst = max(abs(x["rtprof"] - x["perf"]) for x in r["shares"])
        n = r["samples"]
        gp = {g["name"]: g for g in r.get("gprof_shares", [])}
        L += [f"### {r['workload']}", "",
              f"{n['rtprof']:,} rtprof samples (and {n['rtprof_agent']:,} in the agent itself, left "
              f"out), {n['perf']:,} perf samples; largest difference "
              f"from perf: {worst:.2f} points.", "",
              "| function | rtprof % | perf % | 2σ |" + (" rtprof % of own code | gprof % |" if gp else ""),
              "|---|---|---|---|" + ("---|---|" if gp else "")]
        for x in r["shares"]:
            row = f"| `{x['name']}` | {x['rtprof']:.2f} | {x['perf']:.2f} | {x['noise_2sigma']:.2f} |"
            if gp:
                g = gp.get(x["name"])
                row += f" {g['rtprof_own']:.2f} | {g['gprof']:.2f} |" if g else " | |"
            L.append(row)
        L.append("")
    L += ["## Coverage", "",
          "Functions found in each instrumented module (symbol tables, or .eh_frame when "
          "stripped), patched, and refused by reason; the agent's start-up (find, analyse, "
          "patch, map) and the extra peak resident memory of the counting run over the "
          "uninstrumented one.", "",
          "| workload | module | functions | patched | refused (reason: count) | start-up ms | extra RSS MiB |",
          "|---|---|---|---|---|---|---|"]
    for r in results:
        for m in r["modules"]:
            ref = ", ".join(f"{k}: {v}" for k, v in sorted(m["refused"].items())) or "none"
            L.append(f"| {r['workload']} | `{Path(m['path']).name}` | {m['functions']} | "
                     f"{m['patched']} ({100.0 * m['patched'] / max(1, m['functions']):.1f}%) | "
                     f"{ref} | {r['setup_ms']:.1f} | {r['extra_rss_mib']:.1f} |")
    L.append("")
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--only", help="run only workloads whose name contains this")
    a = ap.parse_args()
    runs = a.runs or (1 if a.quick else 5)
    out = a.out or (ROOT / "target" / "bench-quick" if a.quick else HERE)
    ensure_peers()
    if not AGENT.exists():
        run(["cargo", "build", "--release", "--workspace"], cwd=ROOT)
    work = ROOT / "target" / "bench-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    workloads = [w for w in build_workloads(work, a.quick)
                 if not a.only or a.only.lower() in w.name.lower()]
    results = []
    for w in workloads:
        log(f"measuring {w.name}")
        results.append(measure(w, runs, work))
    mach = machine()
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"machine": mach, "runs": runs,
                                                  "quick": a.quick, "results": results}, indent=1))
    (out / "RESULTS.md").write_text(markdown(results, mach, runs, a.quick))
    log(f"wrote {out / 'RESULTS.md'} and {out / 'results.json'}")


if __name__ == "__main__":
    main()
