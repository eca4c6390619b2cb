"""NCCL through the loom torch group against torch's own NCCL group, world size 1 (torchrun):
microseconds per allreduce call added by loom, per size, the two interleaved round by round.

    python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
        bench/gpu/torch_nccl_overhead.py [--rounds 5] [--calls 200] [--json FILE]

Each round times `calls` back-to-back async allreduces of one CUDA tensor per group and size,
then one wait and a device synchronize: the host's cost per call plus the device's. The loom
group must take the nccl path (backend_of(group).device_path()), or the run stops.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import loom_torch


def per_call_us(group, tensor, calls):
    torch.cuda.synchronize()
    start = time.perf_counter()
    work = None
    for _ in range(calls):
        work = dist.all_reduce(tensor, group=group, async_op=True)
    work.wait()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("loom")
    nccl = dist.new_group(backend="nccl")
    loom = dist.group.WORLD
    sizes = [4 << (2 * k) for k in range(13)]  # 4 B to 64 MiB, x4
    tensors = {s: torch.ones(max(1, s // 4), device="cuda") for s in sizes}
    for s in sizes:  # warm-up: opens loom's device backend and NCCL's communicators
        per_call_us(loom, tensors[s], 5)
        per_call_us(nccl, tensors[s], 5)
    path = loom_torch.backend_of(loom).device_path()
    if path != "nccl":
        raise SystemExit("the loom group took the %r path, not nccl" % path)
    rows = []
    for s in sizes:
        times = {"loom": [], "nccl": []}
        for _ in range(args.rounds):
            times["loom"].append(per_call_us(loom, tensors[s], args.calls))
            times["nccl"].append(per_call_us(nccl, tensors[s], args.calls))
        loom_us = statistics.median(times["loom"])
        nccl_us = statistics.median(times["nccl"])
        rows.append({"bytes": s, "loom_us": loom_us, "nccl_us": nccl_us,
                     "added_us": loom_us - nccl_us})
    print("%10s %12s %12s %12s" % ("bytes", "torch nccl us", "loom us", "added us"))
    for r in rows:
        print("%10d %12.2f %12.2f %12.2f" % (r["bytes"], r["nccl_us"], r["loom_us"],
                                             r["added_us"]))
    print("device: %s; torch %s; loom path %s; median of %d rounds of %d calls"
          % (torch.cuda.get_device_name(), torch.__version__, path, args.rounds, args.calls))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
