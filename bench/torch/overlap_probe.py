#!/usr/bin/env python3
"""How much of one allreduce hides behind the caller's compute, loom against Gloo, on a host whose
cores the ranks fill.

    mpirun -np 2 --bind-to none /usr/bin/python3 bench/torch/overlap_probe.py [--sizes 1M,4M]
    bench/netem.sh 2gbit -- mpirun -np 2 --bind-to none /usr/bin/python3 bench/torch/overlap_probe.py

For each size (float32, sum) and each group ("gloo", "loom"), rounds interleave three timings on
every rank, each after a barrier:
  compute  N matrix products (256 x 256, one thread) alone, N sized to take about as long as
           the allreduce alone (--compute-ratio times it);
  comm     one dist.all_reduce alone;
  both     dist.all_reduce(async_op=True), the same N products, then wait().
The slowest rank's time counts; each column is the median over rounds. The overlap efficiency is
the share of the shorter of the two that was hidden: (compute + comm - both) / min(compute, comm);
1 when the longer one hides the shorter entirely, 0 when they ran one after the other. With one
compute thread per rank and as many ranks as cores, the backend's threads compete with the
compute for the cores, as in a training step: loom's progress thread polls
(LOOM_PROGRESS_PRIORITY says at what priority), Gloo's threads block in the kernel.
"""
import argparse
import os
import statistics
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402  (after the thread limits)
import torch.distributed as dist  # noqa: E402

import loom_torch  # noqa: E402,F401  registers "loom"; RANK, WORLD_SIZE, MASTER_* under mpirun
from allreduce_sweep import parse_bytes  # noqa: E402  (this script's folder is on sys.path)


def slowest(seconds, sync):
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=sync)
    return t.item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="256K,1M,4M", help="comma list of byte sizes")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--compute-ratio", type=float, default=1.0,
                    help="the compute's length over the allreduce's (alone, on Gloo)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("loom")
    gloo = dist.new_group(backend="gloo")
    groups = {"gloo": gloo, "loom": dist.group.WORLD}
    rank = dist.get_rank()
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def products(n):
        for _ in range(n):
            torch.mm(a, b)

    products(50)
    start = time.perf_counter()
    products(200)
    per_product = slowest((time.perf_counter() - start) / 200, gloo)
    if rank == 0:
        print("# overlap_probe: %d ranks, float32 sum, one 256x256 product %.3f ms, median of %d "
              "rounds, priority %s" % (dist.get_world_size(), per_product * 1e3, args.rounds,
                                       os.environ.get("LOOM_PROGRESS_PRIORITY", "automatic")))
        print("# %10s %8s %10s | %9s %9s %6s | %9s %9s %6s" % (
            "bytes", "products", "compute ms", "gloo comm", "gloo both", "eff", "loom comm",
            "loom both", "eff"))
    for size in [parse_bytes(s) for s in args.sizes.split(",")]:
        x = torch.ones(size // 4)
        for g in groups.values():  # warm-up: connections, buffers
            dist.all_reduce(x, group=g)
        dist.barrier(group=gloo)
        start = time.perf_counter()
        for _ in range(3):
            dist.all_reduce(x, group=gloo)
        n = max(1, round(args.compute_ratio * slowest((time.perf_counter() - start) / 3, gloo)
                         / per_product))
        times = {"compute": []}
        for name in groups:
            times[name + " comm"], times[name + " both"] = [], []
        for _ in range(args.rounds):
            dist.barrier(group=gloo)
            start = time.perf_counter()
            products(n)
            times["compute"].append(slowest(time.perf_counter() - start, gloo))
            for name, g in groups.items():
                dist.barrier(group=gloo)
                start = time.perf_counter()
                dist.all_reduce(x, group=g)
                times[name + " comm"].append(slowest(time.perf_counter() - start, gloo))
                dist.barrier(group=gloo)
                start = time.perf_counter()
                work = dist.all_reduce(x, group=g, async_op=True)
                products(n)
                work.wait()
                times[name + " both"].append(slowest(time.perf_counter() - start, gloo))
        med = {k: statistics.median(v) for k, v in times.items()}
        if rank == 0:
            row = []
            for name in groups:
                comm, both = med[name + " comm"], med[name + " both"]
                eff = (med["compute"] + comm - both) / min(med["compute"], comm)
                row += [comm * 1e3, both * 1e3, eff]
            print("%12d %8d %10.2f | %9.2f %9.2f %6.2f | %9.2f %9.2f %6.2f" % (
                size, n, med["compute"] * 1e3, *row), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
