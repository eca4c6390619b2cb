"""Everyday training-loop patterns under loom_torch.parallelize, each against DDP on Gloo.

Each case trains the same model (same seed, same per-rank data) with DistributedDataParallel on
the job's Gloo group and with loom_torch.parallelize on the default loom group, with the
wrappers' default arguments unless the pattern needs an option, and compares what the loop
produces (parameters, gradient norms, learning rates, EMA weights, evaluation losses): fp32
parameters through helpers.assert_like_ddp (rtol 1e-5, atol 1e-6, and bit-identical
on every rank). bf16 autocast, fp16 autocast with a GradScaler and torch.compile, which amplify
last-bit differences, are held to "as close to DDP as DDP is to itself with other buckets"
(assert_as_close_as_ddp_to_itself).
Every rank runs every case in the same order (no rank-dependent skip), so the collectives
match.
"""
import os
import shutil
import tempfile
import types
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import loom_torch
from helpers import (OPTIMIZERS, STEPS, Encoder, accumulate_loop,
                     assert_as_close_as_ddp_to_itself, assert_like_ddp, data, flat, fresh,
                     identical_on_every_rank, loss_of)

TINY_CAP_MB = 0.002  # DDP with a few KiB per bucket: the "DDP against itself" reference


def wrap(model, opt, gloo, use_loom, ddp_options=None, **loom_options):
    """DDP on Gloo (its defaults, 25 MiB buckets) or parallelize on the default loom group."""
    if use_loom:
        return loom_torch.parallelize(model, opt, **loom_options)
    return DDP(model, process_group=gloo, **(ddp_options or {})), opt


def one_step(net, opt, kind, rank, step, scale=1.0):
    x, y = data(kind, rank, step)
    opt.zero_grad()
    loss = loss_of(kind, net(x), y)
    (scale * loss).backward()
    opt.step()
    return loss.detach()


def run(name, optimizer, gloo, use_loom, loop=None, steps=STEPS, ddp_options=None,
        **loom_options):
    """Trains MODELS[name] for `steps` steps; returns .model, .net, .opt and .seen (what loop
    returned each step), parallelize's pending updates applied (net.synchronize()). Callers
    keep the result (its net) while they use the model."""
    model, kind = fresh(name)
    opt = OPTIMIZERS[optimizer](model.parameters())
    net, opt = wrap(model, opt, gloo, use_loom, ddp_options, **loom_options)
    seen = []
    for step in range(steps):
        if loop is None:
            one_step(net, opt, kind, dist.get_rank(), step)
        else:
            seen.append(loop(net, opt, model, kind, step))
    synchronize(net)
    return types.SimpleNamespace(model=model, net=net, opt=opt, seen=seen, kind=kind)


def synchronize(net):
    """parallelize's pending updates applied (where the loop read no weights since its last
    step); nothing for DDP."""
    if not isinstance(net, DDP):
        net.synchronize()


# 1. clip_grad_norm_ between backward and step ----------------------------------------------

def clip_loop(net, opt, model, kind, step):
    x, y = data(kind, dist.get_rank(), step)
    opt.zero_grad()
    (10 * loss_of(kind, net(x), y)).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    opt.step()
    return norm.item()


@pytest.mark.parametrize("name", ["mlp", "encoder"])
def test_clip_grad_norm_is_named_by_default_and_like_ddp_with_defer_updates(world, name):
    rank, n, gloo = world
    model, kind = fresh(name)
    net, opt = loom_torch.parallelize(model, OPTIMIZERS["sgd"](model.parameters()))
    with pytest.raises(RuntimeError, match="defer_updates=True"):
        clip_loop(net, opt, model, kind, 0)  # raised on every rank at the same point
    del net, opt, model  # perhaps unusable now: a fresh model is wrapped below
    ddp = run(name, "sgd", gloo, False, clip_loop)
    loom = run(name, "sgd", gloo, True, clip_loop, defer_updates=True)
    assert min(ddp.seen) > 0.1  # every step was clipped: the clipping is what is compared
    assert loom.seen == pytest.approx(ddp.seen, rel=1e-5)
    assert_like_ddp(loom.model, ddp.model, gloo, n)


# 2. autocast: bf16; fp16 with a GradScaler ------------------------------------------------

def autocast_loop(net, opt, model, kind, step):
    x, y = data(kind, dist.get_rank(), step)
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(x)
        loss = loss_of(kind, out, y)
    assert out.dtype == torch.bfloat16  # the Linear layers ran in bf16
    loss.backward()
    opt.step()
    return loss.item()


@pytest.mark.parametrize("name,optimizer", [("mlp", "sgd"), ("encoder", "adam")])
def test_bf16_autocast_is_as_close_to_ddp_as_ddp_to_itself(world, name, optimizer):
    rank, n, gloo = world
    ddp = run(name, optimizer, gloo, False, autocast_loop)
    tiny = run(name, optimizer, gloo, False, autocast_loop,
               ddp_options={"bucket_cap_mb": TINY_CAP_MB})
    loom = run(name, optimizer, gloo, True, autocast_loop)
    assert_as_close_as_ddp_to_itself(flat(loom.model), flat(ddp.model), flat(tiny.model),
                                     gloo, n)
    assert loom.seen[0] == ddp.seen[0]  # the same weights at step 0
    # every step's loss tracked DDP's (loosely: bf16 activations; the weights are the test)
    assert loom.seen == pytest.approx(ddp.seen, rel=1e-2)


# fp16 autocast with torch.amp.GradScaler. The first scale (2**20) overflows the fp16 backward
# and the scale doubles after every 3 clean steps, so steps are skipped at the start and again
# later, once the optimizer has state.
SCALER = {"init_scale": 2.0 ** 20, "growth_interval": 3}


def optimizer_state(opt):
    """A copy of the optimizer's state: (parameter, key, value) in order."""
    state = opt.state_dict()["state"]
    return [(i, key, value.clone() if isinstance(value, torch.Tensor) else value)
            for i in sorted(state) for key, value in sorted(state[i].items())]


def assert_same_state(mine, want):
    assert [entry[:2] for entry in mine] == [entry[:2] for entry in want]
    for (i, key, a), (_, _, b) in zip(mine, want):
        same = torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
        assert same, "the optimizer's state %d '%s' changed" % (i, key)


def scaled_loop(clip):
    """The GradScaler loop (clip: scaler.unscale_ and clip_grad_norm_ before scaler.step);
    each step returns (loss, the scale it ran with, whether the scaler skipped it, the norm)
    and checks that a skipped step changed neither the parameters nor the optimizer's state
    and that a step not skipped changed the parameters."""
    scaler = torch.amp.GradScaler("cpu", **SCALER)

    def loop(net, opt, model, kind, step):
        x, y = data(kind, dist.get_rank(), step)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            out = net(x)
            loss = loss_of(kind, out, y)
        assert out.dtype == torch.float16  # the Linear layers ran in fp16
        scaler.scale(loss).backward()
        norm = None
        if clip:
            scaler.unscale_(opt)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1).item()
        weights, state = flat(model), optimizer_state(opt)
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped = scaler.get_scale() < scale  # (the scale backs off only after an overflow)
        if skipped:
            assert torch.equal(flat(model), weights)
            # (a fused optimizer makes its state, zeros, in a skipped first step, as without
            # loom; every later skipped step must leave it as it was)
            if state or not opt.defaults.get("fused"):
                assert_same_state(optimizer_state(opt), state)
        else:
            assert not torch.equal(flat(model), weights)
        return loss.item(), scale, skipped, norm
    return loop


@pytest.mark.parametrize("name,optimizer,clip", [("mlp", "sgd", False), ("encoder", "adam", False),
                                                 ("mlp", "adam", True), ("encoder", "sgd", True),
                                                 ("mlp", "adam_fused", False)])
def test_fp16_grad_scaler_with_defer_updates_is_as_close_to_ddp_as_ddp_to_itself(
        world, name, optimizer, clip):
    rank, n, gloo = world
    ddp = run(name, optimizer, gloo, False, scaled_loop(clip))
    tiny = run(name, optimizer, gloo, False, scaled_loop(clip),
               ddp_options={"bucket_cap_mb": TINY_CAP_MB})
    loom = run(name, optimizer, gloo, True, scaled_loop(clip), defer_updates=True)
    skipped = [seen[2] for seen in ddp.seen]
    first_stepped = skipped.index(False)
    # overflowed at the start, and again once the optimizer had state
    assert skipped[0] and any(skipped[first_stepped:]), skipped
    # the scaler saw the same overflows and ran with the same scales under both
    assert [seen[1:3] for seen in loom.seen] == [seen[1:3] for seen in ddp.seen]
    assert_as_close_as_ddp_to_itself(flat(loom.model), flat(ddp.model), flat(tiny.model),
                                     gloo, n)
    assert loom.seen[0][0] == ddp.seen[0][0]  # the same weights at step 0
    assert [seen[0] for seen in loom.seen] == pytest.approx([seen[0] for seen in ddp.seen],
                                                            rel=1e-3)
    if clip:
        norms = [(seen[3], want[3]) for seen, want in zip(loom.seen, ddp.seen) if not want[2]]
        assert all(want > 0.1 for _, want in norms)  # every step taken was clipped
        assert [mine for mine, _ in norms] == pytest.approx([want for _, want in norms],
                                                            rel=1e-3)


@pytest.mark.parametrize("how", ["scaler.step", "unscale_ and clip_grad_norm_", "overflowed",
                                 "fused Adam"])
def test_grad_scaler_is_named_without_defer_updates(world, how):
    # Each bucket's update was applied during backward, before the scaler could unscale it or
    # skip the step: named at the first scaler.step(), also when it would have skipped it.
    # (torch's in-place unscaling leaves .grad's version counter as it was: without the name it
    # would be a silent update with the scaled gradients.)
    rank, n, gloo = world
    model, kind = fresh("mlp")
    optimizer = "adam_fused" if how == "fused Adam" else "adam"
    net, opt = loom_torch.parallelize(model, OPTIMIZERS[optimizer](model.parameters()))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** (40 if how == "overflowed" else 8))
    x, y = data(kind, rank, 0)
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = loss_of(kind, net(x), y)
    scaler.scale(loss).backward()
    finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    assert finite == (how != "overflowed")
    if how == "unscale_ and clip_grad_norm_":
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    with pytest.raises(RuntimeError, match=r"optimizer\.step\(\) on rank %d was called by a "
                                           r"torch\.amp\.GradScaler .*updates were made with the "
                                           r"scaled gradients\. Wrap with parallelize\(\.\.\., "
                                           r"defer_updates=True\)" % rank):
        scaler.step(opt)
    del net, opt, model  # perhaps unusable now


def test_grad_scaler_works_once_the_model_is_wrapped_again_with_defer_updates(world):
    # The first wrapper (updates during backward) hands GradScaler's steps to itself; once it
    # lets go of the optimizer, the scaler unscales and skips for the optimizer's own step()
    # again.
    rank, n, gloo = world
    out = []
    for use_loom in (False, True):
        model, kind = fresh("mlp")
        net, opt = wrap(model, OPTIMIZERS["sgd"](model.parameters()), gloo, use_loom)
        one_step(net, opt, kind, rank, 0)
        if use_loom:
            net, opt = loom_torch.parallelize(model, opt, defer_updates=True)
        loop = scaled_loop(False)
        seen = [loop(net, opt, model, kind, step) for step in range(1, 8)]
        synchronize(net)
        out.append((model, net, seen))
    (ddp_model, _, ddp_seen), (loom_model, _, loom_seen) = out
    assert ddp_seen[0][2]  # the first scaled step overflowed and was skipped
    assert [seen[1:3] for seen in loom_seen] == [seen[1:3] for seen in ddp_seen]
    assert_like_ddp(loom_model, ddp_model, gloo, n)


# 3. LR schedulers -------------------------------------------------------------------------

SCHEDULERS = {
    "StepLR": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5),
    "OneCycleLR": lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1,
                                                                  total_steps=STEPS),
    "CosineAnnealingLR": lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, STEPS),
    "LambdaLR": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s)),
    "ReduceLROnPlateau": lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(
        opt, factor=0.5, patience=0),
}


@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_lr_schedulers_step_like_ddp_and_do_not_warn(world, scheduler):
    rank, n, gloo = world
    out = []
    for use_loom in (False, True):
        model, kind = fresh("mlp")
        net, opt = wrap(model, OPTIMIZERS["sgd"](model.parameters()), gloo, use_loom)
        sched = SCHEDULERS[scheduler](opt)
        lrs = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(STEPS):
                loss = one_step(net, opt, kind, rank, step)
                if scheduler == "ReduceLROnPlateau":
                    # the mean loss of every rank: the same decision everywhere
                    mean = loss.clone()
                    dist.all_reduce(mean, group=gloo)
                    sched.step(mean.item() / n)
                else:
                    sched.step()
                lrs.append(opt.param_groups[0]["lr"])
        # torch's "lr_scheduler.step() before optimizer.step()" and "optimizer.step() has been
        # overridden after learning rate scheduler initialization"
        about_step = [str(w.message) for w in caught if "step()" in str(w.message)]
        assert not about_step, about_step
        synchronize(net)
        out.append((model, net, lrs))
    (ddp_model, _, ddp_lrs), (loom_model, _, loom_lrs) = out
    assert len(set(ddp_lrs)) > 2  # the schedule moved the learning rate
    assert loom_lrs == pytest.approx(ddp_lrs, rel=1e-6)
    assert_like_ddp(loom_model, ddp_model, gloo, n)


# 4. Gradient accumulation -----------------------------------------------------------------

@pytest.mark.parametrize("name,optimizer", [("mlp", "sgd"), ("encoder", "adamw")])
def test_gradient_accumulation_with_no_sync_is_like_ddp(world, name, optimizer):
    rank, n, gloo = world
    ddp = run(name, optimizer, gloo, False, accumulate_loop)
    loom = run(name, optimizer, gloo, True, accumulate_loop)
    assert_like_ddp(loom.model, ddp.model, gloo, n)


# 5, 6. AdamW with weight decay; tied embeddings -------------------------------------------

@pytest.mark.parametrize("name", ["mlp", "encoder", "convnet", "mobile"])
def test_adamw_with_weight_decay_is_like_ddp(world, name):
    rank, n, gloo = world
    ddp = run(name, "adamw", gloo, False)
    loom = run(name, "adamw", gloo, True)
    assert loom.opt.param_groups[0]["weight_decay"] == 0.05
    assert_like_ddp(loom.model, ddp.model, gloo, n)


def test_tied_embeddings_with_adamw_are_like_ddp(world):
    rank, n, gloo = world
    ddp = run("gpt", "adamw", gloo, False)
    loom = run("gpt", "adamw", gloo, True)
    assert loom.model.out.weight is loom.model.embed.weight  # still one parameter
    start, _ = fresh("gpt")
    assert not torch.equal(loom.model.embed.weight, start.embed.weight)  # and it trained
    assert_like_ddp(loom.model, ddp.model, gloo, n)


# 7. torch.compile -------------------------------------------------------------------------

# backend="aot_eager": dynamo and AOTAutograd (the graph's backward one autograd node, the
# parameters' AccumulateGrad hooks after it) without inductor's code generation, which took
# ~30 s per graph cold on the 2-core host this was written on (the MLP alone, one process),
# with several graphs per rank here. aot_eager runs torch's eager kernels: compiled DDP equals
# eager DDP exactly here.
COMPILE_BACKEND = "aot_eager"


@pytest.mark.parametrize("order", ["compile then wrap", "wrap then compile"])
def test_torch_compile_is_as_close_to_ddp_as_ddp_to_itself(world, order):
    rank, n, gloo = world
    torch._dynamo.reset()
    out = []
    for use_loom, cap in ((False, 25), (False, TINY_CAP_MB), (True, None)):
        model, kind = fresh("encoder")
        opt = OPTIMIZERS["adam"](model.parameters())
        if order == "compile then wrap":
            wrapped = torch.compile(model, backend=COMPILE_BACKEND)
            net, opt = wrap(wrapped, opt, gloo, use_loom, {"bucket_cap_mb": cap})
            run_net = net
        else:  # DDP's graph is split at its buckets (dynamo's DDPOptimizer)
            net, opt = wrap(model, opt, gloo, use_loom, {"bucket_cap_mb": cap})
            wrapped, run_net = model, torch.compile(net, backend=COMPILE_BACKEND)
        losses = [one_step(run_net, opt, kind, rank, step).item() for step in range(STEPS)]
        # read through the model itself (inside torch.compile's wrapper in the first order):
        # fresh after opt.step() (loom's reads are installed on both)
        out.append((flat(model), net, losses))
    (ddp_w, _, ddp_losses), (tiny_w, _, _), (loom_w, loom_net, loom_losses) = out
    assert_as_close_as_ddp_to_itself(loom_w, ddp_w, tiny_w, gloo, n)
    assert loom_losses == pytest.approx(ddp_losses, rel=1e-5)
    # and as close to eager DDP
    eager = run("encoder", "adam", gloo, False)
    torch.testing.assert_close(loom_w, flat(eager.model), rtol=1e-5, atol=1e-6)


# 8. EMA -----------------------------------------------------------------------------------

@pytest.mark.parametrize("made", ["before parallelize", "after parallelize"])
def test_ema_weights_are_like_ddp(world, made):
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
    rank, n, gloo = world
    out = []
    for use_loom in (False, True):
        model, kind = fresh("mlp")
        opt = OPTIMIZERS["sgd"](model.parameters())
        if made == "before parallelize":
            ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
        net, opt = wrap(model, opt, gloo, use_loom)
        if made == "after parallelize":
            ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
        hand = [p.detach().clone() for p in model.parameters()]
        for step in range(STEPS):
            one_step(net, opt, kind, rank, step)
            ema.update_parameters(model)
            with torch.no_grad():
                for e, p in zip(hand, model.parameters()):
                    e.mul_(0.9).add_(p.detach(), alpha=0.1)
        out.append((model, net, flat(ema.module), torch.cat([e.flatten() for e in hand])))
    (ddp_model, _, ddp_ema, ddp_hand), (loom_model, _, loom_ema, loom_hand) = out
    assert not torch.allclose(ddp_ema, flat(ddp_model), rtol=1e-3)  # an average, not a copy
    for mine, want in ((loom_ema, ddp_ema), (loom_hand, ddp_hand)):
        identical_on_every_rank(mine, gloo, n)
        torch.testing.assert_close(mine, want, rtol=1e-5, atol=1e-6)
    assert_like_ddp(loom_model, ddp_model, gloo, n)


# 9. Checkpoint and resume -----------------------------------------------------------------

HALF = STEPS // 2


def resumed_run(rank, gloo, use_loom, load):
    """A new model (other initial weights) and AdamW, wrapped, load(net, opt), then the last
    HALF steps; returns flat(model) with the net."""
    torch.manual_seed(123)
    model = Encoder()
    net, opt = wrap(model, OPTIMIZERS["adamw"](model.parameters()), gloo, use_loom)
    load(net, opt)
    assert len(opt.state) == len(list(model.parameters()))  # AdamW's moments came back
    for step in range(HALF, STEPS):
        one_step(net, opt, "sequence", rank, step)
    synchronize(net)
    return flat(model), net


def test_checkpoint_with_torch_save_resumes_like_the_uninterrupted_run(world, tmp_path):
    rank, n, gloo = world
    ddp = run("encoder", "adamw", gloo, False)
    full = run("encoder", "adamw", gloo, True)
    first = run("encoder", "adamw", gloo, True, steps=HALF)
    path = str(tmp_path / ("checkpoint.rank%d.pt" % rank))
    torch.save({"model": first.net.state_dict(), "opt": first.opt.state_dict()}, path)

    def load(net, opt):
        state = torch.load(path)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])

    resumed, net = resumed_run(rank, gloo, True, load)
    identical_on_every_rank(resumed, gloo, n)
    torch.testing.assert_close(resumed, flat(full.model), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(resumed, flat(ddp.model), rtol=1e-5, atol=1e-6)


def test_checkpoint_with_distributed_checkpoint_resumes_like_the_uninterrupted_run(world):
    # torch.distributed.checkpoint's own API: get_state_dict / dcp.save, then into a new
    # wrapped model and optimizer get_state_dict (which initialises an empty optimizer's state
    # with a step of zero gradients at lr 0), dcp.load, set_state_dict. Its collectives run on
    # the default (loom) group. DDP goes through the same steps.
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    rank, n, gloo = world
    directory = [tempfile.mkdtemp(prefix="loom_dcp_") if rank == 0 else None]
    dist.broadcast_object_list(directory, src=0, group=gloo)  # one directory for the job
    try:
        out = []
        for use_loom in (False, True):
            where = os.path.join(directory[0], "loom" if use_loom else "ddp")
            full = run("encoder", "adamw", gloo, use_loom)
            first = run("encoder", "adamw", gloo, use_loom, steps=HALF)
            model_state, opt_state = get_state_dict(first.net, first.opt)
            dcp.save({"model": model_state, "optim": opt_state}, checkpoint_id=where)

            def load(net, opt):
                model_state, opt_state = get_state_dict(net, opt)
                state = {"model": model_state, "optim": opt_state}
                dcp.load(state, checkpoint_id=where)
                set_state_dict(net, opt, model_state_dict=state["model"],
                               optim_state_dict=state["optim"])

            resumed, net = resumed_run(rank, gloo, use_loom, load)
            torch.testing.assert_close(resumed, flat(full.model), rtol=1e-5, atol=1e-6)
            out.append((resumed, net))
        identical_on_every_rank(out[1][0], gloo, n)
        torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-5, atol=1e-6)
    finally:
        dist.barrier(group=gloo)
        if rank == 0:
            shutil.rmtree(directory[0], ignore_errors=True)


# 10. Evaluation every few steps -----------------------------------------------------------

EVAL_EVERY = 5


@pytest.mark.parametrize("name", ["encoder", "mobile"])
def test_an_evaluation_loop_every_few_steps_is_like_ddp(world, name):
    rank, n, gloo = world
    out = []
    for use_loom in (False, True):
        model, kind = fresh(name)
        # AdamW: with SGD (lr 0.05, momentum 0.9) TinyMobile at 3 ranks turns the last bits of
        # the allreduce's order into 1e-2 after 20 steps (DDP against DDP with other buckets)
        net, opt = wrap(model, OPTIMIZERS["adamw"](model.parameters()), gloo, use_loom)
        held_out = [data(kind, rank, 1000 + i) for i in range(3)]
        evaluations = []
        for step in range(STEPS):
            one_step(net, opt, kind, rank, step)
            if (step + 1) % EVAL_EVERY == 0:
                net.eval()  # (the encoder's eval forward takes torch's fast path)
                with torch.no_grad():
                    evaluations.append([loss_of(kind, net(x), y).item() for x, y in held_out])
                    evaluations.append([loss_of(kind, model(x), y).item() for x, y in held_out])
                net.train()
        out.append((model, net, evaluations))
    (ddp_model, _, ddp_evals), (loom_model, _, loom_evals) = out
    assert len(loom_evals) == 2 * (STEPS // EVAL_EVERY)
    assert ddp_evals[0] != ddp_evals[-1]  # the evaluations saw the training
    for mine, want in zip(loom_evals, ddp_evals):
        assert mine == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert_like_ddp(loom_model, ddp_model, gloo, n)


# 11. SyncBatchNorm ------------------------------------------------------------------------

class BatchNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 4)

    def forward(self, x):
        return self.fc(F.max_pool2d(F.relu(self.bn(self.conv(x))), 2).flatten(1))


def test_sync_batchnorm_on_cpu_is_refused_by_torch_under_both(world):
    # torch 2.13 refuses SyncBatchNorm on CPU: DDP at construction (ValueError "SyncBatchNorm
    # layers only work with GPU modules", distributed.py's _passing_sync_batchnorm_handle), and
    # SyncBatchNorm.forward itself in training with a process group (ValueError "SyncBatchNorm
    # expected input tensor to be on GPU or XPU or privateuseone"). Its collectives cannot run
    # on CPU, so what is compared: parallelize refuses it too, with torch's ValueError naming
    # SyncBatchNorm and the GPU, when wrapped or at the latest at the first training forward,
    # on every rank alike (no hang); and in eval mode (no synchronisation) it runs as the
    # plain model.
    rank, n, gloo = world
    x, y = data("image", rank, 0)

    def build():
        torch.manual_seed(0)
        model = nn.SyncBatchNorm.convert_sync_batchnorm(BatchNormNet())
        assert isinstance(model.bn, nn.SyncBatchNorm)
        return model, OPTIMIZERS["sgd"](model.parameters())

    model, opt = build()
    with pytest.raises(ValueError, match="SyncBatchNorm layers only work with GPU modules"):
        DDP(model, process_group=gloo)
    model, opt = build()
    # Refused when wrapped, as by DDP, on every rank (before any collective of the wrap).
    with pytest.raises(ValueError, match="module 'bn' is SyncBatchNorm, which torch runs on GPU "
                                         "only"):
        loom_torch.parallelize(model, opt)


# 12. DistributedSampler -------------------------------------------------------------------

def test_distributed_sampler_epochs_are_like_ddp(world):
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    rank, n, gloo = world
    g = torch.Generator().manual_seed(7)
    dataset = TensorDataset(torch.randn(97, 16, generator=g),
                            torch.randint(0, 4, (97,), generator=g))
    out = []
    for use_loom in (False, True):
        model, _ = fresh("mlp")
        net, opt = wrap(model, OPTIMIZERS["sgd"](model.parameters()), gloo, use_loom)
        sampler = DistributedSampler(dataset, shuffle=True)  # from the default (loom) group
        assert (sampler.num_replicas, sampler.rank) == (n, rank)
        loader = DataLoader(dataset, batch_size=8, sampler=sampler)
        orders, sizes = [], []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            orders.append(list(sampler))
            for x, y in loader:
                opt.zero_grad()
                F.cross_entropy(net(x), y).backward()
                opt.step()
                sizes.append(len(x))
        assert orders[0] != orders[1]  # set_epoch reshuffled
        assert sum(sizes) == 2 * -(-97 // n)  # every rank the same count (padded)
        synchronize(net)
        out.append((model, net))
    assert_like_ddp(out[1][0], out[0][0], gloo, n)
