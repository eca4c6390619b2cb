#!/usr/bin/env python3
"""Real models, trained data-parallel three ways in one run: DDP on Gloo, DDP on loom with loom's
hook, and loom_torch.parallelize, interleaved.

    mpirun -np 2 --bind-to none /usr/bin/python3 bench/torch/real_models.py --model transformer

Models (--model; the shapes of issue 22's table):
  transformer  nn.TransformerEncoder, 4 layers, d 256, 4 heads, ff 1024, seq 64, batch 16,
               + linear head (3.3 M parameters)
  resnet18     torchvision resnet18, 10 classes, 64x64 images, batch 8 (11.2 M; needs
               torchvision, which the project's venv lacks: pip install torch==2.14.1
               torchvision==0.29.1 into a separate venv and run its python)
  convnet      3 conv + 2 linear, 32x32 images, batch 32 (2.3 M)
  mlp          loom-overlap's MLP 64 -> 8 x 512 -> 16, batch 512 (bench/torch/ddp_step.py)
  gpt          a small GPT-like stack with tied input/output embeddings
  mobilenet_v2 torchvision mobilenet_v2 (many small tensors), 10 classes, 64x64, batch 8
Every mode starts from the same weights (seeded), sees the same batches, and steps with SGD
(momentum 0.9, lr 0.01; --optimizer adamw: AdamW, lr 1e-3, weight decay 0.01), DDP's
bucket_cap_mb 25 (--bucket-cap-mb). --clip MAX_NORM: every mode calls
torch.nn.utils.clip_grad_norm_(parameters, MAX_NORM) between backward and the optimizer step;
parallelize then needs defer_updates=True (DDP's semantics: its default applies each bucket's
update as it lands, and refuses code between backward and step), which its rows get and show
in their name ("parallelize+defer"); parallelize-auto plans the overlap of updates and cannot
defer them, so --clip refuses it. Rounds interleave the modes:
each mode runs --discard untimed steps, then --steps timed ones, every step after a barrier, and
parallelize then lets what it still has in flight land (untimed) before the next mode's round,
so every timed step follows a step of its own mode, as in training, and no mode's communication
runs under another's steps. A step is zero_grad, forward, loss, backward, (--clip's clipping,)
optimizer step, timed on every rank, the slowest rank's counting. Besides each mode's median step, "ratio_rounds" is
the median over rounds of the mode's round median over DDP-on-Gloo's in the same round: a
shared host's speed drifts over seconds, which a same-round ratio cancels (with few steps per
round each round's median is noisy in turn: read both). (One process training four identical
convnets in turn once saw 68 to 214 ms steps: much of that was glibc's malloc trimming the heap
after each step and faulting it in again, which real_models.sh now turns off for every mode.)
The prediction needs at least two timed steps per round (a step followed by another mode's
round is left out of it).
--modes picks the rows ("local": every rank trains alone, no communication, the compute floor of
N ranks on this host); "parallelize" needs loom_torch.parallelize (bucket_cap_mb
--bucket-cap-mb), "parallelize-auto" is it with bucket_cap_mb="auto" (its warm-up runs until the
automatic plan decided, so its row is the chosen plan's step); either takes a plan in its name,
e.g. "parallelize:cap=2:first=0.25" (options cap, first, inflight, priority, partition:
parallelize()'s bucket_cap_mb, first_bucket_mb, collectives_in_flight, priority and
partition_large). "parallelize-default" is parallelize() with no plan argument at all (nor
profile: its row has a prediction only where the automatic plan profiles), its defaults' plan: when that plan is an automatic one still to be made, its warm-up too runs until
it decided. parallelize-auto's and parallelize-default's rows say at which step the plan was
decided ("decided_at_step", counted from the first warm-up step; absent: no automatic plan).
"ddp-gloo-optim-bwd" is DDP on Gloo with torch's optimizer in backward
(torch.distributed.optim._apply_optimizer_in_backward before wrapping: DDP's comm hook steps
each bucket's parameters once its allreduce landed, opt.step() is nothing); it refuses --clip
(each update runs before the global norm is known) and --compression float16 (the hook is
DDP's own), and where torch's hook needs an accelerator (torch 2.13 on CPU: its end-of-backward
callback calls torch.accelerator.current_stream()) it exits naming torch's error.
--series N: the warm-up is N steps per mode (in place of --warmups; the settling of an automatic
plan still follows), and the parallelize and ddp-gloo rows record each of them (the slowest
rank's, in order: "series_ms") and print the medians of steps 1-5, 6-20 and 21-N: whether a
plan settles within its first 20 steps. The parallelize rows
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


def gpt_wide():
    """The GPT-like model at a size where model state dominates a rank's memory: vocabulary
    8000, width 512, 4 blocks (16.7 M parameters)."""
    return Gpt(vocab=8000, d=512, heads=8, layers=4, seq=32)


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
        try:
            import torchvision
        except ImportError as error:
            raise SystemExit(
                "real_models.py: model %s needs torchvision (%s), which %s lacks: install it "
                "into a separate venv (pip install torch==2.14.1 torchvision==0.29.1) and run "
                "that venv's python (real_models.sh: PYTHON=/that/venv/bin/python)"
                % (name, error, sys.executable))
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
    if name == "gpt-wide":
        b = batch or 8
        return (gpt_wide(), lambda g: torch.randint(0, 8000, (b, 32), generator=g),
                lambda out, y: nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                                           y.reshape(-1)),
                lambda g: torch.randint(0, 8000, (b, 32), generator=g))
    if name == "gpt":
        b = batch or 8
        return (Gpt(), lambda g: torch.randint(0, 2000, (b, 32), generator=g),
                lambda out, y: nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                                           y.reshape(-1)),
                lambda g: torch.randint(0, 2000, (b, 32), generator=g))
    raise SystemExit("real_models.py: unknown model %r" % name)


PLAN_OPTIONS = {"cap": ("bucket_cap_mb", float), "first": ("first_bucket_mb", float),
                "inflight": ("collectives_in_flight", int), "priority": ("priority", str),
                "partition": ("partition_large", lambda v: v in ("1", "true", "yes")),
                "shard": ("shard", str),
                "rebuild": ("rebuild_buckets", lambda v: v in ("1", "true", "yes")),
                "budget": ("memory_budget_mb", float)}


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


MODES = ("local", "ddp-gloo", "ddp-loom", "ddp-gloo-optim-bwd", "parallelize", "parallelize-auto",
         "parallelize-default", "ddp-gloo-zero", "fsdp2-gloo")


def blocks_of(model):
    """The blocks FSDP2 wraps one by one (fsdp2-gloo): transformer layers, else the model's
    layers with parameters; the root takes the rest (tied embeddings stay in one group)."""
    blocks = [m for m in model.modules()
              if isinstance(m, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer))]
    if blocks:
        return blocks
    return [m for m in model.children() if any(True for _ in m.parameters())]
PLANNED = ("parallelize", "parallelize-auto")  # the modes that take a plan in their name


def optimizer_of(args):
    """(class, keyword arguments) of --optimizer, the same in every mode."""
    if args.optimizer == "adamw":
        return torch.optim.AdamW, dict(lr=1e-3, weight_decay=0.01)
    return torch.optim.SGD, dict(lr=0.01, momentum=0.9)


class NoOptimizer:
    """ddp-gloo-optim-bwd's opt: the optimizer already ran in backward (DDP's comm hook, one
    bucket at a time) and DDP set the gradients to None: step() and zero_grad() are nothing."""

    def zero_grad(self, set_to_none=True):
        pass

    def step(self):
        pass


def optim_bwd_failure(error):
    return SystemExit("real_models.py: ddp-gloo-optim-bwd does not run on CPU with torch %s: %s"
                      % (torch.__version__, error))


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
        if self.kind not in MODES or (":" in mode and self.kind not in PLANNED):
            raise SystemExit("real_models.py: unknown mode %r (known: %s; a plan in the name: %s "
                             "only)" % (mode, ", ".join(MODES), ", ".join(PLANNED)))
        self.label = mode  # the row's name: the mode, and "+defer" where parallelize defers
        self.params = sum(p.numel() for p in model.parameters())
        self.clip = args.clip
        optimizer_class, optimizer_kwargs = optimizer_of(args)
        optimizer = lambda params: optimizer_class(params, **optimizer_kwargs)  # noqa: E731
        self.pending_plan = False  # an automatic plan still to be made when wrapped
        self.decided_at = None     # the step (from the first warm-up step) that decided it
        self.steps_run = 0
        # --series: parallelize's and DDP-on-Gloo's warm-up steps, each recorded
        self.series = [] if args.series and (
            self.kind.startswith("parallelize") or self.kind.startswith("ddp-gloo")) else None
        if mode == "local":
            # No communication at all: every rank trains its own copy. At N ranks this is the
            # compute floor of a step with N ranks sharing the host (memory, caches, cores).
            self.net, self.opt = model, optimizer(model.parameters())
        elif self.kind.startswith("parallelize"):
            plan = plan_options(mode)
            if self.kind == "parallelize-auto" and "bucket_cap_mb" in plan:
                raise SystemExit("real_models.py: mode %r: parallelize-auto plans its own cap"
                                 % mode)
            if self.kind == "parallelize-auto" and args.clip > 0:
                raise SystemExit("real_models.py: mode %r: --clip needs defer_updates=True, "
                                 "which bucket_cap_mb='auto' refuses (its plans overlap the "
                                 "updates with communication): leave parallelize-auto out or "
                                 "give a cap (parallelize:cap=...)" % mode)
            import loom_torch
            # parallelize-default is what a user's parallelize(model, opt) runs: profile left to
            # its default too (the automatic plan profiles; defer_updates' fixed plan does not).
            options = dict(
                compression=None if args.compression == "none" else args.compression,
                profile=True if args.predict and self.kind != "parallelize-default" else None)
            if self.kind != "parallelize-default":  # parallelize-default: its defaults' plan
                options["bucket_cap_mb"] = ("auto" if self.kind == "parallelize-auto"
                                            else args.bucket_cap_mb)
            if args.clip > 0:
                # clip_grad_norm_ between backward and step: DDP's semantics
                options["defer_updates"] = True
                self.label = mode + "+defer"
            options.update(plan)
            self.net, self.opt = loom_torch.parallelize(
                model, optimizer(model.parameters()), process_group=groups["loom"], **options)
            # True while the engine has an automatic plan still to make (bucket_cap_mb="auto",
            # or the default's when it is automatic; never with defer_updates); evaluated once,
            # before the first step: the warm-up then waits for net.automatic_plan.
            self.pending_plan = bool(getattr(self.net._loom, "automatic", False))
        elif self.kind == "ddp-gloo-optim-bwd":
            if args.clip > 0:
                raise SystemExit("real_models.py: ddp-gloo-optim-bwd refuses --clip: its optimizer "
                                 "steps each bucket's parameters as the bucket lands, before the "
                                 "norm of all gradients could be known")
            if args.compression != "none":
                raise SystemExit("real_models.py: ddp-gloo-optim-bwd refuses --compression: its "
                                 "comm hook is DDP's own optimizer hook")
            from torch.distributed.optim import _apply_optimizer_in_backward
            _apply_optimizer_in_backward(optimizer_class, model.parameters(), optimizer_kwargs)
            try:
                self.net = DDP(model, process_group=groups["gloo"],
                               bucket_cap_mb=args.bucket_cap_mb)
                # What the hook's end-of-backward callback calls (torch 2.13's
                # optimizer_overlap_hooks.py): fail here, before any other mode's steps, rather
                # than in this mode's first backward (which step() also turns into this exit).
                torch.accelerator.current_stream()
            except RuntimeError as error:
                raise optim_bwd_failure(error) from None
            self.opt = NoOptimizer()
        elif self.kind == "fsdp2-gloo":
            # FSDP2 on the job's Gloo group, each block sharded and gathered once per step
            # (reshard_after_forward=False: the gathered weights stay for the backward, as
            # ZeRO-2 keeps whole parameters).
            from torch.distributed.device_mesh import DeviceMesh
            from torch.distributed.fsdp import fully_shard
            mesh = DeviceMesh.from_group(groups["gloo"], "cpu")
            for block in blocks_of(model):
                fully_shard(block, mesh=mesh, reshard_after_forward=False)
            fully_shard(model, mesh=mesh, reshard_after_forward=False)
            self.net, self.opt = model, optimizer(model.parameters())
        elif self.kind == "ddp-gloo-zero":
            # DDP on Gloo with torch's ZeroRedundancyOptimizer (each rank steps its share of the
            # parameters and broadcasts them).
            from torch.distributed.optim import ZeroRedundancyOptimizer
            self.net = DDP(model, process_group=groups["gloo"], bucket_cap_mb=args.bucket_cap_mb)
            self.opt = ZeroRedundancyOptimizer(self.net.parameters(),
                                               optimizer_class=optimizer_class,
                                               process_group=groups["gloo"], **optimizer_kwargs)
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
        if self.kind == "ddp-gloo-optim-bwd":
            try:
                loss.backward()
            except RuntimeError as error:
                raise optim_bwd_failure(error) from None
        else:
            loss.backward()
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.clip)
        self.opt.step()
        elapsed = time.perf_counter() - start
        if timed:
            self.times.append(elapsed)
            self.cpu.append(time.process_time() - cpu)  # every thread of this process
            self.softirq.append(host_softirq_s() - irq)
        self.loss = loss.item()
        self.steps_run += 1
        if self.pending_plan and self.decided_at is None and self.net.automatic_plan is not None:
            self.decided_at = self.steps_run
        return elapsed

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
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd",
                    help="sgd: SGD(lr=0.01, momentum=0.9); adamw: AdamW(lr=1e-3, "
                         "weight_decay=0.01); every mode alike")
    ap.add_argument("--clip", type=float, default=0, metavar="MAX_NORM",
                    help="clip_grad_norm_(parameters, MAX_NORM) between backward and step in "
                         "every mode (0: none); parallelize then runs with defer_updates=True")
    ap.add_argument("--series", type=int, default=0, metavar="N",
                    help="warm up N steps per mode (instead of --warmups) and record each of "
                         "parallelize's and ddp-gloo's (series_ms)")
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
    if args.clip < 0 or args.series < 0:
        raise SystemExit("real_models.py: --clip and --series take a number >= 0")
    trainers = [Trainer(mode, args, rank, world, groups) for mode in modes]
    warmups = args.series or args.warmups
    for t in trainers:
        for _ in range(warmups):
            dist.barrier(group=sync)
            elapsed = t.step()
            if t.series is not None:
                t.series.append(elapsed)
        # An automatic plan (bucket_cap_mb="auto", or parallelize's default when it plans)
        # profiles, then times its shortlist one step per plan: the rows measure the plan it
        # chose, so its warm-up lasts until it decided (the same step on every rank: the
        # decision is collective).
        extra = 0
        while t.pending_plan and t.net.automatic_plan is None:
            if extra == 100:
                raise RuntimeError("%s decided no plan in %d steps" % (t.mode, warmups + extra))
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
              "optimizer": args.optimizer, "clip": args.clip, "warmups": warmups,
              "series": args.series, "steps": args.steps * args.rounds, "modes": {}}
    for t in trainers:
        times = torch.tensor(t.times, dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX, group=sync)
        cpu = torch.tensor([statistics.median(t.cpu)], dtype=torch.float64)
        dist.all_reduce(cpu, op=dist.ReduceOp.MAX, group=sync)
        steps = times.tolist()
        row = result["modes"][t.label] = {
            "step_ms": statistics.median(steps) * 1e3, "cpu_ms": cpu.item() * 1e3,
            # the host's interrupt and softirq time per timed step (rank 0's reading, every CPU;
            # a mean: one step is a few clock ticks)
            "softirq_ms": statistics.mean(t.softirq) * 1e3,
            "final_loss": t.loss,
            # each round's median step (the slowest rank's steps), for same-round ratios
            "round_ms": [statistics.median(steps[k:k + args.steps]) * 1e3
                         for k in range(0, len(steps), args.steps)]}
        if t.series is not None:
            # every warm-up step, in order, the slowest rank's
            series = torch.tensor(t.series, dtype=torch.float64)
            dist.all_reduce(series, op=dist.ReduceOp.MAX, group=sync)
            row["series_ms"] = [v * 1e3 for v in series.tolist()]
        if t.kind.startswith("parallelize"):
            net = t.net
            net.synchronize()
            row["defer_updates"] = args.clip > 0
            if t.pending_plan:
                row["decided_at_step"] = t.decided_at
            row["plan"] = net.plan()[0]
            if net.automatic_plan is not None:
                row["automatic_plan"] = net.automatic_plan
            if args.predict and net._loom.profiling:
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
              "optimizer %s, clip %s, median of %d steps (%d rounds, modes interleaved, %d "
              "untimed steps per round), %d warm-up steps per mode%s"
              % (args.model, trainers[0].params, world, args.compression, args.bucket_cap_mb,
                 args.optimizer, "%g (parallelize: defer_updates=True)" % args.clip
                 if args.clip > 0 else "none", args.steps * args.rounds, args.rounds,
                 args.discard, warmups, " (--series)" if args.series else ""))
        width = max([12] + [len(mode) for mode in result["modes"]])
        print("%-*s one allreduce of every gradient: %.3f ms" % (width, "wire", wire_ms))
        base = result["modes"].get("ddp-gloo", {}).get("step_ms")
        for mode, r in result["modes"].items():
            ratio = (" %.3fx ddp-gloo (%.3fx by rounds)" % (r["step_ms"] / base, r["ratio_rounds"])
                     if base else "")
            print("%-*s step %9.3f ms  cpu %9.3f ms  loss %.5f%s" % (
                width, mode, r["step_ms"], r["cpu_ms"], r["final_loss"], ratio))
            if "pred_ms" in r:
                print("%-*s predicted %9.3f ms, measured period %9.3f ms (%+.1f%%, %d steps), "
                      "plan %s" % (width, "", r["pred_ms"], r["period_ms"], 100 * r["err"],
                                   r["pred_steps"], r["plan"]))
            if "decided_at_step" in r:
                print("%-*s automatic plan decided at step %s (from the first warm-up step)%s"
                      % (width, "", r["decided_at_step"],
                         ": %s" % (r["automatic_plan"].get("plan"),)
                         if isinstance(r.get("automatic_plan"), dict) else ""))
            if "series_ms" in r:
                series = r["series_ms"]
                spans = [(a, min(b, len(series))) for a, b in ((1, 5), (6, 20), (21, len(series)))
                         if a <= len(series)]
                print("%-*s series median ms: %s" % (width, "", ", ".join(
                    "steps %d-%d %.3f" % (a, b, statistics.median(series[a - 1:b]))
                    for a, b in spans)))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
