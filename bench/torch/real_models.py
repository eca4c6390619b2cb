#!/usr/bin/env python3
"""Real models, trained data-parallel three ways in one run: DDP on Gloo, DDP on loom with loom's
hook, and loom_torch.parallelize, interleaved.

    mpirun -np 2 --bind-to none /usr/bin/python3 bench/torch/real_models.py --model transformer

Models (--model; the shapes of issue 22's table):
  transformer  nn.TransformerEncoder, 4 layers, d 256, 4 heads, ff 1024, seq 64, batch 16,
               + linear head (3.3 M parameters)
  resnet18     torchvision resnet18, 10 classes, 64x64 images, batch 8 (11.2 M; needs
               python3-torchvision, which only the benchmark's set-up installs)
  convnet      3 conv + 2 linear, 32x32 images, batch 32 (2.3 M)
  mlp          loom-overlap's MLP 64 -> 8 x 512 -> 16, batch 512 (bench/torch/ddp_step.py)
  gpt          a small GPT-like stack with tied input/output embeddings
  mobilenet_v2 torchvision mobilenet_v2 (many small tensors), 10 classes, 64x64, batch 8
Every mode starts from the same weights (seeded), sees the same batches, and steps with SGD
(momentum 0.9, lr 0.01), DDP's bucket_cap_mb 25 (--bucket-cap-mb). Rounds interleave the modes:
each mode runs --discard untimed steps, then --steps timed ones, every step after a barrier, and
parallelize then lets what it still has in flight land (untimed) before the next mode's round,
so every timed step follows a step of its own mode, as in training, and no mode's communication
runs under another's steps. A step is zero_grad, forward, loss, backward, optimizer step, timed
on every rank, the slowest rank's counting. Besides each mode's median step, "ratio_rounds" is
the median over rounds of the mode's round median over DDP-on-Gloo's in the same round: a
shared host's speed drifts over seconds, which a same-round ratio cancels (with few steps per
round each round's median is noisy in turn: read both). (One process training four identical
convnets in turn once saw 68 to 214 ms steps: much of that was glibc's malloc trimming the heap
after each step and faulting it in again, which real_models.sh now turns off for every mode.)
The prediction needs at least two timed steps per round (a step followed by another mode's
round is left out of it).
--modes picks the rows ("local": every rank trains alone, no communication, the compute floor of
N ranks on this host); "parallelize" needs loom_torch.parallelize, "parallelize-auto" is it
with bucket_cap_mb="auto" (its warm-up runs until the automatic plan decided, so its row is
the chosen plan's step); either takes a plan in its name, e.g. "parallelize:cap=2:first=0.25"
(options cap, first, inflight, priority, partition: parallelize()'s bucket_cap_mb,
first_bucket_mb, collectives_in_flight, priority and partition_large). The parallelize rows
are profiled (--no-predict: not) and carry the step simulator's prediction (net.predict(),
rank 0's): "pred_ms" beside "period_ms", the mean measured period of the same steps (one
backward's start to the next: the timed step plus the barrier and the batch between steps), and
"err" = (pred - period) / period. --compression float16 uses DDP's fp16_compress_hook on Gloo
and loom's float16 on loom. One thread per rank (torch and OpenBLAS), as bench/torch/ddp_step.py.
Rank 0 prints one line per mode and writes --json.
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
import torch.nn as nn  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


class Transformer(nn.Module):
    def __init__(self, d=256, heads=4, ff=1024, layers=4, vocab=1000, classes=10):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


class ConvNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(128, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(256 * 4 * 4, 512), nn.ReLU(),
                                        nn.Linear(512, classes))

    def forward(self, x):
        return self.classifier(self.features(x))


class Gpt(nn.Module):
    """Token and position embeddings, causal encoder blocks, output projection tied to the
    token embedding (the same Parameter used twice)."""

    def __init__(self, vocab=2000, d=128, heads=4, layers=2, seq=32):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d)
        self.positions = nn.Parameter(torch.zeros(seq, d))
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab, bias=False)
        self.out.weight = self.tokens.weight  # tied
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))

    def forward(self, tokens):
        h = self.tokens(tokens) + self.positions[:tokens.shape[1]]
        return self.out(self.norm(self.blocks(h, mask=self.mask)))


def mlp():
    layers = []
    for k in range(8):
        layers.append(nn.Linear(64 if k == 0 else 512, 16 if k == 7 else 512))
        if k < 7:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def make(name, batch):
    """(model, inputs(generator) -> x, loss(out, generator) -> loss, default batch)."""
    if name == "transformer":
        b = batch or 16
        return (Transformer(), lambda g: torch.randint(0, 1000, (b, 64), generator=g),
                lambda out, y: nn.functional.cross_entropy(out, y),
                lambda g: torch.randint(0, 10, (b,), generator=g))
    if name in ("resnet18", "mobilenet_v2"):
        import torchvision  # the benchmark's set-up installs python3-torchvision
        b = batch or 8
        model = getattr(torchvision.models, name)(num_classes=10)
        return (model, lambda g: torch.randn(b, 3, 64, 64, generator=g),
                lambda out, y: nn.functional.cross_entropy(out, y),
                lambda g: torch.randint(0, 10, (b,), generator=g))
    if name == "convnet":
        b = batch or 32
        return (ConvNet(), lambda g: torch.randn(b, 3, 32, 32, generator=g),
                lambda out, y: nn.functional.cross_entropy(out, y),
                lambda g: torch.randint(0, 10, (b,), generator=g))
    if name == "mlp":
        b = batch or 512
        return (mlp(), lambda g: torch.rand(b, 64, generator=g) * 2 - 1,
                lambda out, y: 0.5 * ((out - y) ** 2).sum() / b,
                lambda g: torch.rand(b, 16, generator=g) * 2 - 1)
    if name == "gpt":
        b = batch or 8
        return (Gpt(), lambda g: torch.randint(0, 2000, (b, 32), generator=g),
                lambda out, y: nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                                           y.reshape(-1)),
                lambda g: torch.randint(0, 2000, (b, 32), generator=g))
    raise SystemExit("real_models.py: unknown model %r" % name)


PLAN_OPTIONS = {"cap": ("bucket_cap_mb", float), "first": ("first_bucket_mb", float),
                "inflight": ("collectives_in_flight", int), "priority": ("priority", str),
                "partition": ("partition_large", lambda v: v in ("1", "true", "yes"))}


def plan_options(mode):
    """A parallelize mode's plan, from its name: "parallelize:cap=4:first=0.25:inflight=1:
    priority=forward:partition=1" (any subset; the row keeps the whole name)."""
    options = {}
    for item in mode.split(":")[1:]:
        key, _, value = item.partition("=")
        if key not in PLAN_OPTIONS or not value:
            raise SystemExit("real_models.py: mode %r: unknown plan option %r (known: %s)"
                             % (mode, item, ", ".join(sorted(PLAN_OPTIONS))))
        name, kind = PLAN_OPTIONS[key]
        options[name] = kind(value)
    return options


def host_softirq_s():
    """The host's CPU time in interrupts and softirqs so far, every CPU (/proc/stat's irq and
    softirq, in clock ticks): where the kernel moves loopback TCP through the shaper, charged to
    no process (whatever it interrupts, a rank's compute included)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return (int(fields[6]) + int(fields[7])) / os.sysconf("SC_CLK_TCK")


class Trainer:
    def __init__(self, mode, args, rank, world, groups):
        torch.manual_seed(args.seed)  # the same initial weights in every mode and rank
        model, self.inputs, self.loss_fn, self.targets = make(args.model, args.batch)
        self.mode = mode
        self.kind = mode.split(":")[0]  # the mode without the plan its name may carry
        self.params = sum(p.numel() for p in model.parameters())
        optimizer = lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9)  # noqa: E731
        if mode == "local":
            # No communication at all: every rank trains its own copy. At N ranks this is the
            # compute floor of a step with N ranks sharing the host (memory, caches, cores).
            self.net, self.opt = model, optimizer(model.parameters())
        elif self.kind in ("parallelize", "parallelize-auto"):
            plan = plan_options(mode)
            if self.kind == "parallelize-auto" and "bucket_cap_mb" in plan:
                raise SystemExit("real_models.py: mode %r: parallelize-auto plans its own cap"
                                 % mode)
            import loom_torch
            options = dict(
                bucket_cap_mb="auto" if self.kind == "parallelize-auto" else args.bucket_cap_mb,
                compression=None if args.compression == "none" else args.compression,
                profile=True if args.predict else None)
            options.update(plan)
            self.net, self.opt = loom_torch.parallelize(
                model, optimizer(model.parameters()), process_group=groups["loom"], **options)
        else:
            group = groups["gloo" if mode == "ddp-gloo" else "loom"]
            self.net = DDP(model, process_group=group, bucket_cap_mb=args.bucket_cap_mb)
            if mode == "ddp-loom":
                import loom_torch
                loom_torch.register_ddp_hook(
                    self.net, group,
                    compression="float16" if args.compression == "float16" else "none")
            elif args.compression == "float16":
                self.net.register_comm_hook(group, default_hooks.fp16_compress_hook)
            self.opt = optimizer(self.net.parameters())
        # Each rank its own batches, the same in every mode.
        self.generator = torch.Generator().manual_seed(args.seed * 1000 + rank)
        self.times, self.cpu, self.softirq, self.loss = [], [], [], None

    def step(self, timed=True):
        x, y = self.inputs(self.generator), self.targets(self.generator)
        irq = host_softirq_s()  # before the clock: reading /proc/stat is not the step's
        start, cpu = time.perf_counter(), time.process_time()
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.net(x), y)
        loss.backward()
        self.opt.step()
        if timed:
            self.times.append(time.perf_counter() - start)
            self.cpu.append(time.process_time() - cpu)  # every thread of this process
            self.softirq.append(host_softirq_s() - irq)
        self.loss = loss.item()

    def quiesce(self):
        """Between this mode's round and the next mode's: what parallelize still has in flight
        (the last step's communication tail, which its next forward would have overlapped)
        lands now, untimed, instead of during another mode's steps."""
        if self.mode.startswith("parallelize"):
            self.net.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="transformer")
    ap.add_argument("--modes", default="ddp-gloo,ddp-loom,parallelize")
    ap.add_argument("--compression", choices=["none", "float16"], default="none")
    ap.add_argument("--bucket-cap-mb", type=float, default=25)
    ap.add_argument("--batch", type=int, default=0, help="per rank (0: the model's default)")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per mode and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--discard", type=int, default=1,
                    help="untimed steps at the start of each mode's round (a timed step then "
                         "always follows one of its own mode, as in training)")
    ap.add_argument("--warmups", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json", help="rank 0 writes the medians here")
    ap.add_argument("--no-predict", dest="predict", action="store_false",
                    help="parallelize rows unprofiled, without the simulator's prediction")
    args = ap.parse_args()
    torch.set_num_threads(1)
    modes = args.modes.split(",")
    import loom_torch  # noqa: F401  registers "loom"; fills RANK, WORLD_SIZE and MASTER_* from mpirun
    dist.init_process_group("loom")
    groups = {"loom": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    rank, world = dist.get_rank(), dist.get_world_size()
    sync = groups["gloo"]
    trainers = [Trainer(mode, args, rank, world, groups) for mode in modes]
    for t in trainers:
        for _ in range(args.warmups):
            dist.barrier(group=sync)
            t.step()
        # bucket_cap_mb="auto" profiles, then times its shortlist one step per plan: the rows
        # measure the plan it chose, so its warm-up lasts until it decided (the same step on
        # every rank: the decision is collective).
        extra = 0
        while t.kind == "parallelize-auto" and t.net.automatic_plan is None:
            if extra == 100:
                raise RuntimeError("parallelize-auto decided no plan in %d steps" % (
                    args.warmups + extra))
            dist.barrier(group=sync)
            t.step()
            extra += 1
        t.quiesce()
        t.times.clear()
        t.cpu.clear()
        t.softirq.clear()
    for _ in range(args.rounds):
        for t in trainers:
            for s in range(args.discard + args.steps):
                dist.barrier(group=sync)
                t.step(timed=s >= args.discard)
            t.quiesce()
    # The wire time of one step's gradients: one allreduce of them all, alone on the link (loom's
    # group; float16 halves it with compression), the median of a few.
    wire = torch.zeros(trainers[0].params,
                       dtype=torch.float16 if args.compression == "float16" else torch.float32)
    wire_times = []
    for _ in range(max(3, args.rounds) if world > 1 else 0):
        dist.barrier(group=sync)
        start = time.perf_counter()
        dist.all_reduce(wire, group=groups["loom"])
        wire_times.append(time.perf_counter() - start)
    wire_ms = statistics.median(wire_times) * 1e3 if wire_times else 0.0
    result = {"model": args.model, "ranks": world, "params": trainers[0].params,
              "wire_ms": wire_ms,
              "compression": args.compression, "bucket_cap_mb": args.bucket_cap_mb,
              "steps": args.steps * args.rounds, "modes": {}}
    for t in trainers:
        times = torch.tensor(t.times, dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX, group=sync)
        cpu = torch.tensor([statistics.median(t.cpu)], dtype=torch.float64)
        dist.all_reduce(cpu, op=dist.ReduceOp.MAX, group=sync)
        steps = times.tolist()
        result["modes"][t.mode] = {
            "step_ms": statistics.median(steps) * 1e3, "cpu_ms": cpu.item() * 1e3,
            # the host's interrupt and softirq time per timed step (rank 0's reading, every CPU;
            # a mean: one step is a few clock ticks)
            "softirq_ms": statistics.mean(t.softirq) * 1e3,
            "final_loss": t.loss,
            # each round's median step (the slowest rank's steps), for same-round ratios
            "round_ms": [statistics.median(steps[k:k + args.steps]) * 1e3
                         for k in range(0, len(steps), args.steps)]}
        if t.mode.startswith("parallelize"):
            net = t.net
            net.synchronize()
            row = result["modes"][t.mode]
            row["plan"] = net.plan()[0]
            if net.automatic_plan is not None:
                row["automatic_plan"] = net.automatic_plan
            if args.predict:
                p = net.predict()
                row.update(pred_ms=p["predicted_ms"], period_ms=p["measured_ms"],
                           err=p["error"], pred_steps=p["steps"], breakdown=p["breakdown"],
                           measured=p["measured"])
    # The ratio to DDP on Gloo, made round by round (a mode's round against DDP's round next to
    # it) and then the median: this host's speed drifts by up to 2x over seconds, which the
    # ratio of whole-run medians carries and a same-round ratio cancels.
    ddp_rounds = result["modes"].get("ddp-gloo", {}).get("round_ms")
    if ddp_rounds:
        for r in result["modes"].values():
            r["ratio_rounds"] = statistics.median(m / d for m, d in zip(r["round_ms"], ddp_rounds))
    if rank == 0:
        print("# real_models: %s, %d parameters, %d ranks, compression %s, buckets %g MB, "
              "median of %d steps (%d rounds, modes interleaved, %d untimed steps per round)"
              % (args.model, trainers[0].params, world, args.compression, args.bucket_cap_mb,
                 args.steps * args.rounds, args.rounds, args.discard))
        print("wire         one allreduce of every gradient: %.3f ms" % wire_ms)
        base = result["modes"].get("ddp-gloo", {}).get("step_ms")
        for mode, r in result["modes"].items():
            ratio = (" %.3fx ddp-gloo (%.3fx by rounds)" % (r["step_ms"] / base, r["ratio_rounds"])
                     if base else "")
            print("%-12s step %9.3f ms  cpu %9.3f ms  loss %.5f%s" % (
                mode, r["step_ms"], r["cpu_ms"], r["final_loss"], ratio))
            if "pred_ms" in r:
                print("%-12s predicted %9.3f ms, measured period %9.3f ms (%+.1f%%, %d steps), "
                      "plan %s" % ("", r["pred_ms"], r["period_ms"], 100 * r["err"],
                                   r["pred_steps"], r["plan"]))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
