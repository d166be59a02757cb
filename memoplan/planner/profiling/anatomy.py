"""Planner stage: what a step's peak is made of -- the explanation a refused budget gives (MP601, MP602).

One training step runs twice under memoplan's live-storage meter (:mod:`memoplan.measure`): the
first finds the peak, the second stops the clock the first time the live bytes reach it and
keeps what is alive then.  Each storage alive at that moment is put in one kind:

* **gradients** -- storages that are a parameter's ``.grad`` after the step;
* **outputs and caches** -- storages the model's output holds (tensors, and what objects in it
  hold, such as transformers' ``DynamicCache``): no plan frees them while the output lives;
* **saved activations** -- made in forward and still alive: what autograd keeps for backward
  (and a checkpoint region's kept inputs);
* **temporaries** -- made in backward, not gradients: activation gradients, recomputed regions.

As the meter counts what a step allocates above what was live before it, **parameters** (and
buffers) are not in the peak; the composition gives them beside it, with the **optimizer state**
a step keeps between steps when the profile knows it (``--optimizer``).  CPU, or any device whose
tensors the meter sees; the figures are those of the plan given (``None``: the unplanned step).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memoplan.measure import LiveStorageMeter, default_loss, gc_paused, warm_up
from memoplan.planner.budgets import format_size
from memoplan.planner.profiling.profile import Snapshot, as_example
from memoplan.specs import Example

__all__ = ["KINDS", "Composition", "composition", "explanation"]

#: The kinds of a peak, in the order a refusal lists them.
KINDS = ("gradients", "saved activations", "outputs and caches", "temporaries")


@dataclass(frozen=True)
class Composition:
    """The bytes alive at a step's peak, by kind (:data:`KINDS`), and when the peak happened."""

    peak: int
    kinds: tuple[tuple[str, int], ...]
    phase: str  # "forward" or "backward"
    parameters: int  # parameters and buffers: live before the step, not in the peak
    optimizer_state: int = 0  # kept between steps (a profile's --optimizer), not in the peak

    def __getitem__(self, kind: str) -> int:
        return dict(self.kinds)[kind]

    def describe(self) -> str:
        """``at its moment (backward): gradients 1.2 MiB (40%), ...; beside it: parameters ...``."""
        shares = ", ".join(
            f"{kind} {format_size(n)} ({n / self.peak:.0%})" for kind, n in self.kinds if n and self.peak
        )
        beside = f"parameters and buffers {format_size(self.parameters)}"
        if self.optimizer_state:
            beside += f", optimizer state {format_size(self.optimizer_state)}"
        return f"the peak's composition at its moment (in {self.phase}): {shares or 'nothing'}; beside it: {beside}"


def composition(
    model: nn.Module, example: Example, plan: Any = None, *, loss_fn: Callable[[Any], torch.Tensor] | None = None
) -> Composition:
    """The :class:`Composition` of one training step of ``model`` (with ``plan``: on a copy)."""
    from memoplan import api
    from memoplan.planner.profiling.copies import unplanned_copy

    example = as_example(example)
    with Snapshot(model, example):
        step = api.apply(unplanned_copy(model), plan, warn=False) if plan is not None else model
        # The second step starts where the first did, a spiking neuron's state included (left as
        # the first step's, it would reach into the graph that step's backward freed).
        before = Snapshot(step, example)
        first = _run(step, example, loss_fn, None)
        before.restore()
        second = _run(step, example, loss_fn, first.peak_bytes)
    params = {id(p.untyped_storage()): p.untyped_storage().nbytes() for p in model.parameters()}
    params.update({id(b.untyped_storage()): b.untyped_storage().nbytes() for b in model.buffers()})
    # The first step's peak: the second holds what was alive at it until the step ends.
    return Composition(first.peak_bytes, second.kinds, second.phase, sum(params.values()))


@dataclass
class _Seen:
    peak_bytes: int
    kinds: tuple[tuple[str, int], ...] = ()
    phase: str = "forward"


def _run(model: nn.Module, example: Example, loss_fn, target: int | None) -> _Seen:
    """One step; with ``target``, what is alive the first time the live bytes reach it, by kind."""
    model.zero_grad(set_to_none=True)
    warm_up()
    meter = _Meter(target)
    with gc_paused(), meter:
        output = model(*example.args, **dict(example.kwargs))
        loss = (loss_fn or default_loss)(output)
        meter.phase = "backward"
        loss.backward()
    seen = _Seen(meter.peak_bytes)
    if target is None or meter.alive is None:
        return seen
    grads = {id(p.grad.untyped_storage()) for p in model.parameters() if p.grad is not None}
    held = _held(output)
    totals = dict.fromkeys(KINDS, 0)
    for key, (storage, nbytes, phase) in meter.alive.items():
        del storage  # held only so that no other storage takes its id while the step runs
        if key in grads:
            totals["gradients"] += nbytes
        elif key in held:
            totals["outputs and caches"] += nbytes
        elif phase == "forward":
            totals["saved activations"] += nbytes
        else:
            totals["temporaries"] += nbytes
    seen.kinds, seen.phase = tuple(totals.items()), meter.peak_phase
    meter.alive = None
    return seen


def _held(value: Any) -> set[int]:
    """The ids of the storages a model's output holds: in containers and in objects' attributes (a
    returned ``DynamicCache``), as a profile's ``kept_bytes`` finds them; modules are not opened."""
    found: set[int] = set()
    seen: set[int] = set()
    todo = [value]
    while todo:
        item = todo.pop()
        if id(item) in seen or isinstance(item, (nn.Module, str, bytes, int, float, bool, type(None), type)):
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            if item.layout is torch.strided:
                found.add(id(item.untyped_storage()))
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            todo.extend(item)
        elif hasattr(item, "__dict__"):
            todo.extend(vars(item).values())
    return found


class _Meter(LiveStorageMeter):
    """The live-storage meter that remembers when each storage was made (forward or backward) and,
    given a target, the storages alive the first time the live bytes reach it."""

    def __init__(self, target: int | None) -> None:
        super().__init__()
        self.target = target
        self.phase = "forward"
        self.peak_phase = "forward"
        self.made: dict[int, tuple[weakref.ref[torch.UntypedStorage], str]] = {}
        self.alive: dict[int, tuple[torch.UntypedStorage, int, str]] | None = None

    def _see(self, storage: torch.UntypedStorage, *, known: bool) -> None:
        key = id(storage)
        fresh = key not in self._live
        super()._see(storage, known=known)
        if fresh and key in self._live:
            self.made[key] = (weakref.ref(storage), self.phase)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.target is not None and self.alive is None and self.current_bytes >= self.target:
            self.alive = {}
            self.peak_phase = self.phase
            for key, (nbytes, _) in self._live.items():
                ref, phase = self.made.get(key, (None, self.phase))
                storage = ref() if ref is not None else None
                if storage is not None:
                    self.alive[key] = (storage, nbytes, phase)
        return out


def explanation(
    peak: Composition | None, least: int, unplanned: int, *, checkpoints: bool = True, shards: int = 1
) -> list[str]:
    """A refusal's help lines: the least budget that can be met, the peak's composition and the next step.

    ``peak``: the composition of the least-peak plan's step (None where it could not run for
    real: the next steps are then general); ``least``: the least peak the planner measured
    (bytes); ``unplanned``: the unplanned peak; ``checkpoints``: the refusal is of checkpoint
    rules (``--dtr`` is then a next step); ``shards``: the FSDP2 ranks the step is planned for.
    """
    share = f"{least / unplanned:.1%} of the unplanned peak" if unplanned else "the unplanned peak is 0 B"
    lines = [
        f"the least budget that can be met is {least} B ({format_size(least)}, {share}): "
        + ("write that, or the budget as `hint` to get that plan" if checkpoints else "write that")
    ]
    if peak is None:
        more = "--shards N, " if shards == 1 else ""
        nxt = "`hint`, " + ("--dtr, " if checkpoints else "") + f"{more}or a smaller batch"
        return [*lines, f"next: {nxt}"]
    lines.append(peak.describe())
    fixed = peak["gradients"] + peak["outputs and caches"]
    steps = []
    if peak.peak and peak["gradients"] / peak.peak >= 0.3:
        more = "--shards N (FSDP2 divides gradients and parameters)" if shards == 1 else "more --shards"
        steps.append(
            f"{more}: gradients are {peak['gradients'] / peak.peak:.0%} of the peak and no checkpoint frees them"
        )
    if peak.peak and peak["outputs and caches"] / peak.peak >= 0.2:
        steps.append(
            "a smaller output or cache (`use_cache=False`, a smaller vocabulary or batch): the output holds "
            f"{peak['outputs and caches'] / peak.peak:.0%} of the peak"
        )
    if checkpoints and peak["saved activations"] + peak["temporaries"] > 0:
        steps.append("--dtr (eviction at run time under a threshold)")
    steps.append("a smaller batch (activations scale with it; gradients and parameters do not)")
    lines.append(
        f"the part no plan lowers here: gradients and outputs, {format_size(fixed)}; next: " + "; ".join(steps)
    )
    return lines
