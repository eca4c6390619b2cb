"""parallelize's defaults against DDP on Gloo, in the same job: the automatic plan (settled
within 20 steps), gradients that are views of loom's buckets (DDP's gradient_as_bucket_view),
and uneven inputs under join() (DDP's join()).
"""
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import loom_torch
from helpers import OPTIMIZERS, assert_like_ddp, data, flat, fresh, loss_of


def ddp_run(name, optimizer, rank, steps, gloo, zero="opt"):
    model, kind = fresh(name)
    net = DDP(model, process_group=gloo)
    opt = OPTIMIZERS[optimizer](model.parameters())
    for step in range(steps):
        x, y = data(kind, rank, step)
        opt.zero_grad()
        loss_of(kind, net(x), y).backward()
        opt.step()
    return model


@pytest.mark.parametrize("name,optimizer", [("encoder", "sgd"), ("gpt", "adamw")])
def test_the_default_plans_automatically_and_settles_within_20_steps(world, name, optimizer):
    rank, n, gloo = world
    ddp_model = ddp_run(name, optimizer, rank, 20, gloo)
    model, kind = fresh(name)
    net, opt = loom_torch.parallelize(model, OPTIMIZERS[optimizer](model.parameters()))
    decided_at = None
    for step in range(20):
        x, y = data(kind, rank, step)
        opt.zero_grad()
        loss_of(kind, net(x), y).backward()
        opt.step()
        if decided_at is None and net.automatic_plan is not None:
            decided_at = step + 1
    assert decided_at is not None and decided_at <= 20, "the plan was not decided in 20 steps"
    plan = net.plan()
    everyone = [None] * n
    dist.all_gather_object(everyone, (decided_at, plan), group=gloo)
    assert all(e == everyone[0] for e in everyone), everyone  # the same step, the same plan
    assert_like_ddp(model, ddp_model, gloo, n)


def test_fixed_plans_stay_available_and_profile_false_means_ddps_cap(world):
    model, _ = fresh("mlp")
    net, _ = loom_torch.parallelize(model, OPTIMIZERS["sgd"](model.parameters()),
                                    bucket_cap_mb=0.002)
    assert not net.status().planning and net.reducer_plan.bucket_cap_mb == pytest.approx(0.002, rel=1e-3)
    model, _ = fresh("mlp")
    net, _ = loom_torch.parallelize(model, OPTIMIZERS["sgd"](model.parameters()),
                                    profile=False)
    assert not net.status().planning and not net.status().profiling
    model, _ = fresh("mlp")
    net, _ = loom_torch.parallelize(model, OPTIMIZERS["sgd"](model.parameters()),
                                    defer_updates=True)
    assert not net.status().planning  # DDP's semantics: DDP's 25 MiB cap
    with pytest.raises(ValueError, match="defer_updates=True give a bucket cap"):
        loom_torch.parallelize(model, OPTIMIZERS["sgd"](model.parameters()),
                               bucket_cap_mb="auto", defer_updates=True)


def slots(net):
    """Each trained parameter's .grad is its slot in loom's bucket memory."""
    params = [p for p in net.module.parameters() if p.requires_grad]
    return [p.grad is not None and p.grad.data_ptr() == v.data_ptr()
            for p, v in zip(params, net.gradient_slots())]


@pytest.mark.parametrize("zero", ["opt", "opt-in-place", "net-in-place", "model", "model-in-place"])
def test_gradients_are_views_of_the_buckets_and_zeroing_them_keeps_the_numerics(world, zero):
    rank, n, gloo = world
    ddp_model = ddp_run("convnet", "sgd", rank, 12, gloo)
    model, kind = fresh("convnet")
    net, opt = loom_torch.parallelize(model, OPTIMIZERS["sgd"](model.parameters()))
    for step in range(12):
        x, y = data(kind, rank, step)
        if zero == "opt":
            opt.zero_grad()
        elif zero == "opt-in-place":
            opt.zero_grad(set_to_none=False)  # the slots: pending averages applied first
        elif zero == "net-in-place":
            net.zero_grad(set_to_none=False)
        elif zero == "model":
            model.zero_grad()
        else:
            model.zero_grad(set_to_none=False)
        loss_of(kind, net(x), y).backward()
        assert all(slots(net)), "after backward a .grad is not its bucket slot"
        opt.step()
    assert_like_ddp(model, ddp_model, gloo, n)
    # The plan changed on the way (rebuild, trials): every .grad still a slot of the buckets
    # in force, and the averages DDP leaves in .grad.
    net.synchronize()
    assert all(slots(net))
    ddp_grads = torch.cat([p.grad.flatten() for p in ddp_model.parameters()])
    torch.testing.assert_close(torch.cat([p.grad.flatten() for p in model.parameters()]),
                               ddp_grads, rtol=1e-5, atol=1e-6)


def test_gradient_as_bucket_view_false_keeps_gradients_apart(world):
    rank, n, gloo = world
    model, kind = fresh("mlp")
    net, opt = loom_torch.parallelize(model, OPTIMIZERS["sgd"](model.parameters()),
                                      gradient_as_bucket_view=False)
    for step in range(3):
        x, y = data(kind, rank, step)
        opt.zero_grad()
        loss_of(kind, net(x), y).backward()
        opt.step()
    net.synchronize()
    assert not any(slots(net))
    for p, v in zip([p for p in net.module.parameters() if p.requires_grad],
                    net.gradient_slots()):
        torch.testing.assert_close(p.grad, v)  # the average, copied


def train_uneven(name, rank, gloo=None, divide=True, throw=False, defer=False, steps=None):
    model, kind = fresh(name)
    opt = OPTIMIZERS["adamw"](model.parameters())
    if gloo is not None:
        net = DDP(model, process_group=gloo)
    else:
        net, opt = loom_torch.parallelize(model, opt, defer_updates=defer)
    with net.join(divide_by_initial_world_size=divide, throw_on_early_termination=throw):
        for step in range(steps if steps is not None else 3 + 2 * rank):
            x, y = data(kind, rank, step)
            opt.zero_grad()
            loss_of(kind, net(x), y).backward()
            opt.step()
    return model, net, opt


@pytest.mark.parametrize("name,divide,defer", [("mlp", True, False), ("mobile", True, False), ("mlp", False, False), ("gpt", True, False),
                                               ("gpt", False, False), ("mlp", True, True)])
def test_uneven_inputs_under_join_train_like_ddps_join(world, name, divide, defer):
    rank, n, gloo = world
    ddp_model, _, _ = train_uneven(name, rank, gloo=gloo, divide=divide)
    model, net, opt = train_uneven(name, rank, divide=divide, defer=defer)
    # Every rank ends with the last rank's model, as DDP's join; and they go on together.
    assert_like_ddp(model, ddp_model, gloo, n)
    for b, d in zip(model.buffers(), ddp_model.buffers()):
        torch.testing.assert_close(b, d)
    kind = {"mlp": "vector", "mobile": "image", "gpt": "tokens"}[name]
    x, y = data(kind, rank, 99)
    opt.zero_grad()
    loss_of(kind, net(x), y).backward()
    opt.step()
    net.synchronize()
    everyone = [torch.empty_like(flat(model)) for _ in range(n)]
    dist.all_gather(everyone, flat(model), group=gloo)
    assert all(torch.equal(w, everyone[0]) for w in everyone)


def test_even_inputs_under_join_train_like_ddp(world):
    rank, n, gloo = world
    ddp_model, _, _ = train_uneven("mlp", rank, gloo=gloo, steps=4)
    model, _, _ = train_uneven("mlp", rank, steps=4)
    assert_like_ddp(model, ddp_model, gloo, n)


def test_throw_on_early_termination_raises_on_every_rank(world):
    rank, n, gloo = world
    with pytest.raises(RuntimeError, match="ran out of inputs while rank"):
        train_uneven("mlp", rank, throw=True)
    dist.barrier(group=gloo)


def test_join_is_refused_inside_itself(world):
    model, _ = fresh("mlp")
    net, _ = loom_torch.parallelize(model, OPTIMIZERS["sgd"](model.parameters()))
    with net.join():
        with pytest.raises(RuntimeError, match="join\\(\\) is already in force"):
            with net.join():
                pass


def test_a_wrapper_dropped_right_after_step_leaves_the_model_its_last_updates(world):
    import gc
    rank, n, gloo = world
    ddp_model = ddp_run("mlp", "sgd", rank, 6, gloo)

    def train():  # returns the model only: the wrapper goes with the function's frame
        model, kind = fresh("mlp")
        net, opt = loom_torch.parallelize(model, OPTIMIZERS["sgd"](model.parameters()))
        for step in range(6):
            x, y = data(kind, rank, step)
            opt.zero_grad()
            loss_of(kind, net(x), y).backward()
            opt.step()
        return model

    model = train()
    gc.collect()
    assert_like_ddp(model, ddp_model, gloo, n)  # (the read applies what was pending)
    assert "_loom_pending_updates" not in model.__dict__
