#!/usr/bin/env python3
"""Start-up of `recall embed`: process start to first vector, and memory.

    python scripts/bench_startup.py models/bge-m3-random [--runs 10] [--dtypes f32,bf16,q8]

For each dtype, runs `recall embed --model DIR --dtype D "the server ran
out of space"` RUNS times with the pack cache on (after one run that
writes it, not counted) and RUNS times with RECALL_PACK_CACHE=off, taking
turns, and prints per dtype and mode: the wall time of each run (median,
min, max) and the peak of the process's private memory (RssAnon: what no
other process can share; polled from /proc every 0.2 ms, so a peak
shorter than that can be missed) and of its whole resident set (VmHWM,
which also counts the page-cache pages of mapped files that other
processes share). Linux only; Python standard library only.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_peers import cpu_line  # noqa: E402

TEXT = "the server ran out of space"


def kib(status, key):
    for line in status.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def run(binary, model, dtype, env):
    started = time.perf_counter()
    proc = subprocess.Popen(
        [binary, "embed", "--model", model, "--dtype", dtype, TEXT],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    path = f"/proc/{proc.pid}/status"
    anon = hwm = 0
    while proc.poll() is None:
        try:
            with open(path) as f:
                status = f.read()
        except OSError:
            break
        # A zombie's status has no memory lines: keep the last seen.
        if "VmHWM" in status:
            anon = max(anon, kib(status, "RssAnon"))
            hwm = max(hwm, kib(status, "VmHWM"))
        time.sleep(0.0002)
    out, _ = proc.communicate()
    wall = time.perf_counter() - started
    if proc.returncode != 0 or b'"dense"' not in out:
        sys.exit(f"recall embed --dtype {dtype} failed (exit {proc.returncode})")
    return wall, anon / 1024, hwm / 1024


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--dtypes", default="f32,bf16,q8")
    p.add_argument("--binary", default="target/release/recall")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="recall-startup-") as cache:
        measure(args, cache)


def measure(args, cache):
    print(f"CPU: {cpu_line()}; {os.cpu_count()} logical CPUs")
    print("| dtype | pack cache | wall s (median, min-max) | private MiB (median) | VmHWM MiB (median) |")
    print("|---|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        modes = {
            "on": dict(os.environ, RECALL_CACHE_DIR=cache),
            "off": dict(os.environ, RECALL_CACHE_DIR=cache, RECALL_PACK_CACHE="off"),
        }
        run(args.binary, args.model, dtype, modes["on"])  # writes the pack file
        results = {mode: [] for mode in modes}
        for _ in range(args.runs):
            for mode, env in modes.items():
                results[mode].append(run(args.binary, args.model, dtype, env))
        for mode, rows in results.items():
            walls = [r[0] for r in rows]
            print(
                f"| {dtype} | {mode} | {statistics.median(walls):.3f} "
                f"({min(walls):.3f}-{max(walls):.3f}) | "
                f"{statistics.median(r[1] for r in rows):.0f} | "
                f"{statistics.median(r[2] for r in rows):.0f} |"
            )


if __name__ == "__main__":
    main()
