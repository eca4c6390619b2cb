"""A 2 x 2 DeviceMesh on 4 ranks of loom (run at np 4): each dimension's groups are loom
subgroups, and a collective on one dimension reduces over exactly that dimension's ranks."""
import torch
import torch.distributed as dist
import loom_torch
from torch.distributed.device_mesh import init_device_mesh


def test_a_2x2_device_mesh(world):
    rank, n, _ = world
    assert n == 4
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    row, col = divmod(rank, 2)  # mesh [[0, 1], [2, 3]]: dp varies the row, tp the column
    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
    assert isinstance(loom_torch.backend_of(dp), loom_torch.ProcessGroupLoom)
    assert loom_torch.backend_of(dp).global_ranks() == [col, 2 + col]
    assert loom_torch.backend_of(tp).global_ranks() == [2 * row, 2 * row + 1]
    t = torch.full((5,), float(rank))
    dist.all_reduce(t, group=dp)
    assert torch.equal(t, torch.full((5,), float(col + 2 + col)))
    t = torch.full((5,), float(rank))
    dist.all_reduce(t, group=tp)
    assert torch.equal(t, torch.full((5,), float(4 * row + 1)))
