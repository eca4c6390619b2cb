#!/usr/bin/env python3
"""Runs fault_mpi under mpirun and checks how every rank's run ended (see fault_mpi.cpp).

kill:  the last rank SIGKILLs itself mid-step; every survivor must leave Executor::run() with a
       loom::Error naming a collective node within LOOM_TIMEOUT_S + SLACK_S seconds.
throw: a compute node throws on the last rank only; that rank reports node_failed naming the
       node, then exits; the others' run of that step fails with peer_failed naming it.
mpirun runs with orte_enable_recovery and without orte_abort_on_non_zero_status, so the
survivors are not killed by mpirun and can report. The whole job has a hard timeout: a hang
fails the test instead of blocking ctest.
"""
import argparse
import os
import re
import signal
import subprocess
import sys

SLACK_S = 30  # generous: a loaded 2-core machine, sanitizer builds
LINE = re.compile(r"^loom-fault: rank (\d+) step (\d+): (.*)$")
ERROR = re.compile(r"^error code=(\w+) elapsed_s=([\d.]+) wrong=(\d+): (.*)$")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=4)
    ap.add_argument("--mode", choices=["kill", "throw"], required=True)
    ap.add_argument("--program", required=True)
    args = ap.parse_args()

    cmd = [args.mpiexec, "-np", str(args.ranks), "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += ["--mca", "btl", "self,vader,tcp", "--mca", "orte_enable_recovery", "1",
            "--mca", "orte_abort_on_non_zero_status", "0",
            "-x", "LOOM_TIMEOUT_S=%g" % args.timeout_s, args.program, args.mode]
    hard_timeout = args.timeout_s * 3 + 90
    print("running:", " ".join(cmd), flush=True)
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
    print(out, flush=True)

    victim = args.ranks - 1
    outcome = {}
    for line in out.splitlines():
        m = LINE.match(line.strip())
        if m:
            outcome[int(m.group(1))] = (int(m.group(2)), m.group(3))
    problems = []

    def expect(cond, text):
        if not cond:
            problems.append(text)

    for rank in range(args.ranks):
        if rank not in outcome:
            problems.append("rank %d reported nothing" % rank)
            continue
        step, what = outcome[rank]
        if rank == victim:
            expect(step == 3, "rank %d failed at step %d, not 3" % (rank, step))
            if args.mode == "kill":
                expect(what.startswith("SIGKILL to myself"), "victim: %s" % what)
            else:
                m = ERROR.match(what)
                expect(m and m.group(1) == "node_failed", "victim: expected node_failed: " + what)
                expect("compute node 'backward1'" in what and "rank %d of %d" % (rank, args.ranks)
                       in what, "victim: the error does not name the node and rank: " + what)
            continue
        m = ERROR.match(what)
        if not m:
            problems.append("rank %d did not leave run() with a loom::Error: %s" % (rank, what))
            continue
        code, elapsed, wrong, message = m.group(1), float(m.group(2)), int(m.group(3)), m.group(4)
        if args.mode == "kill":
            expect(code in ("timeout", "backend_failure"),
                   "rank %d: expected timeout or backend_failure, got %s" % (rank, code))
            expect("collective node 'allreduce" in message,
                   "rank %d: the error does not name the collective: %s" % (rank, message))
            expect(code != "timeout" or "rank %d did not arrive" % victim in message,
                   "rank %d: the timeout does not say who is missing: %s" % (rank, message))
        else:
            expect(code == "peer_failed", "rank %d: expected peer_failed, got %s" % (rank, code))
            expect("rank %d failed" % victim in message and "'backward1'" in message,
                   "rank %d: the error does not name the failed rank and node: %s"
                   % (rank, message))
        expect(elapsed <= args.timeout_s + SLACK_S,
               "rank %d: left run() after %.1f s (LOOM_TIMEOUT_S=%g)" % (rank, elapsed,
                                                                          args.timeout_s))
        expect(wrong == 0, "rank %d: %d wrong values before the fault" % (rank, wrong))
        expected_steps = (3,)
        expect(step in expected_steps, "rank %d failed at step %d" % (rank, step))
        print("rank %d: %s after %.2f s at step %d" % (rank, code, elapsed, step))
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        return 1
    print("OK: every surviving rank left run() with a loom::Error naming the collective")
    return 0


if __name__ == "__main__":
    sys.exit(main())
