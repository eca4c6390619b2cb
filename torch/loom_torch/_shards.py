"""The engine's sharded plans (parallelize(..., shard="optimizer" | "gradients"): ZeRO-1 and 2).

The parameters are views of loom's parameter memory (laid out as the buckets, padded to the
world size); each rank's optimizer steps only its pieces of every bucket (1-D views of that
memory, each with its slice of the averaged gradient as .grad), so its state is for the shard;
loom all-gathers the updated shards into the parameters after every bucket's reduction, and the
next forward's pre-hooks wait for their own parameters' all-gather. When the buckets change
(DDP's rebuild, the automatic plan, replan()) the optimizer state moves into the new pieces
key by key through a sum over the ranks (a collective, at the same point on every rank)."""
import torch
import torch.distributed as dist


def state_bytes_per_element(optimizer, dtype):
    """The optimizer's state per parameter element, in bytes, as a step of a probe parameter of
    `dtype` makes it (Adam: its two moments); 0 when the optimizer cannot be probed."""
    probe = torch.zeros(16, dtype=dtype, requires_grad=True)
    try:
        opt = type(optimizer)([probe], **optimizer.defaults)
        probe.grad = torch.full_like(probe, 1e-3)
        opt.step()
    except Exception:  # (a constructor that wants more than its defaults, a fused CUDA kernel)
        return 0.0
    state = opt.state.get(probe, {})
    return sum(v.numel() * v.element_size() for v in state.values()
               if isinstance(v, torch.Tensor) and v.numel() == probe.numel()) / probe.numel()


# The optimizer state moves between layouts through a buffer of this many elements at a time.
MOVE_CHUNK = 4 << 20


# Optimizers whose update of an element reads only that element's parameter, gradient and
# state: a shard is updated exactly as it would be in the whole tensor.
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Adadelta", "Adamax", "NAdam",
               "RAdam", "ASGD", "Rprop")


def check_shardable(optimizer, params, names, level):
    kind = type(optimizer)
    known = next((c.__name__ for c in kind.__mro__
                  if c.__name__ in ELEMENTWISE and c.__module__.startswith("torch.optim")), None)
    if known is None:
        raise ValueError(
            "parallelize: shard=%r updates each rank's shard of every parameter with its own "
            "optimizer, which needs an element-wise optimizer (%s); %s updates whole tensors "
            "(or is not known to loom), so its update of a shard would differ: use shard='none'"
            % (level, ", ".join(ELEMENTWISE), kind.__name__))
    for name, p in zip(names, params):
        if p.device.type != "cpu":
            raise ValueError("parallelize: shard=%r keeps the parameters in loom's host memory; "
                             "parameter '%s' is on %s (use shard='none' for CUDA models)"
                             % (level, name, p.device))
        if not p.is_contiguous():
            raise ValueError("parallelize: shard=%r makes each parameter a view of loom's "
                             "memory, which is contiguous; parameter '%s' is not (make it "
                             "contiguous before parallelize(), or use shard='none')"
                             % (level, name))


class _Shards:
    """Mixed into _Engine (_engine.py)."""

    def _shard_layout(self):
        """The parameters as views of the reducer's parameter memory (their values copied in)
        and this rank's pieces per update group; the optimizer's state sliced into them (carried
        over a replan, or held for the whole parameters)."""
        for i, p in enumerate(self.params):
            memory = self.reducer.parameter_values(i)
            if not self.params_in_loom:  # (a replan moved loom's own copy)
                memory.copy_(p.detach())
            p.data = memory
        self.params_in_loom = True
        self.quick = [(p, p.data_ptr()) for p in self.params]
        if hasattr(self, "signature"):
            self.signature = self._signature()
        self.gather_sequence = self.reducer.gather_order()
        self.gather_position = [0] * len(self.groups)
        for position, k in enumerate(self.gather_sequence):
            self.gather_position[k] = position
        self.pieces = []           # per update group: [(parameter, offset, piece)]
        self.pieces_of = {}        # parameter -> its pieces (all in one update group)
        for k in range(len(self.groups)):
            mine = []
            for i, offset, count, values, gradient in self.reducer.shard_pieces(k):
                values.grad = gradient  # the averaged gradient lands there
                mine.append((i, offset, values))
                self.pieces_of.setdefault(i, []).append(values)
            self.pieces.append(mine)
        if self.carried_state is not None:  # the old pieces' state, into the new pieces
            old, self.carried_state = self.carried_state, None
            self._move_state(old, [(i, offset, piece) for mine in self.pieces
                                   for i, offset, piece in mine], self.optimizer.state)
        self._adopt_optimizer_state()

    def _check_budget(self, budget_mb):
        """memory_budget_mb against the model's state (activations are not known before the
        first forward): with shard="auto" the first of none, optimizer, gradients that fits is
        the starting plan; a named error naming the smallest plan's need when none does."""
        search = self.search
        search.memory_budget_mb = float(budget_mb)
        search.state_bytes_per_element = state_bytes_per_element(self.optimizer,
                                                                 self.params[0].dtype)
        levels = list(search.shard_levels) or [self.plan.shard]
        needs = []
        for level in levels:
            plan = self.plan.copy()
            plan.shard = level
            need = self.reducer.plan_memory(plan, search)
            if need["total_mb"] <= budget_mb:
                if level != self.plan.shard:
                    self.plan = plan
                    self.replan_agreed()  # (before any step: the same on every rank)
                return
            needs.append((need["total_mb"], level, need["text"]))
        total, level, text = min(needs)
        if not search.shard_levels:  # one plan, the one asked for
            raise ValueError(
                "parallelize: memory_budget_mb=%g, but the plan (%s) needs %.1f MiB per rank "
                "before any activation: %s" % (budget_mb, self.reducer.describe_plan(), total,
                                               text))
        raise ValueError(
            "parallelize: memory_budget_mb=%g is below what every plan needs per rank before any "
            "activation; the smallest, shard=%r, needs %.1f MiB: %s"
            % (budget_mb, level, total, text))

    def _adopt_optimizer_state(self):
        """State the optimizer holds for the whole parameters when wrapped (Adagrad makes its
        sums in its constructor, a checkpoint may have been loaded): sliced into the pieces."""
        full = {}
        for i, p in enumerate(self.params):
            state = self.optimizer.state.pop(p, None)
            if state:
                full[i] = state
        if full:
            self._load_full_state(full)

    def _load_full_state(self, full):
        """full: parameter index -> {key: value} for whole parameters; each piece takes its
        slice of every tensor shaped like its parameter, and every other value whole."""
        state = self.optimizer.state
        for k, mine in enumerate(self.pieces):
            for i, offset, piece in mine:
                whole = full.get(i)
                if not whole:
                    continue
                numel = self.params[i].numel()
                taken = {}
                for key, value in whole.items():
                    if isinstance(value, torch.Tensor) and value.dim() > 0 \
                            and value.numel() == numel:
                        taken[key] = value.detach().reshape(-1)[offset:offset + piece.numel()] \
                            .clone().to(piece.dtype if value.is_floating_point() else value.dtype)
                    elif isinstance(value, torch.Tensor):
                        taken[key] = value.detach().clone()
                    else:
                        taken[key] = value
                state[piece] = taken

    def _own_pieces(self):
        """(parameter, offset, piece) of every piece this rank holds."""
        return [(i, offset, piece) for mine in self.pieces for i, offset, piece in mine]

    def _gather_full_state(self):
        """Every parameter's optimizer state whole, on every rank (a collective on the group),
        the pieces' own left as they are: parameter index -> {key: value}."""
        state = self.optimizer.state
        old = [(i, offset, piece, state.get(piece, {})) for i, offset, piece in self._own_pieces()]
        whole = {}
        self._move_state(old, [(i, 0, p) for i, p in enumerate(self.params)], whole,
                         keep=True)
        return {i: whole[p] for i, p in enumerate(self.params) if p in whole}

    def _move_state(self, old, targets, out, keep=False):
        """A collective on the group: the state of `old` pieces ((parameter, offset, piece,
        state), this rank's, every rank's together covering each element once) into `targets`
        ((parameter, offset, tensor): whole parameters at offset 0, or the new pieces), written
        to out[tensor]. Key by key: a tensor shaped like its piece goes through sums over the
        ranks of a buffer of MOVE_CHUNK elements (each rank's elements of that stretch of the
        model in place, the rest zero), and is freed from `old` as it goes unless `keep`; a
        scalar comes from the piece holding its parameter's first element; other values are
        copied."""
        elementwise, scalars, others = {}, {}, {}
        for _, _, piece, state in old:
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 \
                        and value.numel() == piece.numel():
                    elementwise[key] = str(value.dtype)
                elif isinstance(value, torch.Tensor) and value.numel() == 1:
                    scalars[key] = str(value.dtype)
                else:
                    others[key] = value
        keys = self._agreed_keys(elementwise, scalars)  # every rank runs the same collectives
        starts = [0]
        for p in self.params:
            starts.append(starts[-1] + p.numel())
        # Which parameters have state on some rank (never-stepped ones get none).
        known = torch.zeros(len(self.params), dtype=torch.float64)
        for i, offset, piece, state in old:
            if state:
                known[i] = 1
        if keys:
            dist.all_reduce(known, group=self.group)
        has = [known[i].item() > 0 for i in range(len(self.params))]
        made = {}
        for key, (kind, dtype_name) in keys.items():
            dtype = getattr(torch, dtype_name.replace("torch.", ""))
            if kind == "e":
                # Through a buffer of MOVE_CHUNK elements at a time: its sum over the ranks holds
                # every rank's elements of that stretch of the model (the rest is zero).
                sources = []
                for i, offset, piece, state in old:
                    value = state.get(key) if keep else state.pop(key, None)
                    if value is not None:
                        at = starts[i] + offset
                        sources.append((at, at + piece.numel(), value.detach().reshape(-1)))
                outs = []
                for i, offset, target in targets:
                    if has[i]:
                        at = starts[i] + offset
                        into = torch.zeros(target.numel(), dtype=dtype)
                        made.setdefault(target, {})[key] = into.view(target.shape)
                        outs.append((at, at + target.numel(), into))
                for lo in range(0, starts[-1], MOVE_CHUNK):
                    hi = min(starts[-1], lo + MOVE_CHUNK)
                    buffer = torch.zeros(hi - lo, dtype=dtype)
                    for a, b, value in sources:
                        if a < hi and b > lo:
                            x, y = max(a, lo), min(b, hi)
                            buffer[x - lo:y - lo] = value[x - a:y - a]
                    dist.all_reduce(buffer, group=self.group)
                    for a, b, into in outs:
                        if a < hi and b > lo:
                            x, y = max(a, lo), min(b, hi)
                            into[x - a:y - a] = buffer[x - lo:y - lo]
                del sources
            else:
                values = torch.zeros(len(self.params), dtype=torch.float64)
                for i, offset, piece, state in old:
                    value = state.get(key)
                    if value is not None and offset == 0:
                        values[i] = float(value)
                dist.all_reduce(values, group=self.group)
                for i, offset, target in targets:
                    if has[i]:
                        made.setdefault(target, {})[key] = torch.tensor(values[i].item(),
                                                                        dtype=dtype)
        for target, state in made.items():
            state.update(others)
            out[target] = state

    def _agreed_keys(self, elementwise, scalars):
        # The union over the ranks (a rank may hold no piece of some parameter, or none at all):
        # key -> ("e" elementwise | "s" scalar, dtype).
        mine = [("e", key, dtype) for key, dtype in elementwise.items()] + \
               [("s", key, dtype) for key, dtype in scalars.items()]
        everyone = [None] * self.world
        dist.all_gather_object(everyone, mine, group=self.group)
        return {key: (kind, dtype) for kind, key, dtype in
                sorted({entry for rank in everyone for entry in rank})}

    def _parameters_to_their_own_memory(self):
        """The parameters leave loom's memory (the plan is no longer sharded, or the wrapper
        lets go of the model): each gets a copy of its values."""
        if self.params_in_loom:
            for p in self.params:
                p.data = p.detach().clone()
            self.params_in_loom = False
            self.quick = [(p, p.data_ptr()) for p in self.params]
            if hasattr(self, "signature"):
                self.signature = self._signature()

    def rebuild_before_forward(self):
        """A sharded plan's rebuild of the buckets in the observed ready order (DDP's, after the
        first step), made before a forward rather than as the next backward begins: then no
        autograd graph holds the parameters, whose memory the rebuild moves, and the replaced
        memory is freed at once (as the backward begins it would stay until that backward
        ended, beside the new: the model's parameters twice at the peak)."""
        if not (self.rebuild_pending and self.sharded) or self.in_backward:
            return
        if not self.reducer.observed_ready_order():
            if not self.reducer.in_step() or self.awaiting_step:
                return  # no step yet (or its optimizer.step() is still to come)
            self.synchronize()  # the first step ends here (its all-gathers land, once)
            if not self.reducer.observed_ready_order():
                return
        self._rebuild_buckets()
        self.reducer.release_replaced()

    def _state_to_whole_parameters(self):
        """A sharded optimizer's state, carried out of its pieces, onto the whole parameters (a
        collective: the plan is no longer sharded, or the wrapper lets go of the model)."""
        if self.carried_state is not None:
            old, self.carried_state = self.carried_state, None
            self._move_state(old, [(i, 0, p) for i, p in enumerate(self.params)],
                             self.optimizer.state)

    def _carry_state_over_replan(self):
        """Before the buckets change: the optimizer's state of this rank's pieces, taken out of
        the optimizer, for _move_state into the new layout (_shard_layout, or the whole
        parameters when the plan is no longer sharded)."""
        state = self.optimizer.state
        self.carried_state = [(i, offset, piece, state.pop(piece, {}))
                              for i, offset, piece in self._own_pieces()]

    def _init_piece_state(self):
        """A step of every piece with zero gradients (the caller set every learning rate to 0):
        the optimizer's state for the shard, shaped, as torch.distributed.checkpoint makes a
        fresh optimizer's state to load into. Local: nothing is communicated."""
        groups = self.optimizer.param_groups
        narrowed = self._shard_step([g["params"] for g in groups], every=True)
        saved = [g["params"] for g in groups]
        # The parameters loom does not reduce step as themselves, with the .grad DCP gave them.
        unreduced = {id(p) for params in saved for p in params if id(p) not in self.index}
        grads = {}
        try:
            for g, pieces in zip(groups, narrowed):
                g["params"] = pieces
                for piece in pieces:
                    if id(piece) in unreduced:
                        continue
                    grads[piece] = piece.grad
                    piece.grad = torch.zeros_like(piece)
            self.step_function(self.optimizer)
        finally:
            for g, params in zip(groups, saved):
                g["params"] = params
            for piece, grad in grads.items():
                piece.grad = grad

    def _shard_step(self, narrowed, every=False):
        """What the user's optimizer steps for an update group: each param group (`narrowed`:
        its parameters in the group) as the pieces of those parameters (a parameter unused on
        every rank is left out, as DDP leaves it without a gradient). every=True: every piece,
        and the group's parameters loom does not reduce (outside the model, frozen in it) as
        themselves, with their own .grad."""
        track = self.plan.track_usage and not every
        pieces = []
        for params in narrowed:
            mine = []
            for p in params:
                i = self.index.get(id(p))
                if i is None and every:
                    mine.append(p)
                    continue
                if track and self.reducer.globally_unused(i):
                    continue
                mine.extend(self.pieces_of.get(i, ()))
            pieces.append(mine)
        return pieces

    def _shard_norm(self, norm_type):
        """The norm of the averaged gradients over every rank's shard (a collective)."""
        grads = [piece.grad for mine in self.pieces for _, _, piece in mine]
        norm_type = float(norm_type)
        if norm_type == float("inf"):
            local = max((g.abs().max() for g in grads if g.numel()), default=torch.tensor(0.0))
            total = local.detach().double().reshape(1).clone()
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=self.group)
            return total[0], grads
        local = sum((g.double().abs().pow(norm_type).sum() for g in grads),
                    torch.tensor(0.0, dtype=torch.float64))
        total = local.reshape(1).clone()
        dist.all_reduce(total, group=self.group)
        return total[0].pow(1.0 / norm_type), grads
