"""Smaller examples and out-of-memory errors: what lets memoplan work on a step that does not fit.

:func:`shrink` derives a smaller example from a given one (the batch dimension halved), used to
calibrate an estimated profile's times with a real run and by ``memoplan verify`` to prove
equivalence when the full-size unplanned step cannot run.  :func:`is_out_of_memory` tells an
allocator's out-of-memory error (CPU or CUDA) from any other failure of a step, and
:func:`wanted_bytes` reads how much it asked for.
"""

from __future__ import annotations

import contextvars
import gc
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import torch
import torch.utils._pytree as pytree

from memoplan.oom import is_out_of_memory, wanted_bytes
from memoplan.specs import Example

__all__ = [
    "StepOutOfMemory",
    "describe_example",
    "is_out_of_memory",
    "out_of_memory_as",
    "shrink",
    "shrinking",
    "wanted_bytes",
]

T = TypeVar("T")

#: Set while planning from an estimated profile: :func:`memoplan.planner.search.refine.measure_plan`
#: then estimates each trial on fake tensors instead of running it.
ESTIMATING: contextvars.ContextVar[bool] = contextvars.ContextVar("memoplan_estimating", default=False)

# What an allocator running out of memory says: memoplan.oom (specs uses it too, for a factory).


def batch_size(example: Example) -> int | None:
    """The size of dimension 0 of the example's first tensor (None: no tensor, or a scalar)."""
    for leaf in pytree.tree_leaves((tuple(example.args), dict(example.kwargs))):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    return None


def shrink(example: Example) -> Example | None:
    """The example with its batch dimension halved (rounded up); None when it is already 1.

    The batch dimension is dimension 0 of the first tensor argument; every tensor whose
    dimension 0 has that size is cut to its first half (so ids and their attention mask stay
    paired), other values are kept as they are.  A multi-step spiking input ``[T, B, ...]`` has
    its time steps halved instead: a smaller example of the same model all the same.
    """
    size = batch_size(example)
    if size is None or size <= 1:
        return None
    half = (size + 1) // 2

    def cut(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == size:
            return value[:half].clone()
        return value

    return Example(pytree.tree_map(cut, tuple(example.args)), pytree.tree_map(cut, dict(example.kwargs)))


def describe_example(example: Example) -> str:
    """The shapes of the example's tensors: ``args[0] 2x1024 int64, kwargs['mask'] 2x1024 bool``."""
    parts = []
    for root, tree in (("args", tuple(example.args)), ("kwargs", dict(example.kwargs))):
        for path, leaf in pytree.tree_flatten_with_path(tree)[0]:
            if isinstance(leaf, torch.Tensor):
                shape = "x".join(str(d) for d in leaf.shape) or "scalar"
                parts.append(f"{root}{pytree.keystr(path)} {shape} {str(leaf.dtype).removeprefix('torch.')}")
    return ", ".join(parts) or "no tensors"


def shrinking(example: Example, run: Callable[[Example], T], *, first: int = 1) -> tuple[Example, T]:
    """``run`` on the example halved until it does not run out of memory: (the example used, its result).

    The full-size example is not tried (the caller knows it does not fit); the first try is the
    example halved ``first`` times (as far as batch 1).  An error that is not
    out of memory is raised as it is; running out at batch 1 raises the last out-of-memory error.
    """
    current = example
    for _ in range(max(1, first)):  # halved `first` times, as far as batch 1
        smaller = shrink(current)
        if smaller is None:
            break
        current = smaller
    if current is example:
        raise torch.OutOfMemoryError(f"out of memory at batch 1 ({describe_example(example)}): nothing smaller to try")
    while True:
        try:
            return current, run(current)
        except BaseException as exc:
            if not is_out_of_memory(exc):
                raise
        gc.collect()  # the traceback, gone with the except block, held the failed step's tensors
        smaller = shrink(current)
        if smaller is None:
            raise torch.OutOfMemoryError(
                f"out of memory even with the example cut to batch 1 ({describe_example(current)})"
            )
        current = smaller


class StepOutOfMemory(Exception):
    """A training step ran out of memory: which step (``unplanned``, ``planned``, ``profile``),
    the bytes the allocator wanted (None when its error does not say) and its message.

    Raised in place of the allocator's error by :func:`out_of_memory_as`, without its traceback
    (which would keep the failed step's tensors alive).
    """

    def __init__(self, step: str, wanted: int | None, message: str) -> None:
        super().__init__(f"the {step} step ran out of memory: {message}")
        self.step = step
        self.wanted = wanted
        self.message = message


class out_of_memory_as:  # noqa: N801 - used as a context manager, like contextlib's
    """``with out_of_memory_as("planned"): ...`` turns an allocator's out-of-memory error raised
    inside into a :class:`StepOutOfMemory` of that step (other errors pass as they are)."""

    def __init__(self, step: str) -> None:
        self.step = step

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        if exc is None or isinstance(exc, StepOutOfMemory) or not is_out_of_memory(exc):
            return False
        text = str(exc).strip()
        self.caught = StepOutOfMemory(
            self.step, wanted_bytes(exc), text.splitlines()[0] if text else type(exc).__name__
        )
        exc.__traceback__ = None
        gc.collect()
        raise self.caught from None
