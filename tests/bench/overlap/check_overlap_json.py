#!/usr/bin/env python3
"""Runs loom-overlap with --json, --trace and --dot and checks the files: one object per mode
with the documented keys, sane figures (efficiency in [0, 1], hidden <= min(compute, comm),
speedups consistent with step times), a Chrome trace holding every node of the loom step, and
a DOT graph.

usage: check_overlap_json.py OUT_DIR RANKS COMMAND... (--json/--trace/--dot are appended)
"""
import json
import math
import os
import subprocess
import sys

KEYS = {"mode": str, "ranks": int, "buckets": int, "step_ms": float, "cpu_ms": float,
        "compute_ms": float,
        "comm_ms": float, "hidden_ms": float, "exposed_comm_ms": float,
        "overlap_efficiency": float, "speedup_vs_sequential": float}
MODES = ["sequential", "ddp", "loom"]
EPS = 1e-6


def check_rows(rows, ranks, problems):
    if not isinstance(rows, list) or [r.get("mode") for r in rows] != MODES:
        problems.append(f"expected one object per mode {MODES}, got {rows!r}")
        return
    for row in rows:
        where = f"mode {row['mode']}"
        if set(row) != set(KEYS):
            problems.append(f"{where}: keys {sorted(row)}, expected {sorted(KEYS)}")
            continue
        for key, kind in KEYS.items():
            value = row[key]
            ok = isinstance(value, kind) or (kind is float and isinstance(value, int))
            if not ok or isinstance(value, bool):
                problems.append(f"{where}: {key} = {value!r} is not {kind.__name__}")
        if row["ranks"] != ranks:
            problems.append(f"{where}: ranks {row['ranks']}, expected {ranks}")
        if row["buckets"] < 1:
            problems.append(f"{where}: {row['buckets']} buckets")
        for key in ("step_ms", "cpu_ms", "compute_ms"):
            if not row[key] > 0:
                problems.append(f"{where}: {key} {row[key]} is not positive")
        if ranks > 1 and not row["comm_ms"] > 0:
            problems.append(f"{where}: comm_ms {row['comm_ms']} is not positive on {ranks} ranks")
        if not 0 <= row["overlap_efficiency"] <= 1:
            problems.append(f"{where}: overlap_efficiency {row['overlap_efficiency']} not in [0, 1]")
        if not -EPS <= row["hidden_ms"] <= min(row["compute_ms"], row["comm_ms"]) + EPS:
            problems.append(f"{where}: hidden {row['hidden_ms']} not in [0, min(compute "
                            f"{row['compute_ms']}, comm {row['comm_ms']})]")
        if not -EPS <= row["exposed_comm_ms"] <= row["comm_ms"] + EPS:
            problems.append(f"{where}: exposed {row['exposed_comm_ms']} not in [0, comm]")
        expected = rows[0]["step_ms"] / row["step_ms"]
        if not math.isclose(row["speedup_vs_sequential"], expected, rel_tol=1e-4):
            problems.append(f"{where}: speedup {row['speedup_vs_sequential']} != sequential "
                            f"step / step = {expected}")
    # Sequential runs no compute while communicating, by construction of its graph.
    if rows[0]["overlap_efficiency"] > 0.01:
        problems.append(f"sequential overlaps {rows[0]['overlap_efficiency']}: its graph forbids it")


def check_trace(trace, buckets, problems):
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        problems.append("trace: no traceEvents list")
        return
    spans = [e for e in events if e.get("ph") == "X"]
    names = {e.get("name") for e in spans}
    # The trace is loom mode's, whose runs end with the next step's forward (".next").
    wanted = {"forward0.next", "loss.next", "backward0.weights"} | {
        f"bucket{b}.allreduce" for b in range(buckets)} | {f"bucket{b}.sgd" for b in range(buckets)}
    if wanted - names:
        problems.append(f"trace: missing spans {sorted(wanted - names)}")
    for e in spans:
        if not (isinstance(e.get("ts"), (int, float)) and e["ts"] >= 0 and
                isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            problems.append(f"trace: span {e.get('name')} has ts {e.get('ts')} dur {e.get('dur')}")
        if e.get("name", "").endswith(".allreduce") and e.get("cat") != "collective":
            problems.append(f"trace: {e['name']} has category {e.get('cat')!r}")


def main():
    out_dir, ranks, command = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    os.makedirs(out_dir, exist_ok=True)
    paths = {flag: os.path.join(out_dir, name) for flag, name in
             (("--json", "overlap.json"), ("--trace", "overlap_trace.json"),
              ("--dot", "overlap.dot"))}
    for path in paths.values():
        if os.path.exists(path):
            os.remove(path)
    for flag, path in paths.items():
        command += [flag, path]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        sys.exit(f"{' '.join(command)} exited with {run.returncode}\n{run.stdout}{run.stderr}")
    problems = []
    rows = json.load(open(paths["--json"]))
    check_rows(rows, ranks, problems)
    buckets = rows[-1].get("buckets", 0) if isinstance(rows, list) and rows else 0
    check_trace(json.load(open(paths["--trace"])), buckets, problems)
    dot = open(paths["--dot"]).read()
    if not dot.startswith("digraph") or "bucket0.allreduce" not in dot or "->" not in dot:
        problems.append("dot: not a digraph with the bucket nodes and edges")
    for mode in MODES:
        if f"  {mode} " not in run.stdout:
            problems.append(f"stdout: no row for {mode}")
    if problems:
        sys.exit("\n".join(problems) + f"\n--- output ---\n{run.stdout}{run.stderr}")
    print(f"loom-overlap files OK: {len(rows)} modes, {buckets} buckets")


if __name__ == "__main__":
    main()
