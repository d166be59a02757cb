"""Planner stage: the unplanned step's live bytes between module boundaries (:class:`Held`), from
which the search predicts what a set of checkpoints measures without a trial
(:func:`memoplan.planner.search.held.held_peak`).

While the profile's unplanned step runs under a recording meter, every module marks two moments:
where its forward ends (all it saves for backward is made) and where its backward begins (the
gradient of its output is ready; until then nothing it saved is used).  A checkpoint of the module
holds off what it saves beyond its input exactly between those two moments: the region frees its
saved tensors when its forward returns, and backward recomputes them when it reaches the region.
So at any moment the planned step's live bytes are the unplanned step's less what each checkpointed
module holds off then, and the planned peak is the largest of that over the step.  Between two
consecutive marks the set of modules holding off is the same, so only each stretch's own peak is
kept: the profile stores one number per stretch and one window of stretches per module.

Unlike the cost model's single sum (:mod:`memoplan.planner.search`), this sees when each byte is
live: a language model's loss temporaries, alive at the unplanned peak, are gone by the time a
checkpointed step peaks in backward; so are the activations of the blocks backward has passed.
What it does not see (a region's own bookkeeping, an allocator's rounding of new sizes) is the
same from set to set, which the planner learns from the first trial
(:mod:`memoplan.planner.search.calibrate`).

A third mark, where the module's backward ends (the gradient of its inputs is ready), bounds its
backward: a checkpoint that keeps some ops' outputs (``save = [...]``) holds those autograd would
not have saved until then (:func:`memoplan.planner.search.held.held_peak`).

A module called more than once, or whose output needs no gradient, has no window: a set that
holds it is predicted by trials alone.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

_END, _START, _DONE = "forward-end", "backward-start", "backward-end"


@dataclass(frozen=True)
class Held:
    """``peaks``: the unplanned step's peak in each stretch between module boundaries, in order;
    ``windows``: per module path, the stretches ``[first, last)`` in which a checkpoint of it
    holds its saved bytes off (empty when its backward starts right after its forward ends), and
    ``done``, where its backward ends: ``[last, done)`` are its backward's stretches (to the
    step's end where that was not marked)."""

    peaks: tuple[int, ...]
    windows: Mapping[str, tuple[int, int, int]]


def boundaries(model: nn.Module) -> Callable[[Callable[[str], None]], contextlib.AbstractContextManager[Any]]:
    """The ``marks`` of :func:`memoplan.measure.timeline_step` (or of any recording meter's step):
    hooks that mark where each named module's forward ends and where its backward begins."""

    @contextlib.contextmanager
    def marking(mark: Callable[[str], None]) -> Iterator[None]:
        handles = [
            module.register_forward_hook(_marker(name, mark), with_kwargs=True)
            for name, module in model.named_modules()
            if name
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    return marking


def _marker(name: str, mark: Callable[[str], None]):
    def forward_end(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        mark(f"{_END} {name}")
        _once(output, f"{_START} {name}", mark, first=True)  # the first of its outputs' gradients
        _once((args, kwargs), f"{_DONE} {name}", mark, first=False)  # the last of its inputs'

    return forward_end


def _once(tree: Any, label: str, mark: Callable[[str], None], *, first: bool) -> None:
    """Mark ``label`` when the first (or the last) gradient of the tensors in ``tree`` that need
    one is ready."""
    tensors = [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor) and t.requires_grad]
    left = [len({id(t) for t in tensors})]
    seen: set[int] = set()

    def ready(key: int):
        def hook(grad: torch.Tensor) -> None:
            if key in seen:
                return
            seen.add(key)
            left[0] -= 1
            if (first and len(seen) == 1) or (not first and left[0] == 0):
                mark(label)

        return hook

    for tensor in {id(t): t for t in tensors}.values():
        tensor.register_hook(ready(id(tensor)))


def stretches(samples: Sequence[int], marks: Sequence[tuple[int, str]], extra: int = 0) -> Held:
    """The :class:`Held` of a recorded step: ``samples`` (live bytes after each change, from 0) and
    ``marks`` (sample index, label) made by :func:`boundaries`; ``extra`` bytes are added to every
    stretch (what the meter does not count but the step's peak does, e.g. gathered shards).

    A module's window runs from the sample after its forward's end to the sample before its
    backward's start: at both marks its saved tensors are live in the planned step too.  Its
    backward runs to the sample after its backward's end (to the step's end where not marked)."""
    found: dict[str, dict[str, int]] = {_END: {}, _START: {}, _DONE: {}}
    seen = Counter(label for _, label in marks)
    for index, label in marks:
        kind, name = label.split(" ", 1)
        found[kind][name] = index
    ends, starts = found[_END], found[_START]
    names = [n for n in ends if n in starts and seen[f"{_END} {n}"] == 1 and seen[f"{_START} {n}"] == 1]
    names = [n for n in names if ends[n] < starts[n]]
    done = {
        n: found[_DONE][n] + 1 if seen[f"{_DONE} {n}"] == 1 and found[_DONE][n] >= starts[n] else len(samples)
        for n in names
    }
    cuts = sorted({0, *(ends[n] + 1 for n in names), *(starts[n] for n in names), *done.values()})
    cuts = [c for c in cuts if c < len(samples)]
    bounds = [*cuts[1:], len(samples)]
    peaks = tuple(max(samples[a:b]) + extra for a, b in zip(cuts, bounds))
    position = {c: k for k, c in enumerate(cuts)}
    position[len(samples)] = len(cuts)
    windows = {n: (position[ends[n] + 1], position[starts[n]], position[done[n]]) for n in names}
    return Held(peaks, windows)


def held_fields(held: Held) -> dict[str, Any]:
    """``held`` as the profile's fields (:class:`memoplan.planner.profiling.schema.Profile`)."""
    return {
        "held_peaks": held.peaks,
        "held_windows": tuple((name, *window) for name, window in held.windows.items()),
    }
