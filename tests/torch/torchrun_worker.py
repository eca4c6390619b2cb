#!/usr/bin/env python3
"""The worker of torchrun_check.py, started by torchrun (RANK, WORLD_SIZE, torch's store).

    train: parallelize(model, opt) on the default loom group for --steps steps, a checkpoint
        (torch.save, rank 0) every --every steps; resumes from the checkpoint when there is one.
        On torchrun's first attempt (TORCHELASTIC_RESTART_COUNT=0), rank --kill-rank SIGKILLs
        itself at step --kill-at, after writing the time. Rank 0 saves the final weights.
    never_joins: the last rank never calls init_process_group (it waits for the others' verdicts,
        bounded, then exits 0); every other rank's init_process_group("loom") must fail within
        LOOM_TIMEOUT_S + 10 s with loom's error naming that rank.
"""
import argparse
import json
import os
import signal
import sys
import time
from datetime import timedelta


def write_json(path, value):
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def train(args, rank):
    import torch
    import torch.distributed as dist
    import loom_torch

    torch.set_num_threads(1)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    started = time.time()
    dist.init_process_group("loom")
    formed = time.time()
    backend = loom_torch.backend_of(dist.distributed_c10d._get_default_group()).backend_name()
    write_json(os.path.join(args.dir, "attempt%d.rank%d.json" % (attempt, rank)),
               {"started": started, "formed": formed, "backend": backend})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    net, opt = loom_torch.parallelize(model, opt, bucket_cap_mb=1)
    checkpoint = os.path.join(args.dir, "checkpoint.pt")
    first = 0
    if os.path.exists(checkpoint):
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        first = state["step"]
    for step in range(first, args.steps):
        if attempt == 0 and rank == args.kill_rank and step == args.kill_at:
            write_json(os.path.join(args.dir, "killed.json"), {"time": time.time(), "step": step})
            os.kill(os.getpid(), signal.SIGKILL)
        generator = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(16, 32, generator=generator)
        y = torch.randn(16, 8, generator=generator)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        if (step + 1) % args.every == 0 and rank == 0:
            net.synchronize()  # the updates still in flight, into the weights saved
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1},
                       checkpoint + ".tmp")
            os.replace(checkpoint + ".tmp", checkpoint)
    net.synchronize()
    if rank == 0:
        torch.save({"model": model.state_dict(), "first_step": first, "attempt": attempt},
                   args.out)
    dist.destroy_process_group()


def never_joins(args, rank, world):
    import torch.distributed as dist
    import loom_torch  # noqa: F401  registers "loom"

    absent = world - 1
    verdicts = [os.path.join(args.dir, "verdict.rank%d.json" % r) for r in range(absent)]
    if rank == absent:  # never joins: waits (bounded) until the others have said what they saw
        deadline = time.time() + 180
        while not all(map(os.path.exists, verdicts)) and time.time() < deadline:
            time.sleep(0.2)
        return
    start = time.time()
    try:
        dist.init_process_group("loom", timeout=timedelta(seconds=300))
        verdict = {"error": None}
    except Exception as error:  # noqa: BLE001  loom's error, whatever torch wraps it in
        verdict = {"error": str(error)}
    verdict["elapsed"] = time.time() - start
    write_json(verdicts[rank], verdict)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["train", "never_joins"])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--kill-at", type=int, default=-1)
    ap.add_argument("--kill-rank", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.mode == "train":
        train(args, rank)
    else:
        never_joins(args, rank, world)
    return 0


if __name__ == "__main__":
    sys.exit(main())
