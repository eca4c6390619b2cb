"""Run by torchrun (tests/torch/CMakeLists.txt): a loom group of several processes on CPU needs
mpirun; the error says so, and why, on every rank."""
import faulthandler
import os
import sys

import torch.distributed as dist
import loom_torch  # noqa: F401

faulthandler.dump_traceback_later(60, exit=True)  # never a hang: where it stood, then exit

try:
    dist.init_process_group("loom")
except RuntimeError as error:
    text = str(error)
    n = os.environ["WORLD_SIZE"]
    expected = ["[loom:unavailable]", "launched by torchrun", "Open MPI wires its processes up "
                "through mpirun's runtime", "mpirun -np %s python3" % n]
    missing = [e for e in expected if e not in text]
    if missing:
        print("rank %s: the error lacks %s: %s" % (os.environ["RANK"], missing, text))
        sys.exit(1)
    print("rank %s: refused as expected: %s" % (os.environ["RANK"], text.splitlines()[0]))
    sys.exit(0)
print("rank %s: init_process_group('loom') under torchrun did not fail" % os.environ["RANK"])
sys.exit(1)
