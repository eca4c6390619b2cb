#!/usr/bin/env python3
"""Training step time of real models: DDP on Gloo, DDP on loom with loom's hook, and
loom_torch.parallelize, interleaved in one run.

    mpirun -np 2 --bind-to none /usr/bin/python3 bench/torch/parallelize_step.py \
        [--models transformer,convnet] [--modes ddp-gloo,ddp-loom-hook,parallelize]

Models: bench/torch/models.py. Each mode trains its own copy (same seed, same per-rank data)
with SGD (lr 0.01, momentum 0.9) and bucket_cap_mb (default 25, as DDP); the modes alternate
step by step, each step after a Gloo barrier, so a noisy machine disturbs them alike. A step is
zero_grad + forward + backward + optimizer.step, timed on every rank; the slowest rank's time
counts. Under parallelize the communication tail overlaps the next forward, so a step's time
includes waiting for the previous step's last buckets (what a training loop sees). --compression
float16 uses DDP's fp16_compress_hook on Gloo and loom's float16 on loom. One thread per rank
(OPENBLAS_NUM_THREADS=1 and torch.set_num_threads(1), as bench/torch/ddp_step.py).
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402  (after the thread limits)
import torch.distributed as dist  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import MODELS  # noqa: E402

MODES = ("ddp-gloo", "ddp-loom-hook", "parallelize")


class Trainer:
    def __init__(self, mode, model_name, args, groups, rank):
        import loom_torch
        self.mode = mode
        made = MODELS[model_name](args.seed, args.scale)
        self.model, self.batch_of, self.loss = made
        self.rank = rank
        params = self.model.parameters()
        if mode == "parallelize":
            opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
            self.net, self.opt = loom_torch.parallelize(
                self.model, opt, bucket_cap_mb=args.bucket_cap_mb,
                compression=None if args.compression == "none" else args.compression)
        else:
            group = groups["gloo"] if mode == "ddp-gloo" else groups["loom"]
            self.net = DDP(self.model, process_group=group, bucket_cap_mb=args.bucket_cap_mb)
            if mode == "ddp-loom-hook":
                loom_torch.register_ddp_hook(self.net, group, compression=args.compression)
            elif args.compression == "float16":
                self.net.register_comm_hook(group, default_hooks.fp16_compress_hook)
            self.opt = torch.optim.SGD(self.net.parameters(), lr=0.01, momentum=0.9)
        self.times, self.losses, self.step_index = [], [], 0

    def step(self):
        x, y = self.batch_of(self.rank, self.step_index)
        self.step_index += 1
        start = time.perf_counter()
        self.opt.zero_grad()
        loss = self.loss(self.net(x), y)
        loss.backward()
        self.opt.step()
        self.times.append(time.perf_counter() - start)
        self.losses.append(loss.item())

    def finish(self):
        if self.mode == "parallelize":
            self.net.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="transformer,resnet18,convnet,mlp,gpt")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--bucket-cap-mb", type=float, default=25)
    ap.add_argument("--compression", choices=["none", "float16"], default="none")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmups", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0, help="shrink the models (quick runs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the medians here (rank 0)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import loom_torch  # noqa: F401  registers "loom", fills RANK/WORLD_SIZE/MASTER_* from mpirun
    dist.init_process_group("loom")
    groups = {"loom": dist.distributed_c10d._get_default_group(),
              "gloo": dist.new_group(backend="gloo")}
    rank, world = dist.get_rank(), dist.get_world_size()
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            raise SystemExit("unknown mode %r (expected %s)" % (m, ", ".join(MODES)))
    results = []
    for name in [n for n in args.models.split(",") if n]:
        if MODELS[name](args.seed, args.scale) is None:
            if rank == 0:
                print("# %s: skipped (torchvision is not installed)" % name)
            continue
        trainers = [Trainer(m, name, args, groups, rank) for m in modes]
        for _ in range(args.warmups + args.steps):
            for t in trainers:
                dist.barrier(group=groups["gloo"])
                t.step()
        for t in trainers:
            t.finish()
        row = {"model": name, "ranks": world, "compression": args.compression,
               "bucket_cap_mb": args.bucket_cap_mb,
               "parameters": sum(p.numel() for p in trainers[0].model.parameters())}
        for t in trainers:
            times = torch.tensor(t.times[args.warmups:], dtype=torch.float64)
            dist.all_reduce(times, op=dist.ReduceOp.MAX, group=groups["gloo"])
            row[t.mode + "_step_ms"] = statistics.median(times.tolist()) * 1e3
            row[t.mode + "_final_loss"] = t.losses[-1]
        results.append(row)
        if rank == 0:
            line = "%-12s %5.1f M params" % (name, row["parameters"] / 1e6)
            for m in modes:
                line += "  %s %8.2f ms" % (m, row[m + "_step_ms"])
            if "ddp-gloo" in modes:
                for m in modes:
                    if m != "ddp-gloo":
                        line += "  %s/gloo %.3f" % (m, row[m + "_step_ms"] /
                                                     row["ddp-gloo_step_ms"])
            print(line, flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
