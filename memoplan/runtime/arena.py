"""Runtime stage: run a memonger arena module — one preallocated arena, reused on every call.

A generated plan module with a ``memonger`` block defines the captured graph as a
function and an :class:`ArenaSpec`; :func:`install` makes it the model's forward.
On each call :func:`run` decides: the arena runs the graph only for inference
(every module in ``eval()`` mode, grad disabled — ``torch.no_grad`` or
``torch.inference_mode``) and only for inputs exactly like the captured example
(the same structure, dtypes, shapes, strides and device, and equal constants), with
parameters and buffers still of the captured dtypes, shapes, strides and device.
Anything else runs the model's own forward, unchanged, so training is exactly as
without the plan.

The arena is allocated on the first call that uses it, outside inference mode (so
its views can be written under ``no_grad`` later too), and kept in the model's
``__dict__``; a deep copy or a pickled model gets a fresh one.  Its views are made
once with it.  Ops whose ``out=`` overload would allocate are called through their forms in
``into`` (``memoplan.runtime.arena_into``), and numbers given for tensors through
``scalar``.  The arena is shared by the calls of one model: calls from several
threads at once must not use the same model.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from memoplan.diagnostics import Diagnostic, PlanError
from memoplan.runtime import arena_into as into
from memoplan.runtime import pickling
from memoplan.runtime.arena_into import scalar

__all__ = ["ArenaSpec", "ArenaState", "arena_state", "install", "into", "run", "scalar", "uninstall"]

STATE_ATTR = "_memoplan_arena"


@dataclass(frozen=True)
class ArenaSpec:
    """What the generated module captured: the arena's views and the inputs it runs for.

    ``views``: ``(byte offset, dtype, shape, stride)`` per arena buffer; ``inputs``: per flat
    input leaf, ``(dtype, shape, stride)`` for a tensor or ``("const", value)``; ``attributes``:
    the model's parameters and buffers the graph reads, ``(path, (dtype, shape, stride))``.
    """

    plan_id: str
    nbytes: int
    views: tuple[tuple[int, torch.dtype, tuple[int, ...], tuple[int, ...]], ...]
    inputs: tuple[tuple, ...]
    in_spec: str
    out_spec: str
    attributes: tuple[tuple[str, tuple], ...]
    device: str
    graph: Callable[..., tuple]

    if TYPE_CHECKING:  # derived in __post_init__; not dataclass fields (no init, repr or comparison)
        _in_tree: pytree.TreeSpec
        _out_tree: pytree.TreeSpec
        _device: torch.device
        _owners: dict[str, tuple[tuple[str, int], ...]]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_in_tree", pytree.treespec_loads(self.in_spec))
        object.__setattr__(self, "_out_tree", pytree.treespec_loads(self.out_spec))
        object.__setattr__(self, "_device", torch.device(self.device))
        owners: dict[str, list[tuple[str, int]]] = {}  # module path -> (name, index) of what it holds
        for index, (path, _) in enumerate(self.attributes):
            prefix, _, name = path.rpartition(".")
            owners.setdefault(prefix, []).append((name, index))
        object.__setattr__(self, "_owners", {k: tuple(v) for k, v in owners.items()})


class ArenaState:
    """A model's arena and its counters; copied and pickled empty."""

    def __init__(self, plan_id: str) -> None:
        self.plan_id = plan_id
        self.arena: torch.Tensor | None = None
        self.views: tuple[torch.Tensor, ...] = ()
        self.arena_calls = 0
        self.eager_calls = 0

    def __deepcopy__(self, memo: dict) -> ArenaState:
        return ArenaState(self.plan_id)

    def __reduce__(self) -> Any:
        return (ArenaState, (self.plan_id,))

    def ensure(self, spec: ArenaSpec, device: torch.device) -> tuple[torch.Tensor, ...]:
        if self.arena is None or self.arena.device != device:
            with torch.inference_mode(False), torch.no_grad():
                arena = torch.empty(spec.nbytes, dtype=torch.uint8, device=device)
                self.views = tuple(
                    arena[offset:].view(dtype).as_strided(shape, stride) for offset, dtype, shape, stride in spec.views
                )
            self.arena = arena
        return self.views


def arena_state(model: nn.Module) -> ArenaState | None:
    state = model.__dict__.get(STATE_ATTR)
    return state if isinstance(state, ArenaState) else None


def _same_tensor(tensor: Any, guard: tuple, device: torch.device) -> bool:
    return (
        isinstance(tensor, torch.Tensor)
        and tensor.dtype == guard[0]
        and tensor.shape == guard[1]
        and tensor.stride() == guard[2]
        and tensor.device == device
    )


def _matches(spec: ArenaSpec, leaves: list, tree) -> bool:
    if tree != spec._in_tree or len(leaves) != len(spec.inputs):
        return False
    for leaf, guard in zip(leaves, spec.inputs):
        if guard[0] == "const":
            if isinstance(leaf, torch.Tensor) or type(leaf) is not type(guard[1]) or leaf != guard[1]:
                return False
        elif not _same_tensor(leaf, guard, spec._device) or leaf.requires_grad:
            return False
    return True


def _attributes(model: nn.Module, spec: ArenaSpec) -> tuple | None:
    """The parameters and buffers the graph reads, found by one walk over the modules; None when a
    module is in training mode or one of them is gone or changed dtype, shape, stride or device.

    The walk runs on every call, so a submodule or parameter replaced after ``apply`` is seen.
    """
    values: list[Any] = [None] * len(spec.attributes)
    for prefix, module in model.named_modules(remove_duplicate=False):
        if module.training:
            return None
        for name, index in spec._owners.get(prefix, ()):
            value = module._parameters.get(name)
            values[index] = value if value is not None else module._buffers.get(name)
    for value, (_, guard) in zip(values, spec.attributes):
        if not _same_tensor(value, guard, spec._device):
            return None
    return tuple(values)


def run(model: nn.Module, spec: ArenaSpec, args: tuple, kwargs: dict) -> Any:
    """The graph on the arena when the call is inference on the captured inputs; else the model's forward."""
    state = arena_state(model)
    if state is not None and not torch.is_grad_enabled():
        leaves, tree = pytree.tree_flatten((args, kwargs))
        attributes = _attributes(model, spec) if _matches(spec, leaves, tree) else None
        if attributes is not None:
            views = state.ensure(spec, spec._device)
            outputs = spec.graph(views, leaves, attributes)
            state.arena_calls += 1
            return pytree.tree_unflatten(list(outputs), spec._out_tree)
    if state is not None:
        state.eager_calls += 1
    return type(model).forward(model, *args, **kwargs)


def install(model: nn.Module, forward: Callable[..., Any], spec: ArenaSpec) -> None:
    """Make ``forward`` (the generated arena forward) the model's own, or raise ``MP440`` and change nothing."""
    if "forward" in model.__dict__ or arena_state(model) is not None:
        raise PlanError(
            (
                Diagnostic(
                    "MP440",
                    f"cannot install the memonger arena on the model ({type(model).__qualname__}): "
                    "its forward is already replaced on the instance",
                    help="remove the other plan or patch first (memoplan.remove(model)); nothing was changed",
                ),
            )
        )
    bound = types.MethodType(forward, model)
    try:
        model.forward = bound
        if model.__dict__.get("forward") is not bound:
            raise AttributeError("the module's __setattr__ did not store `forward` on the instance")
    except Exception as error:
        _take_back(model, bound)
        raise PlanError(
            (
                Diagnostic(
                    "MP440",
                    f"cannot install the memonger arena on the model ({type(model).__qualname__}): "
                    f"{type(error).__name__}: {error}",
                    help="its class refuses an instance `forward`; remove the `memonger` block (nothing was changed)",
                ),
            )
        ) from None
    except BaseException:  # Ctrl-C and the like: nothing stays half-installed
        _take_back(model, bound)
        raise
    try:
        model.__dict__[STATE_ATTR] = ArenaState(spec.plan_id)
        pickling.register(forward)
    except BaseException:
        _take_back(model, bound)
        raise


def _take_back(model: nn.Module, bound: types.MethodType) -> None:
    if model.__dict__.get("forward") is bound:
        del model.__dict__["forward"]
    model.__dict__.pop(STATE_ATTR, None)


def uninstall(model: nn.Module) -> None:
    """Give the model its own forward back and drop the arena; nothing happens without one."""
    if model.__dict__.pop(STATE_ATTR, None) is None:
        return
    patched = model.__dict__.get("forward")
    if isinstance(patched, types.MethodType):
        del model.__dict__["forward"]
