"""The loom Backend behind a torch.distributed group."""
import torch
import torch.distributed as dist

from ._C import ProcessGroupLoom


def backend_of(group=None):
    """The ProcessGroupLoom behind a torch.distributed group (default: the default group).

    Raises TypeError naming the group's backend when loom does not run it.
    """
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    if isinstance(group, ProcessGroupLoom):
        return group
    try:
        backend = group._get_backend(torch.device("cpu"))
    except (RuntimeError, AttributeError):
        backend = None
    if not isinstance(backend, ProcessGroupLoom):
        try:
            name = dist.get_backend(group)
        except Exception:  # a group this process is not a member of
            name = type(group).__name__
        raise TypeError("the group runs on %r, not loom (init_process_group(\"loom\") or "
                        "new_group(backend=\"loom\"))" % (name,))
    return backend
