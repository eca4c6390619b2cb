#!/usr/bin/env python3
"""One mode of bench/torch/real_models.py trained alone in its process, and the memory it took per
rank: the process's resident memory and its peak above what it held before the model was built,
and the tensors torch sees (the unique storages of parameters, gradients and optimizer state,
DTensors by their local shard), each part apart.

    mpirun -np 2 python bench/torch/shard_memory.py --mode parallelize:shard=gradients \\
        --model gpt-wide --optimizer adamw --json out.json

One mode per process, so that no mode's freed memory is another's; bench/torch/shard_memory.sh
runs every mode in turn, rounds interleaved, with glibc's MALLOC_MMAP_THRESHOLD_ fixed alike for
every run (allocations above it are mapped, and given back to the kernel when freed), and prints
the table. Rank 0 writes --json with every rank's figures (the largest rank's are the row's).
"""
import argparse
import json
import os
import resource
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import real_models  # noqa: E402  (the models and every mode's construction)


def resident_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # (KiB on Linux)


def storage_bytes(tensors, seen):
    total = 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        if hasattr(t, "to_local"):  # a DTensor: this rank's shard
            t = t.to_local()
        storage = t.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def state_tensors(opt):
    inner = getattr(opt, "optim", None)  # ZeroRedundancyOptimizer's local optimizer
    states = (inner or opt).state if hasattr(inner or opt, "state") else {}
    return [v for state in states.values() for v in state.values()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", required=True)
    ap.add_argument("--model", default="gpt-wide")
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="adamw")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import loom_torch  # noqa: F401
    dist.init_process_group("loom")
    groups = {"loom": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    rank, world = dist.get_rank(), dist.get_world_size()
    # real_models' Trainer with its defaults for what this script does not vary.
    options = argparse.Namespace(model=args.model, batch=0, optimizer=args.optimizer, clip=0,
                                 series=0, compression="none", bucket_cap_mb=25, seed=42,
                                 predict=False)
    dist.barrier(group=groups["gloo"])
    before = resident_bytes()
    trainer = real_models.Trainer(args.mode, options, rank, world, groups)
    for _ in range(args.steps):
        dist.barrier(group=groups["gloo"])
        trainer.step(timed=False)
    trainer.quiesce()
    model = trainer.net.module if hasattr(trainer.net, "module") else trainer.net
    params = list(model.parameters())
    seen = set()
    parts = {
        "parameters": storage_bytes(params, seen),
        "gradients": storage_bytes([p.grad for p in params], seen),
        "optimizer_state": storage_bytes(state_tensors(trainer.opt), seen),
    }
    mine = {"rank": rank, "resident": resident_bytes() - before, "peak": peak_bytes() - before,
            "tensors": sum(parts.values()), **parts, "loss": trainer.loss}
    if args.mode.startswith("parallelize"):
        mine["loom_plan_memory_mb"] = trainer.net.plan_memory()
    everyone = [None] * world
    dist.all_gather_object(everyone, mine, group=groups["gloo"])
    if rank == 0:
        row = {"mode": args.mode, "model": args.model, "ranks": world,
               "params": sum(p.numel() for p in params) if world == 1 else trainer.params,
               "optimizer": args.optimizer, "steps": args.steps, "per_rank": everyone,
               "mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_", "glibc default")}
        for key in ("resident", "peak", "tensors", "parameters", "gradients",
                    "optimizer_state"):
            row[key] = max(r[key] for r in everyone)
        print("%-30s resident %8.1f MB  peak %8.1f MB  tensors %8.1f MB (params %.1f, grads "
              "%.1f, state %.1f)" % (args.mode, row["resident"] / 1e6, row["peak"] / 1e6,
                                     row["tensors"] / 1e6, row["parameters"] / 1e6,
                                     row["gradients"] / 1e6, row["optimizer_state"] / 1e6))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(row, f, indent=1)
    dist.barrier(group=groups["gloo"])  # every rank ends together
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
