"""Runs pyperformance benchmark scripts in this one process, each a fixed
number of times.

usage: python pyperf_runner.py LOOPS SCRIPT [SCRIPT...]

The scripts are the suite's own (installed from PyPI); what stands in for
pyperf.Runner here only calls the benchmark function LOOPS times, with no
calibration, worker processes, timing output or system metadata, so two runs
of the same interpreter execute the same calls (with PYTHONHASHSEED fixed)
and call counts can be compared between profilers. Prints one line per
script: its name and how many times it ran.
"""

import argparse
import asyncio
import os
import runpy
import sys
import time
import types


class Runner:
    """The parts of pyperf.Runner the benchmark scripts use."""

    loops = 1

    def __init__(self, *args, add_cmdline_args=None, **kwargs):
        self.argparser = argparse.ArgumentParser()
        self.metadata = {}

    def parse_args(self, args=None):
        return self.argparser.parse_args([])

    def bench_func(self, name, func, *args, inner_loops=None, metadata=None):
        for _ in range(self.loops):
            func(*args)

    def bench_time_func(self, name, func, *args, inner_loops=None, metadata=None):
        func(self.loops, *args)

    def bench_async_func(self, name, func, *args, inner_loops=None, metadata=None):
        for _ in range(self.loops):
            asyncio.run(func(*args))


def main():
    Runner.loops = int(sys.argv[1])
    shim = types.ModuleType("pyperf")
    shim.Runner = Runner
    shim.perf_counter = time.perf_counter
    sys.modules["pyperf"] = shim
    for script in sys.argv[2:]:
        sys.argv = [script]
        runpy.run_path(script, run_name="__main__")
        print(os.path.basename(os.path.dirname(script)), Runner.loops)


if __name__ == "__main__":
    main()
