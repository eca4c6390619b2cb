#!/usr/bin/env python3
"""Runs tools/loom-flight-recorder on flight records written for the purpose: three ranks where
rank 2 stopped after collective #1 (its file missing), then the same with rank 1 issuing another
count at #2. Checks what the tool says: who waits where and who never reached it; the first
divergence, naming both versions; exit status 2 on an empty directory.

usage: check_flight_recorder.py TOOL WORK_DIR
"""
import json
import os
import shutil
import subprocess
import sys


def entry(seq, name, count, state):
    return {"record_id": seq, "collective_seq_id": seq, "p2p_seq_id": -1, "profiling_name": name,
            "op": "allreduce", "input_dtypes": ["float32"], "input_sizes": [[count]],
            "algorithm": "native", "peer": -1, "is_p2p": False, "state": state,
            "time_created_ns": 1000 + seq, "time_discovered_started_ns": 1000 + seq,
            "time_discovered_completed_ns": 0}


def write(directory, rank, entries, reason):
    with open(os.path.join(directory, "loom_flight_recorder_rank%d.json" % rank), "w") as f:
        json.dump({"rank": rank, "world_size": 3, "reason": reason, "entries": entries}, f)


def run(tool, directory):
    out = subprocess.run([sys.executable, tool, directory], capture_output=True, text=True)
    return out.returncode, out.stdout


def expect(text, wanted):
    if wanted not in text:
        sys.exit("expected %r in:\n%s" % (wanted, text))


def main():
    tool, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    stopped, diverged, empty = (os.path.join(work, d) for d in ("stopped", "diverged", "empty"))
    for d in (stopped, diverged, empty):
        os.makedirs(d)
    done = [entry(0, "a0", 8, "completed"), entry(1, "a1", 16, "completed")]
    for rank in (0, 1):
        write(stopped, rank, done + [entry(2, "a2", 32, "failed")], "timeout in 'a2'")
    status, text = run(tool, stopped)
    assert status == 0, text
    expect(text, "flight records of 2 of 3 ranks (0, 1)")
    expect(text, "no record from rank 2")
    expect(text, "ranks 0, 1 wait in #2 'a2' allreduce float32[32] native (failed); "
                 "rank 2 never reached it")
    write(diverged, 0, done + [entry(2, "a2", 32, "failed")], "mismatch")
    write(diverged, 1, done + [entry(2, "a2", 64, "failed")], "mismatch")
    write(diverged, 2, done + [entry(2, "a2", 32, "failed")], "mismatch")
    status, text = run(tool, diverged)
    assert status == 0, text
    expect(text, "first divergence at collective #2:")
    expect(text, "rank 1: #2 'a2' allreduce float32[64]")
    expect(text, "rank 0: #2 'a2' allreduce float32[32]")
    status, text = run(tool, empty)
    assert status == 2, (status, text)
    print("loom-flight-recorder read every case")


if __name__ == "__main__":
    main()
