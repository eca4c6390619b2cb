#!/usr/bin/env python3
"""loom_torch under torchrun beyond --standalone (the worker is torchrun_worker.py):

    restart: torchrun --max-restarts 1, rank 1 SIGKILLed at step 17 of 30 (checkpoints every 5
        steps): no worker hangs, torchrun restarts both, the new group forms from the new
        rendezvous round, training resumes from step 15 and ends with weights equal (bit for bit:
        2 ranks) to the same run uninterrupted. Prints the time from the kill to the restarted
        workers and to their group.
    never_joins: torchrun --nproc-per-node 3 where rank 2 never calls init_process_group: ranks 0
        and 1 fail within LOOM_TIMEOUT_S + 10 s with loom's error naming rank 2; nothing hangs.
    nodes: two torchrun "nodes" (two agents, 2 workers each) meeting through the c10d
        rendezvous on one machine; the 4 ranks run the 2 x 2 DeviceMesh test (test_mesh.py).

    python3 tests/torch/torchrun_check.py restart|never_joins|nodes
Exits non-zero naming what failed.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torchrun_worker.py")


def torchrun(*args):
    return [sys.executable, "-m", "torch.distributed.run"] + list(args)


def run(name, command, env, timeout_s):
    """Runs command; returns (error text or None, output)."""
    start = time.time()
    try:
        done = subprocess.run(command, env=env, cwd=HERE, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout_s, text=True)
    except subprocess.TimeoutExpired as error:
        out = error.output.decode(errors="replace") if isinstance(error.output, bytes) else \
            (error.output or "")
        return "%s: still running after %d s (a hang)" % (name, timeout_s), out
    if done.returncode != 0:
        return "%s: torchrun exit status %d" % (name, done.returncode), done.stdout
    print("%s: torchrun finished in %.1f s" % (name, time.time() - start))
    return None, done.stdout


def fail(message, output=""):
    print(message)
    if output:
        print("---- output ----\n" + output[-8000:])
    return 1


def restart(env, timeout_s):
    import torch
    with tempfile.TemporaryDirectory() as whole, tempfile.TemporaryDirectory() as killed:
        common = ["--standalone", "--nproc-per-node", "2"]
        error, out = run("uninterrupted", torchrun(*common, WORKER, "train", "--dir", whole,
                                                   "--out", os.path.join(whole, "final.pt")),
                         env, timeout_s)
        if error:
            return fail(error, out)
        error, out = run("killed at step 17", torchrun(
            *common, "--max-restarts", "1", "--monitor-interval", "0.1", WORKER, "train",
            "--dir", killed, "--kill-at", "17", "--kill-rank", "1",
            "--out", os.path.join(killed, "final.pt")), env, timeout_s)
        if error:
            return fail(error, out)
        kill = json.load(open(os.path.join(killed, "killed.json")))
        attempts = {}
        for attempt in (0, 1):
            for rank in (0, 1):
                path = os.path.join(killed, "attempt%d.rank%d.json" % (attempt, rank))
                if not os.path.exists(path):
                    return fail("no record of rank %d in attempt %d (%s)" % (rank, attempt, path),
                                out)
                attempts[attempt, rank] = json.load(open(path))
        problems = []
        for (attempt, rank), record in sorted(attempts.items()):
            if record["backend"] != "ucx":
                problems.append("attempt %d rank %d ran on %s, not ucx"
                                % (attempt, rank, record["backend"]))
        final, reference = torch.load(os.path.join(killed, "final.pt")), \
            torch.load(os.path.join(whole, "final.pt"))
        if final["attempt"] != 1 or final["first_step"] != 15:
            problems.append("the final weights come from attempt %d starting at step %d, not "
                            "attempt 1 from the step-15 checkpoint"
                            % (final["attempt"], final["first_step"]))
        for key, value in reference["model"].items():
            if not torch.equal(value, final["model"][key]):
                problems.append("weight %s differs from the uninterrupted run's by up to %g"
                                % (key, float((value - final["model"][key]).abs().max())))
        if problems:
            return fail("restart: " + "; ".join(problems), out)
        started = min(attempts[1, r]["started"] for r in (0, 1)) - kill["time"]
        formed = max(attempts[1, r]["formed"] for r in (0, 1)) - kill["time"]
        print("restart: rank 1 killed at step %d; torchrun restarted the workers %.2f s after "
              "the kill, their loom group (ucx, new rendezvous round) formed %.2f s after it; "
              "resumed from step 15, final weights equal to the uninterrupted run's (%d tensors)"
              % (kill["step"], started, formed, len(reference["model"])))
    return 0


def never_joins(env, timeout_s):
    limit = float(env.get("LOOM_TIMEOUT_S", "5"))
    with tempfile.TemporaryDirectory() as tmp:
        error, out = run("rank 2 never joins", torchrun(
            "--standalone", "--nproc-per-node", "3", WORKER, "never_joins", "--dir", tmp),
            env, timeout_s)
        if error:
            return fail(error, out)
        problems = []
        for rank in (0, 1):
            path = os.path.join(tmp, "verdict.rank%d.json" % rank)
            if not os.path.exists(path):
                problems.append("rank %d left no verdict" % rank)
                continue
            verdict = json.load(open(path))
            if verdict["error"] is None:
                problems.append("rank %d made a group without rank 2" % rank)
            elif "rank 2 of 3 did not arrive" not in verdict["error"]:
                problems.append("rank %d's error does not name rank 2: %s"
                                % (rank, verdict["error"]))
            elif verdict["elapsed"] > limit + 10:
                problems.append("rank %d failed after %.1f s (LOOM_TIMEOUT_S %g)"
                                % (rank, verdict["elapsed"], limit))
            else:
                print("rank %d: failed after %.1f s: %s" % (rank, verdict["elapsed"],
                                                           verdict["error"].splitlines()[-1]))
        if problems:
            return fail("never_joins: " + "; ".join(problems), out)
    return 0


def nodes(env, timeout_s):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        agents = []
        for node in range(2):
            command = torchrun("--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                               "--rdzv-endpoint", "127.0.0.1:%d" % port,
                               "--rdzv-id", "loom-nodes-%d" % port,
                               os.path.join(HERE, "mpi_pytest.py"), "--log-dir", tmp, "--",
                               "-x", "-q", "-p", "no:cacheprovider", "test_mesh.py")
            agents.append(subprocess.Popen(command, env=env, cwd=HERE, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True))
        deadline = time.time() + timeout_s
        outputs, problems = [], []
        for node, agent in enumerate(agents):
            try:
                out, _ = agent.communicate(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                for a in agents:
                    a.kill()
                out = agent.communicate()[0]
                problems.append("node %d still running after %d s (a hang)" % (node, timeout_s))
            outputs.append(out)
            if agent.returncode != 0:
                problems.append("node %d's torchrun exit status %s" % (node, agent.returncode))
        if problems:
            return fail("nodes: " + "; ".join(problems), "\n".join(outputs))
        print("\n".join(o for o in outputs if "==== rank" in o))
        print("nodes: 2 torchrun agents x 2 workers met through the c10d rendezvous; the 2 x 2 "
              "DeviceMesh test passed on every rank")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=["restart", "never_joins", "nodes"])
    ap.add_argument("--timeout-s", type=int, default=240)
    args = ap.parse_args()
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    if args.case == "never_joins":
        env["LOOM_TIMEOUT_S"] = env.get("LOOM_NEVER_JOINS_TIMEOUT_S", "5")
    return {"restart": restart, "never_joins": never_joins, "nodes": nodes}[args.case](
        env, args.timeout_s)


if __name__ == "__main__":
    sys.exit(main())
