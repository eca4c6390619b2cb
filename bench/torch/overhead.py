#!/usr/bin/env python3
"""Per-step overhead of loom_torch.parallelize against DDP, where communication costs little:
2 ranks on shared memory, a model of 60 parameter tensors totalling 1 MiB (30 nn.Linear(93, 93)
layers with ReLUs), a small batch, SGD with momentum. Issue 22's figure: parallelize's step
<= 1.05x DDP-on-Gloo's step.

    PYTHONPATH=build/python LOOM_CALIBRATION=0 \\
      mpirun -np 2 --bind-to none /usr/bin/python3 bench/torch/overhead.py

Modes (--modes): ddp-gloo (DDP on Gloo), ddp-loom (DDP on loom with loom's hook), parallelize.
Rounds interleave the modes (one untimed step, then --steps timed steps each per round, every
step after a barrier; parallelize's tail lands untimed before the next mode's round, as in
bench/torch/real_models.py); a step
(zero_grad, forward, loss, backward, optimizer step) is timed on every rank, the slowest rank's
counting. Printed: each mode's median step and, per round, its ratio to DDP on Gloo's step of the
same round, with the median of those ratios (the figure: it is immune to the drift of a loaded
host). --profile FILE: rank 0 writes a cProfile of parallelize's steps (pstats format). One thread
per rank (torch and OpenBLAS).
"""
import argparse
import cProfile
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402  (after the thread limits)
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def model(layers, width):
    modules = []
    for k in range(layers):
        modules.append(nn.Linear(width, width))
        if k < layers - 1:
            modules.append(nn.ReLU())
    return nn.Sequential(*modules)


class Trainer:
    def __init__(self, mode, args, rank, groups):
        torch.manual_seed(args.seed)
        net = model(args.layers, args.width)
        self.mode = mode
        self.tensors = sum(1 for _ in net.parameters())
        self.bytes = sum(p.numel() * p.element_size() for p in net.parameters())
        optimizer = lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9)  # noqa: E731
        if mode in ("parallelize", "parallelize-default"):
            import loom_torch
            # parallelize-default: no plan given (loom's automatic plan, the default).
            plan = {} if mode == "parallelize-default" else {"bucket_cap_mb": args.bucket_cap_mb}
            self.net, self.opt = loom_torch.parallelize(
                net, optimizer(net.parameters()), process_group=groups["loom"], **plan)
        else:
            group = groups["gloo" if mode == "ddp-gloo" else "loom"]
            self.net = DDP(net, process_group=group, bucket_cap_mb=args.bucket_cap_mb)
            if mode == "ddp-loom":
                import loom_torch
                loom_torch.register_ddp_hook(self.net, group)
            self.opt = optimizer(self.net.parameters())
        g = torch.Generator().manual_seed(args.seed * 1000 + rank)
        self.x = torch.randn(args.batch, args.width, generator=g)
        self.y = torch.randn(args.batch, args.width, generator=g)
        self.times = []

    def step(self, timed=True):
        start = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        loss = ((self.net(self.x) - self.y) ** 2).mean()
        loss.backward()
        self.opt.step()
        if timed:
            self.times.append(time.perf_counter() - start)

    def quiesce(self):
        """What parallelize still has in flight lands now, untimed, not under the next mode."""
        if self.mode.startswith("parallelize"):
            self.net.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="ddp-gloo,ddp-loom,parallelize")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--width", type=int, default=93, help="30 x (93 x 93 + 93) floats = 1 MiB")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--bucket-cap-mb", type=float, default=25)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per mode and round")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmups", type=int, default=10)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--profile", help="rank 0 writes a cProfile of parallelize's steps here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import loom_torch  # noqa: F401  registers "loom"; fills RANK, WORLD_SIZE and MASTER_* from mpirun
    dist.init_process_group("loom")
    groups = {"loom": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    rank, world = dist.get_rank(), dist.get_world_size()
    sync = groups["gloo"]
    trainers = [Trainer(mode, args, rank, groups) for mode in args.modes.split(",")]
    for t in trainers:
        for _ in range(args.warmups):
            dist.barrier(group=sync)
            t.step()
        # The default's automatic plan: timed once it decided (the same step on every rank).
        while t.mode == "parallelize-default" and t.net.automatic_plan is None:
            dist.barrier(group=sync)
            t.step()
        t.times.clear()
    profiler = cProfile.Profile() if args.profile and rank == 0 else None
    # Each mode's round starts with an untimed step, so that every timed step follows one of its
    # own mode (parallelize's next forward overlaps the previous step's tail), and parallelize's
    # tail lands before the next mode's round.
    for t in trainers:
        t.quiesce()
    for _ in range(args.rounds):
        for t in trainers:
            for s in range(1 + args.steps):
                dist.barrier(group=sync)
                if profiler is not None and t.mode == "parallelize":
                    profiler.enable()
                    t.step(timed=s > 0)
                    profiler.disable()
                else:
                    t.step(timed=s > 0)
            t.quiesce()
    medians = {}
    per_round = {}
    for t in trainers:
        times = torch.tensor(t.times, dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX, group=sync)
        times = times.tolist()
        medians[t.mode] = statistics.median(times) * 1e3
        per_round[t.mode] = [statistics.median(times[r * args.steps:(r + 1) * args.steps])
                             for r in range(args.rounds)]
    if rank == 0:
        t = trainers[0]
        print("# overhead: %d ranks, %d tensors, %d bytes of gradients, batch %d, buckets %g MB, "
              "%d rounds x %d steps per mode, interleaved; load average %s"
              % (world, t.tensors, t.bytes, args.batch, args.bucket_cap_mb, args.rounds,
                 args.steps, open("/proc/loadavg").read().split()[0]))
        base = per_round.get("ddp-gloo")
        for mode in medians:
            line = "%-12s median step %8.3f ms" % (mode, medians[mode])
            if base and mode != "ddp-gloo":
                ratios = [a / b for a, b in zip(per_round[mode], base)]
                line += ("   x ddp-gloo: median of rounds %.3f (rounds %s)"
                         % (statistics.median(ratios), " ".join("%.2f" % r for r in ratios)))
            print(line)
        if profiler is not None:
            profiler.dump_stats(args.profile)
        sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
