#!/usr/bin/env python3
"""rtprof next to gprof, uftrace, perf, callgrind and gperftools.

usage: python3 examples/bench/compare.py [--quick] [--runs N] [--out DIR]

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


class Workload:
    def __init__(self, name, argv, plain, pg=None, modules=None, stripped=False,
                 stdin=None, calls=None):
        self.name, self.argv, self.plain, self.pg = name, argv, plain, pg
        self.modules, self.stripped, self.stdin = modules, stripped, stdin
        # Calls of the measured function, when the program says (multiply).
        self.calls = calls


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
    lua_extra = ["-DLUA_USE_LINUX", f"-I{lua_dir}", "-lm", "-ldl"]
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
    # Stripped distribution binary and library: functions from .eh_frame.
    data = work / "xz-input"
    words = [("w%x" % (i * 2654435761 % 4093)).encode() for i in range(4096)]
    size = (4 if quick else 8) << 20
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


def configs():
    """name -> function(workload, scratch dir) -> (argv prefix, exe, env) or None."""
    def agent(extra):
        def f(w, d):
            env = {"LD_PRELOAD": str(AGENT), **extra}
            if w.modules:
                env["RTPROF_MODULES"] = w.modules
            return [], w.plain, env
        return f
    return {
        "baseline": lambda w, d: ([], w.plain, {}),
        "rtprof calls": agent({"RTPROF_SAMPLE_HZ": "0"}),
        "rtprof samples": agent({"RTPROF_INSTRUMENT": "0", "RTPROF_SAMPLE_HZ": "1000"}),
        "rtprof both": agent({"RTPROF_SAMPLE_HZ": "1000"}),
        "gprof (-pg)": lambda w, d: ([], w.pg, {}) if w.pg else None,
        "uftrace -P": lambda w, d: (
            ["uftrace", "record", "-P", ".", "-d", str(d / "uftrace.data")], w.plain, {})
        if not w.stripped else None,
        "perf record": lambda w, d: (
            ["perf", "record", "-q", "-e", "cpu-clock:u", "-c", "1000000",
             "-o", str(d / "perf.data"), "--"], w.plain, {}),
        "gperftools": lambda w, d: (
            [], w.plain, {"LD_PRELOAD": PROFILER_LIB, "CPUPROFILE": str(d / "gperf.prof"),
                          "CPUPROFILE_FREQUENCY": "1000"}),
        "callgrind": lambda w, d: (
            ["valgrind", "-q", "--tool=callgrind",
             f"--callgrind-out-file={d / 'callgrind.out'}"], w.plain, {}),
    }


PEAKRSS = None


def execute(w, cfg, d, extra_env=None):
    """Runs one configuration; returns wall seconds, peak RSS KiB, stdout."""
    made = configs()[cfg](w, d)
    if made is None:
        return None
    prefix, exe, env = made
    settings = [f"{k}={v}" for k, v in {**env, **(extra_env or {})}.items()]
    argv = [str(PEAKRSS), str(d / "peakrss"), *settings, "--"] + prefix + [
        str(exe) if a == "{exe}" else a for a in w.argv]
    full_env = dict(os.environ)
    with open(d / "stdout", "wb") as so, open(d / "stderr", "wb") as se:
        t = time.perf_counter()
        p = subprocess.Popen(argv, env=full_env, cwd=d, stdout=so, stderr=se)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        err = (d / "stderr").read_text(errors="replace")[-500:]
        raise RuntimeError(f"{w.name} / {cfg} exited {p.returncode}: {err}")
    return wall, int((d / "peakrss").read_text()), (d / "stdout").read_bytes()


def callgrind_calls(path):
    """Calls per called function name, summed over every call site."""
    names, calls, current = {}, {}, None
    pat = re.compile(r"^(c?fn)=\((\d+)\)(?: (.*))?$")
    for line in open(path, errors="replace"):
        m = pat.match(line.rstrip("\n"))
        if m:
            kind, ident, name = m.groups()
            if name:
                names[ident] = name
            if kind == "cfn":
                current = names.get(ident)
            continue
        if line.startswith("calls=") and current:
            # Recursion levels are named f'2, f'3...: one function.
            base = re.sub(r"'\d+$", "", current)
            calls[base] = calls.get(base, 0) + int(line[6:].split()[0])
    return calls


def perf_shares(data):
    out = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "-q",
                          "--sort", "sym"], capture_output=True, text=True).stdout
    shares = {}
    for line in out.splitlines():
        m = re.match(r"^\s*([\d.]+)%\s+\[[.k]\]\s+(\S+)", line)
        if m:
            shares[m.group(2)] = shares.get(m.group(2), 0) + float(m.group(1))
    return shares


def perf_shares_by_address(data, rep):
    """For stripped code perf names addresses: sums them into the functions
    rtprof found (from .eh_frame), by module-relative address."""
    out = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "-q",
                          "--sort", "dso,sym"], capture_output=True, text=True).stdout
    # perf names the file (liblzma.so.5.4.1), rtprof the path as loaded.
    real = {Path(m["path"]).name: Path(os.path.realpath(m["path"])).name for m in rep["modules"]}
    ranges = {}
    for f in rep["functions"]:
        dso = real.get(f["module"], f["module"])
        ranges.setdefault(dso, []).append((f["vaddr"], f["vaddr"] + f["size"], f["name"]))
    shares = {}
    for line in out.splitlines():
        m = re.match(r"^\s*([\d.]+)%\s+(\S+)\s+\[[.k]\]\s+(\S+)", line)
        if not m:
            continue
        pct, dso, sym = float(m.group(1)), m.group(2), m.group(3)
        name = sym
        if sym.startswith("0x"):
            addr = int(sym, 16)
            name = next((n for lo, hi, n in ranges.get(dso, []) if lo <= addr < hi), sym)
        shares[name] = shares.get(name, 0) + pct
    return shares


def gprof_shares(exe, gmon):
    out = subprocess.run(["gprof", "-b", "-p", str(exe), str(gmon)],
                         capture_output=True, text=True).stdout
    shares = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 4 and re.match(r"^[\d.]+$", f[0]) and re.match(r"^[\d.]+$", f[1]):
            shares[f[-1]] = float(f[0])
    return shares


def rtprof_report(w, d, cfg):
    path = d / "rtprof.json"
    execute(w, cfg, d, {"RTPROF_REPORT": str(path)})
    return json.load(open(path))["processes"][0]


def stats(v):
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    return {"cpu": cpu, "cpus": os.cpu_count(), "kernel": platform.release(),
            "date": time.strftime("%Y-%m-%d"),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)}


def measure(w, runs, work):
    d = work / re.sub(r"\W+", "-", w.name).strip("-")
    d.mkdir(exist_ok=True)
    names = [c for c in configs() if c != "callgrind" and configs()[c](w, d) is not None]
    walls = {c: [] for c in names}
    loops = {c: [] for c in names}
    rss = {c: [] for c in names}
    expected = None
    for r in range(runs):
        order = names[r % len(names):] + names[:r % len(names)]
        for c in order:
            wall, peak, out = execute(w, c, d)
            walls[c].append(wall)
            rss[c].append(peak)
            if w.calls:
                loops[c].append(float(out.split()[0]))
            elif expected is None:
                expected = out
            elif out != expected:
                raise RuntimeError(f"{w.name} / {c}: output differs from the other runs")
    log(f"  {w.name}: callgrind")
    cg_wall, _, _ = execute(w, "callgrind", d)
    res = {"workload": w.name, "configs": {}}
    base = statistics.median(walls["baseline"])
    for c in names:
        e = {"wall_s": stats(walls[c]), "ratio": statistics.median(walls[c]) / base,
             "max_rss_kib": statistics.median(rss[c])}
        if w.calls:
            e["ns_per_call"] = (statistics.median(loops[c])
                                - statistics.median(loops["baseline"])) / w.calls
        res["configs"][c] = e
    res["configs"]["callgrind"] = {"wall_s": stats([cg_wall]), "ratio": cg_wall / base}

    # Accuracy and coverage.
    # Counts and coverage from counting alone; shares from sampling alone,
    # the same program perf and gprof sample.
    rep = rtprof_report(w, d, "rtprof calls")
    res["setup_ms"] = rep["setup_ns"] / 1e6
    res["modules"] = [{k: m[k] for k in ("path", "functions", "patched", "refused")}
                      for m in rep["modules"] if not m["sampled_only"]]
    fns = [f for f in rep["functions"] if f["instrumented"]]
    total_calls = sum(f["calls"] for f in fns)
    res["calls_counted"] = total_calls
    if total_calls and not w.calls:
        for c in names:
            extra = statistics.median(walls[c]) - base
            res["configs"][c]["ns_per_call"] = extra * 1e9 / total_calls
    cg = callgrind_calls(d / "callgrind.out")
    if not w.stripped:
        called = [f for f in fns if f["patched"] and (f["calls"] or cg.get(f["name"]))]
        exact = [f for f in called if f["calls"] == cg.get(f["name"], 0)]
        worst = max(called, default=None,
                    key=lambda f: abs(f["calls"] - cg.get(f["name"], 0)) / max(1, cg.get(f["name"], 0)))
        res["counts"] = {
            "functions": len(called), "exact": len(exact),
            "differ": [{"name": f["name"], "rtprof": f["calls"], "callgrind": cg.get(f["name"], 0)}
                       for f in called if f not in exact][:8],
        }
        if worst is not None:
            cgw = cg.get(worst["name"], 0)
            res["counts"]["worst_relative_error"] = abs(worst["calls"] - cgw) / max(1, cgw)
    rep = rtprof_report(w, d, "rtprof samples")
    total = sum(f["samples"] for f in rep["functions"]) + sum(m["samples"] for m in rep["modules"])
    if total:
        mine = sorted(rep["functions"], key=lambda f: -f["samples"])[:10]
        perf = (perf_shares_by_address(d / "perf.data", rep) if w.stripped
                else perf_shares(d / "perf.data"))
        rows = []
        for f in mine:
            rows.append({"name": f["name"], "rtprof": 100.0 * f["samples"] / total,
                         "perf": perf.get(f["name"], 0.0)})
        res["shares"] = rows
        if w.pg and (d / "gmon.out").exists():
            gp = gprof_shares(w.pg, d / "gmon.out")
            own = [f for f in rep["functions"] if f["module"] == Path(w.plain).name]
            own_total = sum(f["samples"] for f in own) or 1
            res["gprof_shares"] = [
                {"name": f["name"], "rtprof_own": 100.0 * f["samples"] / own_total,
                 "gprof": gp.get(f["name"], 0.0)}
                for f in sorted(own, key=lambda f: -f["samples"])[:10]]
    return res


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
            L.append(f"| {c} | {fmt_ms(w['median'])} | {fmt_ms(w['min'])}-{fmt_ms(w['max'])} | "
                     f"{e['ratio']:.3f} | {'' if npc is None or c == 'baseline' else f'{npc:.2f}'} | "
                     f"{'' if rssv is None else f'{rssv / 1024:.1f}'} |")
        L.append("")
        if "calls_counted" in r and r["calls_counted"]:
            L += [f"Calls counted by rtprof: {r['calls_counted']:,} (ns per call = extra wall "
                  "time / these calls" + (", from the loop time the program reports" if "multiply" in r["workload"] else "") + ").", ""]
    L += ["## Call counts against callgrind", "",
          "| workload | functions called | equal counts | worst relative error |",
          "|---|---|---|---|"]
    for r in results:
        c = r.get("counts")
        if c:
            L.append(f"| {r['workload']} | {c['functions']} | {c['exact']} "
                     f"({100.0 * c['exact'] / max(1, c['functions']):.1f}%) | "
                     f"{c.get('worst_relative_error', 0):.3g} |")
        else:
            L.append(f"| {r['workload']} | (stripped: callgrind names addresses, rtprof sub_<addr>; not matched) | | |")
    L.append("")
    for r in results:
        c = r.get("counts")
        if c and c["differ"]:
            L += [f"Differences, {r['workload']}: " + "; ".join(
                f"`{d['name']}` {d['rtprof']:,} vs {d['callgrind']:,}" for d in c["differ"]), ""]
    L += ["## Sample shares, top ten", ""]
    for r in results:
        if "shares" not in r:
            continue
        worst = max(abs(s["rtprof"] - s["perf"]) for s in r["shares"])
        L += [f"### {r['workload']} (largest difference from perf: {worst:.2f} points)", "",
              "| function | rtprof % | perf % |" + (" rtprof % of own code | gprof % |" if "gprof_shares" in r else ""),
              "|---|---|---|" + ("---|---|" if "gprof_shares" in r else "")]
        gp = {g["name"]: g for g in r.get("gprof_shares", [])}
        for s in r["shares"]:
            row = f"| `{s['name']}` | {s['rtprof']:.2f} | {s['perf']:.2f} |"
            if gp:
                g = gp.get(s["name"])
                row += f" {g['rtprof_own']:.2f} | {g['gprof']:.2f} |" if g else " | |"
            L.append(row)
        L.append("")
    L += ["## Coverage", "",
          "| workload | module | functions | patched | refused (reason: count) | start-up ms |",
          "|---|---|---|---|---|---|"]
    for r in results:
        for m in r.get("modules", []):
            ref = ", ".join(f"{k}: {v}" for k, v in sorted(m["refused"].items())) or "none"
            L.append(f"| {r['workload']} | `{Path(m['path']).name}` | {m['functions']} | "
                     f"{m['patched']} ({100.0 * m['patched'] / max(1, m['functions']):.1f}%) | "
                     f"{ref} | {r['setup_ms']:.1f} |")
    L.append("")
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    runs = a.runs or (1 if a.quick else 5)
    out = a.out or (ROOT / "target" / "bench-quick" if a.quick else HERE)
    ensure_peers()
    if not AGENT.exists():
        run(["cargo", "build", "--release", "--workspace"], cwd=ROOT)
    work = ROOT / "target" / "bench-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    workloads = build_workloads(work, a.quick)
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
