"""What parallelize checks before it wraps a model: that this rank can (said before any
collective), and that every rank holds the same model (one allgather, each difference named)."""
import hashlib

import torch
import torch.distributed as dist


def _local_problem(model):
    """Why this rank cannot wrap `model` (None if it can): said before any collective, so that
    the peers hear of it instead of waiting."""
    trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if not trained:
        return "parallelize: the model has no parameter that requires grad"
    devices = sorted({str(p.device) for _, p in trained})
    if len(devices) > 1:
        return ("parallelize: the trained parameters are on %s; parallelize wraps a model on one "
                "device, as DDP does (move it with .to(device) first)" % " and ".join(devices))
    for name, p in trained:
        if p.device.type not in ("cpu", "cuda"):
            return ("parallelize: parameter '%s' is on %s; parallelize trains parameters on the "
                    "CPU or on a CUDA device" % (name, p.device))
        if not p.is_floating_point():
            return ("parallelize: parameter '%s' is %s; only floating-point parameters are "
                    "trained" % (name, p.dtype))
    for mname, m in model.named_modules():
        if isinstance(m, torch.nn.SyncBatchNorm):
            return ("parallelize: module '%s' is SyncBatchNorm, which torch runs on GPU only (its "
                    "forward on CPU raises; DDP refuses it on CPU too); use nn.BatchNorm1d/2d/3d on CPU"
                    % mname)
        if (isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse
                and m.weight.requires_grad):
            return ("parallelize: module '%s' is %s(sparse=True), whose gradients are sparse; "
                    "parallelize reduces dense gradients (DDP's sparse gradients are not "
                    "supported): use sparse=False" % (mname, type(m).__name__))
    return None


def _describe(model):
    """One line per parameter and buffer: what must be the same on every rank."""
    lines = ["parameter '%s' %s %s%s" % (name, str(p.dtype).replace("torch.", ""),
                                         list(p.shape), "" if p.requires_grad else " frozen")
             for name, p in model.named_parameters()]
    lines += ["buffer '%s' %s %s" % (name, str(b.dtype).replace("torch.", ""), list(b.shape))
              for name, b in model.named_buffers()]
    return lines


def _agree_on_model(group, model, problem):
    """Collective on the loom group (its deadline): every rank raises, naming what is wrong,
    if any rank refused the model or the ranks' models differ (names, dtypes, shapes, frozen
    parameters), before rank 0's state is broadcast into them."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    lines = _describe(model)
    digest = int.from_bytes(hashlib.sha256("\n".join(lines).encode()).digest()[:7], "little")
    mine = torch.tensor([1 if problem else 0, digest], dtype=torch.int64)
    every = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(every, mine, group=group)
    refused = [r for r in range(n) if every[r][0].item()]
    if problem:
        raise ValueError(problem)
    if refused:
        raise RuntimeError("parallelize on rank %d: rank(s) %s refused the model (their errors "
                           "say why); no rank wraps it" % (rank, ", ".join(map(str, refused))))
    differ = [r for r in range(n) if every[r][1].item() != every[0][1].item()]
    if not differ:
        return
    # Rank 0's description, to name the first difference on each rank that differs.
    text = torch.tensor(list("\n".join(lines).encode()) if rank == 0 else [], dtype=torch.int32)
    size = torch.tensor([text.numel()], dtype=torch.int64)
    dist.broadcast(size, 0, group=group)
    if rank != 0:
        text = torch.empty(int(size.item()), dtype=torch.int32)
    dist.broadcast(text, 0, group=group)
    theirs = bytes(text.tolist()).decode().split("\n")
    ranks = ", ".join(map(str, differ))
    if rank not in differ:
        raise RuntimeError("parallelize on rank %d: the model differs across ranks: rank(s) %s "
                           "hold other parameters or buffers than rank 0 (their errors name the "
                           "first difference); wrap the same model on every rank" % (rank, ranks))
    for k in range(max(len(lines), len(theirs))):
        here = lines[k] if k < len(lines) else "nothing"
        there = theirs[k] if k < len(theirs) else "nothing"
        if here != there:
            raise RuntimeError("parallelize on rank %d: the model differs across ranks: entry %d "
                               "is %s here and %s on rank 0 (%d entries here, %d there); wrap "
                               "the same model on every rank" % (rank, k, here, there,
                                                                 len(lines), len(theirs)))


# torch's coalescing bucket for broadcasts of model state (DDP's broadcast_bucket_size).
_BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024


def broadcast_tensors(group, tensors, source):
    """`source`'s values of `tensors` on every rank of `group` (in place, coalesced)."""
    if tensors and dist.get_world_size(group) > 1:
        dist._broadcast_coalesced(group, tensors, _BROADCAST_BUCKET_BYTES, source)


def broadcast_state(group, module, source):
    """`source`'s parameters and buffers of `module` on every rank: when wrapped, as DDP, and at
    the end of join(). Tensors without elements are left out (torch's coalescing fails on them,
    and they have nothing to send)."""
    broadcast_tensors(group, [t.detach() for t in module.state_dict(keep_vars=True).values()
                              if isinstance(t, torch.Tensor) and t.numel() > 0], source)
