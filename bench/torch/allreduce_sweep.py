#!/usr/bin/env python3
"""torch.distributed allreduce bandwidth of the "gloo" and "loom" groups, nccl-tests' columns.

    mpirun -np 2 --bind-to none /usr/bin/python3 bench/torch/allreduce_sweep.py [--max-bytes 128M]

One job, both groups; for each size (float32, sum, 8 B to 128 MiB by powers of two) the two
groups alternate rounds (gloo, loom, gloo, ...) so a noisy machine disturbs both alike. A round
is a barrier then `iters` back-to-back dist.all_reduce calls; time = the slowest rank's round /
iters, the median over rounds. algbw = bytes / time, busbw = algbw * 2 (n - 1) / n (nccl-tests'
allreduce factor). `cpu us` is the process CPU time per call (every thread of the rank: the
caller, the backend's threads; not the kernel's softirq work, which is charged to whoever it
interrupts), the busiest rank's. The last column is loom's busbw over Gloo's.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import loom_torch  # noqa: F401  registers "loom", agrees on MASTER_ADDR/PORT under mpirun


def parse_bytes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def timed_round(tensor, group, iters, sync):
    """(seconds, process CPU seconds) per call: the slowest rank's, the busiest rank's."""
    dist.barrier(group=sync)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(iters):
        dist.all_reduce(tensor, group=group)
    spent = torch.tensor([time.perf_counter() - start, time.process_time() - cpu],
                         dtype=torch.float64)
    dist.all_reduce(spent, op=dist.ReduceOp.MAX, group=sync)
    return spent[0].item() / iters, spent[1].item() / iters


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--min-bytes", default="8")
    ap.add_argument("--max-bytes", default="128M")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", help="write the rows here (rank 0)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("loom")
    gloo = dist.new_group(backend="gloo")
    groups = {"gloo": gloo, "loom": dist.group.WORLD}
    rank, n = dist.get_rank(), dist.get_world_size()
    factor = 2 * (n - 1) / n
    rows = []
    if rank == 0:
        print("# allreduce_sweep: %d ranks, float32 sum, median of %d rounds, gloo and loom "
              "interleaved" % (n, args.rounds))
        print("#%11s %10s %6s %6s | %10s %8s %8s %9s | %10s %8s %8s %9s | %6s" % (
            "size", "count", "type", "redop", "gloo us", "algbw", "busbw", "cpu us", "loom us",
            "algbw", "busbw", "cpu us", "loom/gloo"))
    size = parse_bytes(args.min_bytes)
    while size <= parse_bytes(args.max_bytes):
        count = max(1, size // 4)
        tensor = torch.ones(count, dtype=torch.float32)
        iters = max(2, min(200, (64 << 20) // max(size, 1)))  # about 64 MiB moved per round
        for name, group in groups.items():  # warm-up: connections, buffers
            timed_round(tensor, group, 2, gloo)
        times = {name: [] for name in groups}
        cpus = {name: [] for name in groups}
        for _ in range(args.rounds):
            for name, group in groups.items():
                t, c = timed_round(tensor, group, iters, gloo)
                times[name].append(t)
                cpus[name].append(c)
        row = {"bytes": count * 4, "count": count}
        for name in groups:
            t = statistics.median(times[name])
            row[name + "_us"] = t * 1e6
            row[name + "_cpu_us"] = statistics.median(cpus[name]) * 1e6
            row[name + "_algbw"] = count * 4 / t / 1e9
            row[name + "_busbw"] = row[name + "_algbw"] * factor
        row["busbw_ratio"] = row["loom_busbw"] / row["gloo_busbw"]
        rows.append(row)
        if rank == 0:
            print("%12d %10d %6s %6s | %10.1f %8.3f %8.3f %9.1f | %10.1f %8.3f %8.3f %9.1f | "
                  "%6.2f" % (count * 4, count, "float", "sum", row["gloo_us"], row["gloo_algbw"],
                             row["gloo_busbw"], row["gloo_cpu_us"], row["loom_us"],
                             row["loom_algbw"], row["loom_busbw"], row["loom_cpu_us"],
                             row["busbw_ratio"]), flush=True)
        size *= 2
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
