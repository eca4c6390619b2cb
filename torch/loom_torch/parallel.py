"""loom_torch.parallelize: loom schedules a PyTorch model's data-parallel communication.

    net, opt = loom_torch.parallelize(model, optimizer)      # after dist.init_process_group("loom")
    for x, y in data:
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()

What happens underneath, each step:

* Each parameter's gradient is handed to loom's GradientReducer (C++, parallel/) by a hook on its
  AccumulateGrad node as autograd produces it: copied into loom's bucket memory, scaled by
  1 / world size as DDP does, and its graph node signalled. Buckets are all-reduced in loom's
  fixed order, identical on every rank, on a communicator of their own (a duplicate of the loom
  group's), issued from the hook's thread and completed by loom's progress thread.
* As soon as a bucket lands, its parameters are updated by the user's own optimizer: its step()
  runs with every param group's 'params' narrowed to those parameters and each parameter's .grad
  reading the averaged gradient, so state, param groups, state_dict() and LR schedulers keep
  working. Buckets that land during backward are applied in the autograd hooks; opt.step() applies
  those that landed since and returns; the rest are applied by forward pre-hooks on every module
  (each waits only for its own parameters' bucket), so the next forward overlaps the
  communication tail. Hyperparameters are those the param groups had when backward began.
* With profiling on, each step's timeline (when each gradient was handed over, each bucket's
  allreduce, each update applied, the next forward's modules) is kept, and net.predict() replays
  it in loom's step simulator (parallel/src/reducer_prediction.cpp): the predicted step beside
  the measured one. bucket_cap_mb="auto" ranks candidate plans with the same prediction.
* net.synchronize() applies everything still pending; net.state_dict(), net.load_state_dict(),
  opt.state_dict(), opt.load_state_dict(), net.dump_dot(), net.write_trace() and net.explain() call
  it first. Code that reads the parameters through the unwrapped model right after opt.step()
  must call net.synchronize() first.

Rules, each a named error rather than a hang: one optimizer.step() per backward (accumulate with
`with net.no_sync():`), nothing between backward and step that changes what an update uses
(gradients in place, hyperparameters, param groups), no write through the unwrapped model while
an update is pending, every rank runs backward every step, a parameter that gets no gradient
needs find_unused_parameters=True, the same model on every rank (checked when wrapped), and the
model's parameters must not be moved, replaced or re-registered after wrapping (wrap it after
.to(...)). defer_updates=True gives DDP's semantics instead (backward waits for every bucket and
leaves the averages in .grad; opt.step() runs the optimizer), where the first three rules do not
apply.
"""
import contextlib
import hashlib
import time
import types
import weakref

import torch
import torch.distributed as dist
from torch.autograd import Variable

from . import _C
from ._groups import backend_of

__all__ = ["parallelize", "ParallelModule"]

# Loom's bookkeeping runs eagerly under torch.compile (a graph break), never traced.
_eager = torch.compiler.disable if hasattr(torch, "compiler") else (lambda f: f)

_COMPRESSIONS = {None: "none", "none": "none", "float16": "float16", "fp16": "float16",
                 "bfloat16": "bfloat16", "bf16": "bfloat16"}


def parallelize(model, optimizer, process_group=None, bucket_cap_mb=None, compression=None,
                find_unused_parameters=False, first_bucket_mb=1, partition_large=None,
                collectives_in_flight=0, overlap_forward=True, broadcast_buffers=True,
                rebuild_buckets=True, profile=None, priority="forward", defer_updates=False,
                gradient_as_bucket_view=True):
    """Wraps `model` and `optimizer` for data-parallel training on a loom process group.

    Returns (net, optimizer): net is a module wrapping `model` (as DDP's, its state_dict keys
    start with "module."); optimizer is the same object, its step() taken over.

    process_group: a "loom" group (default: the default group). bucket_cap_mb / first_bucket_mb:
    DDP's bucket caps; bucket_cap_mb=None (the default) is "auto", or DDP's 25 MiB with
    defer_updates=True or profile=False. bucket_cap_mb="auto": loom plans the buckets itself: the first steps run
    with DDP's 25 MiB (rebuilt in the observed order after the first step), profiled; after
    three profiled steps the step simulator predicts every candidate plan from them (bucket cap
    1 to 50 MiB x first bucket x partitioning x collectives in flight 0 to 3 x priority) on a
    wire fitted to the measured communication; rank 0 shortlists the running plan and the two
    fastest predicted that beat it, every rank runs each of them one step in turn for five
    rounds (the first not counted), and all replan to the plan with rank 0's lowest step, each
    plan's measured against the running plan's in the same rounds (net.automatic_plan says what was timed and chosen); the first_bucket_mb, partition_large, collectives_in_flight and priority given are those of the
    starting plan. "auto" profiles every step (profile=False is refused). compression: None, "float16" or "bfloat16" (cast, reduce, cast back).
    find_unused_parameters: as DDP's; parameters unused on every rank are left to the optimizer
    with the .grad they had. partition_large: cut gradients larger than the cap across buckets
    (None: when forward priority is in effect). collectives_in_flight: at most this many
    allreduces on the wire (0: no limit). priority: which ready bucket a limited wire
    (collectives_in_flight > 0) takes first, as a fixed order identical on every rank: "forward"
    (ByteScheduler's priority: buckets whose parameters the next forward needs earlier go ahead
    of lower-priority ones expected to be waiting with them) or "ready" (DDP's order: as they
    become ready). Without a limit every ready bucket is issued at once, in the ready order.
    overlap_forward: leave the updates of buckets still in flight at opt.step() to the next
    forward (False: opt.step() waits for every bucket). broadcast_buffers: rank 0's buffers before
    each forward, as DDP. rebuild_buckets: after the first step, rebuild the buckets in the order
    the gradients became ready (rank 0's), as DDP. profile: record each step's timeline for
    write_trace()/explain()/dump_dot() durations and net.predict() (None: LOOM_TRACE decides).
    defer_updates: DDP's semantics: backward ends once every bucket has landed, with the averaged
    gradients in .grad, and opt.step() updates the parameters itself. Code that reads or changes
    the gradients or the param groups between backward and step (clip_grad_norm_, a learning
    rate set right before step(), add_param_group), several backwards before one step, and a
    backward through this model that its optimizer does not step (a GAN's generator step through
    the discriminator) then work as with DDP; the communication still overlaps backward in
    loom's buckets and order, but no update overlaps it and the next forward waits for nothing.
    (False: each bucket's update is applied as it lands; those uses are named errors.)
    gradient_as_bucket_view: as DDP's: once handed over, each .grad is the parameter's slot in
    loom's bucket memory (one copy of the gradients, and no copy of the average back into .grad);
    False: .grad stays the tensor autograd made, the average copied into it.
    Uneven inputs: `with net.join():` around the loop (DDP's join(); ParallelModule.join).
    """
    if bucket_cap_mb is None:
        # The default: loom plans the buckets itself, unless defer_updates asks for DDP's
        # semantics (the plan's search models updates that overlap the communication).
        bucket_cap_mb = 25 if defer_updates or profile is False else "auto"
    automatic = isinstance(bucket_cap_mb, str)
    if automatic:
        if bucket_cap_mb != "auto":
            raise ValueError("parallelize: bucket_cap_mb must be a size in MiB or 'auto', not %r"
                             % (bucket_cap_mb,))
        if profile is False:
            raise ValueError("parallelize: bucket_cap_mb='auto' plans from profiled steps; it "
                             "cannot run with profile=False")
        if defer_updates:
            raise ValueError("parallelize: bucket_cap_mb='auto' plans the overlap of updates "
                             "with communication; with defer_updates=True give a bucket cap in "
                             "MiB")
        profile = True
        bucket_cap_mb = 25  # DDP's, until the plan is made
    if priority not in ("forward", "ready"):
        raise ValueError("parallelize: priority must be 'forward' or 'ready', not %r"
                         % (priority,))
    if partition_large is None:
        partition_large = priority == "forward" and int(collectives_in_flight) > 0
    if compression not in _COMPRESSIONS:
        raise ValueError("parallelize: compression must be None, 'float16' or 'bfloat16', not %r"
                         % (compression,))
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("parallelize: optimizer must be a torch.optim.Optimizer, not %s"
                        % type(optimizer).__name__)
    group = process_group
    if group is None or group == dist.GroupMember.WORLD:
        group = dist.distributed_c10d._get_default_group()
    try:
        backend_of(group)
    except TypeError as error:
        raise ValueError("parallelize needs a loom process group (dist.init_process_group(\"loom\")"
                         "): %s" % error) from None
    previous = _WRAPPED.get(model)
    previous = previous() if previous is not None else None
    driver = getattr(optimizer, "_loom_engine", None)
    driver = driver() if driver is not None else None
    if driver is not None and not driver.closed and driver is not previous:
        raise ValueError("parallelize: this optimizer is already driven by another "
                         "parallelized model (one optimizer per wrapped model)")
    if previous is not None and not previous.closed:
        # Wrapping a model again (a new optimizer, other options): the previous wrapper lets go
        # of the model (its pending updates applied, its hooks removed) and refuses to run.
        previous.close()
    net = ParallelModule(model, optimizer, group, dict(
        bucket_cap_mb=float(bucket_cap_mb), first_bucket_mb=float(first_bucket_mb),
        partition_large=bool(partition_large), collectives_in_flight=int(collectives_in_flight),
        compression=_COMPRESSIONS[compression], track_usage=bool(find_unused_parameters),
        priority=priority, wire_ratio=1.0),
        overlap_forward=overlap_forward, broadcast_buffers=broadcast_buffers,
        rebuild_buckets=rebuild_buckets, profile=profile, automatic=automatic,
        defer_updates=bool(defer_updates), gradient_as_bucket_view=bool(gradient_as_bucket_view))
    _WRAPPED[model] = weakref.ref(net._loom)
    return net, optimizer


# model -> the engine wrapping it (weakly: a model can be deep-copied, pickled and freed).
_WRAPPED = weakref.WeakKeyDictionary()


def _local_problem(model):
    """Why this rank cannot wrap `model` (None if it can): said before any collective, so that
    the peers hear of it instead of waiting."""
    trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if not trained:
        return "parallelize: the model has no parameter that requires grad"
    for name, p in trained:
        if p.device.type != "cpu":
            return ("parallelize: parameter '%s' is on %s; loom_torch.parallelize reduces CPU "
                    "parameters only so far" % (name, p.device))
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


def _first_tensor_needing_grad(value):
    if isinstance(value, torch.Tensor):
        return value if value.requires_grad else None
    if isinstance(value, (list, tuple)):
        items = value
    elif isinstance(value, dict):
        items = value.values()
    else:
        return None
    for item in items:
        found = _first_tensor_needing_grad(item)
        if found is not None:
            return found
    return None


class _WrittenWhilePending(RuntimeError):
    """A parameter was written through the unwrapped model while its update was pending."""


def _autograd_running():
    """Whether autograd is running a backward on this thread (final callbacks can be queued
    only then)."""
    try:
        Variable._execution_engine.queue_callback(_nothing)
    except RuntimeError:
        return False
    return True


def _nothing():
    pass


def _same_value(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and torch.equal(a, b))
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):
        return False


class _EngineHook:
    """A hook that calls its engine's method while the engine lives (held weakly, so a dropped
    wrapper lets go of the model). A copy or a pickle of the model (an EMA copy, torch.save of
    the module) carries an inert hook instead: the copy is not this wrapper's."""

    __slots__ = ("engine", "method", "args")

    def __init__(self, engine, method, *args):
        self.engine = weakref.ref(engine)
        self.method = method
        self.args = args

    @_eager
    def __call__(self, *call_args):
        engine = self.engine()
        if engine is not None and not engine.closed:
            getattr(engine, self.method)(*self.args, *call_args)

    def __reduce__(self):
        return (_inert_hook, ())

    def __deepcopy__(self, memo):
        return _InertHook()


class _InertHook:
    def __call__(self, *args):
        return None

    def __reduce__(self):
        return (_inert_hook, ())


def _inert_hook():
    return _InertHook()


# Reads of the wrapped model that see its weights: each applies the updates still pending from
# the last optimizer.step() first (the unwrapped model, net.module, an EMA, a metric, a
# checkpoint all read the updated values). Installed on the model instance, so the per-step
# path (the wrapped forward, the optimizer) never runs them.
# zero_grad(set_to_none=True) only drops each .grad: it reads no weight, and runs in every
# step's loop (model.zero_grad()), so it never waits for the pending updates.
_FRESH_READS = ("parameters", "named_parameters", "state_dict", "__reduce_ex__", "zero_grad")


# The model's attribute that keeps an engine with pending updates alive (left out of pickles).
_PENDING = "_loom_pending_updates"


class _FreshRead:
    """The model's own method `name`, after the engine's pending updates are applied. A copy or
    a pickle of the model (deepcopy for an EMA, torch.save of the module) is a plain module:
    __reduce_ex__ leaves these out of the state it hands over."""

    __slots__ = ("engine", "module", "name")

    def __init__(self, engine, module, name):
        self.engine = weakref.ref(engine)
        self.module = weakref.ref(module)
        self.name = name

    @_eager
    def __call__(self, *args, **kwargs):
        engine, module = self.engine(), self.module()
        if self.name == "zero_grad" and (args[0] if args else kwargs.get("set_to_none", True)):
            for p in torch.nn.Module.parameters(module):
                p.grad = None  # (Module.zero_grad's own set_to_none path)
            return None
        if engine is not None and not engine.closed:
            engine.before_read()
        result = getattr(type(module), self.name)(module, *args, **kwargs)
        if self.name == "__reduce_ex__" and isinstance(result, tuple) and len(result) > 2 \
                and isinstance(result[2], dict):
            state = {k: v for k, v in result[2].items()
                     if not isinstance(v, _FreshRead) and k != _PENDING}
            result = result[:2] + (state,) + result[3:]
        return result

    @property
    def __func__(self):
        # What a bound method has: the function it calls (torch.compile checks that the
        # module's named_parameters is nn.Module's own, to trace the module as usual).
        module = self.module()
        return getattr(type(module), self.name) if module is not None else None

    def __reduce__(self):  # only reached through a state this class did not filter
        return (_inert_hook, ())

    def __deepcopy__(self, memo):
        return _InertHook()


class _Engine:
    """The per-step state machine between autograd, the optimizer and loom's GradientReducer."""

    # bucket_cap_mb="auto": the plan is made once this many steps were profiled under the
    # starting plan (after DDP's rebuild of the buckets in the observed order, when enabled).
    AUTO_PLAN_AFTER = 3
    # Then the running plan and the best predicted that beat it (AUTO_SHORTLIST in all) run one
    # step each in turn, AUTO_TRIAL_ROUNDS rounds (the first not counted), and rank 0's periods
    # decide, each plan's taken against the running plan's in the same round
    # (PlanTrials::steps_s): the simulator ranks, the clock chooses.
    AUTO_SHORTLIST = 3
    # Five: a median of four same-round ratios per plan. With two counted steps one noisy step
    # on a loaded host decided (the MLP's chosen plan timed 15% faster in its trials and ran 13%
    # slower after); with three raw medians the transformer kept a 4 MiB cap whose last bucket
    # left 30 ms exposed where 1 and 2 MiB caps left 15 ms.
    AUTO_TRIAL_ROUNDS = 5

    def __init__(self, module, optimizer, group, plan, overlap_forward, rebuild_buckets, profile,
                 automatic=False, defer_updates=False, gradient_as_bucket_view=True):
        self.module = module
        self.optimizer = optimizer
        self.group = group
        self.plan = plan
        self.overlap_forward = overlap_forward
        self.defer_updates = defer_updates
        self.closed = False
        self.read_targets = [module]  # where reads apply pending updates (ParallelModule sets)
        self.rebuild_pending = rebuild_buckets
        # Zero-element parameters have nothing to reduce: the optimizer steps them at step()
        # like any parameter outside the model.
        named = [(name, p) for name, p in module.named_parameters()
                 if p.requires_grad and p.numel() > 0]
        if not named:
            raise ValueError("parallelize: the model has no parameter with elements that "
                             "requires grad")
        owner = {}
        for mname, m in module.named_modules():
            for p in m.parameters(recurse=False):
                owner.setdefault(id(p), mname)
        self.names = [name for name, _ in named]
        self.params = [p for _, p in named]
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.reducer = _C.GradientReducer(
            backend_of(group), self.names, [owner.get(id(p), "") for p in self.params], self.params,
            plan["bucket_cap_mb"], plan["first_bucket_mb"], plan["partition_large"],
            plan["collectives_in_flight"], plan["compression"], plan["track_usage"], profile,
            plan["priority"])
        # gradient_as_bucket_view (DDP's): each .grad is its parameter's slot in loom's bucket
        # memory once handed over (autograd then accumulates into the bucket itself), not a
        # tensor beside it; a parameter whose memory is not contiguous keeps its own .grad (the
        # slot is contiguous, and .grad's layout follows the parameter's).
        self.as_bucket_view = [gradient_as_bucket_view and p.is_contiguous() for p in self.params]
        # join(divide_by_initial_world_size=False): world / ranks training, for the step in
        # progress (its updates may land in the next forward) and for the next one.
        self.grad_scale = self.next_scale = 1.0
        self.joining = None          # the options of the join() in force
        self.last_active = None      # join(): which ranks trained in the last step
        self._layout()
        # The step's timeline for the simulator (net.predict(), bucket_cap_mb="auto"): what
        # this thread did, in ns since the step's begin(); kept only while profiling.
        self.profiling = self.reducer.profiling()
        self.t0 = None               # monotonic ns of the open step's begin()
        self.last_period = None      # seconds from the last step's begin() to this one's
        self.timeline_updates, self.timeline_waits = [], []
        self.timeline_forward, self.timeline_forward_end = [], 0
        self.automatic = automatic   # a plan still to be made (bucket_cap_mb="auto")
        self.automatic_plan = None   # what the automatic plan decided
        self.steps_since_plan = 0
        self.seen = [None] * len(self.params)
        # .grad's version counter as loom last left it (handed over, or the average copied in):
        # a change before optimizer.step() is the user's (clip_grad_norm_) and a named error.
        self.seen_version = [0] * len(self.params)
        self.pending_versions = {}   # parameter -> its version at step(), update still pending
        self.step_narrow = None      # the param groups' membership when backward began
        # Step state.
        # A reduced forward ran since the last reduced backward began: only then is a backward
        # reduced (as DDP: a backward through the unwrapped model is none of loom's business).
        self.expect_backward = False
        self.output_at = None  # monotonic ns when this backward reached the output
        # As DDP's require_forward_param_sync: the buffers are broadcast before a forward that
        # follows a grad-enabled, reduced forward (not before evaluation's forwards).
        self.forward_param_sync = True
        self.no_sync_depth = 0
        self.in_backward = False     # a reduced backward began and did not end
        self.awaiting_step = False   # a reduced backward ended, optimizer.step() not yet called
        self.updates_pending = False  # optimizer.step() left updates to land during the forward
        self.in_wrapped_forward = False
        self.hyper = None            # the param groups' hyperparameters when backward began
        self.narrow_key = None
        self.narrow = None
        # Autograd hooks: keep every AccumulateGrad node, or its hook never fires.
        # The hooks hold the engine weakly: a wrapper dropped by the user lets go of the model.
        self.accumulators, self.handles = [], []
        with torch.enable_grad():
            for i, p in enumerate(self.params):
                accumulate = p.expand_as(p).grad_fn.next_functions[0][0]
                self.handles.append(accumulate.register_hook(_EngineHook(self, "_on_gradient",
                                                                         i)))
                self.accumulators.append(accumulate)
        # Forward pre-hooks on every module that registers trainable parameters itself (not only
        # leaves: nn.MultiheadAttention's in_proj_weight belongs to a non-leaf module).
        # A module whose forward is never called (nn.MultiheadAttention reads out_proj.weight
        # itself) is learnt in the first forward: its parameters are then guarded by the nearest
        # ancestor whose pre-hook fired (by the wrapper's forward if none did).
        self.guards = {}   # module name -> the parameter indices its pre-hook waits for
        self.root_guard = []
        self.fired = set()
        self.learning = True
        for mname, m in module.named_modules():
            mine = sorted({self.index[id(p)] for p in m.parameters(recurse=False)
                           if id(p) in self.index})
            if mine:
                self.guards[mname] = mine
                self.handles.append(m.register_forward_pre_hook(
                    _EngineHook(self, "_before_module", mname, mine)))
        self.signature = self._signature()
        # Per step, a quick look at the trained parameters (moved, cast, frozen); the whole
        # registration is compared every FULL_CHECK_EVERY steps (named_modules() costs ~1 ms per
        # step on a model of 60 tensors: the per-step overhead DDP does not have).
        self.quick = [(p, p.data_ptr()) for p in self.params]
        self.checks = 0
        # As DDP: the buffers the model had when wrapped (those with elements).
        self.buffers = [b for b in module.buffers() if b.numel() > 0]
        self.step_function = type(optimizer).step

    # -- layout (rebuilt after a replan) --------------------------------------------------------
    def _layout(self):
        self.groups = self.reducer.update_groups()
        self.group_of = [0] * len(self.params)
        for k, members in enumerate(self.groups):
            for i in members:
                self.group_of[i] = k
        self.views = [self.reducer.gradient(i) for i in range(len(self.params))]
        self.applied = [True] * len(self.groups)
        self.narrow_key = None

    def _release_views(self):
        """Before the buckets are rebuilt (their memory freed): a .grad that is a bucket slot
        becomes a tensor of its own, with the same values."""
        for i, p in enumerate(self.params):
            grad = p.grad
            if grad is not None and grad is self.views[i]:
                p.grad = grad.clone()

    def _signature(self):
        # Frozen parameters may move freely (nothing of loom refers to them).
        return [(id(p), p.data_ptr() if p.requires_grad else 0, p.requires_grad)
                for p in torch.nn.Module.parameters(self.module)]

    FULL_CHECK_EVERY = 64

    def check_registration(self):
        """Raises if the model changed since it was wrapped; True if every trained parameter is
        frozen for this forward (requires_grad=False on all of them, nothing else changed)."""
        self.checks += 1
        if self.checks % self.FULL_CHECK_EVERY != 1:
            for p, ptr in self.quick:
                if p.data_ptr() != ptr or not p.requires_grad:
                    break
            else:
                return False
        now = self._signature()
        if now == self.signature:
            return False
        if (all(not p.requires_grad for p in self.params)
                and all(p.data_ptr() == ptr for p, ptr in self.quick)
                and [entry[0] for entry in now] == [entry[0] for entry in self.signature]):
            return True
        named = list(torch.nn.Module.named_parameters(self.module))
        before = {entry[0]: entry for entry in self.signature}
        for name, p in named:
            old = before.get(id(p))
            if old is None:
                raise RuntimeError("loom_torch.parallelize: parameter '%s' was registered after "
                                   "the model was wrapped; wrap the finished model" % name)
            if old[1] != p.data_ptr() and p.requires_grad:
                raise RuntimeError("loom_torch.parallelize: parameter '%s' was moved or replaced "
                                   "after the model was wrapped (its memory changed: .to(), "
                                   ".double(), .data = ...); move the model before parallelize()"
                                   % name)
            if old[2] != p.requires_grad:
                raise RuntimeError("loom_torch.parallelize: parameter '%s' changed requires_grad "
                                   "after the model was wrapped; freeze parameters before "
                                   "parallelize(), or all of its trained parameters for a "
                                   "forward whose backward this model takes no part in (a "
                                   "GAN's generator step through the discriminator)" % name)
        raise RuntimeError("loom_torch.parallelize: parameters were removed from the model after "
                           "it was wrapped (%d now, %d then)" % (len(now), len(self.signature)))

    # -- backward -----------------------------------------------------------------------------
    def on_output_gradient(self, grad):
        # When backward reached the output: the step's start for the timeline. The step itself
        # begins with the first gradient (torch.autograd.grad through the output, a gradient
        # penalty, accumulates none and must not begin one).
        if not self.in_backward and self.expect_backward:
            self._refuse_second_backward()  # before any gradient accumulates into .grad
            self.output_at = time.monotonic_ns()
        return None

    def _refuse_second_backward(self):
        if self.awaiting_step and not self.defer_updates:
            raise RuntimeError(
                "loom_torch.parallelize: backward on rank %d began, but optimizer.step() was not "
                "called after the previous backward; parallelize updates the parameters as their "
                "gradients land, so every backward is followed by optimizer.step() (accumulate "
                "gradients with `with net.no_sync():`; a backward through this model that its "
                "optimizer does not step, as a GAN's generator step through the discriminator, "
                "freezes all of its parameters for that forward; or wrap with "
                "defer_updates=True for DDP's semantics). The previous backward's updates were "
                "applied" % self.rank)

    def recover_if_backward_failed(self):
        """The last reduced backward raised (autograd never ran its end callback, so in_backward
        stayed set): its step is completed here as a peer's would be, every update applied.
        Called from user-level entry points (a forward, synchronize(), close()), never while
        autograd runs."""
        if not self.in_backward or _autograd_running():
            return
        self.in_backward = False
        self.awaiting_step = False
        for i in self.reducer.missing():  # the same communication as the ranks that went on
            self.reducer.mark_unused(i)
        if self.plan["track_usage"]:
            self.reducer.backward_done()
        # Every update is applied (gradients that never came count as zero), as on a peer whose
        # backward went on: which buckets landed before the failure depends on timing, so only
        # applying all of them keeps the ranks' parameters identical.
        self.synchronize()

    def _learn_guards(self):
        self.learning = False
        for mname, mine in list(self.guards.items()):
            if mname in self.fired:
                continue
            parts = mname.split(".") if mname else []
            target = self.root_guard
            while parts:
                parts.pop()
                ancestor = ".".join(parts)
                if ancestor in self.fired:
                    target = self.guards[ancestor]
                    break
            target[:] = sorted(set(target) | set(mine))

    def _begin_backward(self, shadow=False):
        if self.learning:
            self._learn_guards()
        self._refuse_second_backward()
        now = self.output_at if self.output_at is not None else time.monotonic_ns()
        self.output_at = None
        self.synchronize()
        self._record_step(now)
        if self.rebuild_pending:
            self._rebuild_buckets()
        if self.automatic and self.steps_since_plan >= self.AUTO_PLAN_AFTER:
            self._plan_automatically()
        elif self.reducer.timing_plans() and self.last_period is not None:
            self._time_plans()
        self.hyper = [{key: value for key, value in g.items() if key != "params"}
                      for g in self.optimizer.param_groups]
        self.step_narrow = self._narrowed()
        self.step_orphans = self.orphan_groups
        self.grad_scale = self.next_scale
        self.pending_versions = {}
        self.seen = [None] * len(self.params)  # this step's gradients only
        if self.profiling:
            self.timeline_updates, self.timeline_waits = [], []
            self.timeline_forward, self.timeline_forward_end = [], 0
            self.t0 = now
        self.expect_backward = False
        self.reducer.begin()
        self.steps_since_plan += 1
        self.applied = [False] * len(self.groups)
        self.in_backward = True
        if not shadow:
            Variable._execution_engine.queue_callback(self._end_backward)

    def _record_step(self, now):
        # The step that just finished, up to now (the next begin()), for the simulator.
        if self.t0 is None:
            return
        end = now - self.t0
        self.t0 = None
        self.last_period = end * 1e-9
        if not self.timeline_forward:
            return  # no forward since its backward: nothing to gate on its updates
        s = 1e-9
        self.reducer.record_step(
            end * s,
            [(name, indices, entered * s, resumed * s)
             for name, indices, entered, resumed in self.timeline_forward],
            self.timeline_forward_end * s,
            [(k, start * s, stop * s) for k, start, stop in self.timeline_updates],
            [(start * s, stop * s) for start, stop in self.timeline_waits])

    def _plan_automatically(self):
        # Collective, at the same step on every rank: rank 0 ranks the plans from its profiled
        # steps and shares its shortlist, which then runs one step per plan in turn.
        self.automatic = False
        self.last_period = None
        self._release_views()
        chosen = self.reducer.shortlist_plans(self.AUTO_SHORTLIST, self.AUTO_TRIAL_ROUNDS)
        if chosen is not None:  # no plan predicted faster than the running one: nothing to time
            self._decided(chosen)

    def _time_plans(self):
        # Collective: every rank records the period it measured (rank 0's decide) and moves to
        # the next trial plan, or to the fastest once every plan ran its rounds.
        self._release_views()
        chosen = self.reducer.trial_step(self.last_period)
        self.last_period = None
        if chosen is None:
            self._layout()
        else:
            self._decided(chosen)

    def _decided(self, chosen):
        self.automatic_plan = chosen
        for key in ("bucket_cap_mb", "first_bucket_mb", "partition_large",
                    "collectives_in_flight", "priority", "wire_ratio"):
            self.plan[key] = chosen[key]
        self.steps_since_plan = 0
        self._layout()

    def _rebuild_buckets(self):
        # As DDP after its first iteration: buckets filled in the order the gradients became
        # ready in the first step, rank 0's order on every rank (a collective, at the same point
        # of every rank's second backward).
        order = self.reducer.observed_ready_order()
        if not order:
            return
        self.rebuild_pending = False
        agreed = self.reducer.agreed(order)
        p = self.plan
        self._release_views()
        self.reducer.replan(p["bucket_cap_mb"], p["first_bucket_mb"], p["partition_large"],
                            p["collectives_in_flight"], p["compression"], p["track_usage"],
                            agreed, [], p["priority"], p["wire_ratio"])
        self.steps_since_plan = 0
        self._layout()

    def _on_gradient(self, i, grad_inputs, grad_outputs):
        if not self.in_backward:
            if not self.expect_backward:
                # No reduced forward (grad-enabled, outside no_sync, not wholly frozen) since
                # the last reduced backward began: this backward is not reduced, as DDP's.
                return
            self._begin_backward()
        grad = self.params[i].grad
        if grad is None:
            raise RuntimeError("loom_torch.parallelize: parameter '%s' has no .grad after its "
                               "gradient was accumulated" % self.names[i])
        self._hand_over(i, grad)
        if not self.defer_updates:
            self._apply_landed()

    def _name_list(self, indices):
        """The first five parameters' names, quoted, and how many more."""
        names = ", ".join("'%s'" % self.names[i] for i in indices[:5])
        return names + (" and %d more" % (len(indices) - 5) if len(indices) > 5 else "")

    def _hand_over(self, i, grad, used=True):
        self.reducer.ready(i, grad, used=used)  # (in place when .grad is the slot already)
        if self.as_bucket_view[i] and grad is not self.views[i]:
            grad = self.views[i]
            self.params[i].grad = grad  # autograd's tensor is freed: one copy of the gradients
        self.seen[i] = weakref.ref(grad)
        self.seen_version[i] = grad._version

    def _end_backward(self):
        self.in_backward = False
        self.awaiting_step = True
        missing = self.reducer.missing()
        for i in missing:  # every rank hands every gradient over: the same communication
            grad = self.params[i].grad
            if grad is not None and self.plan["track_usage"]:
                # Unused here in this backward, but this rank holds a gradient (accumulated
                # under no_sync): DDP sends it; it does not count as a use.
                self._hand_over(i, grad, used=False)
            else:
                self.reducer.mark_unused(i)
        self.reducer.backward_done()
        if missing and not self.plan["track_usage"]:
            raise RuntimeError(
                "loom_torch.parallelize: on rank %d, %d parameter(s) received no gradient in this "
                "backward: %s. Pass find_unused_parameters=True to parallelize() if the model "
                "leaves parameters unused in some steps (or freeze them before wrapping)"
                % (self.rank, len(missing), self._name_list(missing)))
        if self.defer_updates:
            self._land_all()
        else:
            self._apply_landed()
            for k in self.step_orphans:
                self.wait_and_apply(k)  # (copies the average into the .grad autograd made)
                self._copy_average(k, missing_only=True)  # as DDP, .grad where none was

    def _land_all(self):
        # defer_updates: as DDP's backward, this one ends with every average in .grad; the
        # optimizer runs in opt.step() on the whole model.
        try:
            for k in range(len(self.groups)):
                self.reducer.wait_update(k)
                try:
                    self._scale_landed(k)
                    self._copy_average(k)
                finally:
                    self.applied[k] = True
                    self.reducer.updated(k)
        finally:
            self.reducer.finish()

    def _scale_landed(self, k):
        # join(divide_by_initial_world_size=False): the sum over the ranks still training, not
        # over every rank (the reducer divides by the world size).
        if self.grad_scale == 1.0:
            return
        for i in self.groups[k]:
            self.views[i].mul_(self.grad_scale)
            if self.params[i].grad is self.views[i]:
                self.seen_version[i] = self.views[i]._version

    # -- join(): uneven inputs --------------------------------------------------------------------
    def join_round(self, training, broadcast):
        """Collective on the group, once per reduced step while join() is in force: which ranks
        still train (a rank that ran out of inputs says 0) and whether they broadcast the
        buffers in this forward. Returns the ranks still training."""
        flags = torch.zeros(self.world + 1, dtype=torch.int64)
        if training:
            flags[self.rank] = 1
            flags[self.world] = int(broadcast)
        dist.all_reduce(flags, group=self.group)
        mask = flags.tolist()
        training_ranks = [r for r in range(self.world) if mask[r]]
        options = self.joining
        if training_ranks:
            self.last_active = training_ranks
            if options["throw"] and len(training_ranks) < self.world:
                done = [r for r in range(self.world) if not mask[r]]
                raise RuntimeError(
                    "loom_torch.parallelize: rank(s) %s ran out of inputs while rank(s) %s still "
                    "train (join(throw_on_early_termination=True) raises on every rank; this is "
                    "rank %d)" % (", ".join(map(str, done)), ", ".join(map(str, training_ranks)),
                                  self.rank))
            self.next_scale = (1.0 if options["divide"] else
                               float(self.world) / len(training_ranks))
        return training_ranks, mask[self.world] > 0

    def shadow_step(self):
        """join(): this rank ran out of inputs, its peers still train: it takes part in their
        step as a backward with no gradient (zeros, as DDP's joined ranks), and applies the same
        averaged update to its own parameters, so it stays with them."""
        self._begin_backward(shadow=True)
        for i in range(len(self.params)):
            self.reducer.mark_unused(i)
        self.reducer.backward_done()
        self.in_backward = False
        self.awaiting_step = False
        self.synchronize()
        if self.defer_updates:  # the averages are in .grad: the step the peers take
            self.step_function(self.optimizer)

    def _copy_average(self, k, missing_only=False):
        # Group k's averages into .grad (only where there is none: missing_only).
        track = self.plan["track_usage"]
        for i in self.groups[k]:
            if track and self.reducer.globally_unused(i):
                continue  # as DDP: its .grad is left as it was
            p = self.params[i]
            if p.grad is None:
                p.grad = self.views[i] if self.as_bucket_view[i] else self.views[i].clone()
            elif not missing_only and p.grad is not self.views[i]:
                p.grad.copy_(self.views[i])

    # -- updates --------------------------------------------------------------------------------
    def _apply_landed(self):
        for k in self.reducer.poll():
            self._apply(k)

    def _narrowed(self):
        groups = self.optimizer.param_groups
        key = tuple((id(g["params"]), len(g["params"])) for g in groups)
        if key != self.narrow_key:
            self.narrow = [[[] for _ in groups] for _ in self.groups]
            # The optimizer's parameters loom does not reduce (outside the model, frozen in it,
            # without elements): stepped in opt.step() with their own .grad, as without loom.
            self.outside = [[] for _ in groups]
            stepped = set()
            for gi, g in enumerate(groups):
                for p in g["params"]:
                    i = self.index.get(id(p))
                    if i is not None:
                        self.narrow[self.group_of[i]][gi].append(p)
                        stepped.add(i)
                    else:
                        self.outside[gi].append(p)
            self.any_outside = any(self.outside)
            # Update groups holding trained parameters that this optimizer does not step
            # (another optimizer does, after backward): they land before backward ends, so
            # that .grad holds the average then, as with DDP.
            self.orphan_groups = sorted({self.group_of[i] for i in range(len(self.params))
                                         if i not in stepped})
            self.stepped = stepped
            self.narrow_key = key
        return self.narrow

    def _step_outside(self):
        self._narrowed()
        if not self.any_outside:
            return
        groups = self.optimizer.param_groups
        saved = [g["params"] for g in groups]
        try:
            for g, params in zip(groups, self.outside):
                g["params"] = params
            self.step_function(self.optimizer)
        finally:
            for g, params in zip(groups, saved):
                g["params"] = params

    def _check_before_step(self):
        # Eager updates were made with the gradients and hyperparameters of when each bucket
        # landed: code between backward and step that changes them would be silently ignored.
        hint = ("parallelize applies each bucket's update as it lands, during backward; wrap "
                "with defer_updates=True to run code between backward and optimizer.step() as "
                "with DDP")
        if self._narrowed() is not self.step_narrow:
            raise RuntimeError("loom_torch.parallelize: the optimizer's param groups changed "
                               "between backward and optimizer.step() (add_param_group): %s"
                               % hint)
        for gi, g in enumerate(self.optimizer.param_groups):
            for key, value in self.hyper[gi].items():
                now = g.get(key)
                if now is not value and not _same_value(now, value):
                    raise RuntimeError(
                        "loom_torch.parallelize: param group %d's '%s' changed between backward "
                        "and optimizer.step() (%r, was %r when backward began); set it before "
                        "backward (or after step(), as LR schedulers do): %s"
                        % (gi, key, now, value, hint))
        for i, p in enumerate(self.params):
            grad = p.grad
            seen = self.seen[i]
            if grad is None or seen is None or i not in self.stepped:
                continue  # (another optimizer's parameters are its business)
            if seen() is not grad:
                raise RuntimeError(
                    "loom_torch.parallelize: the gradient of '%s' was replaced between backward "
                    "and optimizer.step() (p.grad = ...): %s" % (self.names[i], hint))
            if grad._version != self.seen_version[i]:
                raise RuntimeError(
                    "loom_torch.parallelize: the gradient of '%s' was changed in place between "
                    "backward and optimizer.step() (clip_grad_norm_, scaling): %s"
                    % (self.names[i], hint))

    def _apply(self, k):
        if self.applied[k]:
            return
        if self.t0 is not None:
            start = time.monotonic_ns() - self.t0
            self._apply_group(k)
            self.timeline_updates.append((k, start, time.monotonic_ns() - self.t0))
        else:
            self._apply_group(k)

    def _apply_group(self, k):
        pending = self.pending_versions
        if pending:
            if any(i in pending and self.params[i]._version != pending[i]
                   for i in self.groups[k]):
                # Named once, for every pending parameter written: the groups stay pending and
                # the next synchronize() (or forward) applies them on top of the writes.
                written = sorted(i for i, v in pending.items() if self.params[i]._version != v)
                pending.clear()
                raise _WrittenWhilePending(
                    "loom_torch.parallelize: parameter(s) %s were written after "
                    "optimizer.step() while their updates were still pending (an update lands "
                    "as the next forward reaches its module); call net.synchronize() before "
                    "writing the parameters through the unwrapped model (writes through .data "
                    "cannot be seen)" % self._name_list(written))
            for i in self.groups[k]:
                pending.pop(i, None)
        self.applied[k] = True
        self._scale_landed(k)
        swapped = []
        track = self.plan["track_usage"]
        for i in self.groups[k]:
            p = self.params[i]
            if track and self.reducer.globally_unused(i):
                continue  # as DDP: its .grad is left as it was
            grad = p.grad
            seen = self.seen[i]
            if (grad is not None and seen is not None and seen() is grad
                    and grad._version == self.seen_version[i]):
                if grad is not self.views[i]:
                    grad.copy_(self.views[i])  # .grad holds the average, as with DDP
                    self.seen_version[i] = grad._version
            else:
                # zero_grad() or the user replaced .grad since backward: the average is lent
                # for the update only.
                swapped.append((p, grad))
                p.grad = self.views[i]
        groups = self.optimizer.param_groups
        # The groups as they were when backward began (a group added since gets nothing).
        narrowed = self.step_narrow[k]
        saved = []
        try:
            for gi, g in enumerate(groups):
                saved.append((g["params"], {key: g[key] for key in self.hyper[gi]}
                              if gi < len(self.hyper) else {}))
                g["params"] = narrowed[gi] if gi < len(narrowed) else []
                if gi < len(self.hyper):
                    g.update(self.hyper[gi])
            self.step_function(self.optimizer)
        finally:
            for g, (params, hyper) in zip(groups, saved):
                g["params"] = params
                g.update(hyper)
            for p, grad in swapped:
                p.grad = grad
            # Signalled even if the optimizer raised: its error is the one reported, and the
            # step's end does not wait for an update node that nothing would signal.
            self.reducer.updated(k)

    def wait_and_apply(self, k):
        if not self.applied[k]:
            if self.t0 is not None:
                start = time.monotonic_ns() - self.t0
                self.reducer.wait_update(k)
                self.timeline_waits.append((start, time.monotonic_ns() - self.t0))
            else:
                self.reducer.wait_update(k)
            self._apply(k)

    def before_module(self, indices):
        if self.in_backward or all(self.applied[self.group_of[i]] for i in indices):
            return
        if self.defer_updates:  # a backward that raised before it landed its buckets
            self.synchronize()
            return
        for k in sorted({self.group_of[i] for i in indices}):
            self.wait_and_apply(k)

    def _before_module(self, name, indices, module, inputs):
        if self.learning:
            self.fired.add(name)
        if self.t0 is not None and not self.in_backward:
            entered = time.monotonic_ns() - self.t0
            self.before_module(indices)
            self.timeline_forward.append((name, indices, entered, time.monotonic_ns() - self.t0))
        else:
            self.before_module(indices)

    def before_read(self):
        """A read of the weights outside the wrapped forward (the unwrapped model's
        parameters(), state_dict(), forward, a pickle): the pending updates first."""
        if self.updates_pending and not self.in_backward and not self.in_wrapped_forward:
            self.synchronize()

    def before_unwrapped_forward(self, module, inputs):
        self.before_read()

    def synchronize(self):
        """Applies every pending update and ends the step's run (raises its failure)."""
        if self.closed:
            return
        self.recover_if_backward_failed()
        if not self.reducer.in_step():
            return
        if self.in_backward:
            raise RuntimeError("loom_torch.parallelize: synchronize() during backward")
        if self.defer_updates:
            self._land_all()  # the averages into .grad; opt.step() updates
            return
        written = False
        try:
            for k in range(len(self.groups)):
                self.wait_and_apply(k)
        except _WrittenWhilePending:
            written = True  # the step stays open: the next synchronize() applies the group
            raise
        finally:
            if written:
                pass
            elif self.t0 is not None:
                start = time.monotonic_ns() - self.t0
                self.reducer.finish()
                self.timeline_waits.append((start, time.monotonic_ns() - self.t0))
            else:
                self.reducer.finish()
            if not written:
                self.updates_pending = False
                for target in self.read_targets:
                    target.__dict__.pop(_PENDING, None)

    def optimizer_step(self, closure=None):
        if self.defer_updates:
            # DDP's semantics: the averages are in .grad (backward waited for them).
            self.awaiting_step = False
            return self.step_function(self.optimizer, closure)
        if (not self.awaiting_step and not self.optimizer.state
                and all(g.get("lr", 1.0) == 0 for g in self.optimizer.param_groups)):
            # torch.distributed.checkpoint's _init_optim_state: a step at learning rate 0 with
            # zero gradients that makes a fresh optimizer's state, on every rank, to load into.
            # Local: it communicates nothing and changes no parameter.
            return self.step_function(self.optimizer, closure)
        if closure is not None:
            raise RuntimeError("loom_torch.parallelize: optimizer.step(closure) is not supported: "
                               "the parameters are updated as their gradients land (wrap with "
                               "defer_updates=True)")
        if not self.awaiting_step:
            raise RuntimeError(
                "loom_torch.parallelize: optimizer.step() on rank %d of %d without a reduced "
                "backward since the last step; every rank runs backward (outside no_sync) before "
                "each step, since its peers' allreduces wait for this rank's gradients"
                % (self.rank, self.world))
        self.awaiting_step = False
        self._check_before_step()
        self._apply_landed()
        self._step_outside()
        if not self.overlap_forward:
            self.synchronize()
            return
        # What a write through the unwrapped model would overtake: named when it lands.
        for k, done in enumerate(self.applied):
            if not done:
                self.updates_pending = True
                for i in self.groups[k]:
                    self.pending_versions[i] = self.params[i]._version
        if self.updates_pending:
            # While updates are pending the model keeps this engine alive (a wrapper dropped
            # right after opt.step(), as `return model` from a training function, must not take
            # the last step's updates with it): its next read or forward applies them.
            for target in self.read_targets:
                target.__dict__[_PENDING] = self

    def optimizer_zero_grad(self, set_to_none=True):
        # A .grad that is a bucket slot holds an average whose update may still be pending:
        # zeroing it in place first applies what is pending (set_to_none only drops .grad).
        if not set_to_none:
            self.before_read()
        return type(self.optimizer).zero_grad(self.optimizer, set_to_none)

    def optimizer_state_dict(self):
        self.synchronize()
        return type(self.optimizer).state_dict(self.optimizer)

    def optimizer_load_state_dict(self, state_dict):
        self.synchronize()
        return type(self.optimizer).load_state_dict(self.optimizer, state_dict)

    def close(self):
        """Lets go of the model (the model was wrapped again): pending updates applied, hooks
        removed; the optimizer's own methods run again; the wrapper refuses to run."""
        self.recover_if_backward_failed()
        if self.in_backward or (self.awaiting_step and not self.defer_updates):
            raise RuntimeError("loom_torch.parallelize: the model is wrapped again between "
                               "backward and optimizer.step() of its previous wrapper; wrap it "
                               "again after step()")
        self.synchronize()
        self._release_views()  # (the reducer's memory is not the model's any more)
        for handle in self.handles:
            handle.remove()
        self.handles, self.accumulators = [], []
        for target in self.read_targets:
            for name in _FRESH_READS:
                if isinstance(target.__dict__.get(name), _FreshRead):
                    del target.__dict__[name]
        self.closed = True
        if getattr(self.optimizer, "_loom_engine", None) is not None:
            self.optimizer._loom_engine = None



class ParallelModule(torch.nn.Module):
    """The model as loom_torch.parallelize wraps it (the model is `self.module`)."""

    def __init__(self, module, optimizer, group, plan, overlap_forward=True,
                 broadcast_buffers=True, rebuild_buckets=True, profile=None, automatic=False,
                 defer_updates=False, gradient_as_bucket_view=True):
        super().__init__()
        self.module = module
        self.process_group = group
        self.broadcast_buffers = broadcast_buffers
        problem = _local_problem(module)
        if dist.get_world_size(group) > 1:
            _agree_on_model(group, module, problem)
        elif problem:
            raise ValueError(problem)
        # Rank 0's parameters and buffers everywhere, as DDP does when it wraps a model.
        state = [t.detach() for t in module.state_dict(keep_vars=True).values()
                 if isinstance(t, torch.Tensor) and t.numel() > 0]  # (torch's coalescing
        # fails on a tensor without elements, which has nothing to send)
        if state and dist.get_world_size(group) > 1:
            dist._broadcast_coalesced(group, state, 250 * 1024 * 1024, 0)
        engine = _Engine(module, optimizer, group, plan, overlap_forward, rebuild_buckets, profile,
                         automatic, defer_updates, gradient_as_bucket_view)
        object.__setattr__(self, "_loom", engine)
        optimizer._loom_engine = weakref.ref(engine)  # the wrapper keeps it alive, not this
        # The model, and the module torch.compile wrapped (its reads are the user's too).
        engine.read_targets = [module]
        inner = getattr(module, "_orig_mod", None)
        if isinstance(inner, torch.nn.Module):
            engine.read_targets.append(inner)
        for target in engine.read_targets:
            for name in _FRESH_READS:
                target.__dict__[name] = _FreshRead(engine, target, name)
            engine.handles.append(target.register_forward_pre_hook(
                _EngineHook(engine, "before_unwrapped_forward")))
        # Methods of the optimizer itself, so that LR schedulers can wrap and count step(); a
        # closed engine (the model wrapped again) passes them through to the optimizer's own.
        cls = type(optimizer)
        ref = weakref.ref(engine)

        def through(name):
            def call(opt, *args, **kwargs):
                owner = ref()
                if name == "step":
                    opt._opt_called = True  # what an LR scheduler's wrapper of step() records
                    if hasattr(opt, "_step_count"):
                        opt._step_count += 1
                if owner is None or owner.closed:
                    return getattr(cls, name)(opt, *args, **kwargs)
                return getattr(owner, "optimizer_" + name)(*args, **kwargs)
            if name == "step":
                # An LR scheduler made before or after parallelize() finds its counter here
                # (else it warns that step() was overridden, and wraps it once more).
                call._wrapped_by_lr_sched = True
            return types.MethodType(call, optimizer)
        optimizer.step = through("step")
        optimizer.state_dict = through("state_dict")
        optimizer.zero_grad = through("zero_grad")
        optimizer.load_state_dict = through("load_state_dict")

    def forward(self, *inputs, **kwargs):
        # torch.compile(net) compiles the model's own forward; loom's bookkeeping around it
        # (and its hooks) run eagerly, as graph breaks.
        reduced, timed = self._before_forward()
        try:
            output = self.module(*inputs, **kwargs)
        finally:
            self._forward_ended()
        return self._after_forward(output, reduced, timed)

    @_eager
    def _before_forward(self):
        engine = self._loom
        if engine.closed:
            raise RuntimeError("loom_torch.parallelize: this wrapper was replaced by a later "
                               "parallelize() of the same model; use the one it returned")
        engine.recover_if_backward_failed()
        timed = engine.t0 is not None and not engine.in_backward
        entered = 0
        if timed:  # a new forward: the step's timeline keeps the last one before backward
            entered = time.monotonic_ns() - engine.t0
            engine.timeline_forward = []
        frozen = engine.check_registration()
        # Every trained parameter frozen for this forward (a GAN's generator step through the
        # discriminator): its backward is none of this model's business. A forward under no_grad
        # or no_sync does not cancel an earlier reduced forward's backward (as DDP).
        reduced = engine.no_sync_depth == 0 and not frozen and torch.is_grad_enabled()
        broadcast = (self.broadcast_buffers and engine.world > 1 and bool(engine.buffers)
                     and engine.forward_param_sync)
        source = 0
        if engine.joining is not None and reduced and engine.world > 1:
            # join(): the ranks that ran out of inputs hear of this step and take part in it.
            source = engine.join_round(True, broadcast)[0][-1]
        if broadcast:
            # On the group's communicator, apart from the reducer's; as DDP, only after a
            # grad-enabled reduced forward (so evaluation loops may differ in length by rank).
            self._broadcast_buffers(source)
        engine.forward_param_sync = reduced
        if reduced:
            engine.expect_backward = True
        if engine.root_guard:
            engine.before_module(engine.root_guard)
        if timed:
            engine.timeline_forward.append(("", engine.root_guard, entered,
                                            time.monotonic_ns() - engine.t0))
        engine.in_wrapped_forward = True
        return reduced, timed

    @_eager
    def _forward_ended(self):
        self._loom.in_wrapped_forward = False

    @_eager
    def _after_forward(self, output, reduced, timed):
        engine = self._loom
        if timed:
            engine.timeline_forward_end = time.monotonic_ns() - engine.t0
        if reduced:
            first = _first_tensor_needing_grad(output)
            if first is not None:
                first.register_hook(engine.on_output_gradient)
        return output

    def _broadcast_buffers(self, source):
        dist._broadcast_coalesced(self.process_group, self._loom.buffers, 250 * 1024 * 1024,
                                  source)

    @contextlib.contextmanager
    def join(self, divide_by_initial_world_size=True, enable=True,
             throw_on_early_termination=False):
        """Uneven inputs, as DDP's join(): run the training loop inside `with net.join():`.
        A rank whose loop ends first takes part in its peers' remaining steps as a rank with
        zero gradients (averages over the initial world size; divide_by_initial_world_size=False:
        over the ranks still training) and applies the same updates; when every rank's loop
        ended, the parameters and buffers of the last rank to train are broadcast to all.
        throw_on_early_termination=True: every rank raises instead, at the step where the
        first rank ran out. Costs one small allreduce per step while in force. Each reduced
        forward inside must be followed by its backward and optimizer.step(), as without it."""
        engine = self._loom
        if not enable or engine.world == 1:
            yield
            return
        if engine.joining is not None:
            raise RuntimeError("loom_torch.parallelize: join() is already in force for this "
                               "model (one join() at a time)")
        engine.joining = {"divide": bool(divide_by_initial_world_size),
                          "throw": bool(throw_on_early_termination)}
        engine.last_active = list(range(engine.world))
        try:
            yield
            # This rank's inputs ended: shadow the peers' steps until every rank's ended.
            engine.synchronize()
            while True:
                training, broadcast = engine.join_round(False, False)
                if not training:
                    break
                if broadcast:  # from the highest rank still training, as DDP's join
                    self._broadcast_buffers(training[-1])
                engine.shadow_step()
            # The last rank(s) to train hold the model every rank keeps (as DDP's join); with
            # the same hyperparameters everywhere it is what every rank computed already.
            engine.synchronize()
            state = [t.detach() for t in self.module.state_dict(keep_vars=True).values()
                     if isinstance(t, torch.Tensor) and t.numel() > 0]
            dist._broadcast_coalesced(self.process_group, state, 250 * 1024 * 1024,
                                      engine.last_active[-1])
        finally:
            engine.joining = None
            engine.next_scale = 1.0

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes of forwards run inside accumulate their gradients locally (no
        communication, no update); the next reduced backward averages the sum, as DDP's."""
        self._loom.no_sync_depth += 1
        try:
            yield
        finally:
            self._loom.no_sync_depth -= 1

    def synchronize(self):
        """Applies every update still pending (the tail of the last step's communication)."""
        self._loom.synchronize()

    def zero_grad(self, set_to_none=True):
        """As Module.zero_grad; zeroing in place (set_to_none=False) first applies the updates
        still pending (their averages are the gradients' memory)."""
        if not set_to_none:
            self._loom.before_read()
        return super().zero_grad(set_to_none)

    def state_dict(self, *args, **kwargs):
        self._loom.synchronize()
        return super().state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        if assign:
            raise ValueError("loom_torch.parallelize: load_state_dict(assign=True) would replace "
                             "the parameters loom reduces; load with assign=False (the values "
                             "are copied into them)")
        self._loom.synchronize()
        return super().load_state_dict(state_dict, strict)

    def dump_dot(self, path):
        """The step's graph as Graphviz DOT (gradients by module, buckets, updates), with the
        last profiled step's durations."""
        self._loom.synchronize()
        self._loom.reducer.dump_dot(path)

    def write_trace(self, path):
        """This rank's Chrome trace of the last step (".rank<r>" inserted with several ranks;
        tools/loom-trace-merge joins them); returns the path written. Needs profile=True."""
        self._loom.synchronize()
        return self._loom.reducer.write_trace(path)

    def explain(self):
        """Why each bucket's communication was or was not hidden in the last profiled step, and
        which modules each bucket holds."""
        self._loom.synchronize()
        return self._loom.reducer.explain()

    def plan(self):
        """The bucketing plan in force ("cap 25 MiB, first 1 MiB, ...") and its bucket sizes."""
        return self._loom.reducer.describe_plan(), self._loom.reducer.bucket_bytes()

    def replan(self, bucket_cap_mb=None, first_bucket_mb=None, partition_large=None,
               collectives_in_flight=None, compression=None, issue_order=(), priority=None):
        """Rebuilds the buckets with another plan between steps (collective: every rank, with the
        same arguments). The hook a planner (bucket_cap_mb="auto") drives."""
        engine = self._loom
        engine.synchronize()
        p = engine.plan
        for key, value in (("bucket_cap_mb", bucket_cap_mb), ("first_bucket_mb", first_bucket_mb),
                           ("partition_large", partition_large),
                           ("collectives_in_flight", collectives_in_flight),
                           ("priority", priority)):
            if value is not None:
                p[key] = value
        if compression is not None:
            p["compression"] = _COMPRESSIONS[compression]
        order = engine.reducer.observed_ready_order()
        if order:  # rank 0's, so that every rank builds the same buckets
            order = engine.reducer.agreed(order)
        engine._release_views()
        engine.reducer.replan(p["bucket_cap_mb"], p["first_bucket_mb"], p["partition_large"],
                              p["collectives_in_flight"], p["compression"], p["track_usage"],
                              order, list(issue_order), p["priority"], p["wire_ratio"])
        engine.steps_since_plan = 0
        engine._layout()

    def predict(self):
        """The step simulator's prediction of this plan's step, from the profiled steps since
        the plan was last made (up to 16; a step is kept once the next one begins), beside
        their measured mean. A dict: "predicted_ms" and "measured_ms" (the period from one
        backward's start to the next, the loop's whole iteration), "error" ((predicted -
        measured) / measured), "steps", "plan", "buckets", "breakdown" (the predicted step's
        backward, forward, other and update compute of this thread, the wire time of the
        buckets alone on the wire fitted to the measured communication, the communication
        exposed, this thread's wait for it, the fitted link) and "measured" (wait, update and
        communication time as measured). Needs profile=True (or LOOM_TRACE)."""
        engine = self._loom
        if not engine.profiling:
            raise RuntimeError("loom_torch.parallelize: predict() needs profiled steps: wrap "
                               "with parallelize(..., profile=True) or set LOOM_TRACE")
        return engine.reducer.predict()

    @property
    def automatic_plan(self):
        """bucket_cap_mb="auto": what the automatic plan chose (a dict: "plan", its fields,
        "predicted_ms", "candidates", "changed" (False: the starting plan stayed, as the fastest
        measured or since no candidate was predicted faster), the starting plan as predicted and
        measured over the profiled steps, "replaced_predicted_ms" and "replaced_measured_ms",
        and "timed": each shortlisted plan with its prediction and rank 0's step in the
        trials (against the starting plan's in the same rounds), the starting plan first; empty when nothing was timed); None until it is
        made."""
        return self._loom.automatic_plan
