#!/usr/bin/env python3
"""A ucx job that loses a rank: starts --ranks processes of ucx_fault on a fresh file store
(no mpirun), the last of which kills or stops itself inside a run of allreduces, and checks by
the text of their errors that every survivor ends with the named error in time:

  kill  SIGKILL  -> peer_failed naming the victim, within --detect-s of the victim's death, with
                    LOOM_TIMEOUT_S far above it (UCX's peer failure, not the deadline)
  stop  SIGSTOP  -> timeout naming the victim, within LOOM_TIMEOUT_S + 5 s of the stop

Prints one line per survivor with the time it took. A job still running after a hard limit
fails the test (every process is killed).
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

ERROR = re.compile(r"\[loom:(\w+)\] (.*)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--program", required=True)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--mode", choices=["kill", "stop"], required=True)
    ap.add_argument("--timeout-s", type=float, default=4.0, help="LOOM_TIMEOUT_S for stop")
    ap.add_argument("--detect-s", type=float, default=10.0,
                    help="how soon after the kill every survivor must have failed")
    args = ap.parse_args()
    victim = args.ranks - 1
    loom_timeout = 120.0 if args.mode == "kill" else args.timeout_s
    store = tempfile.mkdtemp(prefix="loom-ucx-fault-")
    procs, outputs = [], []
    try:
        for rank in range(args.ranks):
            env = dict(os.environ, LOOM_STORE=store, LOOM_RANK=str(rank),
                       LOOM_WORLD_SIZE=str(args.ranks), LOOM_BACKEND="ucx",
                       LOOM_TIMEOUT_S="%g" % loom_timeout)
            out = tempfile.TemporaryFile()
            outputs.append(out)
            procs.append(subprocess.Popen([args.program, args.mode], env=env, stdout=out,
                                          stderr=subprocess.STDOUT))
        fault_at = None
        ended = {}
        limit = time.monotonic() + loom_timeout + 90
        while time.monotonic() < limit:
            now = time.monotonic()
            for rank, p in enumerate(procs):
                if rank not in ended and p.poll() is not None:
                    ended[rank] = now
            if fault_at is None:
                if args.mode == "kill" and victim in ended:
                    fault_at = ended[victim]
                if args.mode == "stop":
                    try:
                        with open("/proc/%d/stat" % procs[victim].pid) as f:
                            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                                fault_at = now
                    except OSError:
                        pass
            if all(r in ended for r in range(args.ranks) if r != victim):
                break
            time.sleep(0.01)
        failures = []
        if fault_at is None:
            failures.append("the victim (rank %d) never %s" % (victim, "died" if args.mode == "kill" else "stopped"))
        for rank in range(args.ranks):
            if rank == victim:
                continue
            outputs[rank].seek(0)
            text = outputs[rank].read().decode(errors="replace")
            if rank not in ended:
                failures.append("rank %d did not end (hung)" % rank)
                continue
            found = ERROR.search(text)
            took = ended[rank] - fault_at if fault_at is not None else float("nan")
            status = procs[rank].returncode
            print("rank %d: status %d, %.2f s after the %s: %s" % (
                rank, status, took, args.mode, found.group(0) if found else text.strip()[-300:]))
            want = "peer_failed" if args.mode == "kill" else "timeout"
            bound = args.detect_s if args.mode == "kill" else args.timeout_s + 5
            if status != 1 or not found or found.group(1) != want:
                failures.append("rank %d: expected [loom:%s], got status %d: %s" % (
                    rank, want, status, text.strip()[-500:]))
            elif "rank %d" % victim not in found.group(2):
                failures.append("rank %d: the error does not name rank %d: %s" % (rank, victim, found.group(2)))
            elif not took <= bound:
                failures.append("rank %d: took %.2f s, more than %.1f s" % (rank, took, bound))
        for f in failures:
            print("FAIL:", f)
        return 1 if failures else 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait()
        shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
