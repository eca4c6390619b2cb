#!/usr/bin/env python3
"""PyTorch DDP training step time on the "gloo" and "loom" groups, interleaved in one run.

    mpirun -np 2 --bind-to none /usr/bin/python3 bench/torch/ddp_step.py [--backend both]

loom-overlap's model, data and loss (examples/train_step/mlp.cpp): an MLP 64 -> 8 linear layers
(64->512, 6 x 512->512, 512->16) with ReLU between them, Glorot-uniform weights and zero biases;
inputs uniform in [-1, 1), targets tanh(inputs @ teacher) with a teacher uniform in [-1, 1) /
sqrt(64), each rank its own slice of batch x world samples; loss 0.5 * sum((out - target)^2) /
batch; SGD lr 0.05; batch 512 per rank; 1 MiB buckets (bucket_cap_mb=1; DDP's first bucket is
1 MiB too); one thread per rank (see below). The values come from torch's generator (same distributions as
loom's std::mt19937_64 draws, not the same numbers).

--backend both (default) builds one DDP model per group and alternates their steps (gloo, loom,
gloo, ...), every step after a barrier, so a noisy machine disturbs both alike; a step is
forward + backward + optimizer step, timed on every rank, the slowest rank's counting. --hook
fp16 uses DDP's fp16_compress_hook on gloo and loom's float16 hook on loom. Rank and size come
from mpirun (OMPI_COMM_WORLD_RANK/SIZE -> RANK/WORLD_SIZE; MASTER_ADDR/PORT agreed by
loom_torch, or 127.0.0.1:29500 for gloo alone).

One thread per rank means one for BLAS too: Debian's torch multiplies through the system BLAS
(libblas.so.3, OpenBLAS's pthread build), whose thread pool torch.set_num_threads does not
bound; left alone it starts one thread per core (a 512^3 matmul took 1.05 ms with 2 threads
against 1.91 ms with one on the 2-core machine). OPENBLAS_NUM_THREADS=1 is set before torch
loads unless the caller set it, and the header line prints what OpenBLAS reports.
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402  (after the thread limits)
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

INPUT, WIDTH, OUTPUT, DEPTH = 64, 512, 16, 8


def make_model(seed):
    g = torch.Generator().manual_seed(seed)
    layers = []
    for k in range(DEPTH):
        fan_in = INPUT if k == 0 else WIDTH
        fan_out = OUTPUT if k == DEPTH - 1 else WIDTH
        linear = torch.nn.Linear(fan_in, fan_out)
        bound = (6.0 / (fan_in + fan_out)) ** 0.5
        with torch.no_grad():
            linear.weight.copy_((torch.rand(fan_out, fan_in, generator=g) * 2 - 1) * bound)
            linear.bias.zero_()
        layers.append(linear)
        if k + 1 < DEPTH:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def make_data(seed, rank, world, batch):
    g = torch.Generator().manual_seed(seed + 1)
    samples = batch * world
    inputs = torch.rand(samples, INPUT, generator=g) * 2 - 1
    teacher = (torch.rand(INPUT, OUTPUT, generator=g) * 2 - 1) / INPUT ** 0.5
    targets = torch.tanh(inputs @ teacher)
    return inputs[rank * batch:(rank + 1) * batch], targets[rank * batch:(rank + 1) * batch]


class Trainer:
    def __init__(self, name, group, args, rank, world):
        self.name = name
        self.model = DDP(make_model(args.seed), process_group=group, bucket_cap_mb=1)
        if args.hook == "fp16":
            if name == "loom":
                import loom_torch
                loom_torch.register_ddp_hook(self.model, group, compression="float16")
            else:
                self.model.register_comm_hook(group, default_hooks.fp16_compress_hook)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.x, self.y = make_data(args.seed, rank, world, args.batch)
        self.batch = args.batch
        self.times, self.losses = [], []

    def step(self):
        start = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        loss = 0.5 * ((self.model(self.x) - self.y) ** 2).sum() / self.batch
        loss.backward()
        self.opt.step()
        self.times.append(time.perf_counter() - start)
        self.losses.append(loss.item())


def blas_threads():
    """The thread count OpenBLAS reports in this process ("?" if it is not OpenBLAS)."""
    for name in ("libopenblas.so.0", "libblas.so.3"):
        try:
            return str(ctypes.CDLL(name).openblas_get_num_threads())
        except (OSError, AttributeError):
            continue
    return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["gloo", "loom", "both"], default="both")
    ap.add_argument("--hook", choices=["none", "fp16"], default="none")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmups", type=int, default=5)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json", help="write the medians here (rank 0)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for var, names in (("RANK", ("OMPI_COMM_WORLD_RANK", "PMIX_RANK")),
                       ("WORLD_SIZE", ("OMPI_COMM_WORLD_SIZE",))):
        for n in names:
            if n in os.environ and var not in os.environ:
                os.environ[var] = os.environ[n]
    if args.backend == "gloo":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group("gloo")
        groups = {"gloo": None}
    else:
        import loom_torch  # noqa: F401  registers "loom" and agrees on MASTER_ADDR/PORT
        dist.init_process_group("loom")
        groups = {"loom": None}
        if args.backend == "both":
            groups = {"gloo": dist.new_group(backend="gloo"), "loom": None}
    rank, world = dist.get_rank(), dist.get_world_size()
    sync = groups.get("gloo")  # barriers and the max over ranks go through Gloo in both modes
    trainers = [Trainer(name, group if group is not None else dist.group.WORLD, args, rank,
                        world) for name, group in groups.items()]
    for _ in range(args.warmups + args.steps):
        for t in trainers:
            dist.barrier(group=sync)
            t.step()
    result = {"ranks": world, "batch": args.batch, "hook": args.hook, "steps": args.steps}
    for t in trainers:
        times = torch.tensor(t.times[args.warmups:], dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX, group=sync)  # the slowest rank's step
        result[t.name + "_step_ms"] = statistics.median(times.tolist()) * 1e3
        result[t.name + "_final_loss"] = t.losses[-1]
    if rank == 0:
        print("# ddp_step: %d ranks, MLP %d -> %d x %d -> %d, batch %d per rank, 1 MiB buckets, "
              "hook %s, median of %d steps after %d warm-ups, interleaved; threads: torch %d, "
              "BLAS %s"
              % (world, INPUT, DEPTH, WIDTH, OUTPUT, args.batch, args.hook, args.steps,
                 args.warmups, torch.get_num_threads(), blas_threads()))
        for t in trainers:
            print("%-5s step %8.3f ms  loss %.6f" % (t.name, result[t.name + "_step_ms"],
                                                    t.losses[-1]))
        if len(trainers) == 2:
            result["loom_over_gloo"] = result["loom_step_ms"] / result["gloo_step_ms"]
            print("loom/gloo step time ratio %.3f" % result["loom_over_gloo"])
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
