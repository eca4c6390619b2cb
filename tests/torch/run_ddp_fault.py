#!/usr/bin/env python3
"""Runs ddp_fault.py under mpirun: one rank SIGKILLs itself at step 3 of DDP training on loom.

Every survivor must end (non-zero) with loom's timeout error naming the stopped rank, within
LOOM_TIMEOUT_S plus slack, instead of hanging, and write its flight record (LOOM_FLIGHT_RECORDER_DIR)
from which tools/loom-flight-recorder names the stopped rank as the one that never arrived. mpirun runs with orte_enable_recovery and without
orte_abort_on_non_zero_status, so no survivor is killed before it reports; the whole job has a
hard timeout, so a hang fails the test instead of blocking ctest.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SLACK_S = 40  # the census grace (3 s), interpreter exit, a loaded 2-core machine


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--victim", type=int, default=-1, help="rank to stop (default: the last)")
    ap.add_argument("--hook", default="ddp", help="ddp (DDP's allreduce) or a loom compression")
    ap.add_argument("--timeout-s", type=float, default=5)
    args = ap.parse_args()
    victim = args.victim % args.ranks
    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(here, "ddp_fault.py")
    records = tempfile.mkdtemp(prefix="loom-ddp-fault-")
    cmd = [args.mpiexec, "-np", str(args.ranks), "--oversubscribe", "--tag-output"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += ["--mca", "btl", "self,vader,tcp", "--mca", "orte_enable_recovery", "1",
            "--mca", "orte_abort_on_non_zero_status", "0", "-x", "PYTHONPATH",
            "-x", "LOOM_TIMEOUT_S=%g" % args.timeout_s, "-x", "LOOM_FLIGHT_RECORDER_DIR=" + records,
            args.python, script, str(victim), args.hook]
    hard_timeout = args.timeout_s * 4 + 120
    print("running:", " ".join(cmd), flush=True)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=hard_timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        print(out)
        print("FAIL: the job hung: still running after %g s" % hard_timeout)
        return 1
    elapsed = time.monotonic() - start
    print(out, flush=True)
    problems = []
    # mpirun's --tag-output sometimes writes one rank's tag before another's line has ended
    # ("...step 3: start[1,2]<stdout>:..."): split on the tags, not on lines.
    pieces = re.split(r"\[1,(\d+)\]<std(?:out|err)>:", out)
    tagged = []
    for r, text in zip(pieces[1::2], pieces[2::2]):
        tagged += [(int(r), line) for line in text.splitlines() if line.strip()]
    for rank in range(args.ranks):
        mine = [text for r, text in tagged if r == rank]
        text = "\n".join(mine)
        if rank == victim:
            if "SIGKILL to myself" not in text:
                problems.append("rank %d (the victim) did not reach step 3" % rank)
            continue
        errors = [line for line in mine if "[loom:timeout]" in line]
        if not errors:
            problems.append("rank %d did not end with loom's timeout error" % rank)
            continue
        missing = ("rank %d is missing" % victim) if victim != 0 else "rank 0 is missing"
        if missing not in errors[0]:
            problems.append("rank %d: the error does not name the stopped rank (%r): %s"
                            % (rank, missing, errors[0]))
        if "finished" in text:
            problems.append("rank %d finished training although rank %d stopped" % (rank, victim))
        if "flight record: " not in errors[0]:
            problems.append("rank %d: the error does not give its flight record: %s"
                            % (rank, errors[0]))
        print("rank %d ended with: %s" % (rank, errors[0].strip()))
    # Every survivor's flight record, none from the victim; the reader names the victim.
    written = sorted(f for f in os.listdir(records) if f.endswith(".json"))
    expected = ["loom_flight_recorder_rank%d.json" % r for r in range(args.ranks) if r != victim]
    if written != expected:
        problems.append("flight records written: %s, expected %s" % (written, expected))
    reader = subprocess.run([sys.executable, os.path.join(here, "..", "..", "tools",
                                                          "loom-flight-recorder"), records],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(reader.stdout, flush=True)
    for wanted in ("no record from rank %d" % victim, "rank %d never reached it" % victim):
        if wanted not in reader.stdout:
            problems.append("loom-flight-recorder does not say %r" % wanted)
    # (mpirun's own status says nothing here: with orte_enable_recovery it exits 0.)
    if elapsed > args.timeout_s + SLACK_S + 30:
        problems.append("the job took %.1f s (LOOM_TIMEOUT_S=%g)" % (elapsed, args.timeout_s))
    shutil.rmtree(records, ignore_errors=True)
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        return 1
    print("OK: every survivor ended with loom's timeout naming rank %d, job %.1f s" %
          (victim, elapsed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
