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
(gradients in place, a GradScaler's unscaling and skipped steps, hyperparameters, param groups),
no write through the unwrapped model while an update is pending, every rank runs backward every
step, a parameter that gets no gradient needs find_unused_parameters=True, the same model on
every rank (checked when wrapped), and the model's parameters must not be moved, replaced or
re-registered after wrapping (wrap it after .to(...)). defer_updates=True gives DDP's semantics
instead (backward waits for every bucket and leaves the averages in .grad; opt.step() runs the
optimizer), where the first three rules do not apply.
"""
import contextlib
import time
import types
import weakref

import torch
import torch.distributed as dist

from . import _C
from ._compress import compression_name
from ._engine import _Engine
from ._groups import backend_of
from ._hooks import (_FRESH_READS, _AmpScalingInStep, _EngineHook, _FreshRead, _eager,
                     _first_tensor_needing_grad,
                     _inert_hook)  # noqa: F401  (_inert_hook: named by pickles of wrapped models)
from ._model_checks import _agree_on_model, _local_problem, broadcast_state, broadcast_tensors

__all__ = ["parallelize", "ParallelModule"]


def parallelize(model, optimizer, process_group=None, bucket_cap_mb=None, compression=None,
                find_unused_parameters=False, first_bucket_mb=1, partition_large=None,
                collectives_in_flight=0, overlap_forward=True, broadcast_buffers=True,
                rebuild_buckets=None, profile=None, priority="forward", defer_updates=False,
                gradient_as_bucket_view=True, shard="none", memory_budget_mb=None):
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
    the gradients became ready (rank 0's), as DDP (None: unless the plan is sharded, whose
    rebuild moves the parameters' memory and so holds them twice for a moment). profile: record each step's timeline for
    write_trace()/explain()/dump_dot() durations and net.predict() (None: LOOM_TRACE decides).
    defer_updates: DDP's semantics: backward ends once every bucket has landed, with the averaged
    gradients in .grad, and opt.step() updates the parameters itself. Code that reads or changes
    the gradients or the param groups between backward and step (clip_grad_norm_, a learning
    rate set right before step(), add_param_group), torch.amp.GradScaler (float16 autocast: its
    unscale_(), and the steps it skips when the gradients overflowed), several backwards before
    one step, and a backward through this model that its optimizer does not step (a GAN's
    generator step through the discriminator) then work as with DDP; the communication still
    overlaps backward in loom's buckets and order, but no update overlaps it and the next
    forward waits for nothing. (False: each bucket's update is applied as it lands; those uses
    are named errors, a GradScaler's at its first scaler.step(), when the first backward's
    updates were made with the scaled gradients.)
    gradient_as_bucket_view: as DDP's: once handed over, each .grad is the parameter's slot in
    loom's bucket memory (one copy of the gradients, and no copy of the average back into .grad);
    False: .grad stays the tensor autograd made, the average copied into it.
    Uneven inputs: `with net.join():` around the loop (DDP's join(); ParallelModule.join).
    shard: "none" (every rank holds and updates the whole model, as DDP), "optimizer" (ZeRO-1:
    each bucket reduce-scattered as its gradients are in, so a rank holds only its shard's
    average and .grad is None after backward; each rank's optimizer updates only its
    1/world-size shard of every bucket, so its state is for the shard; the updated shards are
    all-gathered into the parameters ahead of the next forward, layer by layer;
    net.clip_grad_norm_() clips over the shards) or "gradients" (ZeRO-2: as "optimizer", and
    each bucket's memory goes back to the kernel once scattered). Element-wise optimizers only (SGD,
    Adam, AdamW, Adagrad, RMSprop, ...); the parameters become views of loom's host memory.
    "auto": the automatic plan (bucket_cap_mb="auto") also chooses the level, among those that
    fit memory_budget_mb (with an optimizer that is not element-wise, or a CUDA model, only
    "none"). memory_budget_mb: the bytes per rank a plan may take (parameters, gradient buckets,
    shards, optimizer state, and activations from the first forward; net.plan_memory() says
    what the plan in force takes): checked when wrapped (a named error, naming the smallest
    plan's need, when nothing fits the model's state), and the automatic plan picks the fastest
    plan that fits.
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
    if partition_large is None:
        partition_large = priority == "forward" and int(collectives_in_flight) > 0
    compression = compression_name(compression, "parallelize")
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
    # parallelize's arguments, one to one (find_unused_parameters counts usage).
    if shard not in ("none", "optimizer", "gradients", "auto"):
        raise ValueError("parallelize: shard must be 'none', 'optimizer', 'gradients' or 'auto', "
                         "not %r" % (shard,))
    if memory_budget_mb is not None and not float(memory_budget_mb) > 0:
        raise ValueError("parallelize: memory_budget_mb must be > 0 MiB, not %r"
                         % (memory_budget_mb,))
    shard_levels = ()
    if shard == "auto":
        if not automatic:
            raise ValueError("parallelize: shard='auto' is chosen by the automatic plan: leave "
                             "bucket_cap_mb='auto' (and defer_updates=False)")
        shard_levels = ("none", "optimizer", "gradients")
        try:
            from ._shards import check_shardable
            named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            check_shardable(optimizer, [p for _, p in named], [n for n, _ in named], "auto")
        except ValueError:
            shard_levels = ("none",)
        shard = "none"  # the starting plan's, unless the budget needs more
    plan = _C.ReducerPlan(
        bucket_cap_mb=float(bucket_cap_mb), first_bucket_mb=float(first_bucket_mb),
        partition_large=bool(partition_large), collectives_in_flight=int(collectives_in_flight),
        compression=compression, track_usage=bool(find_unused_parameters), priority=priority,
        shard=shard)
    options = {"shard_levels": shard_levels, "memory_budget_mb": memory_budget_mb}
    if rebuild_buckets is None:
        rebuild_buckets = shard == "none"
    plan.check("parallelize")
    net = ParallelModule(model, optimizer, group, plan,
        overlap_forward=overlap_forward, broadcast_buffers=broadcast_buffers,
        rebuild_buckets=rebuild_buckets, profile=profile, automatic=automatic,
        defer_updates=bool(defer_updates), gradient_as_bucket_view=bool(gradient_as_bucket_view),
        **options)
    _WRAPPED[model] = weakref.ref(net._loom)
    return net, optimizer


# model -> the engine wrapping it (weakly: a model can be deep-copied, pickled and freed).
_WRAPPED = weakref.WeakKeyDictionary()


class ParallelModule(torch.nn.Module):
    """The model as loom_torch.parallelize wraps it (the model is `self.module`)."""

    def __init__(self, module, optimizer, group, plan, overlap_forward=True,
                 broadcast_buffers=True, rebuild_buckets=True, profile=None, automatic=False,
                 defer_updates=False, gradient_as_bucket_view=True, shard_levels=(),
                 memory_budget_mb=None):
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
        broadcast_state(group, module, 0)
        engine = _Engine(module, optimizer, group, plan, overlap_forward, rebuild_buckets, profile,
                         automatic, defer_updates, gradient_as_bucket_view, shard_levels,
                         memory_budget_mb)
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
        if not defer_updates and not getattr(optimizer, "_step_supports_amp_scaling", False):
            # A GradScaler unscales .grad, or skips a step whose gradients overflowed, after
            # backward, where the updates were applied already: its unscaling in place leaves
            # .grad's version counter as it was, and a skipped step never calls step(). Its
            # contract with optimizers that handle its scaling in step() brings every
            # scaler.step() to the engine's step(), which names it (an optimizer that handles
            # the scaling itself, as fused Adam, is named there as it is).
            optimizer._step_supports_amp_scaling = _AmpScalingInStep(engine)

    def forward(self, *inputs, **kwargs):
        # torch.compile(net) compiles the model's own forward; loom's bookkeeping around it
        # (and its hooks) run eagerly, as graph breaks.
        reduced, timed = self._before_forward()
        try:
            engine = self._loom
            if reduced and engine.activation_bytes is None and engine.search.memory_budget_mb > 0:
                output = self._measured_forward(inputs, kwargs)
            else:
                output = self.module(*inputs, **kwargs)
        finally:
            self._forward_ended()
        return self._after_forward(output, reduced, timed)

    @_eager
    def _measured_forward(self, inputs, kwargs):
        # A memory budget's activations: the bytes the first reduced forward saves for its
        # backward (each storage once; the parameters' own excluded).
        engine = self._loom
        own = {p.untyped_storage().data_ptr() for p in engine.params}
        saved = {}

        def pack(t):
            storage = t.untyped_storage()
            if storage.data_ptr() not in own:
                saved[storage.data_ptr()] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            output = self.module(*inputs, **kwargs)
        engine.activation_bytes = sum(saved.values())
        return output

    @_eager
    def _before_forward(self):
        engine = self._loom
        if engine.closed:
            raise RuntimeError("loom_torch.parallelize: this wrapper was replaced by a later "
                               "parallelize() of the same model; use the one it returned")
        engine.recover_if_backward_failed()
        if engine.no_sync_depth == 0 and torch.is_grad_enabled():
            engine.rebuild_before_forward()  # (a sharded plan's, where every rank trains)
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
        broadcast_tensors(self.process_group, self._loom.buffers, source)

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
        if engine.sharded:
            raise RuntimeError("loom_torch.parallelize: join() with shard=%r is not supported: a "
                               "rank whose inputs ended would still own shards to update; use "
                               "shard='none' with uneven inputs" % engine.plan.shard)
        if engine.joining is not None:
            raise RuntimeError("loom_torch.parallelize: join() is already in force for this "
                               "model (one join() at a time)")
        engine.joining = {"divide": bool(divide_by_initial_world_size),
                          "throw": bool(throw_on_early_termination)}
        engine.last_active = list(range(engine.world))
        try:
            yield
            engine.run_joined(self)  # this rank's inputs ended: its peers' steps, then the model
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

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """torch.nn.utils.clip_grad_norm_ over the averaged gradients, between backward and
        opt.step() (defer_updates=True): the total norm of every parameter's gradient, clipped
        in place; returns the norm. With shard="gradients" the gradients exist only as each
        rank's shard: the norm is taken over every rank's shard (a collective), as FSDP's."""
        engine = self._loom
        if not engine.defer_updates:
            raise RuntimeError("loom_torch.parallelize: clip_grad_norm_ between backward and "
                               "optimizer.step() needs defer_updates=True (otherwise each "
                               "bucket's update is applied as it lands, during backward)")
        if not engine.average_in_shards:
            return torch.nn.utils.clip_grad_norm_(
                [p for p in self.module.parameters() if p.grad is not None], max_norm,
                norm_type)
        if not engine.awaiting_step:
            raise RuntimeError("loom_torch.parallelize: clip_grad_norm_ comes after a reduced "
                               "backward and before optimizer.step()")
        total, grads = engine._shard_norm(norm_type)
        coefficient = float(max_norm) / (float(total) + 1e-6)
        if coefficient < 1.0:
            for g in grads:
                g.mul_(coefficient)
        return total.to(torch.float32)

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

    def status(self):
        """Where the wrapper is in its step, for code that must know (a read-only snapshot):
        in_backward (a backward began and has not ended), awaiting_step (a backward ended and
        its opt.step() has not run; never with defer_updates=True), updates_pending
        (opt.step() left updates to land in the next forward), updates_applied (per update
        group, whether this step's update was applied), planning (bucket_cap_mb="auto" has not
        decided yet) and profiling."""
        engine = self._loom
        return types.SimpleNamespace(
            in_backward=engine.in_backward, awaiting_step=engine.awaiting_step,
            updates_pending=engine.updates_pending, updates_applied=list(engine.applied),
            planning=engine.automatic or engine.reducer.timing_plans(),
            profiling=engine.profiling)

    def bucket_issue_order(self):
        """The buckets (indices, as net.plan() lists their sizes) in the order their
        allreduces are issued, the same on every rank."""
        return self._loom.reducer.bucket_issue_order()

    def bucket_memory(self):
        """Where the buckets are and how they travel: "host" (CPU models, and CUDA models staged
        through host buckets), "device/nccl" or "device/staged" (a CUDA model's buckets in its
        GPU's memory, on NCCL or through pinned memory on the host transport).
        LOOM_TORCH_CUDA_BUCKETS=host|device chooses for a CUDA model."""
        reducer = self._loom.reducer
        return "device/" + reducer.device_path() if reducer.device_buckets() else "host"

    def collective_issue_order(self):
        """The step's collective nodes by name ("bucket3.allreduce", ...) in the order they
        are issued, as net.dump_dot() and the trace name them."""
        return self._loom.reducer.issue_order()

    def gradient_slots(self):
        """Each parameter's slot in loom's bucket memory (tensors shaped like the parameters,
        in registration order): the average lands there; with gradient_as_bucket_view, .grad
        is the slot itself once handed over."""
        return list(self._loom.views)

    def plan_memory(self):
        """What the plan in force takes per rank, in MiB (a dict: parameters_mb, gradients_mb,
        shards_mb, optimizer_state_mb, activations_mb, total_mb, and "text"), as the memory
        budget weighs it: the optimizer's state at its measured bytes per element, and the
        activations measured in the first forward (0 before, or without a budget)."""
        engine = self._loom
        search = engine.search.copy()
        if search.state_bytes_per_element == 0:
            from ._shards import state_bytes_per_element
            search.state_bytes_per_element = state_bytes_per_element(engine.optimizer,
                                                                     engine.params[0].dtype)
        search.activation_bytes = int(engine.activation_bytes or 0)
        return engine.reducer.plan_memory(engine.reducer.plan(), search)

    @property
    def reducer_plan(self):
        """The plan in force, a loom_torch._C.ReducerPlan (a copy): parallelize's bucket_cap_mb,
        first_bucket_mb, partition_large, collectives_in_flight, compression,
        find_unused_parameters (track_usage) and priority, as given or as the automatic plan
        chose them."""
        return self._loom.reducer.plan()

    def plan(self):
        """The bucketing plan in force ("cap 25 MiB, first 1 MiB, ...") and its bucket sizes."""
        return self._loom.reducer.describe_plan(), self._loom.reducer.bucket_bytes()

    def replan(self, bucket_cap_mb=None, first_bucket_mb=None, partition_large=None,
               collectives_in_flight=None, compression=None, issue_order=(), priority=None):
        """Rebuilds the buckets with another plan between steps (collective: every rank, with the
        same arguments). The hook a planner (bucket_cap_mb="auto") drives."""
        engine = self._loom
        engine.synchronize()
        p = engine.plan.copy()
        if bucket_cap_mb is not None:
            p.bucket_cap_mb = bucket_cap_mb
        if first_bucket_mb is not None:
            p.first_bucket_mb = first_bucket_mb
        if partition_large is not None:
            p.partition_large = partition_large
        if collectives_in_flight is not None:
            p.collectives_in_flight = collectives_in_flight
        if priority is not None:
            p.priority = priority
        if compression is not None:
            p.compression = compression_name(compression, "replan")
        p.check("replan")
        engine.plan = p
        engine.replan_agreed(issue_order)

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
