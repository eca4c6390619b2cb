"""What torch 2.x asks of a c10d Backend, on loom: subgroups, gather/scatter, every all-to-all,
the coalesced forms, the object collectives, functional collectives and distributed
checkpointing. Every rank computes every expected value itself (inputs are seeded by rank), and
the flight record proves loom ran the operation (no fallback to another backend)."""
import json
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import loom_torch


def seq(group=None):
    """loom's next collective number on `group`: each loom collective advances it by one."""
    return json.loads(loom_torch.backend_of(group).flight_record())["next_collective_seq_id"]


def value(src, dst, count, dtype=torch.float32):
    """What rank `src` sends rank `dst`: distinct per pair and element, exact in every dtype."""
    return (torch.arange(count, dtype=torch.float64) + 100 * src + 10 * dst).to(dtype)


def test_the_backend_is_registered_for_cpu_and_cuda(world, loom_group):
    assert isinstance(loom_group._get_backend(torch.device("cpu")), loom_torch.ProcessGroupLoom)
    assert dist.get_backend() == "loom"
    assert "cuda" in dist.Backend.backend_capability["loom"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_gather_and_scatter_from_every_root(world, dtype):
    rank, n, _ = world
    for root in range(n):
        count = 5 + root  # odd sizes
        before = seq()
        out = [torch.full((count,), -1, dtype=dtype) for _ in range(n)] if rank == root else None
        dist.gather(value(rank, root, count, dtype), out, dst=root)
        if rank == root:
            for r in range(n):
                assert torch.equal(out[r], value(r, root, count, dtype)), (root, r)
        got = torch.full((count,), -1, dtype=dtype)
        pieces = [value(root, r, count, dtype) for r in range(n)] if rank == root else None
        dist.scatter(got, pieces, src=root)
        assert torch.equal(got, value(root, rank, count, dtype))
        assert seq() == before + 2  # one loom collective each


def test_gather_names_a_wrong_output_list(world):
    rank, n, _ = world
    if n < 2:
        pytest.skip("needs 2 ranks")
    # Checked on the root before anything is sent or any tag is taken: the group goes on.
    if rank == 0:
        with pytest.raises(RuntimeError, match=r"\[loom:invalid_argument\] gather on rank 0 .*"
                           r"output 1 is float32\[3\]@cpu but the input is float32\[4\]"):
            dist.gather(torch.zeros(4), [torch.zeros(4), torch.zeros(3)] +
                        [torch.zeros(4)] * (n - 2), dst=0)
    dist.barrier()


def test_all_to_all_list_and_uneven_single(world):
    rank, n, _ = world
    # List form: rank r sends rank d (r + d + 1) elements.
    inputs = [value(rank, d, rank + d + 1) for d in range(n)]
    outputs = [torch.empty(s + rank + 1) for s in range(n)]
    dist.all_to_all(outputs, inputs)
    for s in range(n):
        assert torch.equal(outputs[s], value(s, rank, s + rank + 1))
    # Single tensor, uneven rows of width 3.
    width = 3
    in_splits = [rank + d + 1 for d in range(n)]
    out_splits = [s + rank + 1 for s in range(n)]
    send = torch.cat([value(rank, d, in_splits[d] * width).view(-1, width) for d in range(n)])
    recv = torch.empty(sum(out_splits), width)
    before = seq()
    dist.all_to_all_single(recv, send, out_splits, in_splits)
    assert seq() == before + 1
    expected = torch.cat([value(s, rank, out_splits[s] * width).view(-1, width) for s in range(n)])
    assert torch.equal(recv, expected)
    # Equal blocks: loom's alltoall collective.
    even = torch.cat([value(rank, d, 4) for d in range(n)])
    got = torch.empty(4 * n)
    dist.all_to_all_single(got, even)
    assert torch.equal(got, torch.cat([value(s, rank, 4) for s in range(n)]))


def test_coalesced_forms(world):
    rank, n, _ = world
    a, b = torch.full((3,), float(rank)), torch.full((5,), float(rank + 1))
    with dist._coalescing_manager():
        dist.all_reduce(a)
        dist.all_reduce(b)
    total = sum(range(n))
    assert torch.equal(a, torch.full((3,), float(total)))
    assert torch.equal(b, torch.full((5,), float(total + n)))
    outs = [torch.empty(2 * n), torch.empty(3 * n)]
    with dist._coalescing_manager():
        dist.all_gather_into_tensor(outs[0], value(rank, 0, 2))
        dist.all_gather_into_tensor(outs[1], value(rank, 1, 3))
    assert torch.equal(outs[0], torch.cat([value(r, 0, 2) for r in range(n)]))
    assert torch.equal(outs[1], torch.cat([value(r, 1, 3) for r in range(n)]))
    red = [torch.empty(2), torch.empty(1)]
    with dist._coalescing_manager():
        dist.reduce_scatter_tensor(red[0], torch.arange(2.0 * n) + rank)
        dist.reduce_scatter_tensor(red[1], torch.arange(1.0 * n) * (rank + 1))
    tri = n * (n + 1) // 2
    assert torch.equal(red[0], (torch.arange(2.0 * n) * n + total)[2 * rank:2 * rank + 2])
    assert torch.equal(red[1], (torch.arange(1.0 * n) * tri)[rank:rank + 1])
    # Mixed dtypes in one coalesced allreduce: one loom collective per tensor.
    mixed = [torch.full((2,), rank, dtype=torch.int32), torch.full((3,), float(rank))]
    work = loom_torch.backend_of().allreduce_coalesced(mixed)
    work.wait()
    assert torch.equal(mixed[0], torch.full((2,), total, dtype=torch.int32))
    assert torch.equal(mixed[1], torch.full((3,), float(total)))


def test_object_collectives(world):
    rank, n, _ = world
    objs = [None] * n if rank == 0 else None
    dist.gather_object({"rank": rank, "text": "x" * rank}, objs, dst=0)
    if rank == 0:
        assert objs == [{"rank": r, "text": "x" * r} for r in range(n)]
    got = [None]
    dist.scatter_object_list(got, [("to", r) for r in range(n)] if rank == 0 else None, src=0)
    assert got == [("to", rank)]
    every = [None] * n
    dist.all_gather_object(every, rank * 7)
    assert every == [r * 7 for r in range(n)]
    shared = [rank * 3 + 1]
    dist.broadcast_object_list(shared, src=n - 1)
    assert shared == [(n - 1) * 3 + 1]


def test_functional_collectives_reach_loom(world):
    import torch.distributed._functional_collectives as fc
    rank, n, _ = world
    before = seq()
    out = fc.all_reduce(torch.full((6,), float(rank + 1)), "sum", dist.group.WORLD)
    gathered = fc.all_gather_tensor(torch.full((2,), float(rank)), 0, dist.group.WORLD)
    assert torch.equal(out, torch.full((6,), float(n * (n + 1) // 2)))
    assert torch.equal(gathered, torch.arange(n, dtype=torch.float32).repeat_interleave(2))
    assert seq() == before + 2


def test_subgroups_and_two_disjoint_at_once(world):
    rank, n, _ = world
    pair = dist.new_group([0, 1], backend="loom")
    if rank in (0, 1):
        t = torch.full((7,), float(rank + 1))
        dist.all_reduce(t, group=pair)
        assert torch.equal(t, torch.full((7,), 3.0))
        assert loom_torch.backend_of(pair).global_ranks() == [0, 1]
    else:
        assert pair == dist.GroupMember.NON_GROUP_MEMBER
    evens = [r for r in range(n) if r % 2 == 0]
    odds = [r for r in range(n) if r % 2 == 1]
    groups = {0: dist.new_group(evens, backend="loom"), 1: dist.new_group(odds, backend="loom")}
    mine, members = groups[rank % 2], (evens, odds)[rank % 2]
    # Both groups run at the same time, on disjoint ranks, with other sizes.
    t = torch.arange(11, dtype=torch.float64) * (rank + 1)
    dist.all_reduce(t, group=mine)
    assert torch.equal(t, torch.arange(11, dtype=torch.float64) * sum(r + 1 for r in members))
    out = [torch.empty(3, dtype=torch.int64) for _ in members]
    dist.all_gather(out, torch.full((3,), rank, dtype=torch.int64), group=mine)
    assert [int(o[0]) for o in out] == members
    assert dist.get_rank(mine) == members.index(rank)
    dist.barrier()
    for g in [pair] + list(groups.values()):
        if g != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)


def test_distributed_checkpoint_saves_and_loads(world, tmp_path_factory):
    import torch.distributed.checkpoint as dcp
    rank, n, _ = world
    path = [str(tmp_path_factory.mktemp("dcp")) if rank == 0 else None]
    dist.broadcast_object_list(path, src=0)  # one directory for the job, chosen by rank 0
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 2))
    state = {"model": model.state_dict(), "step": torch.tensor(rank * 0 + 42)}
    dcp.save(state, checkpoint_id=path[0])
    fresh = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 2))
    loaded = {"model": fresh.state_dict(), "step": torch.tensor(0)}
    dcp.load(loaded, checkpoint_id=path[0])
    fresh.load_state_dict(loaded["model"])
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), k
    assert int(loaded["step"]) == 42
