"""Every loom_torch operation x dtype x size against an independent reference and Gloo.

Every rank makes every rank's input (seeded by rank and case), so each computes the expected
result itself; values are small integers, so sums, products, minima and maxima are exact in
every dtype (avg is compared with a tolerance; on integers it is exact: the sum divided with
truncation toward zero, as NCCL defines it). bool sums as logical or and multiplies as logical
and, as torch defines them; complex sums and averages component-wise. Gloo runs the same call in
the same job where it supports it (it has no AVG), and must agree with loom.
"""
import json
import zlib

import pytest
import torch
import torch.distributed as dist
import loom_torch
from torch.distributed import ReduceOp

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.uint8, torch.int8, torch.int16, torch.bool, torch.complex64, torch.complex128]
SIZES = [0, 1, 7, (1 << 20) + 3]
COMPLEX = (torch.complex64, torch.complex128)
OPS = {"sum": ReduceOp.SUM, "product": ReduceOp.PRODUCT, "min": ReduceOp.MIN,
       "max": ReduceOp.MAX, "avg": ReduceOp.AVG}
FLOATING = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def name(dtype):
    return str(dtype).replace("torch.", "")


def data(rank, case, count, dtype, op="sum"):
    """Rank `rank`'s input of `case`: small integers, exact in every dtype under `op`."""
    g = torch.Generator().manual_seed(zlib.crc32(case.encode()) * 131 + rank)
    if dtype == torch.bool:
        return torch.rand(count, generator=g) < 0.4
    if dtype in COMPLEX:
        real = torch.randint(-8, 9, (count, 2), generator=g).to(
            torch.float32 if dtype == torch.complex64 else torch.float64)
        return torch.view_as_complex(real)
    if op == "product":
        values = torch.tensor([1, 2] if dtype == torch.uint8 else [1, 2, -1, -2])
        return values[torch.randint(0, len(values), (count,), generator=g)].to(dtype)
    low = 0 if dtype == torch.uint8 else -8
    return torch.randint(low, 16 if dtype == torch.uint8 else 9, (count,), generator=g).to(dtype)


def reduced(tensors, op, dtype):
    """The reduction of `tensors` computed here, in int64/float64, then cast like loom's."""
    if dtype == torch.bool:  # sum and max: any; product and min: all
        stacked = torch.stack(tensors)
        return stacked.any(0) if op in ("sum", "max") else stacked.all(0)
    if dtype in COMPLEX:  # sum and avg only
        out = torch.stack([t.to(torch.complex128) for t in tensors]).sum(0)
        return (out / len(tensors) if op == "avg" else out).to(dtype)
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
        if dtype in FLOATING:
            out /= len(tensors)
        else:  # NCCL's integer avg: the sum (wrapped as the dtype) divided toward zero
            out = torch.div(out.to(dtype).to(torch.int64), len(tensors), rounding_mode="trunc")
    if dtype == torch.uint8:
        out = out % 256
    return out.to(dtype)


def check(actual, expected, op="sum"):
    if op == "avg" and (expected.dtype in FLOATING or expected.dtype in COMPLEX):
        tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6,
               torch.float64: 1e-12, torch.complex64: 1e-6, torch.complex128: 1e-12}[
                   expected.dtype]
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
        # The last: Gloo's AVG divides in place by the world size, which torch refuses for
        # integer tensors (Gloo has no integer AVG).
        if any(s in text for s in ("does not support", "Unsupported", "not supported", "Invalid",
                                   "Cannot use", "can't be cast to the desired output type",
                                   "Invalid scalar type")):
            return None
        raise


params = pytest.mark.parametrize


def refused(op, dtype):
    """What loom refuses by name, as NCCL and Gloo do: AVG on bool, and PRODUCT, MIN and MAX
    on complex (torch's Python layer refuses those before any backend sees them)."""
    return (op == "avg" and dtype == torch.bool) or (
        dtype in COMPLEX and op in ("product", "min", "max"))


@params("count", SIZES)
@params("dtype", DTYPES, ids=name)
@params("op", list(OPS))
def test_allreduce(world, loom_group, op, dtype, count):
    rank, n, gloo = world
    case = "allreduce-%s-%s-%d" % (op, dtype, count)
    if refused(op, dtype):
        # Straight to loom's backend: torch.distributed's all_reduce stops complex MAX itself.
        opts = dist.AllreduceOptions()
        opts.reduceOp = OPS[op]
        backend = loom_group._get_backend(torch.device("cpu"))
        with pytest.raises(RuntimeError, match=r"\[loom:unsupported\].*%s is not defined for %s"
                           % ({"product": "prod"}.get(op, op), name(dtype))):
            backend.allreduce([data(rank, case, count, dtype)], opts).wait()
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
@params("op", ["sum", "avg"])
def test_reduce(world, op, dtype, count):
    rank, n, _ = world
    root = n - 1
    case = "reduce-%s-%s-%d" % (op, dtype, count)
    if refused(op, dtype):
        return  # test_allreduce checks the refusal
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
@params("op", ["sum", "min", "avg"])
def test_reduce_scatter_list_and_base(world, op, dtype, count):
    rank, n, _ = world
    case = "reduce_scatter-%s-%s-%d" % (op, dtype, count)
    if refused(op, dtype):
        return  # test_allreduce checks the refusal
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
    # mpi under mpirun; under torchrun the ucx backend, through torch's store.
    assert loom_backend.backend_name() == ("mpi" if loom_torch._C.launched_by_mpirun() else "ucx")


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
    assert record["backend"] == loom_backend.backend_name()
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


@params("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8], ids=name)
def test_avg_on_integers_sums_then_truncates_toward_zero(world, dtype):
    """ReduceOp.AVG on integers as NCCL defines it, with sums that do not divide evenly and
    negative sums (whose quotient truncates up toward zero, not down as floor would)."""
    rank, n, _ = world
    unsigned = dtype == torch.uint8
    mine = torch.tensor([rank + 1, 1 if rank == 0 else 0, 7 * rank + 3] +
                        ([] if unsigned else [-(rank + 1), -1 if rank == 0 else 0]), dtype=dtype)
    sums = [n * (n + 1) // 2, 1, 7 * n * (n - 1) // 2 + 3 * n] + (
        [] if unsigned else [-(n * (n + 1) // 2), -1])
    expected = torch.tensor([int(s / n) for s in sums], dtype=dtype)  # int(): toward zero
    t = mine.clone()
    dist.all_reduce(t, op=ReduceOp.AVG)
    assert torch.equal(t, expected), (t, expected)
    assert -1 // n == -1 and int(-1 / n) == 0  # the case floor division would get wrong


def test_lightning_metric_sync_averages_an_int64_counter(world):
    """What PyTorch Lightning's self.log(..., sync_dist=True) does with its batch-size counter:
    all_reduce of a 0-d int64 tensor with ReduceOp.AVG."""
    rank, n, _ = world
    batch_size = torch.tensor(32 + rank, dtype=torch.int64)
    dist.all_reduce(batch_size, op=ReduceOp.AVG)
    assert batch_size.dtype == torch.int64 and batch_size.dim() == 0
    assert batch_size.item() == sum(32 + r for r in range(n)) // n


def test_all_gather_coalesced_has_c10ds_shapes(world):
    """output_tensor_lists[r][i] is rank r's input i (one list per rank, each with one tensor
    per input), inputs of different sizes and shapes; equal to Gloo's result."""
    rank, n, gloo = world
    shapes = [(2, 3), (1,), (5,), (0,), (4, 1, 2)]
    for dtype in (torch.float32, torch.int8, torch.bool, torch.complex64):
        inputs = [data(rank, "agc-%d-%s" % (i, dtype), torch.Size(s).numel(), dtype).reshape(s)
                  for i, s in enumerate(shapes)]
        outputs = [[torch.zeros(s, dtype=dtype) for s in shapes] for _ in range(n)]
        dist.all_gather_coalesced(outputs, inputs)
        for r in range(n):
            for i, s in enumerate(shapes):
                want = data(r, "agc-%d-%s" % (i, dtype), torch.Size(s).numel(), dtype).reshape(s)
                assert torch.equal(outputs[r][i], want), (dtype, r, i)
        if dtype in (torch.float32, torch.int8):  # Gloo's all_gather_coalesced, same call
            g = [[torch.zeros(s, dtype=dtype) for s in shapes] for _ in range(n)]
            dist.all_gather_coalesced(g, inputs, group=gloo)
            for r in range(n):
                for i in range(len(shapes)):
                    assert torch.equal(outputs[r][i], g[r][i]), (dtype, r, i)
    with pytest.raises(RuntimeError, match=r"\[loom:invalid_argument\].*output lists; expected "
                                           r"one per rank"):
        dist.all_gather_coalesced([[torch.zeros(1)]] * (n + 1), [torch.ones(1)])


def test_all_reduce_coalesced_matches_gloo(world):
    rank, n, gloo = world
    for dtype, op in ((torch.float32, "sum"), (torch.int16, "max"), (torch.bool, "sum"),
                      (torch.float64, "avg"), (torch.int64, "avg")):
        shapes = [(3,), (2, 2), (1,), (7,)]
        mine = [data(rank, "arc-%d-%s" % (i, dtype), torch.Size(s).numel(), dtype, op)
                .reshape(s) for i, s in enumerate(shapes)]
        t = [x.clone() for x in mine]
        dist.all_reduce_coalesced(t, op=OPS[op])
        for i, s in enumerate(shapes):
            want = reduced([data(r, "arc-%d-%s" % (i, dtype), torch.Size(s).numel(), dtype, op)
                            for r in range(n)], op, dtype).reshape(s)
            check(t[i], want, op)
        g = [x.clone() for x in mine]
        if on_gloo(gloo, lambda grp: dist.all_reduce_coalesced(g, op=OPS[op], group=grp) or 1):
            for a, b in zip(t, g):
                check(a, b, op)


def test_tensor_coalesced_forms(world, loom_group):
    """allgather_into_tensor_coalesced and reduce_scatter_tensor_coalesced (what FSDP2 calls)
    with several inputs of different sizes and dtypes, through torch's coalescing manager."""
    rank, n, _ = world
    sizes = [(1, torch.float32), (5, torch.int8), (3, torch.complex128)]
    ins = [data(rank, "agtc-%d" % c, c, d) for c, d in sizes]
    outs = [torch.empty(c * n, dtype=d) for c, d in sizes]
    with dist._coalescing_manager(group=loom_group):
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    for (c, d), o in zip(sizes, outs):
        check(o, torch.cat([data(r, "agtc-%d" % c, c, d) for r in range(n)]))
    rins = [data(rank, "rstc-%d" % c, c * n, d) for c, d in sizes]
    routs = [torch.empty(c, dtype=d) for c, d in sizes]
    with dist._coalescing_manager(group=loom_group):
        for o, i in zip(routs, rins):
            dist.reduce_scatter_tensor(o, i)
    for (c, d), o in zip(sizes, routs):
        full = reduced([data(r, "rstc-%d" % c, c * n, d) for r in range(n)], "sum", d)
        check(o, full[rank * c:(rank + 1) * c])


def test_sequence_numbers_agree_and_advance_per_collective(world, loom_group):
    """c10d's sequence numbers: the same on every rank, one more per collective, none for
    point-to-point; set agrees through the store (rank 0's count)."""
    rank, n, gloo = world
    backend = loom_group._get_backend(torch.device("cpu"))
    backend._set_sequence_number_for_group()
    first = backend._get_sequence_number_for_group()
    dist.all_reduce(torch.ones(3))
    dist.broadcast(torch.ones(2), 0)
    dist.barrier()
    assert backend._get_sequence_number_for_group() == first + 3
    sent = dist.isend(torch.ones(1), (rank + 1) % n)
    dist.recv(torch.empty(1), (rank - 1) % n)
    sent.wait()
    assert backend._get_sequence_number_for_group() == first + 3
    seqs = [torch.empty(2, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(seqs, torch.tensor([first, backend._get_sequence_number_for_group()]),
                    group=gloo)
    assert all(torch.equal(s, seqs[0]) for s in seqs), seqs
    sub = dist.new_group(list(range(n - 1, -1, -1)), backend="loom")
    sub_backend = sub._get_backend(torch.device("cpu"))
    sub_backend._set_sequence_number_for_group()
    assert sub_backend._get_sequence_number_for_group() == 0
    dist.all_reduce(torch.ones(1), group=sub)
    assert sub_backend._get_sequence_number_for_group() == 1
    dist.destroy_process_group(sub)
