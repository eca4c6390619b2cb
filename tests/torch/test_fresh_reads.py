"""No stale weights: between optimizer.step() and the next forward, loom's updates may still be
landing; every read of the weights through the model the user wrapped applies them first. Each
path is checked on steps where updates were pending when it read (asserted, so the test cannot
pass by finding nothing to apply): its value must equal the value after net.synchronize()."""
import copy
import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import loom_torch

STEPS = 6


class Deep(nn.Module):
    """Six layers, several buckets: the last buckets' updates land during the next forward."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(6))
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)


def snapshot(tensors):
    return [t.detach().clone() for t in tensors]


def read_parameters(model, net, x):
    return snapshot(model.parameters())


def read_named_parameters(model, net, x):
    return snapshot(p for _, p in model.named_parameters())


def read_state_dict(model, net, x):
    return snapshot(model.state_dict().values())


def read_net_module(model, net, x):
    return snapshot(net.module.parameters())


def read_torch_save_of_state_dict(model, net, x):
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    return list(torch.load(buffer).values())


def read_torch_save_of_module(model, net, x):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded) is Deep and "parameters" not in loaded.__dict__
    return snapshot(loaded.parameters())


def read_swa_ema(model, net, x):
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.5))  # deep copy of model
    ema.update_parameters(model)  # the first update copies the model's weights
    return snapshot(ema.module.parameters())


def read_hand_written_ema(model, net, x):
    ema = [torch.zeros_like(p) for p in torch.nn.Module.parameters(model)]
    with torch.no_grad():
        for e, p in zip(ema, model.parameters()):
            e.mul_(0.0).add_(p, alpha=1.0)
    return ema


def read_evaluation(model, net, x):
    with torch.no_grad():
        return [model(x)]


def read_metric(model, net, x):
    return [torch.stack([p.detach().norm() for p in model.parameters()])]


def read_deepcopy(model, net, x):
    return snapshot(copy.deepcopy(model).parameters())


PATHS = [read_parameters, read_named_parameters, read_state_dict, read_net_module,
         read_torch_save_of_state_dict, read_torch_save_of_module, read_swa_ema,
         read_hand_written_ema, read_evaluation, read_metric, read_deepcopy]


@pytest.mark.parametrize("read", PATHS, ids=[p.__name__[5:] for p in PATHS])
def test_a_read_after_step_sees_the_updated_weights(world, read):
    rank, n, _ = world
    torch.manual_seed(0)
    model = Deep()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    net, opt = loom_torch.parallelize(model, opt, bucket_cap_mb=0.02)
    g = torch.Generator().manual_seed(rank)
    pending_reads = 0
    for _ in range(STEPS):
        x = torch.randn(32, 64, generator=g)
        loss = net(x).square().mean()
        loss.backward()
        before = snapshot(torch.nn.Module.parameters(model))
        opt.step()
        pending = net.status().updates_pending
        got = read(model, net, x)
        net.synchronize()
        if not pending:
            continue
        pending_reads += 1
        expected = read(model, net, x)
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            assert torch.equal(a, b), "%s read stale weights" % read.__name__
        after = snapshot(torch.nn.Module.parameters(model))
        assert any(not torch.equal(a, b) for a, b in zip(before, after))  # a real update
    assert pending_reads >= STEPS // 2, "updates were pending at only %d reads" % pending_reads


def test_the_wrapped_forward_does_not_wait_for_every_update(world):
    """The guards are for reads outside the step: the wrapped forward still applies each
    layer's update just before that layer (updates stay pending when it begins)."""
    rank, n, _ = world
    torch.manual_seed(0)
    model = Deep()
    net, opt = loom_torch.parallelize(model, torch.optim.SGD(model.parameters(), lr=0.05),
                                      bucket_cap_mb=0.02)
    g = torch.Generator().manual_seed(rank)
    for _ in range(3):
        net(torch.randn(32, 64, generator=g)).square().mean().backward()
        opt.step()
    engine = net._loom
    assert engine.updates_pending  # the forward below begins with updates still landing
    forced = []
    original = engine.before_read

    def watched():
        if engine.updates_pending and not engine.in_backward and not engine.in_wrapped_forward:
            forced.append(1)
        original()
    engine.before_read = watched
    net(torch.randn(32, 64, generator=g)).square().mean().backward()
    opt.step()
    assert forced == []  # no read guard made the step wait for every update
    engine.before_read = original
    net.synchronize()
