#!/usr/bin/env python3
"""Runs loom-collectives with --json and checks the file: one object per printed row, the
documented keys and types, busbw = algbw x the nccl-tests factor, and no wrong values.

usage: check_collectives_json.py JSON_PATH COMMAND... (the command gets --json JSON_PATH added)
"""
import json
import math
import subprocess
import sys

KEYS = {"op": str, "dtype": str, "redop": str, "bytes": int, "count": int, "algo": str,
        "ranks": int, "time_us": (int, float), "algbw_gbps": (int, float),
        "busbw_gbps": (int, float), "wrong": int}
DTYPE_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8,
               "uint8": 1}


def bus_factor(op, n):
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    raise AssertionError(f"unexpected op {op!r}")


def main():
    path, command = sys.argv[1], sys.argv[2:] + ["--json", sys.argv[1]]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        sys.exit(f"{' '.join(command)} exited with {run.returncode}\n{run.stdout}{run.stderr}")
    printed = [line for line in run.stdout.splitlines() if line and not line.startswith("#")]
    rows = json.load(open(path))
    problems = []
    if not isinstance(rows, list) or not rows:
        sys.exit(f"{path}: expected a non-empty JSON array")
    if len(rows) != len(printed):
        problems.append(f"{len(rows)} JSON rows but {len(printed)} printed rows")
    for i, row in enumerate(rows):
        where = (f"row {i} ({row.get('op')} {row.get('dtype')} {row.get('bytes')} B "
                 f"{row.get('algo')})")
        if set(row) != set(KEYS):
            problems.append(f"{where}: keys {sorted(row)}, expected {sorted(KEYS)}")
            continue
        for key, kind in KEYS.items():
            if not isinstance(row[key], kind) or isinstance(row[key], bool):
                problems.append(f"{where}: {key} = {row[key]!r} is not {kind}")
        if row["wrong"] != 0:
            problems.append(f"{where}: {row['wrong']} wrong values")
        if row["bytes"] != row["count"] * DTYPE_BYTES[row["dtype"]]:
            problems.append(f"{where}: bytes != count x element size")
        if row["time_us"] <= 0:
            problems.append(f"{where}: time_us {row['time_us']} is not positive")
        expected_algbw = row["bytes"] / (row["time_us"] * 1e-6) / 1e9
        if not math.isclose(row["algbw_gbps"], expected_algbw, rel_tol=1e-6, abs_tol=1e-12):
            problems.append(f"{where}: algbw {row['algbw_gbps']} != bytes / time {expected_algbw}")
        expected_busbw = row["algbw_gbps"] * bus_factor(row["op"], row["ranks"])
        if not math.isclose(row["busbw_gbps"], expected_busbw, rel_tol=1e-6, abs_tol=1e-12):
            problems.append(f"{where}: busbw/algbw is not the {row['op']} factor for "
                            f"{row['ranks']} ranks")
    if problems:
        sys.exit(f"{path}:\n  " + "\n  ".join(problems[:20]))
    print(f"{path}: {len(rows)} rows OK")


if __name__ == "__main__":
    main()
