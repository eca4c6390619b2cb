"""The models, data and comparisons the loom_torch tests share: each model built from seed 0,
every rank's batch from (rank, step), DDP on Gloo and parallelize trained alike, and the checks
that parameters equal DDP's and are identical on every rank.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import loom_torch

STEPS = 20
CAP_MB = 0.002  # a few KiB: several buckets even for these small models


class Mlp(nn.Module):
    def __init__(self, frozen_first=False, unused=False):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)
        if unused:
            self.spare = nn.Linear(32, 32)  # never called
        if frozen_first:
            for p in self.fc1.parameters():
                p.requires_grad_(False)

    def forward(self, x):
        return self.head(F.relu(self.fc2(F.relu(self.fc1(x)))))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.encoder(x).mean(dim=1))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 4)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.relu(self.conv2(x))
        return self.fc(x.flatten(1))


class TinyGpt(nn.Module):
    """Token embedding tied with the output projection, one causal self-attention block."""

    def __init__(self, vocab=40, d=16, seq=6):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.position = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.block = nn.TransformerEncoderLayer(d_model=d, nhead=2, dim_feedforward=32,
                                                dropout=0.0, batch_first=True)
        self.out = nn.Linear(d, vocab, bias=False)
        self.out.weight = self.embed.weight  # tied: one parameter, two uses
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))

    def forward(self, tokens):
        h = self.embed(tokens) + self.position[: tokens.shape[1]]
        return self.out(self.block(h, src_mask=self.mask))


class InvertedResidual(nn.Module):
    def __init__(self, channels, expanded):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(channels, expanded, 1, bias=False),
                                    nn.BatchNorm2d(expanded), nn.ReLU6())
        self.depthwise = nn.Sequential(
            nn.Conv2d(expanded, expanded, 3, padding=1, groups=expanded, bias=False),
            nn.BatchNorm2d(expanded), nn.ReLU6())
        self.project = nn.Sequential(nn.Conv2d(expanded, channels, 1, bias=False),
                                     nn.BatchNorm2d(channels))

    def forward(self, x):
        return x + self.project(self.depthwise(self.expand(x)))


class TinyMobile(nn.Module):
    """mobilenet_v2's shape in small (the test command never needs torchvision): inverted
    residual blocks, each conv followed by BatchNorm, so many small tensors (32) and buffers."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU6())
        self.blocks = nn.Sequential(*[InvertedResidual(8, 16) for _ in range(3)])
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def data(kind, rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    if kind == "image":
        return torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 4, (4,), generator=g)
    if kind == "sequence":
        return torch.randn(4, 5, 16, generator=g), torch.randint(0, 4, (4,), generator=g)
    if kind == "tokens":
        tokens = torch.randint(0, 40, (4, 7), generator=g)
        return tokens[:, :-1], tokens[:, 1:]
    return torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)


def loss_of(kind, out, y):
    if kind == "tokens":
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return F.cross_entropy(out, y)


MICRO = 4


def accumulate_loop(net, opt, model, kind, step):
    """One step of gradient accumulation: MICRO micro-batches, all but the last under
    net.no_sync(), then opt.step()."""
    rank = dist.get_rank()
    opt.zero_grad()
    for micro in range(MICRO):
        x, y = data(kind, rank, MICRO * step + micro)
        if micro < MICRO - 1:
            with net.no_sync():
                (loss_of(kind, net(x), y) / MICRO).backward()
        else:  # the synced micro-batch: the sum of all four is averaged
            (loss_of(kind, net(x), y) / MICRO).backward()
    opt.step()


MODELS = {
    "mlp": (lambda: Mlp(), "vector"),
    "encoder": (lambda: Encoder(), "sequence"),
    "convnet": (lambda: ConvNet(), "image"),
    "gpt": (lambda: TinyGpt(), "tokens"),
    "mobile": (lambda: TinyMobile(), "image"),
    "frozen": (lambda: Mlp(frozen_first=True), "vector"),
    "unused": (lambda: Mlp(unused=True), "vector"),
}

# Adam's eps is raised from 1e-8: attention's key bias has a gradient that is zero up to
# rounding, and the last bits of a sum of 3 ranks' gradients depend on the order the allreduce
# adds them in (Gloo's ring and loom's algorithm add in different orders). Adam divides by the
# square root of that noise, so with eps 1e-8 it turns last-bit differences into full steps
# (2e-4 after 20 steps); with 1e-4 the noise stays below 1e-6 and every other parameter is
# compared at rtol 1e-5 as for SGD. Two ranks add in the same order either way (a + b == b + a).
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=2e-3, eps=1e-4),
    "adamw": lambda params: torch.optim.AdamW(params, lr=2e-3, eps=1e-4, weight_decay=0.05),
    # One kernel for every parameter, which unscales and skips a GradScaler's steps itself
    # (GradScaler hands it its scale and found_inf, as to any optimizer with
    # _step_supports_amp_scaling).
    "adam_fused": lambda params: torch.optim.Adam(params, lr=2e-3, eps=1e-4, fused=True),
}


def fresh(name):
    torch.manual_seed(0)
    factory, kind = MODELS[name]
    return factory(), kind


def train(name, optimizer, rank, steps, gloo=None, scheduler=False, start=None, **options):
    """Trains model `name` with DDP on `gloo`, else with parallelize; returns (model, net, opt)."""
    model, kind = fresh(name)
    unused = name == "unused"
    params = [p for p in model.parameters() if p.requires_grad]
    if gloo is not None:
        net = DDP(model, process_group=gloo, bucket_cap_mb=CAP_MB, find_unused_parameters=unused)
        opt = OPTIMIZERS[optimizer](params)
    else:
        opt = OPTIMIZERS[optimizer](params)
        cap = options.pop("bucket_cap_mb", CAP_MB)
        net, opt = loom_torch.parallelize(model, opt, bucket_cap_mb=cap, first_bucket_mb=CAP_MB,
                                          find_unused_parameters=unused, **options)
    if start is not None:
        net.load_state_dict(start[0])
        opt.load_state_dict(start[1])
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5) if scheduler else None
    first = 0 if start is None else start[2]
    for step in range(first, first + steps):
        x, y = data(kind, rank, step)
        opt.zero_grad()
        loss = loss_of(kind, net(x), y)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
    return model, net, opt


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def identical_on_every_rank(weights, gloo, n):
    everyone = [torch.empty_like(weights) for _ in range(n)]
    dist.all_gather(everyone, weights, group=gloo)
    for r, w in enumerate(everyone):
        assert torch.equal(w, everyone[0]), "rank %d's parameters differ from rank 0's" % r


def assert_like_ddp(loom_model, ddp_model, gloo, n, atol=1e-6):
    loom_weights, ddp_weights = flat(loom_model), flat(ddp_model)
    identical_on_every_rank(loom_weights, gloo, n)
    torch.testing.assert_close(loom_weights, ddp_weights, rtol=1e-5, atol=atol)


def assert_as_close_as_ddp_to_itself(loom_weights, ddp_weights, ddp_tiny_weights, gloo, n):
    """For runs whose last-bit noise is amplified (bf16 autocast, compiled graphs), given
    flat(model) of loom's run, DDP's (25 MiB buckets) and DDP's with a few KiB per bucket:
    loom's distance to DDP is at most 4x the distance between the two DDP runs, which differ
    only in how the same sums are chunked for the allreduce (what differs between Gloo's ring
    and loom's algorithm too), or at most 1e-6 where those two are equal (2 ranks: a + b is
    b + a, the runs are then bit-identical). Also bit-identical on every rank."""
    identical_on_every_rank(loom_weights, gloo, n)
    d = (ddp_weights - ddp_tiny_weights).abs().max().item()
    mine = (loom_weights - ddp_weights).abs().max().item()
    assert mine <= max(1e-6, 4 * d), (
        "loom is %.3g from DDP; DDP with other buckets is %.3g from DDP" % (mine, d))
