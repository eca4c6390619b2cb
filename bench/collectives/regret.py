#!/usr/bin/env python3
"""Regret table of a `loom-collectives -a all --json FILE` run, as Markdown.

Per size: the fastest candidate (every algorithm except auto and mpi-raw), auto's speed
relative to it (best time / auto time), native's speed relative to it as a noise control
(native is one fixed candidate: its shortfall is what timing noise alone costs), and auto's
speed relative to mpi-raw. Usage: regret.py run.json [run.txt] [more.json more.txt ...]
(.txt: the printed output, for the algorithm auto chose at each size; several runs over
disjoint sizes, e.g. a small-size run with many iterations and a large-size one with few, make
one table).
"""
import json
import math
import re
import sys


def main():
    rows, chosen = [], {}
    for path in sys.argv[1:]:
        if path.endswith(".json"):
            rows += json.load(open(path))
            continue
        for line in open(path):
            m = re.match(r"# auto at (\d+) B: (\S+)", line)
            if m:
                chosen[int(m.group(1))] = m.group(2)
    by_size = {}
    for r in rows:
        by_size.setdefault((r["op"], r["bytes"]), {})[r["algo"]] = r["time_us"]
    print("| size (B) | best | best (us) | auto chose | auto (us) | auto/best speed | "
          "native/best speed | mpi-raw (us) | auto vs mpi-raw |")
    print("|---:|---|---:|---|---:|---:|---:|---:|---:|")
    logs_best, logs_raw, worst = [], [], 1e9
    for (op, size), times in sorted(by_size.items()):
        candidates = {a: t for a, t in times.items() if a not in ("auto", "mpi-raw")}
        best = min(candidates, key=candidates.get)
        auto = times.get("auto")
        raw = times.get("mpi-raw")
        speed = candidates[best] / auto
        logs_best.append(math.log(speed))
        worst = min(worst, speed)
        native = candidates[best] / candidates["native"] if "native" in candidates else float("nan")
        versus = raw / auto if raw else float("nan")
        if raw:
            logs_raw.append(math.log(versus))
        print(f"| {size} | {best} | {candidates[best]:.2f} | {chosen.get(size, '?')} | "
              f"{auto:.2f} | {speed:.3f} | {native:.3f} | "
              f"{raw if raw else float('nan'):.2f} | {versus:.3f} |")
    print()
    print(f"auto/best: worst {worst:.3f}, geometric mean "
          f"{math.exp(sum(logs_best) / len(logs_best)):.3f}; auto vs mpi-raw geometric mean "
          f"{math.exp(sum(logs_raw) / len(logs_raw)) if logs_raw else float('nan'):.3f} "
          f"over {len(logs_best)} sizes")


if __name__ == "__main__":
    main()
