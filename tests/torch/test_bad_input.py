"""Bad input raises RuntimeError with loom's message on every rank, before anything is sent,
and the group stays usable afterwards."""
import pytest
import torch
import torch.distributed as dist
import loom_torch
from torch.distributed import ReduceOp


def raises(code, *fragments):
    pattern = r"\[loom:%s\] .*" % code + ".*".join(fragments)
    return pytest.raises(RuntimeError, match=pattern)


# Types no CPU backend of torch's moves (Gloo refuses them too): the unsigned integers wider
# than a byte (torch >= 2.3) and the 8-bit floats.
UNMOVED = [getattr(torch, n) for n in ("uint16", "uint32", "float8_e4m3fn") if hasattr(torch, n)]


@pytest.mark.parametrize("dtype", UNMOVED, ids=str)
def test_unsupported_dtype_names_it(world, dtype):
    with raises("unsupported", "broadcast on rank", r"dtype %s is not one loom moves" %
                str(dtype).replace(".", r"\."), "float32, float64", "bool, complex64"):
        dist.broadcast(torch.zeros(4, dtype=dtype), 0)


def test_tensor_on_another_device_names_it(world, loom_group):
    """A tensor outside CPU memory (torch's meta device has none at all; Debian's torch has no
    CUDA) is refused before anything is sent, not read through its null data pointer. dist.*
    calls never bring one here (torch's dispatcher has no c10d kernel for meta); the DDP
    hook's entry point is called directly."""
    with raises("unsupported", r"allreduce \(DDP bucket\) on rank", "bucket is on meta",
                "CPU memory"):
        loom_torch.backend_of(loom_group).allreduce_bucket(torch.zeros(4, device="meta"))


def test_bitwise_reduce_ops_are_refused(world):
    with raises("unsupported", r"ReduceOp\.BAND"):
        dist.all_reduce(torch.zeros(4, dtype=torch.int32), op=ReduceOp.BAND)


def test_avg_of_bool_is_refused(world):
    with raises("unsupported", "avg is not defined for bool"):
        dist.all_reduce(torch.zeros(4, dtype=torch.bool), op=ReduceOp.AVG)


def test_root_out_of_range(world):
    rank, n, _ = world
    with raises("invalid_argument", "broadcast on rank %d of %d" % (rank, n), "root"):
        dist.broadcast(torch.zeros(4), src=n)
    with raises("invalid_argument", "reduce on rank", "root"):
        dist.reduce(torch.zeros(4), dst=-1)


def test_peer_out_of_range(world):
    rank, n, _ = world
    with raises("invalid_argument", "send on rank %d of %d" % (rank, n)):
        dist.send(torch.zeros(4), dst=n + 2)
    with raises("invalid_argument", "recv on rank %d of %d" % (rank, n)):
        dist.recv(torch.zeros(4), src=n)


def test_mismatched_sizes(world):
    rank, n, _ = world
    with raises("invalid_argument", "allgather", "output list has %d tensors" % (n + 1)):
        dist.all_gather([torch.zeros(4) for _ in range(n + 1)], torch.zeros(4))
    with raises("invalid_argument", "allgather", "output 1 is float32\\[5\\]"):
        dist.all_gather([torch.zeros(4), torch.zeros(5)] + [torch.zeros(4)] * (n - 2),
                        torch.zeros(4))
    with raises("invalid_argument", "allgather"):
        dist.all_gather_into_tensor(torch.zeros(4 * n + 1), torch.zeros(4))
    with raises("invalid_argument", "reduce_scatter"):
        dist.reduce_scatter_tensor(torch.zeros(4), torch.zeros(4 * n + 1))
    # Every rank sends everything to rank 0 and expects everything from rank 0: the ranks'
    # split sizes disagree, which each rank that receives a message of the wrong size names.
    with raises("mismatch", "alltoall", "expected %d bytes but the message from rank \\d+ with "
                "tag \\d+ has (more than )?\\d+ bytes" % (16 * n if rank else 0)):
        dist.all_to_all_single(torch.zeros(4 * n), torch.zeros(4 * n), [4 * n] + [0] * (n - 1),
                               [4 * n] + [0] * (n - 1))
    with raises("invalid_argument", "alltoall", "split sizes add up to 5 rows"):
        dist.all_to_all_single(torch.zeros(4 * n), torch.zeros(4 * n), [5] + [0] * (n - 1))
    with raises("invalid_argument", "alltoall"):
        dist.all_to_all_single(torch.zeros(4 * n), torch.zeros(4 * n + 1))


def test_non_contiguous_tensor(world):
    with raises("invalid_argument", "not contiguous"):
        dist.all_reduce(torch.zeros(4, 4).t())


def test_the_group_works_after_the_errors(world):
    rank, n, _ = world
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(sum(range(n)))))
