#!/usr/bin/env python3
"""loom groups in processes started by torch.multiprocessing.spawn (no mpirun, no torchrun),
joined through env:// and file://: the default group and a subgroup, each collective checked
against values every rank computes itself. The ranks meet through torch's store over loom's
ucx backend. Exits non-zero (naming the rank and the check) when any rank fails.

    python3 tests/torch/spawn_check.py --ranks 3
"""
import argparse
import os
import socket
import sys
import tempfile
from datetime import timedelta


def worker(rank, world, init_method, failures):
    import torch
    import torch.distributed as dist
    import loom_torch  # noqa: F401  registers "loom"

    torch.set_num_threads(1)
    dist.init_process_group("loom", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    problems = []
    backend = loom_torch.backend_of(dist.distributed_c10d._get_default_group())
    if backend.backend_name() != "ucx":
        problems.append("the default group runs on %s, not ucx" % backend.backend_name())
    t = torch.full((1027,), float(rank + 1))
    dist.all_reduce(t)
    if not bool((t == world * (world + 1) / 2).all()):
        problems.append("all_reduce gave %s" % t[:3].tolist())
    gathered = [torch.zeros(3, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(gathered, torch.full((3,), rank, dtype=torch.int64))
    if [int(g[0]) for g in gathered] != list(range(world)):
        problems.append("all_gather gave %s" % [g.tolist() for g in gathered])
    b = torch.tensor([rank * 10])
    dist.broadcast(b, src=world - 1)
    if int(b) != (world - 1) * 10:
        problems.append("broadcast gave %d" % int(b))
    out = torch.zeros(world, dtype=torch.int32)
    dist.all_to_all_single(out, torch.arange(world, dtype=torch.int32) + 100 * rank)
    if out.tolist() != [100 * r + rank for r in range(world)]:
        problems.append("all_to_all_single gave %s" % out.tolist())
    evens = [r for r in range(world) if r % 2 == 0]
    sub = dist.new_group(evens)
    if rank in evens:
        s = torch.ones(5)
        dist.all_reduce(s, group=sub)
        if float(s[0]) != len(evens):
            problems.append("subgroup all_reduce gave %s" % float(s[0]))
    dist.barrier()
    dist.destroy_process_group()
    if problems:
        failures.put((rank, problems))
        sys.exit(1)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    import torch.multiprocessing as mp

    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        for init_method in ("env://", "file://" + os.path.join(tmp, "rendezvous")):
            os.environ["MASTER_PORT"] = str(free_port())
            ctx = mp.get_context("spawn")
            failures = ctx.SimpleQueue()
            try:
                mp.spawn(worker, args=(args.ranks, init_method, failures), nprocs=args.ranks)
                print("%s: %d ranks, every collective and a subgroup as expected"
                      % (init_method.split(":")[0], args.ranks))
            except Exception as error:  # a rank exited non-zero: say which check failed
                status = 1
                print("%s: %s" % (init_method.split(":")[0], error))
                while not failures.empty():
                    rank, problems = failures.get()
                    print("  rank %d: %s" % (rank, "; ".join(problems)))
    return status


if __name__ == "__main__":
    sys.exit(main())
