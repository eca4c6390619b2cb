"""PyTorch's own distributed tests (`_DistTestBase` of the torch wheel's
torch/testing/_internal/distributed/distributed_test.py) on a loom default group, run the way
PyTorch ran them for BACKEND=mpi: under mpirun, one process per rank, every rank running the same
tests in the same order on one group made once (no spawned processes).

    mpirun -np N python tests/torch/mpi_pytest.py --log-dir D -- torch_distributed_suite.py \
        [-k EXPR]        (LOOM_TORCH_SUITE_BACKEND=loom | gloo_plugin, LOOM_TORCH_SUITE_TMP=DIR)

What each test's outcome means here:
- passed: as on Gloo;
- skipped: the reason is the test's own (torch's decorators: a GPU, NCCL, a world size, a backend
  named gloo; loom opts in to DDP, subgroups and plugin tests through torch's DistTestCases
  tables, as a plugin backend is meant to); its sys.exit(<TEST_SKIPS code>), which would end this shared process, becomes a
  unittest skip with TEST_SKIPS' message;
- xfail (strict, so an unexpected pass fails the run): a test torch fails for every backend
  registered as a plugin, each listed in PLUGIN_FAILURES with why. The ctest torch_suite_gloo_plugin
  runs exactly those tests on Gloo registered as a plugin (LOOM_TORCH_SUITE_BACKEND=gloo_plugin),
  where they must fail the same way.

TEMP_DIR (the tests' file barrier and lock) is LOOM_TORCH_SUITE_TMP, shared by the ranks; rank 0
empties it before the first test. Every loom operation is bounded by LOOM_TIMEOUT_S.
"""
import functools
import os
import shutil
import sys
import unittest

import torch
import torch.distributed as dist

BACKEND = os.environ.get("LOOM_TORCH_SUITE_BACKEND", "loom")
if BACKEND == "loom":
    import loom_torch  # noqa: F401  registers "loom", fills RANK/WORLD_SIZE/MASTER_* from mpirun
else:
    import loom_torch  # noqa: F401  (the same mpirun environment for torch's store)
    from torch.distributed import ProcessGroupGloo

    def _gloo_plugin(store, rank, size, timeout):
        return ProcessGroupGloo(store, rank, size, timeout)

    dist.Backend.register_backend("gloo_plugin", _gloo_plugin, devices=["cpu"])

WORLD = int(os.environ["WORLD_SIZE"])
TEMP = os.environ["LOOM_TORCH_SUITE_TMP"]
os.environ["BACKEND"] = BACKEND
os.environ["TEMP_DIR"] = TEMP
os.environ.setdefault("INIT_METHOD", "env://")

from torch.testing._internal.common_distributed import (  # noqa: E402
    TEST_SKIPS, DistTestCases)
from torch.testing._internal.common_utils import TestCase  # noqa: E402

# torch's tables of what a backend implements, read by the tests' decorators when
# distributed_test is imported: a plugin backend opts in to what it does. loom does DDP,
# subgroups and what torch tests of a plugin; "gpu" holds the backends registered for cpu and
# cuda (Gloo is one), which gates the object collectives and most CPU DDP tests: those that need
# GPUs skip on torch's own GPU checks on a machine without them.
for _feature in ("ddp", "subgroup", "plugin", "gpu"):
    DistTestCases.backend_feature[_feature].add(BACKEND)
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    Barrier, DistributedTest)

torch.set_num_threads(1)

# Tests that fail for any backend torch knows only as a plugin, with the reason; the
# torch_suite_gloo_plugin ctest shows each failing on Gloo registered as a plugin too.
PLUGIN_FAILURES = {
    "test_ddp_logging_data_cpu":
        "DDP's logging data records the backend name of the group; a plugin's is 'custom' "
        "(ProcessGroup.BackendType.CUSTOM), and the test expects dist.get_backend()",
}


def _as_skip(test):
    """torch's GPU and world-size decorators end the test's process with a TEST_SKIPS exit code
    (they expect one process per test): here that is a unittest skip with TEST_SKIPS' message."""
    @functools.wraps(test)
    def run(self, *args, **kwargs):
        try:
            return test(self, *args, **kwargs)
        except SystemExit as e:
            for skip in TEST_SKIPS.values():
                if e.code == skip.exit_code:
                    raise unittest.SkipTest(skip.message) from None
            raise
    return run


class TestLoomBackend(TestCase, DistributedTest._DistTestBase):
    """_DistTestBase's tests on this job's default group (made once, below)."""

    @property
    def world_size(self):
        return os.environ["WORLD_SIZE"]  # as TestDistBackend: a string

    @property
    def init_method(self):
        return "env://"

    def setUp(self):
        super().setUp()
        self.rank = dist.get_rank()
        self.skip_return_code_checks = []


for _name in list(vars(DistributedTest._DistTestBase)):
    if _name.startswith("test_"):
        _test = _as_skip(getattr(DistributedTest._DistTestBase, _name))
        if _name in PLUGIN_FAILURES:
            _test = unittest.expectedFailure(_test)
        setattr(TestLoomBackend, _name, _test)

if os.environ.get("LOOM_TORCH_SUITE_ONLY_PLUGIN_FAILURES"):
    # The Gloo-as-plugin run: only the listed tests, each of which must fail there as well.
    # (unittest and pytest collect only callable attributes).
    for _name in list(vars(DistributedTest._DistTestBase)):
        if _name.startswith("test_") and _name not in PLUGIN_FAILURES:
            setattr(TestLoomBackend, _name, None)


def _setup_job():
    rank = int(os.environ["RANK"])
    if rank == 0:
        shutil.rmtree(TEMP, ignore_errors=True)
        for sub in ("barrier", "test_dir", "init_dir"):
            os.makedirs(os.path.join(TEMP, sub), exist_ok=True)
    dist.init_process_group(BACKEND)
    dist.barrier()  # TEMP is ready on every rank
    Barrier.init() if rank == 0 else None
    dist.barrier()


_setup_job()
