#!/usr/bin/env python3
"""The fault matrix: runs one case under mpirun (3 ranks) and checks, by the text of the errors,
that every surviving rank exits non-zero with the named error within LOOM_TIMEOUT_S + 5 s of
the fault.

Cases (the last rank is the victim; see fault_mpi.cpp):
  stop-graph       SIGSTOP inside a compute node of a graph run    -> timeout, who is missing
  stop-blocking    SIGSTOP before a blocking allreduce             -> timeout (watchdog), exit 124
  stop-create      SIGSTOP before making a second backend          -> timeout (watchdog), exit 124
  stop-compile     SIGSTOP before compile's cross-rank check       -> timeout, who is missing
  stop-agree       SIGSTOP before Backend::agree_on_root           -> timeout, who is missing
  stop-shortlist   SIGSTOP before shortlist_reducer_plans ("auto") -> timeout, who is missing
  stop-decide      SIGSTOP before decide_reducer_plan ("auto")     -> timeout, who is missing
  kill             SIGKILL inside a compute node                   -> timeout / backend_failure
  skip             the victim's graph lacks a collective           -> mismatch on every rank
  reorder          one extra edge reorders two same-shaped ones    -> mismatch naming both
  priority         another CommOptions::priority on the victim     -> mismatch naming both
  tuning           another LOOM_ALLREDUCE on the victim            -> mismatch (selector digest)
  throw            a compute node throws on the victim             -> peer_failed naming it
  bad-count        a blocking allreduce with a bad count           -> peer_failed (watchdog)
  bad-count-graph  a graph node with a bad count (compile)         -> peer_failed naming it
  demo             loom-train-step, the driver SIGSTOPs rank 2     -> timeout, who is missing
mpirun runs with --tag-output (each line says its rank), orte_enable_recovery and without
orte_abort_on_non_zero_status, so survivors are not killed by mpirun and can report; each rank
runs under `sh -c` that prints its exit status and time. The job has a hard timeout: a hang
fails the test instead of blocking ctest. Prints one line per rank with the measured time.
"""
import argparse
import os
import re
import select
import signal
import subprocess
import sys
import time

SLACK_S = 5.0  # the bound: timeout + 5 s
# mpirun's --tag-output sometimes writes one rank's tag before another rank's line has ended
# ("...step 3: start[1,2]<stdout>:..."): lines are split on the tags, not only on newlines.
TAG = re.compile(r"\[\d+,(\d+)\]<(?:stdout|stderr)>:")


def tagged(line):
    """(rank, text) for every tagged piece of one line of mpirun's output."""
    pieces = TAG.split(line)
    return [(int(r), text) for r, text in zip(pieces[1::2], pieces[2::2])]
ERROR = re.compile(r"\[loom:(\w+)\] (.*)$")
FAULT_AT = re.compile(r"loom-fault: rank \d+ step -?\d+: fault at ([\d.]+)")
EXIT = re.compile(r"^loom-exit: status (\d+) at ([\d.]+)$")

VICTIM_STOPPED = {"stop-create", "stop-graph", "stop-blocking", "stop-compile", "stop-agree", "stop-shortlist",
                  "stop-decide", "demo"}

# case -> (codes accepted from a survivor, texts its error must contain, victim's code or None)
EXPECT = {
    "stop-graph": (("timeout",), ["collective node 'allreduce", "rank 2 did not arrive (last started #"],
                   None),
    "stop-blocking": (("timeout",), ["allreduce float32[1] (collective #", "rank 2 did not arrive (last started #", "cannot be abandoned"], None),
    "stop-create": (("timeout",), ["making the mpi backend on rank", "did not complete within 4 s",
                                   "a rank did not make its backend"], None),
    "stop-compile": (("timeout",), ["Executor::compile", "rank 2 did not arrive"], None),
    "stop-agree": (("timeout",), ["agree_on_root on rank", "rank 2 did not arrive"], None),
    "stop-shortlist": (("timeout",), ["shortlist_reducer_plans on rank", "rank 2 did not arrive"],
                       None),
    "stop-decide": (("timeout",), ["decide_reducer_plan on rank", "rank 2 did not arrive"], None),
    "kill": (("timeout", "backend_failure"), ["collective node 'allreduce"], None),
    "skip": (("mismatch",), ["rank 2 has no collective #1"], "mismatch"),
    "reorder": (("mismatch",), ["collective #0", "'grad.a'", "'grad.b'"], "mismatch"),
    "priority": (("mismatch",), ["collective #0", "'grad.a'", "'grad.b'"], "mismatch"),
    "tuning": (("mismatch",), ["configured the algorithm selector differently"], "mismatch"),
    "throw": (("peer_failed",), ["rank 2 failed", "compute node 'backward1' on rank 2 of 3"], "node_failed"),
    "bad-count": (("peer_failed",), ["rank 2 did not arrive", "it failed: [loom:invalid_argument] allreduce on rank 2 of 3 (mpi)"], "invalid_argument"),
    "bad-count-graph": (("peer_failed",), ["Executor::compile", "rank 2 did not arrive", "[loom:graph_invalid]", "'bad.allreduce'"], "graph_invalid"),
    # With loom's own algorithms every rank has started the collective when rank 2 stops inside
    # it, so rank 2 may be named among the ranks inside it rather than as the one missing.
    # stopped between two collectives (did not arrive) or inside one (its heartbeat is stale)
    "demo": (("timeout",), [r"re:rank 2 (did not arrive|started it but its process has shown no "
                            r"sign of life for [0-9.]+ s \(stopped, frozen or dead\))"],
             None),
}


def rank_pid(session, program, rank):
    """The pid of `program` running as MPI rank `rank` in process session `session`."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) != session:  # field 6 of stat: the session id
                continue
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if os.path.basename(program).encode() not in f.read().split(b"\0")[0]:
                    continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                if b"OMPI_COMM_WORLD_RANK=%d\0" % rank in f.read():
                    return int(pid)
        except (OSError, IndexError, ValueError):
            continue
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=4)
    ap.add_argument("--mode", choices=sorted(EXPECT), required=True)
    ap.add_argument("--program", required=True)
    args = ap.parse_args()
    victim = args.ranks - 1

    cmd = [args.mpiexec, "-np", str(args.ranks), "--oversubscribe", "--tag-output"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += ["--mca", "btl", "self,vader,tcp", "--mca", "orte_enable_recovery", "1",
            "--mca", "orte_abort_on_non_zero_status", "0",
            "-x", "LOOM_TIMEOUT_S=%g" % args.timeout_s]
    if os.environ.get("LOOM_FLIGHT_RECORDER_DIR"):
        cmd += ["-x", "LOOM_FLIGHT_RECORDER_DIR"]
    program = [args.program]
    if args.mode == "demo":
        program += ["--steps", "100000", "--depth", "2", "--width", "64", "--batch", "32",
                    "--dot", os.devnull, "--trace", os.devnull]
    else:
        program += [args.mode]
    cmd += ["sh", "-c", '"$@"; rc=$?; echo "loom-exit: status $rc at $(date +%s.%N)"; exit $rc',
            "loom-fault-rank"] + program
    hard_timeout = args.timeout_s * 3 + 60
    print("running:", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    started = time.time()
    fault_at = None
    errors, exits, lines = {}, {}, []
    expect_exits = set(range(args.ranks)) - ({victim} if args.mode in VICTIM_STOPPED else set())
    buffered = b""
    stopped = False
    while time.time() - started < hard_timeout:
        if expect_exits <= set(exits):
            break
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buffered += chunk
            *complete, buffered = buffered.split(b"\n")
            for raw in complete:
                line = raw.decode(errors="replace")
                lines.append(line)
                for rank, text in tagged(line):
                    f = FAULT_AT.search(text)
                    if f and fault_at is None:
                        fault_at = float(f.group(1))
                    e = ERROR.search(text)
                    if e and rank not in errors:
                        errors[rank] = (e.group(1), e.group(2))
                    x = EXIT.match(text)
                    if x:
                        exits[rank] = (int(x.group(1)), float(x.group(2)))
                    if args.mode == "demo" and not stopped and rank == 0 and "step   3 " in text:
                        pid = rank_pid(os.getpgid(proc.pid), args.program, victim)
                        if pid:
                            os.kill(pid, signal.SIGSTOP)
                            fault_at = time.time()
                            stopped = True
                            lines.append("driver: SIGSTOP to rank %d (pid %d)" % (victim, pid))
    hung = not expect_exits <= set(exits)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    print("\n".join(lines), flush=True)

    problems = []

    def expect(cond, text):
        if not cond:
            problems.append(text)

    if hung:
        problems.append("ranks %s did not exit within %g s (a hang)"
                        % (sorted(expect_exits - set(exits)), hard_timeout))
    expect(fault_at is not None, "no fault was injected (no 'fault at' line)")
    codes, texts, victim_code = EXPECT[args.mode]
    for rank in range(args.ranks):
        if rank == victim:
            if victim_code:
                got = errors.get(rank, ("none", ""))[0]
                expect(got == victim_code, "victim: expected %s, got %s" % (victim_code, got))
                expect(exits.get(rank, (0,))[0] != 0, "victim: exited with status 0")
            continue
        if rank not in errors:
            problems.append("rank %d printed no loom error" % rank)
            continue
        code, message = errors[rank]
        expect(code in codes, "rank %d: expected %s, got %s: %s" % (rank, "/".join(codes), code,
                                                                    message))
        for text in texts:
            found = re.search(text[3:], message) if text.startswith("re:") else text in message
            expect(found, "rank %d: the error does not say %r: %s" % (rank, text, message))
        if rank not in exits:
            continue
        status, exit_at = exits[rank]
        expect(status != 0, "rank %d exited with status 0" % rank)
        if fault_at is not None:
            elapsed = exit_at - fault_at
            expect(elapsed <= args.timeout_s + SLACK_S,
                   "rank %d exited %.2f s after the fault (LOOM_TIMEOUT_S=%g + %g)"
                   % (rank, elapsed, args.timeout_s, SLACK_S))
            print("fault-matrix %s: rank %d %s, exit status %d, %.2f s after the fault"
                  % (args.mode, rank, code, status, elapsed))
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        return 1
    print("OK: every surviving rank exited non-zero with the named error in time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
