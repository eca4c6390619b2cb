"""DDP communication hook that reduces DDP's buckets with loom.

    model = DDP(model, process_group=group)          # group: a "loom" process group
    loom_torch.register_ddp_hook(model, compression="float16")

Each bucket DDP hands the hook is averaged in place by ProcessGroupLoom.allreduce_bucket: the
algorithm loom's selector picks for its size, started asynchronously and completed by loom's
progress engine, which completes DDP's future; with compression the bucket is cast to float16
or bfloat16 with the division by the world size folded into the cast, summed in 16 bits and
cast back as it completes (what loom's Bucketer does).
"""
import torch.distributed as dist


class LoomHookState:
    """What the hook needs: the loom group and the compression (none, float16, bfloat16)."""

    def __init__(self, group, compression="none"):
        if not hasattr(group, "allreduce_bucket"):
            raise ValueError("loom's DDP hook needs a loom process group, got %s"
                             % type(group).__name__)
        if compression not in ("none", "float16", "bfloat16", "fp16", "bf16"):
            raise ValueError("compression must be none, float16 or bfloat16, not %r"
                             % (compression,))
        self.group = group
        self.compression = compression


def allreduce_hook(state, bucket):
    """DDP comm hook: returns a Future that completes with the averaged bucket."""
    return state.group.allreduce_bucket(bucket.buffer(), state.compression).get_future()


def register_ddp_hook(model, group=None, compression="none"):
    """Registers allreduce_hook on a DistributedDataParallel model (group: DDP's by default)."""
    if group is None:
        group = model.process_group
    if group is None or group == dist.GroupMember.WORLD:
        group = dist.distributed_c10d._get_default_group()
    model.register_comm_hook(LoomHookState(group, compression), allreduce_hook)
