"""_Engine: the per-step state machine between autograd, the optimizer and loom's GradientReducer
(C++, parallel/, bound in torch/src/gradient_reducer_binding.cpp)."""
import time
import weakref

import torch
import torch.distributed as dist
from torch.autograd import Variable

from . import _C
from ._groups import backend_of
from ._hooks import (_FRESH_READS, _PENDING, _EngineHook, _FreshRead, _WrittenWhilePending,
                     _autograd_running)
from ._join import _Join
from ._planning import _Planning
from ._shards import _Shards, check_shardable
from ._updates import _Updates


class _Engine(_Planning, _Updates, _Join, _Shards):
    """The per-step state machine between autograd, the optimizer and loom's GradientReducer
    (its plan: _planning.py; its updates and the optimizer: _updates.py; join(): _join.py)."""

    def __init__(self, module, optimizer, group, plan, overlap_forward, rebuild_buckets, profile,
                 automatic=False, defer_updates=False, gradient_as_bucket_view=True,
                 shard_levels=(), memory_budget_mb=None):
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
        # shard="optimizer" | "gradients" (_shards.py): the parameters become views of loom's
        # memory, and the optimizer steps this rank's pieces of them. The plan's search (per
        # wrapper: its shard levels and memory budget are this wrapper's).
        self.search = _C.PlanSearch.for_gradient_reducer()
        self.search.shard_levels = list(shard_levels)
        self.sharded = self.average_in_shards = self.params_in_loom = False
        self.carried_state = None
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.activation_bytes = None  # measured in the first reduced forward (a budget's)
        if plan.shard != "none" or len(shard_levels) > 1:
            check_shardable(optimizer, self.params, self.names,
                            plan.shard if plan.shard != "none" else "auto")
        self.reducer = _C.GradientReducer(
            backend_of(group), self.names, [owner.get(id(p), "") for p in self.params], self.params,
            plan, profile)
        # gradient_as_bucket_view (DDP's): each .grad is its parameter's slot in loom's bucket
        # memory once handed over (autograd then accumulates into the bucket itself), not a
        # tensor beside it; a parameter whose memory is not contiguous keeps its own .grad (the
        # slot is contiguous, and .grad's layout follows the parameter's).
        # A CUDA model's buckets are in its GPU's memory (reducer.device_buckets()): .grad is
        # the slot there as on the CPU. With host buckets (LOOM_TORCH_CUDA_BUCKETS=host, a
        # model on two devices, a loom without CUDA) the slot is in host memory: .grad stays
        # on its device, the average copied in (staged, as DDP on Gloo does with CUDA tensors).
        # shard="gradients": the average exists only for this rank's shard; .grad is dropped
        # once handed over (the gradient's memory is the bucket's, until its reduce-scatter).
        self.as_bucket_view = [False] * len(self.params)  # (set by _layout, per plan)
        # join(divide_by_initial_world_size=False): world / ranks training, for the step in
        # progress (its updates may land in the next forward) and for the next one.
        self.grad_scale = self.next_scale = 1.0
        self.joining = None          # the options of the join() in force
        self.last_active = None      # join(): which ranks trained in the last step
        self._layout()
        if memory_budget_mb is not None:
            self._check_budget(memory_budget_mb)
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
        level = self.reducer.plan().shard
        self.sharded = level != "none"
        # A sharded plan averages only each rank's shard (reduce-scatters): .grad is dropped
        # once handed over (the gradient's memory is the bucket's, until its reduce-scatter).
        self.average_in_shards = self.sharded
        device_buckets = self.reducer.device_buckets()
        self.as_bucket_view = [self.gradient_as_bucket_view and p.is_contiguous()
                               and (p.device.type == "cpu" or device_buckets)
                               and not self.average_in_shards
                               for p in self.params]
        self.groups = self.reducer.update_groups()
        self.group_of = [0] * len(self.params)
        for k, members in enumerate(self.groups):
            for i in members:
                self.group_of[i] = k
        self.views = [self.reducer.gradient(i) for i in range(len(self.params))]
        self.applied = [True] * len(self.groups)
        self.gathered = [True] * len(self.groups)
        self.narrow_key = None
        if self.sharded:
            self._shard_layout()
        else:
            self.pieces, self.pieces_of = [], {}
            self._parameters_to_their_own_memory()
            self._state_to_whole_parameters()

    def _release_views(self):
        """Before the buckets are rebuilt (their memory freed): a .grad that is a bucket slot
        becomes a tensor of its own, with the same values; a sharded optimizer's state is
        gathered whole (a collective), for the new pieces."""
        if self.sharded:
            # (The parameters stay views of the replaced memory, which the reducer keeps until
            # the backward that may read it ended: the next layout copies them from there.)
            self._carry_state_over_replan()
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
        if self.plan.track_usage:
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
        if self.rebuild_pending and not self.sharded:
            self._rebuild_buckets()
        if self.automatic and self.steps_since_plan >= self.search.profile_runs:
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
        self.gathered = [not self.sharded] * len(self.groups)
        self.in_backward = True
        if not shadow:
            Variable._execution_engine.queue_callback(self._end_backward)

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
        if self.average_in_shards:
            # Only this rank's shard will be averaged: there is no whole gradient to keep.
            self.params[i].grad = None
            self.seen[i] = None
            return
        if self.as_bucket_view[i] and grad is not self.views[i]:
            grad = self.views[i]
            self.params[i].grad = grad  # autograd's tensor is freed: one copy of the gradients
        self.seen[i] = weakref.ref(grad)
        self.seen_version[i] = grad._version

    def _end_backward(self):
        self.in_backward = False
        self.awaiting_step = True
        if self.sharded:
            self.reducer.release_replaced()  # (the forward's saved tensors are gone now)
        missing = self.reducer.missing()
        for i in missing:  # every rank hands every gradient over: the same communication
            grad = self.params[i].grad
            if grad is not None and self.plan.track_usage:
                # Unused here in this backward, but this rank holds a gradient (accumulated
                # under no_sync): DDP sends it; it does not count as a use.
                self._hand_over(i, grad, used=False)
            else:
                self.reducer.mark_unused(i)
        self.reducer.backward_done()
        if missing and not self.plan.track_usage:
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

    def before_module(self, indices):
        if self.sharded:
            # The module's parameters are read whole: their shards' updates applied, and
            # all-gathered from every rank.
            if self.in_backward or all(self.gathered[self.group_of[i]] for i in indices):
                return
            if self.defer_updates and self.awaiting_step:
                return  # (a forward between backward and step reads the old parameters)
            # The all-gathers go in a fixed order (gather_order, the forward's by registration):
            # a group's is issued once the groups before it were updated, so those updates are
            # applied first (a module can run before one registered ahead of it).
            needed = {self.group_of[i] for i in indices}
            last = max(self.gather_position[k] for k in needed)
            for k in self.gather_sequence[:last + 1]:
                self.wait_and_apply(k)
            for k in sorted(needed):
                if not self.gathered[k]:
                    self.wait_gathered(k)
            return
        if self.in_backward or all(self.applied[self.group_of[i]] for i in indices):
            return
        if self.defer_updates:  # a backward that raised before it landed its buckets
            self.synchronize()
            return
        for k in sorted({self.group_of[i] for i in indices}):
            self.wait_and_apply(k)

    def wait_gathered(self, k):
        """Sharded plans: waits for update group k's all-gathers, timed as a wait (not as the
        forward's compute)."""
        self.timed_wait(self.reducer.wait_gathered, k)
        self.gathered[k] = True

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
        if self.sharded and self.defer_updates and self.awaiting_step:
            return  # backward landed every average; opt.step() updates, then all-gathers
        if self.defer_updates and not self.sharded:
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
            if not written:
                self.timed_wait(self.reducer.finish)
                self.gathered = [True] * len(self.groups)
                self.updates_pending = False
                for target in self.read_targets:
                    target.__dict__.pop(_PENDING, None)

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
        self._parameters_to_their_own_memory()
        self._state_to_whole_parameters()
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
