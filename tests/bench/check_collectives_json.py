#!/usr/bin/env python3
"""Runs loom-collectives with --json and checks the file: one object per printed row, the
documented keys and types, busbw = algbw x the nccl-tests factor, no wrong values, and the
timed iterations: -n's at every size, or with --min_time MS at least -n's, one count per size
(every algorithm timed alike) and more than -n at the smallest size (its calls are far shorter
than MS / -n).

usage: check_collectives_json.py JSON_PATH COMMAND... (the command gets --json JSON_PATH added)
"""
import json
import math
import subprocess
import sys

KEYS = {"op": str, "dtype": str, "redop": str, "bytes": int, "count": int, "algo": str,
        "ranks": int, "time_us": (int, float), "algbw_gbps": (int, float),
        "busbw_gbps": (int, float), "wrong": int, "iters": int}
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


def flag(command, short, long, default):
    """The value of the last -x V / --long V in the command (mpirun's own -n comes first), or
    the default."""
    value = default
    for i, arg in enumerate(command[:-1]):
        if arg in (short, long):
            value = command[i + 1]
    return value


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
    iters = int(flag(command, "-n", "--iters", "20"))
    min_time = int(flag(command, None, "--min_time", "0"))
    by_size = {}
    for row in rows:
        if isinstance(row.get("iters"), int):
            by_size.setdefault((row["op"], row["dtype"], row["redop"], row["bytes"]),
                               set()).add(row["iters"])
    for key, counts in by_size.items():
        if len(counts) != 1:
            problems.append(f"{key}: the algorithms were timed with {sorted(counts)} iterations")
        if min_time == 0 and counts != {iters}:
            problems.append(f"{key}: {sorted(counts)} iterations without --min_time, not {iters}")
        if min(counts) < iters:
            problems.append(f"{key}: {sorted(counts)} iterations, fewer than -n {iters}")
    if min_time and by_size:
        smallest = min(by_size, key=lambda key: key[3])
        if max(by_size[smallest]) <= iters:
            problems.append(f"{smallest}: --min_time {min_time} left -n {iters} at the "
                            f"smallest size")
    if problems:
        sys.exit(f"{path}:\n  " + "\n  ".join(problems[:20]))
    print(f"{path}: {len(rows)} rows OK")


if __name__ == "__main__":
    main()
