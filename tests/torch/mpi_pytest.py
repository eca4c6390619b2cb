#!/usr/bin/env python3
"""Runs pytest on every rank of an mpirun (or torchrun) job, one readable report per rank.

    mpirun -np N python3 tests/torch/mpi_pytest.py --log-dir DIR -- PYTEST_ARGS...
    torchrun --standalone --nproc-per-node N tests/torch/mpi_pytest.py --log-dir DIR -- ...

Each rank writes its pytest output to DIR/rank<r>.log; rank 0 then prints every rank's log in
rank order (waiting for each, bounded) and each rank exits with its pytest status, so a failure
on any rank fails the job (mpirun returns non-zero). Ranks are not synchronised by MPI here: a
rank whose collective partner failed ends by loom's timeout (LOOM_TIMEOUT_S), never a hang.
"""
import argparse
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log-dir", required=True)
    ap.add_argument("--wait-s", type=float, default=300)
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    pytest_args = [a for a in args.pytest_args if a != "--"]
    # mpirun's variables, else torchrun's (RANK, WORLD_SIZE): the same harness under both.
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK",
                              os.environ.get("PMIX_RANK", os.environ.get("RANK", "0"))))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    os.makedirs(args.log_dir, exist_ok=True)
    log_path = os.path.join(args.log_dir, "rank%d.log" % rank)
    done_path = os.path.join(args.log_dir, "rank%d.status" % rank)
    if rank == 0:  # the previous run's files must not be taken for this one's
        for r in range(size):
            for p in ("rank%d.status" % r,):
                try:
                    os.remove(os.path.join(args.log_dir, p))
                except FileNotFoundError:
                    pass
    # pytest writes to file descriptors 1 and 2 (also from C++): redirect them, not sys.stdout.
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    saved_out, saved_err = os.dup(1), os.dup(2)
    os.dup2(log, 1)
    os.dup2(log, 2)
    import pytest
    status = int(pytest.main(["-p", "no:cacheprovider"] + pytest_args))
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(saved_out, 1)
    os.dup2(saved_err, 2)
    with open(done_path + ".tmp", "w") as f:
        f.write(str(status))
    os.replace(done_path + ".tmp", done_path)
    if rank == 0:
        deadline = time.time() + args.wait_s
        for r in range(size):
            status_path = os.path.join(args.log_dir, "rank%d.status" % r)
            while not os.path.exists(status_path) and time.time() < deadline:
                time.sleep(0.2)
            state = open(status_path).read() if os.path.exists(status_path) else "no status"
            print("==== rank %d (pytest exit %s) ====" % (r, state))
            with open(os.path.join(args.log_dir, "rank%d.log" % r), errors="replace") as f:
                sys.stdout.write(f.read())
        sys.stdout.flush()
    if status != 0:
        # A rank whose peers failed must not wait in MPI_Finalize for them.
        os._exit(status)
    sys.exit(0)  # normal exit: MPI_Finalize, which mpirun expects of a rank that succeeded


if __name__ == "__main__":
    main()
