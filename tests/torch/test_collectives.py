"""Every loom_torch operation x dtype x size against an independent reference and Gloo.

Every rank makes every rank's input (seeded by rank and case), so each computes the expected
result itself; values are small integers, so sums, products, minima and maxima are exact in
every dtype (avg is compared with a tolerance). Gloo runs the same call in the same job where
it supports it (it has no bfloat16 and no AVG in torch 1.13), and must agree with loom.
"""
import json
import zlib

import pytest
import torch
import torch.distributed as dist
import loom_torch
from torch.distributed import ReduceOp

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.uint8]
SIZES = [0, 1, 7, (1 << 20) + 3]
OPS = {"sum": ReduceOp.SUM, "product": ReduceOp.PRODUCT, "min": ReduceOp.MIN,
       "max": ReduceOp.MAX, "avg": ReduceOp.AVG}
FLOATING = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def name(dtype):
    return str(dtype).replace("torch.", "")


def data(rank, case, count, dtype, op="sum"):
    """Rank `rank`'s input of `case`: small integers, exact in every dtype under `op`."""
    g = torch.Generator().manual_seed(zlib.crc32(case.encode()) * 131 + rank)
    if op == "product":
        values = torch.tensor([1, 2] if dtype == torch.uint8 else [1, 2, -1, -2])
        return values[torch.randint(0, len(values), (count,), generator=g)].to(dtype)
    low = 0 if dtype == torch.uint8 else -8
    return torch.randint(low, 16 if dtype == torch.uint8 else 9, (count,), generator=g).to(dtype)


def reduced(tensors, op, dtype):
    """The reduction of `tensors` computed here, in int64/float64, then cast like loom's."""
    wide = [t.to(torch.float64 if dtype in FLOATING else torch.int64) for t in tensors]
    out = wide[0].clone()
    for t in wide[1:]:
        if op in ("sum", "avg"):
            out += t
        elif op == "product":
            out *= t
        elif op == "min":
            out = torch.minimum(out, t)
        else:
            out = torch.maximum(out, t)
    if op == "avg":
        out /= len(tensors)
    if dtype == torch.uint8:
        out = out % 256
    return out.to(dtype)


def check(actual, expected, op="sum"):
    if op == "avg":
        tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6,
               torch.float64: 1e-12}[expected.dtype]
        torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)
    else:
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        assert torch.equal(actual, expected), "first difference at %s" % (
            (actual != expected).nonzero()[:1].tolist(),)


def on_gloo(gloo, fn, count=1):
    """fn(gloo) when Gloo supports the call, else None (Gloo's own refusal). Empty tensors are
    not given to Gloo: torch 1.13's Gloo all_gather dies of SIGFPE on them."""
    if count == 0:
        return None
    try:
        return fn(gloo)
    except RuntimeError as e:
        text = str(e)
        if any(s in text for s in ("does not support", "Unsupported", "not supported", "Invalid",
                                   "Cannot use")):
            return None
        raise


params = pytest.mark.parametrize


@params("count", SIZES)
@params("dtype", DTYPES, ids=name)
@params("op", list(OPS))
def test_allreduce(world, loom_group, op, dtype, count):
    rank, n, gloo = world
    case = "allreduce-%s-%s-%d" % (op, dtype, count)
    if op == "avg" and dtype not in FLOATING:
        with pytest.raises(RuntimeError, match=r"\[loom:unsupported\].*avg"):
            dist.all_reduce(data(rank, case, count, dtype), op=OPS[op])
        return
    t = data(rank, case, count, dtype, op)
    dist.all_reduce(t, op=OPS[op])
    check(t, reduced([data(r, case, count, dtype, op) for r in range(n)], op, dtype), op)
    g = on_gloo(gloo, lambda grp: dist.all_reduce(u := data(rank, case, count, dtype, op),
                                                  op=OPS[op], group=grp) or u, count)
    if g is not None:
        check(t, g, op)


@params("count", SIZES)
@params("dtype", DTYPES, ids=name)
def test_broadcast_from_every_root(world, dtype, count):
    rank, n, gloo = world
    for root in range(n):
        case = "broadcast-%s-%d-%d" % (dtype, count, root)
        t = data(rank, case, count, dtype)
        work = dist.broadcast(t, src=root, async_op=True)
        work.wait()
        check(t, data(root, case, count, dtype))
        u = data(rank, case, count, dtype)
        if on_gloo(gloo, lambda grp: dist.broadcast(u, src=root, group=grp) or True,
                   count):
            check(t, u)


@params("count", SIZES)
@params("dtype", DTYPES, ids=name)
@params("op", ["sum", "max"])
def test_reduce(world, op, dtype, count):
    rank, n, _ = world
    root = n - 1
    case = "reduce-%s-%s-%d" % (op, dtype, count)
    t = data(rank, case, count, dtype, op)
    dist.reduce(t, dst=root, op=OPS[op])
    if rank == root:
        check(t, reduced([data(r, case, count, dtype, op) for r in range(n)], op, dtype), op)


@params("count", SIZES)
@params("dtype", DTYPES, ids=name)
def test_allgather_list_and_base(world, dtype, count):
    rank, n, gloo = world
    case = "allgather-%s-%d" % (dtype, count)
    expected = [data(r, case, count, dtype) for r in range(n)]
    out = [torch.full((count,), 99, dtype=dtype) for _ in range(n)]
    dist.all_gather(out, data(rank, case, count, dtype))
    for r in range(n):
        check(out[r], expected[r])
    flat = torch.empty(count * n, dtype=dtype)  # out of place
    dist.all_gather_into_tensor(flat, data(rank, case, count, dtype))
    check(flat, torch.cat(expected))
    inplace = torch.zeros(count * n, dtype=dtype)  # the input is this rank's slice of the output
    inplace[rank * count:(rank + 1) * count] = data(rank, case, count, dtype)
    dist.all_gather_into_tensor(inplace, inplace[rank * count:(rank + 1) * count])
    check(inplace, torch.cat(expected))
    g = [torch.empty(count, dtype=dtype) for _ in range(n)]
    if on_gloo(gloo, lambda grp: dist.all_gather(g, data(rank, case, count, dtype),
                                                 group=grp) or True, count):
        for r in range(n):
            check(out[r], g[r])


@params("count", SIZES)
@params("dtype", DTYPES, ids=name)
@params("op", ["sum", "min"])
def test_reduce_scatter_list_and_base(world, op, dtype, count):
    rank, n, _ = world
    case = "reduce_scatter-%s-%s-%d" % (op, dtype, count)
    inputs = [data(r, case, count * n, dtype, op) for r in range(n)]
    expected = reduced(inputs, op, dtype)[rank * count:(rank + 1) * count]
    out = torch.full((count,), 7, dtype=dtype)
    dist.reduce_scatter(out, list(inputs[rank].chunk(n)) if count else
                        [torch.empty(0, dtype=dtype) for _ in range(n)], op=OPS[op])
    check(out, expected, op)
    out2 = torch.full((count,), 7, dtype=dtype)
    dist.reduce_scatter_tensor(out2, inputs[rank].clone(), op=OPS[op])
    check(out2, expected, op)


@params("count", SIZES)
@params("dtype", DTYPES, ids=name)
def test_alltoall_base(world, dtype, count):
    rank, n, gloo = world
    case = "alltoall-%s-%d" % (dtype, count)
    inputs = [data(r, case, count * n, dtype) for r in range(n)]
    out = torch.full((count * n,), 5, dtype=dtype)
    dist.all_to_all_single(out, inputs[rank])
    expected = torch.cat([inputs[r][rank * count:(rank + 1) * count] for r in range(n)])
    check(out, expected)
    out2 = torch.empty(count * n, dtype=dtype)
    splits = [count] * n
    dist.all_to_all_single(out2, inputs[rank], splits, splits)
    check(out2, expected)
    g = torch.empty(count * n, dtype=dtype)
    if on_gloo(gloo, lambda grp: dist.all_to_all_single(g, inputs[rank], group=grp) or True,
               count):
        check(out, g)


@params("count", SIZES)
@params("dtype", DTYPES, ids=name)
def test_send_recv_ring(world, dtype, count):
    rank, n, _ = world
    case = "ring-%s-%d" % (dtype, count)
    got = torch.empty(count, dtype=dtype)
    sent = dist.isend(data(rank, case, count, dtype), dst=(rank + 1) % n, tag=3)
    received = dist.irecv(got, src=(rank - 1) % n, tag=3)
    sent.wait()
    received.wait()
    check(got, data((rank - 1) % n, case, count, dtype))


@params("count", [1, 7, (1 << 20) + 3])
def test_recv_any_source_names_the_sender(world, count):
    rank, n, _ = world
    case = "anysource-%d" % count
    if rank == 0:
        seen = set()
        for _ in range(n - 1):
            t = torch.empty(count, dtype=torch.int64)
            sender = dist.recv(t, tag=9)
            check(t, data(sender, case, count, torch.int64))
            seen.add(sender)
        assert seen == set(range(1, n))
    else:
        dist.send(data(rank, case, count, torch.int64), dst=0, tag=9)
    dist.barrier()


def test_barrier_and_async_work(world, loom_group):
    rank, n, _ = world
    work = dist.barrier(async_op=True)
    work.wait()
    assert work.is_completed() and work.is_success()
    t = torch.ones(1000)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    assert fut.wait()[0] is not None
    assert torch.equal(t, torch.full((1000,), float(n)))


def test_each_collective_goes_through_the_selector(world, loom_backend):
    _, n, _ = world
    dist.all_reduce(torch.ones(1 << 16))
    assert loom_backend.last_algorithm().split(" ")[0] in (
        "native", "ring", "rd", "rabenseifner", "tree")
    assert loom_backend.backend_name() == "mpi"


def test_loom_allreduce_ranges_choose_the_algorithm(world, monkeypatch):
    rank, n, _ = world
    monkeypatch.setenv("LOOM_ALLREDUCE", "ring:0-max")
    ring = dist.new_group(backend="loom")  # the selector reads LOOM_<COLL> when a group is made
    t = data(rank, "ring-override", 1000, torch.float32)
    dist.all_reduce(t, group=ring)
    assert loom_torch.backend_of(ring).last_algorithm() == "ring (override)"
    check(t, reduced([data(r, "ring-override", 1000, torch.float32) for r in range(n)], "sum",
                     torch.float32))
    dist.destroy_process_group(ring)


def test_flight_record_holds_every_operation_alike_on_every_rank(world, loom_backend):
    """The group writes each operation into loom's flight recorder, as the executor does:
    collectives numbered by collective_seq_id (the same numbers, operations and sizes on every
    rank), point-to-point apart, each completed, with the algorithm the selector chose."""
    rank, n, gloo = world
    first = json.loads(loom_backend.flight_record())["next_collective_seq_id"]
    t = torch.ones(7)
    dist.all_reduce(t)
    dist.broadcast(torch.ones(5, dtype=torch.float64), 0)
    out = torch.empty(3 * n, dtype=torch.int32)
    gather_into = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
    gather_into(out, torch.ones(3, dtype=torch.int32))
    dist.barrier()
    right, left = (rank + 1) % n, (rank - 1) % n
    recv = torch.empty(4)
    works = [dist.isend(torch.ones(4), right), dist.irecv(recv, left)]
    for w in works:
        w.wait()
    record = json.loads(loom_backend.flight_record("test"))
    assert record["rank"] == rank and record["world_size"] == n and record["reason"] == "test"
    assert record["backend"] == "mpi"
    mine = [e for e in record["entries"] if e["collective_seq_id"] >= first]
    assert [(e["op"], e["input_dtypes"][0], e["input_sizes"][0][0]) for e in mine] == [
        ("allreduce", "float32", 7), ("broadcast", "float64", 5), ("allgather", "int32", 3),
        ("barrier", "float32", 0)]
    assert [e["collective_seq_id"] for e in mine] == list(range(first, first + 4))
    assert all(e["state"] == "completed" and e["algorithm"] for e in mine)
    p2p = [e for e in record["entries"] if e["is_p2p"]][-2:]
    assert [(e["op"], e["peer"], e["input_sizes"][0][0], e["state"]) for e in p2p] == [
        ("send", right, 4, "completed"), ("recv", left, 4, "completed")]
    # The same collectives under the same numbers on every rank (compared over Gloo).
    signature = torch.tensor([first, len(mine), zlib.crc32(repr([
        (e["collective_seq_id"], e["op"], e["input_sizes"][0][0]) for e in mine]).encode())],
        dtype=torch.int64)
    everyone = [torch.empty_like(signature) for _ in range(n)]
    dist.all_gather(everyone, signature, group=gloo)
    assert all(torch.equal(s, signature) for s in everyone), everyone
