#!/usr/bin/env python3
"""The first decoded tokens against the rest, from `bmoe bench`'s per-run
metrics files (its --work directory): per configuration, tok/s and MiB read
per token over the first N decode steps and over the steps after them,
averaged over the runs.

usage: scripts/first-tokens.py WORK_DIR [N]
"""
import csv
import glob
import os
import sys
from collections import defaultdict

work = sys.argv[1]
first = int(sys.argv[2]) if len(sys.argv) > 2 else 8
runs = defaultdict(list)
for path in sorted(glob.glob(os.path.join(work, "*.csv"))):
    with open(path) as f:
        rows = [r for r in csv.DictReader(line for line in f if not line.startswith("#"))]
    steps = [r for r in rows if r["phase"] == "1"]
    if len(steps) <= first:
        continue
    config = os.path.basename(path).rsplit("-", 1)[0]

    def pace(part):
        ms = sum(float(r["wall_ms"]) for r in part)
        mib = sum(int(r["read_bytes"]) for r in part) / 1048576
        return len(part) * 1000 / ms, mib / len(part)

    runs[config].append((pace(steps[:first]), pace(steps[first:])))
print(f"{'config':<22} {'runs':>4} {'first tok/s':>11} {'rest tok/s':>10} {'first MiB/tok':>13} {'rest MiB/tok':>12}")
for config, got in runs.items():
    n = len(got)
    mean = lambda f: sum(f(g) for g in got) / n
    print(
        f"{config:<22} {n:>4} {mean(lambda g: g[0][0]):>11.2f} {mean(lambda g: g[1][0]):>10.2f} "
        f"{mean(lambda g: g[0][1]):>13.1f} {mean(lambda g: g[1][1]):>12.1f}"
    )
