#!/usr/bin/env python3
"""Runs tools/loom-flight-recorder on flight records written for the purpose: three ranks where
rank 2 stopped after collective #1 (its file missing), then the same with rank 1 issuing another
count at #2, then ranks whose identical blocking calls were counted in one entry ("repeats") up to
different points. Checks what the tool says: who waits where and who never reached it; the first
divergence, naming both versions; exit status 2 on an empty directory.

usage: check_flight_recorder.py TOOL WORK_DIR
"""
import json
import os
import shutil
import subprocess
import sys


def entry(seq, name, count, state, repeats=0):
    return {"record_id": seq, "collective_seq_id": seq, "p2p_seq_id": -1, "profiling_name": name,
            "op": "allreduce", "input_dtypes": ["float32"], "input_sizes": [[count]],
            "algorithm": "native", "peer": -1, "is_p2p": False, "state": state,
            "time_created_ns": 1000 + seq, "time_discovered_started_ns": 1000 + seq,
            "time_discovered_completed_ns": 0, "repeats": repeats}


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
    stopped, diverged, repeated, empty = (os.path.join(work, d)
                                          for d in ("stopped", "diverged", "repeated", "empty"))
    for d in (stopped, diverged, repeated, empty):
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
    # Blocking loops: ranks 0 and 2 started call #100 of the loop (entry #1 repeated 99 times),
    # rank 1 is still in #60 of it; then, with rank 1 at #100 too, rank 2 issued another count at
    # #61 where the others repeated the loop.
    write(repeated, 0, [entry(0, "allreduce", 8, "completed"),
                        entry(100, "allreduce", 4, "started", repeats=99)], "timeout")
    write(repeated, 1, [entry(0, "allreduce", 8, "completed"),
                        entry(60, "allreduce", 4, "started", repeats=59)], "timeout")
    write(repeated, 2, [entry(0, "allreduce", 8, "completed"),
                        entry(100, "allreduce", 4, "completed", repeats=99)], "timeout")
    status, text = run(tool, repeated)
    assert status == 0, text
    expect(text, "no divergence in the 61 collectives every record holds")
    expect(text, "rank 1: last started #60 'allreduce' allreduce float32[4] native (started), "
                 "after 59 identical calls")
    expect(text, "rank 1: last started #60 'allreduce' allreduce float32[4] native (started), "
                 "after 59 identical calls; first not completed #60")
    expect(text, "<- behind: never started #100")
    expect(text, "rank 1 waits in #60 'allreduce' allreduce float32[4] native (started), "
                 "after 59 identical calls; every recorded rank started it")
    write(repeated, 1, [entry(0, "allreduce", 8, "completed"),
                        entry(100, "allreduce", 4, "started", repeats=99)], "timeout")
    write(repeated, 2, [entry(0, "allreduce", 8, "completed"),
                        entry(60, "allreduce", 4, "completed", repeats=59),
                        entry(61, "allreduce", 5, "started")], "timeout")
    status, text = run(tool, repeated)
    expect(text, "first divergence at collective #61:")
    expect(text, "rank 0: #61 'allreduce' allreduce float32[4] native (completed)")
    expect(text, "rank 2: #61 'allreduce' allreduce float32[5] native (started)")
    status, text = run(tool, empty)
    assert status == 2, (status, text)
    print("loom-flight-recorder read every case")


if __name__ == "__main__":
    main()
