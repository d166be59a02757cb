"""Measure stage: deterministic peak memory of one training step.

On CPU, process RSS says nothing useful (the allocator keeps freed pages), so
:class:`LiveStorageMeter` counts bytes itself: a ``TorchDispatchMode`` sees the
outputs of every ATen op run while it is active, registers each storage it has
not seen before (views and in-place results alias a storage already known and
are not counted again), and a ``weakref.finalize`` on the storage subtracts it
when it is freed.  Freeing follows reference counting, and the cyclic garbage
collector is paused while measuring, so the same step gives the same bytes on
every run.  Memory allocated inside a kernel and freed before it returns
(workspaces) is not seen; neither is what ``torch.compile`` runs (the meter
reports the eager figure).

On CUDA the caching allocator's own counters are exact and cheap:
``max_memory_allocated`` after ``reset_peak_memory_stats``, minus what was
allocated at the start.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "LiveStorageMeter",
    "StepMemory",
    "Timeline",
    "default_loss",
    "measure_step",
    "timeline_step",
    "training_step",
]

_MIB = 1024 * 1024

LossFn = Callable[[Any], torch.Tensor]


class LiveStorageMeter(TorchDispatchMode):
    """Bytes of tensor storages created while active and still alive; and their peak.

    Use as a context manager.  Storages that existed before entering are never
    counted, so the figures are "above what was live at the start".

    With ``record=True`` it also keeps ``samples``: the live bytes after every
    allocation and every free, in order (``samples[0]`` is 0, the start), and
    ``marks``: ``(index into samples, label)`` pairs made by :meth:`mark`.
    ``max(samples) == peak_bytes``.
    """

    def __init__(self, *, record: bool = False) -> None:
        super().__init__()
        self.current_bytes = 0
        self.peak_bytes = 0
        self.samples: list[int] | None = [0] if record else None
        self.marks: list[tuple[int, str]] = []
        # id(storage) -> (bytes counted for it, finalizer); the finalizer removes the
        # entry before the id can be reused, and holds no reference to the storage.
        self._live: dict[int, tuple[int, weakref.finalize[[int], torch.UntypedStorage]]] = {}

    def reset_peak(self) -> None:
        """Start a new peak from the bytes live now."""
        self.peak_bytes = self.current_bytes

    def mark(self, label: str) -> None:
        """Note ``label`` at this point of the recorded samples (after the latest one)."""
        if self.samples is not None:
            self.marks.append((len(self.samples) - 1, label))

    def _changed(self) -> None:
        if self.samples is not None:
            self.samples.append(self.current_bytes)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Freeze the figures: storages freed after exit no longer call back into the meter.
        for _, finalizer in self._live.values():
            finalizer.detach()
        self._live.clear()
        super().__exit__(exc_type, exc, tb)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {id(s) for s in _storages((args, kwargs))}
        for storage in _storages(out):
            self._see(storage, known=id(storage) in inputs)
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        return out

    def _see(self, storage: torch.UntypedStorage, *, known: bool) -> None:
        key = id(storage)
        nbytes = self._nbytes(storage)
        entry = self._live.get(key)
        if entry is not None:
            # Seen before; an `out=` or `resize_` op may have grown it in place.
            if entry[0] != nbytes:
                self.current_bytes += nbytes - entry[0]
                self._live[key] = (nbytes, entry[1])
                self._changed()
            return
        if known:
            return  # aliases an input that existed before the meter (a view, an in-place op)
        self._live[key] = (nbytes, weakref.finalize(storage, self._freed, key))
        self.current_bytes += nbytes
        self._changed()

    def _nbytes(self, storage: torch.UntypedStorage) -> int:
        """The bytes a storage counts for (a subclass may round them as an allocator does)."""
        return storage.nbytes()

    def _freed(self, key: int) -> None:
        nbytes, _ = self._live.pop(key)
        self.current_bytes -= nbytes
        self._changed()


def _storages(tree: Any) -> Iterator[torch.UntypedStorage]:
    """Each distinct storage behind the dense tensors in a nested structure."""
    seen: set[int] = set()
    for leaf in _leaves(tree):
        if not isinstance(leaf, torch.Tensor) or leaf.layout is not torch.strided:
            continue
        storage = leaf.untyped_storage()
        if id(storage) not in seen:
            seen.add(id(storage))
            yield storage


def _leaves(tree: Any) -> Iterator[Any]:
    """The leaves of an op's arguments or results: a tensor, tuples and lists (of tensors, of
    lists), a dict's values; anything else through pytree.  The meter's hot path: the ops'
    arguments are flat, and a pytree walk of each costs more than the op on small tensors."""
    if isinstance(tree, torch.Tensor):
        yield tree
    elif type(tree) in (tuple, list):
        for item in tree:
            yield from _leaves(item)
    elif type(tree) is dict:
        for item in tree.values():
            yield from _leaves(item)
    elif tree is None or isinstance(tree, (int, float, bool, str, torch.dtype, torch.device)):
        return
    else:
        yield from pytree.tree_leaves(tree)


@dataclass(frozen=True)
class StepMemory:
    """Peak bytes allocated during one training step above what was live at its start."""

    peak_bytes: int
    device: str
    method: str  # "live-storage" (CPU dispatch meter) or "cuda-allocator"

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / _MIB


def default_loss(output: Any) -> torch.Tensor:
    """Sum of ``t.float().sum()`` over every floating-point tensor in ``output`` (``loss = sum``)."""
    from memoplan.step import sum_loss

    return sum_loss(output)


def step_loss(loss_fn: LossFn | None = None) -> LossFn:
    """``loss_fn``, else the loss of the step being run (:func:`memoplan.step.running`), else
    ``loss = auto``: the model's own loss where the output carries one, else the sum."""
    from memoplan.step import auto_loss, current

    if loss_fn is not None:
        return loss_fn
    step = current()
    return step.loss if step is not None else auto_loss


def forward_context(model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any] | None):
    """Where a step's forward and loss run: under the running step's autocast, if it has one."""
    from memoplan.step import current

    step = current()
    if step is None or step.autocast is None:
        return contextlib.nullcontext()
    return step.forward_context(step_device(model, args, kwargs))


def training_step(
    model: nn.Module,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    loss_fn: LossFn | None = None,
) -> tuple[Any, torch.Tensor]:
    """Zero gradients (``set_to_none``), run forward, loss and backward; return (output, loss).

    The loss is ``loss_fn``, else the running step's (:mod:`memoplan.step`: ``loss = auto`` when
    none runs); the forward and the loss run under the step's autocast, the backward outside it."""
    model.zero_grad(set_to_none=True)
    with forward_context(model, args, kwargs):
        output = model(*args, **(kwargs or {}))
        loss = step_loss(loss_fn)(output)
    loss.backward()
    return output, loss


def measure_step(
    model: nn.Module,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    loss_fn: LossFn | None = None,
) -> StepMemory:
    """Peak memory of one :func:`training_step`, gradients included."""
    return measured_step(model, args, kwargs, loss_fn=loss_fn)[0]


def measured_step(
    model: nn.Module,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    loss_fn: LossFn | None = None,
) -> tuple[StepMemory, Any, torch.Tensor]:
    """One :func:`training_step` under the meter: (peak memory, output, loss)."""
    device = step_device(model, args, kwargs)
    # Release last step's gradients before the baseline, so they do not count as live.
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        output, loss = training_step(model, args, kwargs, loss_fn)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - start
        return StepMemory(peak_bytes=peak, device=str(device), method="cuda-allocator"), output, loss
    warm_up()
    with gc_paused(), LiveStorageMeter() as meter:
        output, loss = training_step(model, args, kwargs, loss_fn)
    return StepMemory(peak_bytes=meter.peak_bytes, device=str(device), method="live-storage"), output, loss


@dataclass(frozen=True)
class Timeline:
    """Live bytes over one training step (CPU meter): one sample after every allocation and free.

    ``samples[0]`` is 0, the start of the step; ``backward`` is the index of the last sample
    before ``loss.backward()`` began (forward and loss before it); ``marks`` are
    ``(sample index, label)`` pairs made while the step ran.
    """

    samples: tuple[int, ...]
    backward: int
    marks: tuple[tuple[int, str], ...] = ()

    @property
    def peak_bytes(self) -> int:
        return max(self.samples)


def timeline_step(
    model: nn.Module,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    loss_fn: LossFn | None = None,
    marks: Callable[[Callable[[str], None]], contextlib.AbstractContextManager[Any]] | None = None,
) -> tuple[StepMemory, Timeline]:
    """One :func:`training_step` under a recording meter: its peak (as :func:`measure_step`
    measures it, to the byte) and its :class:`Timeline`.

    ``marks``, when given, is called with the meter's ``mark(label)`` and returns a context
    manager held around the step (hooks that mark module boundaries, say).  CPU only: the
    CUDA allocator is not seen allocation by allocation.
    """
    device = step_device(model, args, kwargs)
    if device.type != "cpu":
        raise ValueError(f"a memory timeline is measured on the CPU, not on {device}")
    model.zero_grad(set_to_none=True)
    warm_up()
    meter = LiveStorageMeter(record=True)
    with gc_paused(), meter, marks(meter.mark) if marks is not None else contextlib.nullcontext():
        with forward_context(model, args, kwargs):
            output = model(*args, **(kwargs or {}))
            loss = step_loss(loss_fn)(output)
        assert meter.samples is not None
        backward = len(meter.samples) - 1
        loss.backward()
        del output, loss
    assert meter.samples is not None
    timeline = Timeline(tuple(meter.samples), backward, tuple(meter.marks))
    return StepMemory(peak_bytes=meter.peak_bytes, device=str(device), method="live-storage"), timeline


_warmed_up = False


def warm_up() -> None:
    """Run one op under the meter once per process before the first measurement.

    The first dispatch mode of a process triggers lazy imports whose caught
    exceptions leave reference cycles holding caller frames; with the cyclic
    collector paused, tensors those frames hold would stay alive and inflate the
    first reading (the step measured first, the unplanned one in `verify`).
    """
    global _warmed_up
    if not _warmed_up:
        with LiveStorageMeter():
            torch.ones(2) + 1
        gc.collect()
        _warmed_up = True


@contextlib.contextmanager
def gc_frozen() -> Iterator[None]:
    """Collect once, then keep every object alive now out of the cyclic collector's reach
    (``gc.freeze``) until the block ends: the collections :func:`gc_paused` makes before each
    measured step then walk only what was made since (a planner's trial copies, their steps'
    graphs), not the hundreds of thousands of objects torch and the user's libraries hold.
    Garbage is still freed as it was (by reference counts; cycles by those collections, or
    after the block).  Nothing is frozen when something else froze objects already (the
    caller's own ``gc.freeze``, or an enclosing block): their unfreeze is theirs."""
    if gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Collect first, then keep the cyclic collector from freeing at arbitrary moments."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def indexed_device(device: torch.device | str) -> torch.device:
    """``device`` as a ``torch.device``; a CUDA one without an index is the current CUDA device."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def step_device(model: nn.Module, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None) -> torch.device:
    """Where a step of ``model`` runs: its first parameter's device, else the first tensor argument's, else CPU."""
    for tensor in model.parameters():
        return tensor.device
    for leaf in pytree.tree_leaves((tuple(args), dict(kwargs or {}))):
        if isinstance(leaf, torch.Tensor):
            return leaf.device
    return torch.device("cpu")
