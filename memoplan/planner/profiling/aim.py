"""Planner stage: the Python API's target device and its profile -- ``memoplan.profile``, and the
``device`` and ``device_memory`` of ``memoplan.plan`` -- checked as the command line checks
``--device`` and ``--device-memory`` (:mod:`memoplan.planner.profiling.target`: the same functions, the
same diagnostics).
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Iterator
from typing import Any

from torch import nn

from memoplan.diagnostics import PlanError

__all__ = ["aimed", "device_budget_limit", "device_budget_refused", "profile"]


@contextlib.contextmanager
def aimed(
    model: nn.Module, example: Any, device: Any, device_memory: Any, step: Any, *, method: str = "auto", plan=None
) -> Iterator[tuple[nn.Module, Any]]:
    """``(model, example)`` for steps planned for ``device`` with ``device_memory``, as the command
    line's ``--device`` and ``--device-memory`` give them (the same checks and diagnostics): MP506 for a device that is not one, or a CUDA device this machine
    lacks for a model that could run here; MP509 for a capacity that is not a size; MP413 for
    ``method="measured"`` of a model no real step of which runs here; MP253 for a precision the
    device cannot run (``step``, a :class:`memoplan.step.Step`).  Where a real step can run there,
    the model is a copy moved to ``device`` (the caller's is not changed) and the example is moved
    too; a meta model stays as it is and is estimated on fake tensors of ``device``.  Inside, the
    target (:data:`memoplan.planner.profiling.target.TARGET`) is that device and capacity."""
    from memoplan.measure import step_device
    from memoplan.planner.profiling.target import (
        TARGET,
        memory_size,
        not_measurable,
        not_runnable,
        parse_device,
        target_for,
    )
    from memoplan.specs import Example
    from memoplan.step import check_precision, step_block

    where = None if device is None else parse_device(str(device), estimating=method != "measured")
    memory = memory_size(device_memory)
    why = not_runnable(model, where)
    if why is not None and method == "measured":
        raise PlanError((not_measurable(why, 'method="measured"'),))
    if why is None and where is not None:
        if any(t.device != where for t in (*model.parameters(), *model.buffers())):
            model = copy.deepcopy(model).to(where)
        if isinstance(example, Example):
            example = example.to(where)
    try:  # MP253, at the `step` block of the plan completed where it says so
        check_precision(step, model, where if where is not None else step_device(model), step_block(plan)[1])
    except PlanError as error:
        raise PlanError(error.diagnostics, None if plan is None else plan.source) from None
    token = TARGET.set(target_for(model, where, memory))
    try:
        yield model, example
    finally:
        TARGET.reset(token)


def device_budget_refused(budget, device: Any, device_memory: Any) -> None:
    """MP509 for ``budget`` (a :class:`~memoplan.planner.budgets.DeviceBudget`, as ``--budget device``)
    where the step's device cannot say its size and ``device_memory`` is not given."""
    from memoplan.planner.profiling.device_budget import device_budget_refused as refused
    from memoplan.planner.profiling.target import memory_size, parse_device

    where = None if device is None else parse_device(str(device), estimating=True)
    refused(where, budget.text, memory_size(device_memory))


def device_budget_limit(budget, model: nn.Module, device: Any, device_memory: Any, config, note):
    """The bytes ``budget`` (a :class:`~memoplan.planner.budgets.DeviceBudget`) stands for, ``model`` on ``device``."""
    from memoplan.planner.profiling.device_budget import device_budget_bytes
    from memoplan.planner.profiling.target import memory_size, parse_device

    where = None if device is None else parse_device(str(device), estimating=True)
    held = (model, config.optimizer, config.shards)
    return device_budget_bytes(where, budget, note, memory_size(device_memory), held)


def profile(
    model: nn.Module,
    example: Any,
    *,
    method: str = "auto",
    device: Any = None,
    step=None,
    repeats: int = 3,
    progress: bool = False,
):
    """Profile one training step of ``model`` on ``example``, as ``memoplan profile`` does; return
    the :class:`~memoplan.planner.profiling.profile.Profile` (``peak_bytes``, ``modules``, ``method``, ...).

    ``method``: ``auto`` (measure; estimate on fake tensors when the step does not fit or cannot
    run here), ``measured`` or ``estimated``; ``device``: the device the step is for, as
    ``--device`` (``"cuda"`` without a GPU here: estimated with the CPU's kernels standing in and
    storages rounded as the CUDA caching allocator rounds them); ``step``: the training step, a
    :class:`memoplan.syntax.blocks.StepConfig` (its loss, autocast, optimizer, shards, ...; default
    ``loss = auto``).  A model built on the meta device is estimated.  ``model`` is not changed.
    """
    from memoplan.planner.profiling.estimate import take_profile
    from memoplan.planner.profiling.profile import as_example
    from memoplan.step import make_step, merged, running

    config = merged(None, {}, {} if step is None else vars(step))  # MP250: mixed precision without shards
    ran = make_step(config)
    note = (lambda line: print(line, file=sys.stderr, flush=True)) if progress else None
    with aimed(model, as_example(example), device, None, ran, method=method) as (model, example), running(ran):
        return take_profile(
            model,
            example,
            method=method,
            note=note,
            repeats=repeats,
            progress=progress,
            shards=config.shards,
            optimizer=config.optimizer,
        )
