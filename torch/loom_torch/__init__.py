"""loom's collectives as a torch.distributed backend.

    import loom_torch                      # registers the backend "loom"
    dist.init_process_group("loom")        # under mpirun: rank, size and rendezvous from it

Importing loom_torch registers the backend "loom" with torch.distributed (a c10d Backend for
cpu and cuda: "loom" and "cpu:loom,cuda:loom" both work, and subgroups from new_group and
DeviceMesh) and an atexit hook that stops every loom group's threads before Python finalises.
Under mpirun, RANK, WORLD_SIZE and LOCAL_RANK are taken from the launcher when unset, and
MASTER_ADDR/MASTER_PORT (for torch's store) are agreed over loom's mpi backend: rank 0's host
name and a free port, in one MPI broadcast. That broadcast must happen at import: torch's env://
rendezvous reads MASTER_ADDR/MASTER_PORT inside init_process_group, before any backend of ours
is made, so every rank imports loom_torch before init_process_group (as it must to name the
backend). The first loom group made also wraps sys.excepthook (_exit_after_loom_timeout).
"""
import atexit
import os
import socket
import sys
import warnings

import torch
import torch.distributed as dist

try:
    from . import _C
except ImportError as error:  # built against another torch: the C++ signatures do not match
    raise ImportError("loom_torch could not load its extension against torch %s (%s); rebuild "
                      "it in this environment: pip install --no-build-isolation <loom>"
                      % (torch.__version__, error)) from error
if _C.TORCH_VERSION != torch.__version__:
    raise ImportError("loom_torch was built against torch %s but this environment has torch %s; "
                      "rebuild it here: pip install --no-build-isolation <loom>"
                      % (_C.TORCH_VERSION, torch.__version__))

from ._C import ProcessGroupLoom  # noqa: E402
from ._groups import backend_of  # noqa: E402
from .hooks import LoomHookState, register_ddp_hook  # noqa: E402
from .parallel import ParallelModule, parallelize  # noqa: E402

__all__ = ["ProcessGroupLoom", "LoomHookState", "register_ddp_hook", "parallelize",
           "ParallelModule", "setup_environment", "backend_of", "transports"]


def transports():
    """The transports between processes this package was built with, e.g. ["mpi", "ucx"].

    "mpi": loom's Open MPI backend, the default under mpirun. "ucx": loom's UCX backend, whose
    ranks meet through torch's store: the default under torchrun, mp.spawn and Lightning (and
    under mpirun with LOOM_BACKEND=ucx). `pip install .` on a machine without Open MPI builds
    ["ucx"] only.
    """
    return list(_C.transports())


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def setup_environment():
    """Fills RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from mpirun where unset.

    Called on import; a no-op outside mpirun or when all five are set. Every rank must import
    loom_torch (the address is broadcast from rank 0 over MPI).
    """
    # The launcher's variables as loom's C++ reads them (loom/environment.hpp).
    rank, size = _C.launcher_rank(), _C.launcher_world_size()
    if rank is None or size is None:
        return
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(size))
    local = _C.launcher_local_rank()
    if local is not None:
        os.environ.setdefault("LOCAL_RANK", str(local))
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return
    if "mpi" not in transports():
        # Nothing to agree on the address over: the launcher's environment must carry it.
        warnings.warn("loom_torch was built without Open MPI (transports: %s): under mpirun set "
                      "MASTER_ADDR and MASTER_PORT for torch's store yourself"
                      % ", ".join(transports()), RuntimeWarning, stacklevel=2)
        return
    mine = "%s:%d" % (socket.gethostname(), _free_port()) if rank == 0 else ""
    addr, port = _C.broadcast_from_rank0(mine).rsplit(":", 1)
    os.environ.setdefault("MASTER_ADDR", addr)
    os.environ.setdefault("MASTER_PORT", port)


_excepthook_installed = False


def _create(options, backend_options=None):
    # torch's extended creator API: the group's store, rank, size, timeout, its name and the
    # job's ranks in it (empty for the default group).
    global _excepthook_installed
    if not _excepthook_installed:
        sys.excepthook = _exit_after_loom_timeout(sys.excepthook)
        _excepthook_installed = True
    return ProcessGroupLoom(options.store, options.group_rank, options.group_size, options.timeout,
                            [int(r) for r in (options.global_ranks_in_group or [])],
                            str(options.group_id or ""))


def _exit_after_loom_timeout(previous):
    # After a loom timeout the communicator has a dead or stuck peer: MPI_Finalize at exit could
    # block forever. Print the error as usual, then end the process (non-zero) at once.
    # torch 2.x's init_process_group installs its own hook around this one, which captures what
    # it prints to prefix each line with the rank: printed there, it would be lost at os._exit.
    # So the error goes to the process's real stderr here.
    def hook(kind, value, tb):
        if not _C.any_broken():
            previous(kind, value, tb)
            return
        import traceback
        text = "".join(traceback.format_exception(kind, value, tb))
        rank = os.environ.get("RANK")
        if rank is not None:
            text = "".join("[rank%s]: %s" % (rank, line) for line in text.splitlines(True))
        sys.stdout.flush()
        out = sys.__stderr__
        out.write(text)
        out.flush()
        os._exit(1)
    return hook


if "LOOM" not in dist.Backend._plugins:
    dist.Backend.register_backend("loom", _create, extended_api=True, devices=["cpu", "cuda"])
    # Before Python finalises: every group's progress thread stopped, so none drops a tensor's
    # last reference (which takes the GIL) while the interpreter ends its threads (a group the
    # program never destroyed: PyTorch Lightning leaves the default group to the exit).
    atexit.register(_C.quiesce_all_groups)
if _C.launched_by_mpirun():
    setup_environment()
