"""A transformer step on CUDA: loom_torch.parallelize against DDP on Gloo with the same CUDA
model, data and bucket cap, the two interleaved round by round in one job (mpirun; every rank on
the visible GPU, LOCAL_RANK % count: 2 ranks share one GPU and time-slice it).

    mpirun -np 2 python3 bench/gpu/torch_parallelize_cuda.py [--rounds 5] [--steps 10] [--json F]

parallelize runs twice: with its buckets in the GPU's memory (the default; loom's kernels copy
the gradients in, and the buckets travel on NCCL, or staged through pinned memory by the mpi
transport where ranks share a GPU) and with LOOM_TORCH_CUDA_BUCKETS=host (each gradient staged
through loom's host buckets); DDP on Gloo stages its CUDA buckets too. Each round runs `steps` steps of each
after 3 warm-up steps; a step is timed from zero_grad() to the next zero_grad() with a device
synchronize, and rank 0's median step per mode is reported with the same-round ratios.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import loom_torch


class Transformer(nn.Module):
    def __init__(self, d=512, layers=6, heads=8, vocab=8192):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--bucket-cap-mb", type=float, default=25)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to try the script itself")
    ap.add_argument("--json")
    args = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")))
    cuda = args.device == "cuda"
    device = torch.device("cuda", local % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    def synchronize():
        if cuda:
            torch.cuda.synchronize()
    dist.init_process_group("loom")
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    g = torch.Generator().manual_seed(rank)
    batches = [torch.randint(0, 8192, (args.batch, args.seq + 1), generator=g).to(device)
               for _ in range(4)]

    def make(mode):
        torch.manual_seed(0)
        model = Transformer(layers=args.layers).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        if mode.startswith("parallelize"):
            os.environ["LOOM_TORCH_CUDA_BUCKETS"] = "host" if mode.endswith("host") else "auto"
            net, opt = loom_torch.parallelize(model, opt, bucket_cap_mb=args.bucket_cap_mb)
            del os.environ["LOOM_TORCH_CUDA_BUCKETS"]
        else:
            net = DDP(model, process_group=gloo, bucket_cap_mb=args.bucket_cap_mb)
        return net, opt

    def step(net, opt, k):
        tokens = batches[k % len(batches)]
        opt.zero_grad()
        out = net(tokens[:, :-1])
        F.cross_entropy(out.reshape(-1, out.shape[-1]), tokens[:, 1:].reshape(-1)).backward()
        opt.step()

    modes = {m: make(m) for m in ("ddp-gloo", "parallelize", "parallelize-host")}
    for net, opt in modes.values():
        for k in range(3):
            step(net, opt, k)
    times = {m: [] for m in modes}
    for _ in range(args.rounds):
        for m, (net, opt) in modes.items():
            dist.barrier(group=gloo)
            synchronize()
            start = time.perf_counter()
            for k in range(args.steps):
                step(net, opt, k)
            if m.startswith("parallelize"):
                net.synchronize()
            synchronize()
            times[m].append((time.perf_counter() - start) / args.steps * 1e3)
    ratios = [p / d for p, d in zip(times["parallelize"], times["ddp-gloo"])]
    host_ratios = [p / d for p, d in zip(times["parallelize-host"], times["ddp-gloo"])]
    row = {"ranks": n, "device": torch.cuda.get_device_name(device) if cuda else "cpu",
           "buckets": modes["parallelize"][0].bucket_memory(),
           "ddp_gloo_ms": statistics.median(times["ddp-gloo"]),
           "parallelize_ms": statistics.median(times["parallelize"]),
           "parallelize_host_ms": statistics.median(times["parallelize-host"]),
           "same_round_ratios": ratios, "ratio_median": statistics.median(ratios),
           "host_ratio_median": statistics.median(host_ratios),
           "rounds": times}
    if rank == 0:
        print(json.dumps(row, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(row, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
