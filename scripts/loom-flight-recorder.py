#!/usr/bin/env python3
"""Reads every rank's flight record (loom_flight_recorder_rank<r>.json, written where
LOOM_FLIGHT_RECORDER_DIR says on a timeout, mismatch or failure) and prints what went wrong:
the first collective where the ranks disagree (another operation, count or name at the same
collective_seq_id), else the ranks that are behind and where they stopped.

  scripts/loom-flight-recorder.py DIR            exit status 0: read; 2: no files
"""
import glob
import json
import os
import sys


def load(directory):
    ranks = {}
    for path in sorted(glob.glob(os.path.join(directory, "loom_flight_recorder_rank*.json"))):
        with open(path) as f:
            data = json.load(f)
        ranks[data["rank"]] = data
    return ranks


def collectives(data):
    """collective_seq_id -> entry (the newest entry for each)."""
    out = {}
    for e in data["entries"]:
        if e["collective_seq_id"] >= 0:
            out[e["collective_seq_id"]] = e
    return out


def describe(e):
    if e is None:
        return "nothing"
    return "#%d '%s' %s %s[%d] %s (%s)" % (e["collective_seq_id"], e["profiling_name"], e["op"],
                                           e["input_dtypes"][0], e["input_sizes"][0][0],
                                           e["algorithm"], e["state"])


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip())
        return 2
    ranks = load(sys.argv[1])
    if not ranks:
        print("no loom_flight_recorder_rank*.json in %s" % sys.argv[1])
        return 2
    world = max(d["world_size"] for d in ranks.values())
    print("flight records of %d of %d ranks (%s)" % (len(ranks), world,
                                                     ", ".join(str(r) for r in sorted(ranks))))
    missing = [r for r in range(world) if r not in ranks]
    if missing:
        print("  no record from rank %s (stopped or killed before it could write one)"
              % ", ".join(map(str, missing)))
    for r in sorted(ranks):
        print("  rank %d: %s" % (r, ranks[r]["reason"][:160]))
    table = {r: collectives(d) for r, d in ranks.items()}
    common = set.intersection(*(set(t) for t in table.values())) if table else set()
    # 1. The first divergence: the same collective_seq_id with another operation or name.
    for seq in sorted(common):
        keys = {r: (t[seq]["op"], t[seq]["input_sizes"][0][0], t[seq]["input_dtypes"][0],
                    t[seq]["profiling_name"]) for r, t in table.items()}
        if len(set(keys.values())) > 1:
            print("first divergence at collective #%d:" % seq)
            for r in sorted(table):
                print("  rank %d: %s" % (r, describe(table[r][seq])))
            return 0
    # 2. The ranks behind: the last collective each started, and the first it has not completed
    # (where it waits).
    def last_started(t):
        done = [s for s, e in t.items() if e["state"] != "scheduled"]
        return max(done) if done else -1

    def first_open(t):
        open_ = [s for s, e in t.items() if e["state"] != "completed"]
        return min(open_) if open_ else None

    started = {r: last_started(t) for r, t in table.items()}
    waiting = {r: first_open(t) for r, t in table.items()}
    front = max(started.values())
    print("no divergence in the %d collectives every record holds" % len(common))
    for r in sorted(table):
        t = table[r]
        line = "  rank %d: last started %s" % (r, describe(t.get(started[r])))
        if waiting[r] is not None:
            line += "; first not completed %s" % describe(t[waiting[r]])
        if started[r] < front:
            line += "  <- behind: never started #%d" % front
        print(line)
    stuck = sorted(r for r in table if waiting[r] is not None)
    if stuck:
        at = min(waiting[r] for r in stuck)
        behind = sorted(set(missing) | {r for r in table if started[r] < at})
        print("ranks %s wait in %s; %s" % (
            ", ".join(map(str, stuck)), describe(table[stuck[0]].get(at)),
            ("rank %s never reached it" % ", ".join(map(str, behind))) if behind
            else "every recorded rank started it"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
