"""Runtime stage: a recompute sees the argument objects as the forward saw them, and leaves them as it found them.

A checkpointed region's arguments may be Python objects that its forward changes:
transformers' ``DynamicCache`` (GPT-2 and Llama with ``use_cache=True``) appends the
layer's keys and values in ``update``.  Recomputing the forward in backward would
append them a second time (the cache returned to the user would hold every position
twice) and attend over the doubled cache.

:class:`ArgumentGuard` supplies a ``context_fn`` pair for ``torch.utils.checkpoint``
(combined with the buffer guard's):

* forward context: before the region runs, record the attributes (``__dict__``) of
  every non-tensor object among its arguments, and of the objects, lists and dicts they
  hold, shallowly;
* recompute context: record the current state the same way, put the recorded
  pre-forward state back, run, and in a ``finally`` restore the current state.

State is compared and restored by reference: an object whose forward *rebinds*
attributes (``self.keys = torch.cat(...)``, as ``DynamicCache`` does) is handled; a
tensor changed in place inside such an object is not (a ``StaticCache`` writes in
place).  Modules are never walked (their buffers are the buffer guard's), nor tensors.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

__all__ = ["ArgumentGuard", "cache_bytes", "combined", "is_cache", "reachable", "warn_cache_in_training"]

#: At most this many objects are recorded per region (a guard against walking a huge graph).
MAX_OBJECTS = 10_000

_ATOMS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, type, nn.Module, torch.Tensor)

_Context = contextlib.AbstractContextManager[None]


def _snapshot(roots: Iterable[Any]) -> list[tuple[Any, Any]]:
    """``(container, shallow copy of its contents)`` for every mutable container reachable from ``roots``."""
    seen: set[int] = set()
    out: list[tuple[Any, Any]] = []
    stack = [r for r in roots if not isinstance(r, _ATOMS)]
    while stack and len(out) < MAX_OBJECTS:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _ATOMS) or callable(obj):
            continue
        seen.add(id(obj))
        if isinstance(obj, list):
            state: Any = list(obj)
            children = state
        elif isinstance(obj, dict):
            state = dict(obj)
            children = list(state.values())
        elif isinstance(obj, tuple):
            state, children = None, list(obj)
        elif isinstance(getattr(obj, "__dict__", None), dict):
            state = dict(vars(obj))
            children = list(state.values())
        else:
            continue
        if state is not None:
            out.append((obj, state))
        stack.extend(c for c in children if not isinstance(c, _ATOMS))
    return out


def _restore(snapshot: list[tuple[Any, Any]]) -> None:
    for obj, state in snapshot:
        if isinstance(obj, list):
            obj[:] = state
        elif isinstance(obj, dict):
            obj.clear()
            obj.update(state)
        else:
            attrs = vars(obj)
            attrs.clear()
            attrs.update(state)


class ArgumentGuard:
    """The forward/recompute context pair for the non-tensor arguments of one checkpointed call."""

    def __init__(self, arguments: Iterable[Any]) -> None:
        self._roots = [a for a in arguments if not isinstance(a, _ATOMS)]
        self._before: list[tuple[Any, Any]] = []

    def contexts(self) -> tuple[_Context, _Context]:
        return self._forward(), self._recompute()

    @contextlib.contextmanager
    def _forward(self) -> Iterator[None]:
        self._before = _snapshot(self._roots)
        yield

    def _recompute(self) -> _Context:
        return _Recompute(self)


class _Recompute:
    """Re-enterable: backward with ``retain_graph`` recomputes a region more than once."""

    def __init__(self, guard: ArgumentGuard) -> None:
        self._guard = guard
        self._now: list[list[tuple[Any, Any]]] = []

    def __enter__(self) -> None:
        before = self._guard._before
        self._now.append(_snapshot(self._guard._roots) if before else [])
        _restore(before)

    def __exit__(self, *exc: object) -> None:
        _restore(self._now.pop())


def combined(*pairs: tuple[_Context, _Context]) -> tuple[_Context, _Context]:
    """One ``context_fn`` result from several: every forward context, then every recompute one."""
    return _All([p[0] for p in pairs]), _All([p[1] for p in pairs])


class _All:
    """Enters its contexts in order and exits them in reverse, each time it is entered."""

    def __init__(self, contexts: list[_Context]) -> None:
        self._contexts = contexts
        self._stacks: list[contextlib.ExitStack] = []

    def __enter__(self) -> None:
        stack = contextlib.ExitStack()
        with contextlib.ExitStack() as undo:
            undo.push(stack)
            for context in self._contexts:
                stack.enter_context(context)
            undo.pop_all()
        self._stacks.append(stack)

    def __exit__(self, *exc: Any) -> bool:
        return bool(self._stacks.pop().__exit__(*exc))


def is_cache(obj: Any) -> bool:
    """A transformers ``Cache`` (``DynamicCache``, ...): a class named ``*Cache`` from ``transformers``."""
    if isinstance(obj, _ATOMS):
        return False
    return any(c.__module__.startswith("transformers") and c.__name__.endswith("Cache") for c in type(obj).__mro__)


def cache_bytes(cache: Any) -> int:
    """The bytes of the distinct tensor storages ``cache`` holds (its layers' keys and values)."""
    storages: dict[int, int] = {}
    for obj in reachable(cache):
        if isinstance(obj, torch.Tensor) and obj.layout is torch.strided:
            storage = obj.untyped_storage()  # told apart by its C++ identity: a fake one has no address
            storages.setdefault(int(storage._cdata), storage.nbytes())
    return sum(storages.values())


def reachable(value: Any) -> list[Any]:
    """Every object reachable from ``value`` through containers and attributes (modules are not opened)."""
    seen: set[int] = set()
    found = []
    todo = [value]
    while todo:
        item = todo.pop()
        if id(item) in seen or isinstance(item, (nn.Module, type, str, bytes, int, float, bool, type(None))):
            continue
        seen.add(id(item))
        found.append(item)
        if isinstance(item, torch.Tensor):
            continue
        if isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            todo.extend(item)
        elif isinstance(getattr(item, "__dict__", None), dict):
            todo.extend(vars(item).values())
    return found


#: Whether MP416 was given in this process (once: every region of every step would repeat it).
_CACHE_WARNED: list[bool] = [False]


def warn_cache_in_training(arguments: Iterable[Any], roots: Iterable[nn.Module], where: str) -> None:
    """MP416, once: a region in training was given a transformers cache (``use_cache=True``) and wrote it.

    Called after the region's forward: the bytes are what the cache holds then."""
    if _CACHE_WARNED[0]:
        return
    cache = next((a for a in arguments if is_cache(a)), None)
    if cache is None or not any(root.training for root in roots):
        return
    _CACHE_WARNED[0] = True
    warnings.warn(
        f"memoplan: MP416: {where or 'a region'}: in training, the model passes a {type(cache).__name__} through "
        f"the plan's regions (`use_cache=True`): it holds {cache_bytes(cache)} B of keys and values after this "
        "region, and every region that writes it adds its own, alive as long as the output; train with "
        "`use_cache=False` (`model.config.use_cache = False`), as Hugging Face's own gradient checkpointing "
        "does, to free them",
        RuntimeWarning,
        stacklevel=5,
    )
