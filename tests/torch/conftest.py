"""Fixtures of the loom_torch tests: one "loom" default group and one Gloo group per job.

Run under mpirun through mpi_pytest.py (see tests/CMakeLists.txt). Every rank runs the same
tests in the same order, so their collectives match; LOOM_TIMEOUT_S bounds every loom
operation and the Gloo group's timeout every Gloo one, so a failing rank ends the others'
tests with an error instead of a hang.
"""
import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def world():
    import loom_torch  # noqa: F401  registers "loom", fills RANK/WORLD_SIZE/MASTER_* from mpirun

    timeout = timedelta(seconds=float(os.environ.get("LOOM_TIMEOUT_S", "120")))
    dist.init_process_group("loom", timeout=timeout)
    gloo = dist.new_group(backend="gloo", timeout=timeout)
    yield dist.get_rank(), dist.get_world_size(), gloo
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def loom_group(world):
    """The default group: a torch ProcessGroup whose cpu and cuda backend is loom's."""
    return dist.distributed_c10d._get_default_group()


@pytest.fixture(scope="session")
def loom_backend(loom_group):
    """The ProcessGroupLoom behind the default group (loom's own methods)."""
    import loom_torch
    return loom_torch.backend_of(loom_group)
