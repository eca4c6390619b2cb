"""The hooks parallelize installs and what they share: autograd and module hooks that hold the
engine weakly, the fresh reads installed on the wrapped model, and small helpers."""
import weakref

import torch
from torch.autograd import Variable

# Loom's bookkeeping runs eagerly under torch.compile (a graph break), never traced.
_eager = torch.compiler.disable if hasattr(torch, "compiler") else (lambda f: f)


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


class _AmpScalingInStep:
    """An optimizer's _step_supports_amp_scaling while an engine that applies the updates
    during backward (without defer_updates) drives it. True: torch.amp.GradScaler then calls
    optimizer.step() itself, with its found_inf set on the optimizer, even on a step whose
    gradients overflowed, where the engine names the scaler (the updates it would unscale or
    skip were applied during backward). False once the engine is closed or freed, so that the
    scaler unscales and skips as usual for the optimizer's own step()."""

    __slots__ = ("engine",)

    def __init__(self, engine):
        self.engine = weakref.ref(engine)

    def __bool__(self):
        engine = self.engine()
        return engine is not None and not engine.closed


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
