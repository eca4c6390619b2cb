"""DDP communication hook that reduces DDP's buckets with loom.

    model = DDP(model, process_group=group)          # group: a "loom" process group
    loom_torch.register_ddp_hook(model, compression="float16")

The hook is C++ on DDP's reducer (no Python runs per bucket). Each bucket is averaged in place
by ProcessGroupLoom.allreduce_bucket: the algorithm loom's selector picks for its size, started
asynchronously and completed by loom's progress engine, which completes DDP's future. With
compression the bucket is cast to float16 or bfloat16 with the division by the world size folded
into the cast, summed in 16 bits and cast back as it completes (what loom's Bucketer does).
Buckets are issued in DDP's order (after DDP's rebuild: the order gradients became ready, the
same on every rank, as loom's Bucketer orders them by default); docs/torch.md ("The DDP hook") says
why the next-forward priority is not applied under DDP.
"""
import torch.distributed as dist

from . import _C
from ._compress import compression_name
from ._groups import backend_of

class LoomHookState:
    """What the hook needs: the loom group and the compression (none, float16, bfloat16)."""

    def __init__(self, group, compression="none"):
        try:
            group = backend_of(group)
        except TypeError as error:
            raise ValueError("loom's DDP hook needs a loom process group: %s" % error) from None
        self.group = group
        self.compression = compression_name(compression, "loom's DDP hook")


def register_ddp_hook(model, group=None, compression="none"):
    """Registers loom's hook on a DistributedDataParallel model (group: DDP's by default).

    As with DDP's register_comm_hook, call it once, before the first forward.
    """
    if group is None:
        group = model.process_group
    if group is None or group == dist.GroupMember.WORLD:
        group = dist.distributed_c10d._get_default_group()
    state = LoomHookState(group, compression)
    _C.register_ddp_hook(model.reducer, state.group, state.compression)
    model.logger._set_comm_hook_name("loom_torch.allreduce_hook(%s)" % state.compression)
