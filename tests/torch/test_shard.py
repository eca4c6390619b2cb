"""parallelize(..., shard="optimizer" | "gradients") (ZeRO-1 and 2) against DDP on Gloo, in the
same job: the same model, data, optimizer and buckets; every rank's parameters equal DDP's
(relative <= 1e-5) and identical on every rank, read through the unwrapped model right after
opt.step() (the all-gathers still in flight); each rank's optimizer state is its shard only;
clip_grad_norm_ over the shards equals DDP's; the misuses are named errors.
"""
import json

import pytest
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import loom_torch

import helpers
from helpers import (CAP_MB, OPTIMIZERS, accumulate_loop, assert_like_ddp, data, fresh, loss_of,
                     train)

LEVELS = ["optimizer", "gradients"]

# The optimizer state moves between layouts (DDP's rebuild after the first step, rewrapping,
# checkpoints) through a buffer of this many elements: odd and small, so that every move here
# crosses buffer boundaries inside pieces.
loom_torch._shards.MOVE_CHUNK = 37


class OddMlp(nn.Module):
    """159 parameters (odd): buckets that do not divide by 2 or 3 ranks are padded."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 7)
        self.fc2 = nn.Linear(7, 3)
        self.head = nn.Linear(3, 4)

    def forward(self, x):
        return self.head(torch.tanh(self.fc2(torch.relu(self.fc1(x)))))


class Wide(nn.Module):
    """279,807 parameters (about 1 MiB): enough that pages and size classes do not decide the
    memory of a plan."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 1024)
        self.fc2 = nn.Linear(1024, 255)
        self.head = nn.Linear(255, 4)

    def forward(self, x):
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


helpers.MODELS["odd"] = (lambda: OddMlp(), "vector")
helpers.MODELS["wide"] = (lambda: Wide(), "vector")


def wrap_like(how, model, opt, gloo, level, group=None, **options):
    """how "ddp": DDP on `gloo`; "loom": parallelize sharded at `level` on `group` (the world by
    default), with the tests' small buckets. Returns (net, opt)."""
    if how == "ddp":
        return DDP(model, process_group=gloo, bucket_cap_mb=CAP_MB), opt
    return loom_torch.parallelize(model, opt, process_group=group, bucket_cap_mb=CAP_MB,
                                  first_bucket_mb=CAP_MB, shard=level, **options)


def count(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name,optimizer", [
    ("odd", "sgd"),
    ("odd", "adam"),
    ("odd", "adamw"),
    ("mlp", "adam"),
    ("gpt", "adamw"),
    ("encoder", "adam"),
])
def test_sharded_training_equals_ddp(world, level, name, optimizer):
    rank, n, gloo = world
    ddp_model, _, _ = train(name, optimizer, rank, 12, gloo=gloo, scheduler=True)
    # A sharded plan keeps its first layout by default; the transformers rebuild it after the
    # first step as DDP does (the parameters' memory and the optimizer state move).
    loom_model, net, opt = train(name, optimizer, rank, 12, scheduler=True, shard=level,
                                 rebuild_buckets=name in ("gpt", "encoder"))
    if name == "odd":
        assert count(loom_model) == 159  # odd: padded buckets
    assert net.reducer_plan.shard == level
    # Read right after opt.step(), the updates' all-gathers possibly in flight: fresh.
    assert_like_ddp(loom_model, ddp_model, gloo, n)


@pytest.mark.parametrize("level", LEVELS)
def test_optimizer_state_is_this_ranks_shard_only(world, level):
    rank, n, gloo = world
    model, net, opt = train("gpt", "adam", rank, 3, shard=level)
    net.synchronize()
    total = count(model)
    mine = sum(v.numel() for state in opt.state.values() for k, v in state.items()
               if k == "exp_avg")
    buckets = len(net.plan()[1])
    # Each bucket's shard is its padded count over n: at most n - 1 padding elements a bucket.
    assert total // n - buckets <= mine <= total // n + buckets, (mine, total, n)
    everyone = [None] * n
    torch.distributed.all_gather_object(everyone, mine, group=gloo)
    assert sum(everyone) == total, everyone
    # Only each rank's shard of the average exists: no whole .grad is kept.
    assert all(p.grad is None for p in model.parameters()), "a whole .grad was kept"


@pytest.mark.parametrize("level", LEVELS + ["none"])
def test_clip_grad_norm_over_the_shards_equals_ddp(world, level):
    rank, n, gloo = world
    norms = {}
    weights = {}
    for how in ("ddp", "loom"):
        model, kind = fresh("mlp")
        opt = OPTIMIZERS["adamw"](model.parameters())
        net, opt = wrap_like(how, model, opt, gloo, level, defer_updates=True)
        seen = []
        for step in range(6):
            x, y = data(kind, rank, step)
            opt.zero_grad()
            loss_of(kind, net(x), y).mul(30.0).backward()
            if how == "ddp":
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            else:
                norm = net.clip_grad_norm_(0.5)
            seen.append(float(norm))
            opt.step()
        norms[how] = seen
        weights[how] = model
    assert max(norms["ddp"]) > 0.5, norms  # the clip did clip
    for a, b in zip(norms["loom"], norms["ddp"]):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), norms
    assert_like_ddp(weights["loom"], weights["ddp"], gloo, n)


def test_a_whole_tensor_optimizer_and_other_misuses_are_named(world):
    rank, n, gloo = world
    model, _ = fresh("mlp")
    lbfgs = torch.optim.LBFGS(model.parameters())
    with pytest.raises(ValueError, match="shard='optimizer'.*element-wise.*LBFGS updates whole"):
        loom_torch.parallelize(model, lbfgs, bucket_cap_mb=1, shard="optimizer")
    if hasattr(torch.optim, "Adafactor"):
        with pytest.raises(ValueError, match="Adafactor updates whole"):
            loom_torch.parallelize(model, torch.optim.Adafactor(model.parameters()),
                                   bucket_cap_mb=1, shard="gradients")
    with pytest.raises(ValueError, match="shard must be 'none', 'optimizer', 'gradients' or 'auto'"):
        loom_torch.parallelize(model, torch.optim.SGD(model.parameters(), lr=0.1),
                               bucket_cap_mb=1, shard="zero3")
    net, opt = loom_torch.parallelize(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                      bucket_cap_mb=1, shard="gradients")
    if n > 1:
        with pytest.raises(RuntimeError, match="join\\(\\) with shard='gradients'"):
            with net.join():
                pass
    with pytest.raises(RuntimeError, match="needs defer_updates=True"):
        net.clip_grad_norm_(1.0)


def test_a_model_wrapped_again_keeps_its_optimizer_state(world):
    """Wrapping again (shard none) after sharded steps: the state gathered whole (a collective)
    goes back to the whole parameters, and training goes on as DDP's."""
    rank, n, gloo = world
    ddp_model, _, _ = train("mlp", "adam", rank, 6, gloo=gloo)
    model, kind = fresh("mlp")
    opt = OPTIMIZERS["adam"](model.parameters())
    net, opt = loom_torch.parallelize(model, opt, bucket_cap_mb=CAP_MB, first_bucket_mb=CAP_MB,
                                      shard="optimizer")
    for step in range(6):
        x, y = data(kind, rank, step)
        if step == 3:
            net, opt = loom_torch.parallelize(model, opt, bucket_cap_mb=CAP_MB,
                                              first_bucket_mb=CAP_MB)
            assert all(p in opt.state and opt.state[p]["exp_avg"].shape == p.shape
                       for p in model.parameters())
        opt.zero_grad()
        loss_of(kind, net(x), y).backward()
        opt.step()
    assert_like_ddp(model, ddp_model, gloo, n)


def steps(net, opt, kind, rank, first, last):
    for step in range(first, last):
        x, y = data(kind, rank, step)
        opt.zero_grad()
        loss_of(kind, net(x), y).backward()
        opt.step()


@pytest.mark.parametrize("level", LEVELS)
def test_a_full_state_dict_saved_at_n_ranks_resumes_at_fewer(world, level):
    """opt.state_dict() of a sharded optimizer is the whole state (a collective), in torch's
    format: saved after 4 steps at n ranks, loaded at n - 1 ranks (a subgroup), and the next 4
    steps there equal DDP's doing the same."""
    rank, n, gloo = world
    m = max(1, n - 1)
    sub = torch.distributed.new_group(list(range(m)), backend="loom")
    sub_gloo = torch.distributed.new_group(list(range(m)), backend="gloo")
    out = {}
    for how in ("ddp", "loom"):
        model, kind = fresh("odd")
        opt = OPTIMIZERS["adamw"](model.parameters())
        net, opt = wrap_like(how, model, opt, gloo, level)
        steps(net, opt, kind, rank, 0, 4)
        saved = (net.state_dict(), opt.state_dict())  # every rank: a collective for loom
        if how == "loom":
            assert set(saved[1]["state"]) == set(range(len(list(model.parameters()))))
            assert saved[1]["state"][0]["exp_avg"].shape == model.fc1.weight.shape
        if rank >= m:
            continue
        torch.manual_seed(7)  # other initial weights: the checkpoint must bring them
        again = OddMlp()
        opt2 = OPTIMIZERS["adamw"](again.parameters())
        net2, opt2 = wrap_like(how, again, opt2, sub_gloo, level, group=sub)
        net2.load_state_dict(saved[0])
        opt2.load_state_dict(saved[1])
        steps(net2, opt2, kind, rank, 4, 8)
        out[how] = again
    if rank < m:
        assert_like_ddp(out["loom"], out["ddp"], sub_gloo, m)
    torch.distributed.barrier(group=gloo)


@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize("level", LEVELS)
def test_distributed_checkpoint_at_the_same_world_size_resumes_like_the_uninterrupted_run(
        world, level, frozen):
    """frozen: the optimizer also holds a parameter loom does not reduce (fc2's weight, frozen
    in the model), which DCP's fresh-state step leaves without a gradient."""
    import os
    import shutil
    import tempfile

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    rank, n, gloo = world
    directory = [tempfile.mkdtemp(prefix="loom_shard_dcp_") if rank == 0 else None]
    torch.distributed.broadcast_object_list(directory, src=0, group=gloo)
    where = os.path.join(directory[0], level + ("-frozen" if frozen else ""))
    try:
        def wrapped(seed):
            torch.manual_seed(seed)
            model = OddMlp()
            model.fc2.weight.requires_grad_(not frozen)
            return (model,) + loom_torch.parallelize(
                model, OPTIMIZERS["adam"](model.parameters()), bucket_cap_mb=CAP_MB,
                first_bucket_mb=CAP_MB, shard=level)

        whole, net, opt = wrapped(0)
        steps(net, opt, "vector", rank, 0, 8)
        first, net, opt = wrapped(0)
        steps(net, opt, "vector", rank, 0, 4)
        model_state, opt_state = get_state_dict(net, opt)
        dcp.save({"model": model_state, "optim": opt_state}, checkpoint_id=where)
        resumed, net, opt = wrapped(5)
        model_state, opt_state = get_state_dict(net, opt)
        state = {"model": model_state, "optim": opt_state}
        dcp.load(state, checkpoint_id=where)
        set_state_dict(net, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        steps(net, opt, "vector", rank, 4, 8)
        assert_like_ddp(resumed, whole, gloo, n)
    finally:
        torch.distributed.barrier(group=gloo)
        if rank == 0:
            shutil.rmtree(directory[0], ignore_errors=True)


def test_a_budget_that_nothing_fits_is_named_before_the_first_step(world):
    rank, n, gloo = world
    model, _ = fresh("wide")
    with pytest.raises(ValueError, match="memory_budget_mb=0.5 is below what every plan needs "
                                         "per rank before any activation; the smallest, "
                                         "shard='(optimizer|gradients)', needs [0-9.]+ MiB"):
        loom_torch.parallelize(model, OPTIMIZERS["adam"](model.parameters()), shard="auto",
                               memory_budget_mb=0.5)
    with pytest.raises(ValueError, match="memory_budget_mb=0.5, but the plan .*shard optimizer"
                                         ".* needs [0-9.]+ MiB per rank"):
        loom_torch.parallelize(model, OPTIMIZERS["adam"](model.parameters()), bucket_cap_mb=1,
                               shard="optimizer", memory_budget_mb=0.5)
    with pytest.raises(ValueError, match="shard='auto' is chosen by the automatic plan"):
        loom_torch.parallelize(model, OPTIMIZERS["adam"](model.parameters()), bucket_cap_mb=1,
                               shard="auto")


def test_auto_within_a_budget_picks_a_plan_that_fits_and_trains_like_ddp(world):
    """A budget below the unsharded plan's need: the automatic plan starts sharded, times only
    plans that fit, and ends on one that fits (activations included); the parameters equal
    DDP's."""
    rank, n, gloo = world
    probe, _ = fresh("wide")
    whole, _ = loom_torch.parallelize(probe, OPTIMIZERS["sgd"](probe.parameters()),
                                      bucket_cap_mb=25)
    need = whole.plan_memory()
    assert need["optimizer_state_mb"] == pytest.approx(need["parameters_mb"], rel=1e-3)  # SGD
    budget = need["total_mb"] - 0.2
    ddp_model, _, _ = train("wide", "sgd", rank, 24, gloo=gloo)
    model, kind = fresh("wide")
    net, opt = loom_torch.parallelize(model, OPTIMIZERS["sgd"](model.parameters()),
                                      shard="auto", memory_budget_mb=budget)
    assert net.reducer_plan.shard != "none"  # the starting plan fits
    for step in range(24):
        x, y = data(kind, rank, step)
        opt.zero_grad()
        loss_of(kind, net(x), y).backward()
        opt.step()
    decided = net.automatic_plan
    assert decided is not None, "the automatic plan did not decide in 24 steps"
    assert all(entry["fits"] for entry in decided["timed"]), decided["timed"]
    mine = net.plan_memory()
    assert mine["activations_mb"] > 0, mine
    assert mine["total_mb"] <= budget, (mine, budget)
    assert net.reducer_plan.shard != "none"
    assert_like_ddp(model, ddp_model, gloo, n)


@pytest.mark.parametrize("level", LEVELS)
def test_the_scatters_and_gathers_are_nodes_of_the_step_in_dot_and_trace(world, level,
                                                                          tmp_path_factory):
    rank, n, gloo = world
    model, net, opt = train("odd", "adam", rank, 3, shard=level, profile=True)
    directory = tmp_path_factory.mktemp("shard_%s" % level)
    dot = directory / "step.dot"
    net.dump_dot(str(dot))
    text = dot.read_text()
    reduction = "reduce_scatter"
    assert "bucket0.%s" % reduction in text and "bucket0.allgather" in text, text[:2000]
    assert "bucket0.shard" in text
    assert ("bucket0.release" in text) == (level == "gradients")
    issued = net.collective_issue_order()
    gathers = [k for k, name in enumerate(issued) if name.endswith(".allgather")]
    reductions = [k for k, name in enumerate(issued) if name.endswith("." + reduction)]
    assert gathers and reductions and max(reductions) < min(gathers), issued
    trace = net.write_trace(str(directory / "trace.json"))
    events = json.load(open(trace))
    names = {e.get("name") for e in (events["traceEvents"] if isinstance(events, dict)
                                    else events)}
    assert "bucket0.allgather" in names and "bucket0.%s" % reduction in names, sorted(names)[:40]


@pytest.mark.parametrize("level", LEVELS)
def test_gradient_accumulation_with_no_sync_is_like_ddp(world, level):
    """Three micro-batches under no_sync, the fourth reduced: the sharded step updates with the
    average of all four, as DDP (the gradients accumulated outside loom's buckets are handed
    over at the reduced backward; the bucket is the scatter's workspace, never carried over)."""
    rank, n, gloo = world
    out = {}
    for how in ("ddp", "loom"):
        model, kind = fresh("odd")
        net, opt = wrap_like(how, model, OPTIMIZERS["adam"](model.parameters()), gloo, level)
        for step in range(4):
            accumulate_loop(net, opt, model, kind, step)
        out[how] = model
    assert_like_ddp(out["loom"], out["ddp"], gloo, n)
