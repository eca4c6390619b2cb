#!/usr/bin/env python3
"""Checks a trace merged by tools/loom-trace-merge: ranks as processes, every flow arrow paired
(one "s", one "f" per id) and bound to a slice on each end, the pieces of each collective
overlapping in time across ranks (clocks aligned), the bytes-in-flight counters back at zero,
every exposed span inside its communication slice.

usage: check_merged_trace.py MERGED_JSON WORLD
"""
import json
import sys
from collections import defaultdict

TOLERANCE_US = 2000.0  # clock alignment error allowed (barrier exit skew, 2 oversubscribed cores)


def main():
    path, world = sys.argv[1], int(sys.argv[2])
    trace = json.load(open(path))
    events = trace["traceEvents"]
    problems = []
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    if sorted(names) != list(range(world)):
        problems.append(f"process names for pids {sorted(names)}, expected 0..{world - 1}")
    for pid, name in names.items():
        if name != f"loom rank {pid}":
            problems.append(f"pid {pid} is named {name!r}")
    slices = defaultdict(list)  # (pid, tid) -> [(ts, end, event)]
    for e in events:
        if e.get("ph") == "X":
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e))

    def inside(pid, tid, ts):
        return any(start - 1e-3 <= ts <= end + 1e-3 for start, end, _ in slices[(pid, tid)])

    flows = defaultdict(lambda: {"s": [], "f": []})
    for e in events:
        if e.get("ph") in ("s", "f"):
            flows[e["id"]][e["ph"]].append(e)
    collectives = {e["args"]["issue_index"] for e in events
                   if e.get("ph") == "X" and e.get("cat") == "collective"}
    if len(flows) != len(collectives) * (world - 1):
        problems.append(f"{len(flows)} arrows for {len(collectives)} collectives on {world} ranks "
                        f"(expected {len(collectives) * (world - 1)})")
    for fid, ends in flows.items():
        if len(ends["s"]) != 1 or len(ends["f"]) != 1:
            problems.append(f"flow {fid}: {len(ends['s'])} starts and {len(ends['f'])} ends")
            continue
        s, f = ends["s"][0], ends["f"][0]
        if f.get("bp") != "e":
            problems.append(f"flow {fid}: the end is not bound to its enclosing slice (bp)")
        if s["pid"] == f["pid"]:
            problems.append(f"flow {fid} does not cross ranks")
        for end in (s, f):
            if not inside(end["pid"], end["tid"], end["ts"]):
                problems.append(f"flow {fid} {end['ph']} at {end['ts']} is in no slice of "
                                f"pid {end['pid']} tid {end['tid']}")
    by_index = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "collective":
            by_index[e["args"]["issue_index"]].append(e)
    for index, pieces in by_index.items():
        if len(pieces) != world:
            problems.append(f"collective #{index} has {len(pieces)} pieces for {world} ranks")
        latest_start = max(p["ts"] for p in pieces)
        earliest_end = min(p["ts"] + p["dur"] for p in pieces)
        if latest_start > earliest_end + TOLERANCE_US:
            problems.append(f"collective #{index}: a rank started it {latest_start - earliest_end:.0f}"
                            f" us after another finished it: clocks not aligned")
    counters = defaultdict(list)
    for e in sorted((e for e in events if e.get("ph") == "C"), key=lambda e: e["ts"]):
        counters[e["pid"]].append(e["args"]["bytes"])
    for pid in range(world):
        values = counters.get(pid, [])
        if not values or min(values) < 0 or values[-1] != 0:
            problems.append(f"pid {pid}: bytes in flight {values[:5]}... (expected >= 0, ending 0)")
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "exposed":
            owner = [s for s in slices[(e["pid"], e["tid"])]]  # its own lane
            comm = [x for (p, t), xs in slices.items() if p == e["pid"] for x in xs
                    if x[2].get("name") == e["args"]["node"]]
            if not any(a - 1e-3 <= e["ts"] and e["ts"] + e["dur"] <= b + 1e-3 for a, b, _ in comm):
                problems.append(f"exposed span of {e['args']['node']} lies outside its slice")
            del owner
    if problems:
        print("\n".join(problems))
        sys.exit(1)
    print(f"{path}: {world} ranks, {len(by_index)} collectives aligned, {len(flows)} arrows paired")


if __name__ == "__main__":
    main()
