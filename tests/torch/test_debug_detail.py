"""loom groups under TORCH_DISTRIBUTED_DEBUG=DETAIL (set by tests/torch/CMakeLists.txt before
the job starts): torch wraps every group's backend in its ProcessGroupWrapper, which compares a
fingerprint of each collective, its sequence number included, across ranks (over a Gloo helper
group) before letting it run. With loom's sequence numbers, subgroups, the object collectives and
a deliberately mismatched collective behave as on Gloo: the last is refused on every rank with
torch's own message, before loom sees it, so nothing hangs.
"""
import os

import pytest
import torch
import torch.distributed as dist


def wrapped(group):
    return type(group._get_backend(torch.device("cpu"))).__name__


def test_detail_wraps_loom_groups(world, loom_group):
    assert os.environ.get("TORCH_DISTRIBUTED_DEBUG") == "DETAIL"
    assert dist.get_debug_level() == dist.DebugLevel.DETAIL
    assert wrapped(loom_group) == "_ProcessGroupWrapper"
    rank, n, _ = world
    t = torch.full((5,), float(rank))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((5,), float(sum(range(n)))))


def test_subgroups_and_object_collectives(world):
    rank, n, _ = world
    odd_first = dist.new_group([r for r in range(n) if r % 2] + [r for r in range(n) if not r % 2])
    tail = dist.new_group(list(range(1, n)))
    assert wrapped(odd_first) == "_ProcessGroupWrapper"
    objects = [None] * n
    dist.all_gather_object(objects, {"rank": rank, "name": "r%d" % rank}, group=odd_first)
    assert sorted(o["rank"] for o in objects) == list(range(n))
    if rank >= 1:
        gathered = [None] * (n - 1) if rank == 1 else None
        dist.gather_object(("hello", rank), gathered, dst=1, group=tail)
        if rank == 1:
            assert gathered == [("hello", r) for r in range(1, n)]
        received = [None]
        dist.broadcast_object_list(received if rank != n - 1 else [{"from": n - 1}],
                                   src=n - 1, group=tail)
        if rank != n - 1:
            assert received == [{"from": n - 1}]
    dist.barrier()
    dist.destroy_process_group(odd_first)
    dist.destroy_process_group(tail)


def test_a_mismatched_collective_is_named_by_torchs_check(world):
    rank, n, _ = world
    t = torch.ones(3 if rank == 0 else 4)
    with pytest.raises(RuntimeError, match="Detected mismatch between collectives on ranks"):
        dist.all_reduce(t)
    # The group is still usable: the check refused the call before loom started it.
    u = torch.ones(2)
    dist.all_reduce(u)
    assert torch.equal(u, torch.full((2,), float(n)))
    with pytest.raises(RuntimeError, match="Detected mismatch between collectives on ranks"):
        if rank == 0:
            dist.broadcast(torch.ones(2), 0)
        else:
            dist.all_reduce(torch.ones(2))
