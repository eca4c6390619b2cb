"""DistributedDataParallel, unchanged, on the "loom" group, with and without loom's hook.

Each case trains the same small MLP (same seed, per-rank data) for a few steps on the loom group
and on the Gloo group of the same job, then checks that every rank holds bit-identical weights
(gathered over Gloo) and that loom's weights equal Gloo's within float tolerance.
"""
import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import loom_torch

STEPS = 6


def train(group, rank, hook=None, gloo_hook=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 4))
    # A tiny bucket cap: several buckets, so the hook sees several calls per step.
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.004)
    if hook is not None:
        loom_torch.register_ddp_hook(ddp, group, compression=hook)
    if gloo_hook is not None:
        ddp.register_comm_hook(group, gloo_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(32, 16, generator=g)
    y = torch.randn(32, 4, generator=g)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.cat([p.detach().flatten() for p in model.parameters()]), losses


def identical_on_every_rank(weights, gloo, n):
    everyone = [torch.empty_like(weights) for _ in range(n)]
    dist.all_gather(everyone, weights, group=gloo)
    for r, w in enumerate(everyone):
        assert torch.equal(w, everyone[0]), "rank %d's weights differ from rank 0's" % r


@pytest.mark.parametrize("hook,gloo_hook,tolerance", [
    (None, None, 1e-6),                                    # DDP's own allreduce on loom
    ("none", None, 1e-5),                                  # loom's hook, float32
    ("float16", default_hooks.fp16_compress_hook, 2e-3),   # both compress to float16
    ("bfloat16", None, 2e-2),                              # Gloo has no bfloat16: uncompressed
])
def test_ddp_trains_identically_on_every_rank_and_like_gloo(world, loom_group, hook, gloo_hook,
                                                             tolerance):
    rank, n, gloo = world
    loom_weights, loom_losses = train(loom_group, rank, hook=hook)
    gloo_weights, gloo_losses = train(gloo, rank, gloo_hook=gloo_hook)
    identical_on_every_rank(loom_weights, gloo, n)
    identical_on_every_rank(gloo_weights, gloo, n)
    torch.testing.assert_close(loom_weights, gloo_weights, rtol=tolerance, atol=tolerance)
    assert loom_losses[-1] < loom_losses[0]


def test_the_hook_refuses_a_gloo_group(world):
    _, _, gloo = world
    with pytest.raises(ValueError, match="needs a loom process group"):
        loom_torch.LoomHookState(gloo)
