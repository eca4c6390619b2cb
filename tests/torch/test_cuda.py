"""CUDA tensors through the loom group: the path rule and the switches everywhere; the
collectives and their stream order where a GPU is (skipped with a message elsewhere).

The path rule (loom_torch._C._choose_device_path) is the one a group applies at its first CUDA
tensor: NCCL where loom has it and no two ranks share a GPU, else staged through pinned host
memory on the mpi transport. The GPU tests run under mpirun with every rank on the visible GPU
(device LOCAL_RANK % count): ranks sharing one GPU take the staged path (NCCL refuses them).
"""
import os

import pytest
import torch
import torch.distributed as dist
import loom_torch
from loom_torch import _C

GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="no CUDA device here: the GPU cases run in "
                                               "bench/gpu/device_check.sh")
SKIP = os.environ.get("LOOM_TORCH_UNSAFE_SKIP", "")


@pytest.mark.parametrize("wanted,nccl,stages,refused,path,why", [
    (None, True, True, False, "nccl", ""),
    (None, True, True, True, "staged", ""),
    (None, False, True, False, "staged", ""),
    (None, True, False, True, None, "NCCL refused the group (two ranks on one GPU), and staging "
                                    "through pinned memory needs loom's mpi or ucx transport"),
    (None, False, False, False, None, "this loom_torch was built without NCCL, and staging"),
    ("nccl", False, True, False, None, "LOOM_TORCH_CUDA_PATH=nccl, but this loom_torch was "
                                       "built without NCCL"),
    ("nccl", True, True, True, None, "LOOM_TORCH_CUDA_PATH=nccl, but NCCL refused the group"),
    ("nccl", True, False, False, "nccl", ""),
    ("staged", True, True, False, "staged", ""),
    ("staged", True, False, False, None, "LOOM_TORCH_CUDA_PATH=staged: staging through pinned "
                                         "memory needs loom's mpi or ucx transport built with "
                                         "CUDA"),
])
def test_device_path_rule(wanted, nccl, stages, refused, path, why):
    got, reason = _C._choose_device_path(wanted, nccl, stages, refused)
    assert got == path
    assert reason.startswith(why) if why else reason == ""


@pytest.mark.parametrize("variable,read,choices", [
    ("LOOM_TORCH_CUDA_PATH", "_device_path_from_environment", ["nccl", "staged"]),
    ("LOOM_TORCH_CUDA_BUCKETS", "_bucket_memory_from_environment", ["host", "device"]),
])
def test_choices_from_environment(monkeypatch, variable, read, choices):
    for text, want in [("", None), ("auto", None)] + [(c, c) for c in choices]:
        monkeypatch.setenv(variable, text)
        assert getattr(_C, read)() == want
    monkeypatch.setenv(variable, "gpu")
    with pytest.raises(RuntimeError, match=r"%s='gpu': expected one of auto, %s"
                                           % (variable, ", ".join(choices))):
        getattr(_C, read)()


def test_unsafe_skips(monkeypatch):
    for text, want in [("", (False, False)), ("stream_wait", (True, False)),
                       ("input_hold", (False, True)), ("stream_wait,input_hold", (True, True))]:
        monkeypatch.setenv("LOOM_TORCH_UNSAFE_SKIP", text)
        assert _C._unsafe_skips() == want
    monkeypatch.setenv("LOOM_TORCH_UNSAFE_SKIP", "stream_wait,order")
    with pytest.raises(RuntimeError, match=r"'order' is not one of stream_wait, input_hold"):
        _C._unsafe_skips()


@pytest.mark.parametrize("wanted,cuda,sharded,devices,cpu,memory,why", [
    (None, True, False, 0, True, "host", ""),
    (None, True, False, 1, False, "device", ""),
    (None, False, False, 1, False, "host", ""),
    (None, True, True, 1, False, "host", ""),
    (None, True, False, 2, False, "host", ""),
    (None, True, False, 1, True, "host", ""),
    ("host", True, False, 1, False, "host", ""),
    ("device", True, False, 1, False, "device", ""),
    ("device", False, False, 1, False, None, "LOOM_TORCH_CUDA_BUCKETS=device, but this "
                                             "loom_torch was built without CUDA"),
    ("device", True, True, 1, False, None, "LOOM_TORCH_CUDA_BUCKETS=device, but a sharded plan "
                                           "keeps the parameters in host memory"),
    ("device", True, False, 2, False, None, "LOOM_TORCH_CUDA_BUCKETS=device, but the parameters "
                                            "are on 2 GPUs"),
    ("device", True, False, 1, True, None, "LOOM_TORCH_CUDA_BUCKETS=device, but some parameters "
                                           "are on the CPU"),
])
def test_bucket_memory_rule(wanted, cuda, sharded, devices, cpu, memory, why):
    got, reason = _C._choose_bucket_memory(wanted, cuda, sharded, devices, cpu)
    assert got == memory
    assert reason.startswith(why) if why else reason == ""


# Ranks that choose differently (LOOM_TORCH_CUDA_BUCKETS on one rank only) would open different
# companions and meet only at the timeout: parallelize's agreement names it on every rank.
def test_ranks_that_disagree_on_bucket_memory_are_named_on_every_rank(world, loom_backend):
    rank, size, _ = world
    with pytest.raises(RuntimeError, match=r"the ranks disagree on where a CUDA model's buckets "
                                           r"live: 1 of %d ranks chose device memory, the others "
                                           r"host memory \(rank %d: %s\)"
                                           % (size, rank, "device" if rank == 0 else "host")):
        _C._agree_on_bucket_memory(loom_backend, "device" if rank == 0 else "host")
    _C._agree_on_bucket_memory(loom_backend, "host")  # agreeing ranks go on
    _C._agree_on_bucket_memory(loom_backend, "device")


def test_cpu_model_has_host_buckets(world):
    model = torch.nn.Linear(3, 2)
    net, opt = loom_torch.parallelize(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert net.bucket_memory() == "host"
    net(torch.ones(4, 3)).sum().backward()
    opt.step()
    net.synchronize()


def test_cpu_group_has_no_device_path(world, loom_backend):
    t = torch.ones(5)
    dist.all_reduce(t)
    assert t.tolist() == [float(world[1])] * 5
    assert loom_backend.device_path() == ""


def device():
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))
                        % torch.cuda.device_count())


@needs_gpu
@pytest.mark.skipif(SKIP != "", reason="the safeguards are switched off for this run")
@pytest.mark.parametrize("count", [1, 7, (1 << 20) + 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_collectives_on_cuda(world, loom_backend, count, dtype):
    rank, size, _ = world
    torch.cuda.set_device(device())
    x = torch.full((count,), rank + 1, dtype=dtype, device=device())
    dist.all_reduce(x)
    assert torch.equal(x.cpu(), torch.full((count,), size * (size + 1) // 2, dtype=dtype))
    assert loom_backend.device_path() in ("nccl", "staged")

    y = torch.full((count,), rank + 1, dtype=dtype, device=device())
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    assert torch.equal(y.cpu(), torch.full((count,), size, dtype=dtype))

    b = torch.full((count,), rank + 10, dtype=dtype, device=device())
    dist.broadcast(b, src=size - 1)
    assert torch.equal(b.cpu(), torch.full((count,), size - 1 + 10, dtype=dtype))

    r = torch.full((count,), rank + 1, dtype=dtype, device=device())
    dist.reduce(r, dst=0)
    if rank == 0:
        assert torch.equal(r.cpu(), torch.full((count,), size * (size + 1) // 2, dtype=dtype))

    inp = torch.full((count,), rank, dtype=dtype, device=device())
    out = torch.empty(count * size, dtype=dtype, device=device())
    dist.all_gather_into_tensor(out, inp)
    want = torch.arange(size, dtype=dtype).repeat_interleave(count)
    assert torch.equal(out.cpu(), want)
    parts = [torch.empty(count, dtype=dtype, device=device()) for _ in range(size)]
    dist.all_gather(parts, inp)
    assert torch.equal(torch.cat(parts).cpu(), want)

    big = torch.arange(count * size, device=device()).to(dtype)
    mine = torch.empty(count, dtype=dtype, device=device())
    dist.reduce_scatter_tensor(mine, big)
    start = rank * count
    assert torch.equal(mine.cpu(),
                       (torch.arange(start, start + count) * size).to(dtype))
    chunks = list(big.chunk(size))
    dist.reduce_scatter(mine, chunks)
    assert torch.equal(mine.cpu(), (torch.arange(start, start + count) * size).to(dtype))


@needs_gpu
def test_host_only_operations_refuse_cuda_by_name(world):
    rank, size, _ = world
    torch.cuda.set_device(device())
    t = torch.ones(3, device=device())
    with pytest.raises(RuntimeError, match=r"is on cuda:\d+: loom_torch runs this operation on "
                                           r"CPU tensors only"):
        if rank == 0:
            dist.send(t, dst=size - 1)
        else:
            dist.recv(t, src=0)


# The stream order: the producer writes the input on a side stream behind a long kernel
# (torch.cuda._sleep), then the collective is issued with that stream current. loom's stream
# waits for it (an event); with LOOM_TORCH_UNSAFE_SKIP=stream_wait loom reads the input before
# the write lands, and the result is wrong: the test then expects exactly that.
@needs_gpu
@pytest.mark.skipif(SKIP not in ("", "stream_wait"), reason="another switch is on")
def test_stream_order_after_the_producer(world):
    rank, size, _ = world
    torch.cuda.set_device(device())
    count = 1 << 20
    side = torch.cuda.Stream()
    x = torch.zeros(count, device=device())
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s on an H100/H200 at its clock
        x.fill_(rank + 1)
        dist.all_reduce(x)
    side.synchronize()
    right = torch.equal(x.cpu(), torch.full((count,), float(size * (size + 1) // 2)))
    assert right == (SKIP == ""), "loom's stream wait %s" % (
        "is on and the result is wrong" if SKIP == "" else
        "is skipped, yet the result is right: the test cannot see the stream order")


# The input's lifetime: an all-gather whose input is freed right after the call while its
# memory is refilled on the same stream; loom holds the input until it has read it. With
# LOOM_TORCH_UNSAFE_SKIP=input_hold and the read still pending (the side stream asleep), the
# refill lands first and the gathered values are wrong.
@needs_gpu
@pytest.mark.skipif(SKIP not in ("", "input_hold"), reason="another switch is on")
def test_input_kept_alive_while_read(world, loom_backend):
    rank, size, _ = world
    torch.cuda.set_device(device())
    count = 1 << 20
    out = torch.empty(count * size, device=device())
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        inp = torch.full((count,), float(rank + 1), device=device())
        torch.cuda._sleep(200_000_000)
        work = dist.all_gather_into_tensor(out, inp, async_op=True)
        del inp
        junk = torch.full((count,), -7.0, device=device())  # the freed block, reused
    work.wait()
    side.synchronize()
    want = torch.arange(1, size + 1, dtype=torch.float32).repeat_interleave(count)
    right = torch.equal(out.cpu(), want)
    del junk
    if SKIP == "":
        assert right
    elif loom_backend.device_path() == "nccl":
        assert not right, "the input hold is skipped, yet the result is right"
    else:
        # The staged path copies the input to the host before the call returns: its hold
        # cannot matter, and the test says so rather than pass for the wrong reason.
        pytest.skip("staged path: the input is on the host before the call returns")


# parallelize on a CUDA model, its buckets in the GPU's memory (the default: each gradient
# copied in, scaled, by loom's kernel on loom's stream after torch's current stream; .grad the
# bucket slot) or in host memory (LOOM_TORCH_CUDA_BUCKETS=host: staged, ready() copies each in
# and the average is copied back into .grad), against DDP on Gloo with the same CUDA model, data
# and buckets. Ranks sharing one GPU time-slice it (device buckets then travel staged too).
@needs_gpu
@pytest.mark.parametrize("name,optimizer", [("mlp", "sgd"), ("encoder", "adam"),
                                            ("gpt", "adamw")])
@pytest.mark.parametrize("defer", [False, True], ids=["overlapped", "defer_updates"])
@pytest.mark.parametrize("buckets", ["device", "host"])
def test_parallelize_a_cuda_model_like_ddp(world, name, optimizer, defer, buckets, monkeypatch):
    from torch.nn.parallel import DistributedDataParallel as DDP
    from helpers import CAP_MB, OPTIMIZERS, assert_like_ddp, data, fresh, loss_of
    rank, n, gloo = world
    torch.cuda.set_device(device())
    monkeypatch.setenv("LOOM_TORCH_CUDA_BUCKETS", buckets)

    def run(use_loom):
        model, kind = fresh(name)
        model = model.to(device())
        opt = OPTIMIZERS[optimizer](model.parameters())
        if use_loom:
            net, opt = loom_torch.parallelize(model, opt, bucket_cap_mb=CAP_MB,
                                              first_bucket_mb=CAP_MB, defer_updates=defer)
        else:
            net = DDP(model, process_group=gloo, bucket_cap_mb=CAP_MB)
        for step in range(6):
            x, y = data(kind, rank, step)
            opt.zero_grad()
            loss_of(kind, net(x.to(device())), y.to(device())).backward()
            opt.step()
        if use_loom:
            net.synchronize()
            assert all(p.grad is None or p.grad.is_cuda for p in model.parameters())
            assert net.bucket_memory().startswith(buckets), net.bucket_memory()
        return model

    assert_like_ddp(run(True), run(False), gloo, n)


# Mixed precision on a CUDA model: bf16 autocast with the updates overlapped, and fp16 autocast
# with a GradScaler (defer_updates=True: its found_inf is known only after the whole backward),
# as close to DDP on Gloo as DDP with other buckets is to itself, the scaler skipping the same
# steps under both.
@needs_gpu
@pytest.mark.parametrize("precision", ["bf16", "fp16_grad_scaler"])
@pytest.mark.parametrize("buckets", ["device", "host"])
def test_parallelize_a_cuda_model_under_autocast_like_ddp(world, precision, buckets, monkeypatch):
    from torch.nn.parallel import DistributedDataParallel as DDP
    from helpers import (CAP_MB, OPTIMIZERS, assert_as_close_as_ddp_to_itself, data, flat, fresh,
                         loss_of)
    rank, n, gloo = world
    torch.cuda.set_device(device())
    monkeypatch.setenv("LOOM_TORCH_CUDA_BUCKETS", buckets)
    fp16 = precision == "fp16_grad_scaler"

    def run(use_loom, cap_mb=CAP_MB):
        model, kind = fresh("encoder")
        model = model.to(device())
        opt = OPTIMIZERS["adam"](model.parameters())
        if use_loom:
            net, opt = loom_torch.parallelize(model, opt, bucket_cap_mb=cap_mb,
                                              first_bucket_mb=cap_mb, defer_updates=fp16)
        else:
            net = DDP(model, process_group=gloo, bucket_cap_mb=cap_mb)
        scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 20, growth_interval=3)
        skipped = []
        for step in range(8):
            x, y = data(kind, rank, step)
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.float16 if fp16 else torch.bfloat16):
                loss = loss_of(kind, net(x.to(device())), y.to(device()))
            if fp16:
                scaler.scale(loss).backward()
                scale = scaler.get_scale()
                scaler.step(opt)
                scaler.update()
                skipped.append(scaler.get_scale() < scale)
            else:
                loss.backward()
                opt.step()
        if use_loom:
            net.synchronize()
        return flat(model), skipped

    loom, loom_skipped = run(True)
    ddp, ddp_skipped = run(False)
    other, _ = run(False, cap_mb=1.0)
    assert loom_skipped == ddp_skipped
    if fp16:
        assert ddp_skipped[0], ddp_skipped  # the first steps overflowed at 2**20
    assert_as_close_as_ddp_to_itself(loom, ddp, other, gloo, n)


# The hand-over's stream order on device buckets: the backward runs on a side stream behind a
# long kernel, so autograd writes each gradient late; loom's copy into the bucket waits for that
# stream (an event). With LOOM_TORCH_UNSAFE_SKIP=stream_wait the copy reads the gradients before
# they are written, and the averages are wrong: the test then expects exactly that. Every rank
# trains on the same data, so the average is the local gradient.
@needs_gpu
@pytest.mark.skipif(SKIP not in ("", "stream_wait"), reason="another switch is on")
def test_device_buckets_read_gradients_after_their_stream(world, monkeypatch):
    rank, size, _ = world
    torch.cuda.set_device(device())
    monkeypatch.setenv("LOOM_TORCH_CUDA_BUCKETS", "device")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Tanh(),
                                torch.nn.Linear(1024, 1024)).to(device())
    reference = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(256, 1024, device=device())
    local = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Tanh(),
                                torch.nn.Linear(1024, 1024)).to(device())
    with torch.no_grad():
        for p, q in zip(local.parameters(), reference):
            p.copy_(q)
    local(x).square().mean().backward()
    want = [p.grad.clone() for p in local.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    net, opt = loom_torch.parallelize(model, opt, defer_updates=True)
    assert net.bucket_memory().startswith("device")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s: autograd's writes land late
        net(x).square().mean().backward()
    side.synchronize()
    net.synchronize()
    torch.cuda.synchronize()
    right = all(torch.allclose(p.grad, w, rtol=1e-5, atol=1e-7)
                for p, w in zip(model.parameters(), want))
    assert right == (SKIP == ""), "loom's stream wait %s" % (
        "is on and the averages are wrong" if SKIP == "" else
        "is skipped, yet the averages are right: the test cannot see the stream order")
