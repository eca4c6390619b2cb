"""The engine's updates: each update group applied by the user's own optimizer as its buckets
land (param groups narrowed to the group, .grad reading the average), what a change between
backward and step would have overtaken (named), and the optimizer's own methods as
parallelize takes them over."""
import time

from ._hooks import _PENDING, _WrittenWhilePending, _same_value


class _Updates:
    """Mixed into _Engine (_engine.py)."""

    def _land_all(self):
        # defer_updates: as DDP's backward, this one ends with every average in .grad; the
        # optimizer runs in opt.step() on the whole model.
        if self.sharded:
            # Every bucket's reduction landed (the all-gathers wait for opt.step()'s updates):
            # with shard="optimizer" the averages are in .grad, as DDP's.
            for k in range(len(self.groups)):
                self.reducer.wait_update(k)
                self._copy_average(k)
            return
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

    def _copy_average(self, k, missing_only=False):
        # Group k's averages into .grad (only where there is none: missing_only).
        if self.average_in_shards:
            return  # only this rank's shard is averaged (the pieces' .grad)
        track = self.plan.track_usage
        for i in self.groups[k]:
            if track and self.reducer.globally_unused(i):
                continue  # as DDP: its .grad is left as it was
            p = self.params[i]
            if p.grad is None:
                p.grad = (self.views[i] if self.as_bucket_view[i]
                          else self.views[i].to(p.device, copy=True))
            elif not missing_only and p.grad is not self.views[i]:
                p.grad.copy_(self.views[i])

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
        track = self.plan.track_usage
        for i in (() if self.average_in_shards else self.groups[k]):
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
                p.grad = self.views[i] if p.device.type == "cpu" else self.views[i].to(p.device)
        groups = self.optimizer.param_groups
        # The groups as they were when backward began (a group added since gets nothing).
        narrowed = self.step_narrow[k]
        if self.sharded:  # this rank's pieces of them
            narrowed = self._shard_step(narrowed)
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

    def timed_wait(self, wait, *args):
        """wait(*args), timed as a wait of the profiled step (the step simulator takes the
        waits out of the compute it measures)."""
        if self.t0 is None:
            return wait(*args)
        start = time.monotonic_ns() - self.t0
        try:
            return wait(*args)
        finally:
            self.timeline_waits.append((start, time.monotonic_ns() - self.t0))

    def wait_and_apply(self, k):
        if not self.applied[k]:
            self.timed_wait(self.reducer.wait_update, k)
            self._apply(k)

    def optimizer_step(self, closure=None):
        if (self.sharded and not self.awaiting_step and not self.optimizer.state
                and all(g.get("lr", 1.0) == 0 for g in self.optimizer.param_groups)):
            # torch.distributed.checkpoint's _init_optim_state (below): with a sharded plan the
            # state it makes, to load into, is the pieces', from zero gradients.
            self._init_piece_state()
            return None
        if self.defer_updates and self.sharded and self.awaiting_step:
            # The averages landed in backward; each group's pieces are updated now, and the
            # all-gathers land before the next forward reads the parameters.
            if closure is not None:
                raise RuntimeError("loom_torch.parallelize: optimizer.step(closure) is not "
                                   "supported with a sharded plan (the closure's forward would "
                                   "read parameters whose update is in flight)")
            self.awaiting_step = False
            self.hyper = [{key: value for key, value in g.items() if key != "params"}
                          for g in self.optimizer.param_groups]
            self.step_narrow = self._narrowed()
            for k in range(len(self.groups)):
                self._apply(k)
            self._step_outside()
            self._leave_pending()
            return None
        if self.defer_updates:
            # DDP's semantics: the averages are in .grad (backward waited for them).
            self.awaiting_step = False
            return self.step_function(self.optimizer, closure)
        if getattr(self.optimizer, "found_inf", None) is not None:
            # torch.amp.GradScaler's step(): it sets found_inf on an optimizer whose
            # _step_supports_amp_scaling is true (_AmpScalingInStep) and calls its step() even
            # when the gradients overflowed.
            raise RuntimeError(
                "loom_torch.parallelize: optimizer.step() on rank %d was called by a "
                "torch.amp.GradScaler (scaler.step()); parallelize applies each bucket's update "
                "as it lands, during backward, before the scaler can unscale the gradients or "
                "skip a step whose gradients overflowed, so this backward's updates were made "
                "with the scaled gradients. Wrap with parallelize(..., defer_updates=True) to "
                "train with a GradScaler, as with DDP" % self.rank)
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
        self._leave_pending()

    def _leave_pending(self):
        # What a write through the unwrapped model would overtake: named when it lands. A
        # sharded plan's all-gathers are pending even once every update is applied.
        for k, done in enumerate(self.applied):
            if not done or not self.gathered[k]:
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
        if not self.sharded:
            return type(self.optimizer).state_dict(self.optimizer)
        # The whole state of every parameter (a collective: every rank calls state_dict()), in
        # torch's format keyed by the param groups' parameters: it loads at any world size, with
        # or without loom, and torch.distributed.checkpoint saves it as DDP's.
        whole = self._gather_full_state()
        state = self.optimizer.state
        mine = dict(state)
        try:
            state.clear()
            for i, entry in whole.items():
                state[self.params[i]] = entry
            return type(self.optimizer).state_dict(self.optimizer)
        finally:
            state.clear()
            state.update(mine)

    def optimizer_load_state_dict(self, state_dict):
        self.synchronize()
        if not self.sharded:
            return type(self.optimizer).load_state_dict(self.optimizer, state_dict)
        # torch's load puts the whole state on the parameters; each rank keeps its pieces' slice.
        state = self.optimizer.state
        for mine in self.pieces:
            for _, _, piece in mine:
                state.pop(piece, None)
        type(self.optimizer).load_state_dict(self.optimizer, state_dict)
        self._adopt_optimizer_state()
        return None
