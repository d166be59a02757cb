"""Measure stage: profile one training step per module, as plain data a planner can read.

:func:`profile` runs a few training steps of a model on an example and records,
for every path of ``named_modules()`` (natural order), what a planner needs to
decide where to checkpoint and what to compress; :class:`Profile` is a frozen,
JSON-serialisable record of it.  Planners are pure functions of a profile, so a
profile taken once (or on every rank and :func:`merge`-d) gives the same plan
everywhere.

This module measures; the records themselves, their JSON form, :func:`merge` and
:func:`chain` are the profile schema, :mod:`memoplan.planner.profiling.schema` (re-exported here); the
probe's and the timer's hooks are :mod:`memoplan.planner.profiling.module_hooks`, and the snapshot that
leaves the model as it was :mod:`memoplan.planner.profiling.snapshot`.

Steps (each starts from the same model state and RNG state, see below):

1. **peak** — one clean step under :func:`memoplan.measure.measure_step` (the
   deterministic live-storage meter on CPU, the caching allocator on CUDA): the
   unplanned peak, with no profiling hooks installed.
2. **probe** — one step with forward pre/post hooks on every module and a
   ``torch.autograd.graph.saved_tensors_hooks`` pack hook: saved-activation bytes,
   input/output bytes, binary inputs, execution order.
3. **time** x ``repeats`` — steps with timing hooks only: per-module forward time
   and whole-step time, the median over the repeats (``time.perf_counter`` on
   CPU, CUDA events on GPU).

Attribution of saved activations: every tensor the pack hook sees is
attributed to the *innermost module whose forward is running* when it is saved
(the top of a stack kept by the pre/post hooks; code in the root's own forward
goes to the root ``""``; the loss, outside the model, to
:attr:`Profile.unattributed_saved_bytes`).  Bytes are those of the tensor's
*storage* (a saved view keeps its whole storage alive), and a storage is counted
once per step, by the first module that saves it: when a ReLU saves its output
and the next Linear saves the same tensor as its input, the ReLU is charged and
the Linear is not.  Storages of parameters and buffers are never counted.
:meth:`Profile.subtree_saved_bytes` adds a module's descendants.

A module called several times in one step (a shared block) adds up its calls:
saved, input and output bytes and forward time are sums over calls, ``calls``
says how many, and ``input_binary`` holds only if every call's inputs were
binary.  A module that never runs (an ``nn.ModuleList``, an unused branch) has
zeros, ``calls == 0`` and ``order is None``.

Binary inputs are probed in **train mode** (train-mode dropout rescales spikes to
``1/(1-p)``, which an eval-mode probe would miss): a model whose root is in
training mode is profiled with its modes as they are; a model in eval mode is put
in train mode for the profile (and back afterwards).

The model is left exactly as it was: parameters (identity and ``.grad``),
buffers (identity and values), every module's attributes (so neuron membrane
potentials and counters rebound in ``forward`` come back), state exposed through
:mod:`memoplan.runtime.state`, training flags, the CPU/CUDA and Python ``random``
RNG states, the ``.grad`` of example tensors, and no hooks left behind.  A
forward that modifies a parameter in place cannot be undone without a copy of
every weight; it is detected (version counters) and reported with a warning.
"""

from __future__ import annotations

import contextlib
import copy
import statistics
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from memoplan.measure import (
    LossFn,
    gc_frozen,
    indexed_device,
    measure_step,
    step_device,
    timeline_step,
    training_step,
)
from memoplan.planner.profiling.held import Held, boundaries, held_fields, stretches
from memoplan.planner.profiling.module_hooks import Probe, Record, Timer, module_profile, tensor_bytes, unique_storages
from memoplan.planner.profiling.regioncost import region_seconds, save_op_seconds
from memoplan.planner.profiling.schema import (
    FORMAT_VERSION,
    ChainLink,
    ModuleProfile,
    Profile,
    TensorMeta,
    chain,
    default_candidates,
    merge,
    nested_candidates,
)
from memoplan.planner.profiling.snapshot import Restored, Snapshot
from memoplan.progress import REPORTER
from memoplan.specs import Example
from memoplan.version import __version__

# The profile's records, JSON, merging and candidate chains live in memoplan.planner.profiling.schema, the
# snapshot that leaves the model as it was in memoplan.planner.profiling.snapshot; they are re-exported
# here, so ``from memoplan.planner.profiling.profile import Profile, Snapshot`` keeps working.  The hooks
# of the probe and timer steps are memoplan.planner.profiling.module_hooks.
__all__ = [
    "FORMAT_VERSION",
    "ChainLink",
    "ModuleProfile",
    "Profile",
    "Snapshot",
    "TensorMeta",
    "binary_inputs",
    "chain",
    "default_candidates",
    "merge",
    "nested_candidates",
    "on_device",
    "profile",
]


# ---------------------------------------------------------------- profile()


def on_device(
    model: nn.Module, example: Example, device: torch.device | str | None
) -> tuple[nn.Module, Example, torch.device]:
    """``model`` and ``example`` on ``device`` (default: where the step runs now), as deep copies
    when it is another device, and that device (a CUDA one with its index)."""
    here = step_device(model, example.args, example.kwargs)
    target = indexed_device(device) if device is not None else here
    if target != here:
        model = copy.deepcopy(model).to(target)
        example = example.to(target)
    return model, example, target


def _timed_steps(
    model, example: Example, target, restored, bar, repeats: int, loss_fn
) -> tuple[list[dict[int, float]], list[float]]:
    """``repeats`` timed training steps: each module's seconds (by ``id``) and each step's, the
    model restored after each."""
    timings: list[dict[int, float]] = []
    steps: list[float] = []
    for i in range(repeats):
        bar.step(f"time {i + 1}/{repeats}")
        timer = Timer(model, target)
        with timer:
            training_step(model, example.args, dict(example.kwargs), loss_fn)
        per_module, step = timer.result()
        timings.append(per_module)
        steps.append(step)
        restored.reset()
    return timings, steps


def _module_profiles(model: nn.Module, timings: list[dict[int, float]], found: Probe) -> tuple[ModuleProfile, ...]:
    """Every module's row: its median seconds over the timed steps and what the probe saw."""
    modules = []
    for name, module in model.named_modules():
        key = id(module)
        seconds = float(statistics.median(per_module.get(key, 0.0) for per_module in timings))
        record = found.records.get(key, Record())
        modules.append(module_profile(name, module, record, seconds, record.binary))
    return tuple(modules)


def profile(
    model: nn.Module,
    example: Example | torch.Tensor | Sequence[Any],
    *,
    device: torch.device | str | None = None,
    repeats: int = 3,
    progress: bool = True,
    loss_fn: LossFn | None = None,
    peak_bytes: int | None = None,
    probe: bool = True,
) -> Profile:
    """Profile training steps of ``model`` on ``example``; leave the model as it was.

    ``example`` is an :class:`~memoplan.specs.Example` (a tensor or a tuple of
    positional arguments is accepted too).  ``device`` defaults to the model's
    (its first parameter's, else the example's); naming another device profiles a
    deep copy moved there, so the model itself is never moved.  ``repeats`` timed
    steps give the medians.  ``progress`` draws a bar on stderr.  ``loss_fn`` maps
    the output to the loss (default: the running step's, :func:`memoplan.measure.step_loss`).
    ``peak_bytes``: the unplanned peak found otherwise (on fake tensors, ``memoplan plan``'s
    default): the peak step is not run, and ``peak_method`` says ``fake-tensor``.  ``probe``
    False: no probe step either (every module's bytes are 0: the caller has them from elsewhere).
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, not {repeats!r}")
    model, example, target = on_device(model, as_example(example), device)

    # On CUDA a process's first steps allocate what then stays (cuBLAS workspaces, compiled
    # and autotuned kernels): measured cold, the unplanned peak would carry them, and every
    # budget given as a share of it would be too loose.  One step first, then the peak.
    warm_up = target.type == "cuda"
    bar = _Progress((2 if peak_bytes is None else int(probe)) + repeats + warm_up, enabled=progress)
    with gc_frozen(), bar, Restored(model, example, target) as restored:
        if warm_up:
            bar.step("warm-up")
            training_step(model, example.args, dict(example.kwargs), loss_fn)
            restored.reset()
        held = Held((), {})
        if peak_bytes is None:
            bar.step("peak")
            measured, held = _peak_step(model, example, target, loss_fn)
            peak, peak_method = measured.peak_bytes, measured.method
            restored.reset()
        else:
            peak, peak_method = peak_bytes, "fake-tensor"

        def probed() -> Probe:
            bar.step("probe")
            probe = Probe(model, target)
            with probe:
                output, _ = training_step(model, example.args, dict(example.kwargs), loss_fn)
                probe.kept_by(output)
                del output
            restored.reset()
            return probe

        # Without the peak step, the first real step is a timed one: it has the fewest Python
        # objects of its own, so a step that does not fit leaves the least behind it.
        probe_first = probed() if peak_bytes is None else None
        timings, steps = _timed_steps(model, example, target, restored, bar, repeats, loss_fn)
        found = probe_first or (probed() if probe else Probe(model, target))

    return Profile(
        modules=_module_profiles(model, timings, found),
        peak_bytes=int(peak),
        peak_method=peak_method,
        step_seconds=float(statistics.median(steps)),
        parameter_bytes=sum(tensor_bytes(p) for p in unique_storages(model.parameters())),
        unattributed_saved_bytes=found.unattributed,
        inputs=input_metas(example),
        device=str(target),
        torch_version=torch.__version__,
        memoplan_version=__version__,
        repeats=repeats,
        region_seconds=region_seconds(target),
        save_op_seconds=save_op_seconds(target),
        **held_fields(held),
    )


def _peak_step(model: nn.Module, example: Example, target: torch.device, loss_fn: LossFn | None):
    """The unplanned step's peak, and on the CPU its live bytes between module boundaries
    (:mod:`memoplan.planner.profiling.held`), from the same step."""
    if target.type != "cpu":
        return measure_step(model, example.args, example.kwargs, loss_fn=loss_fn), Held((), {})
    measured, line = timeline_step(model, example.args, example.kwargs, loss_fn=loss_fn, marks=boundaries(model))
    return measured, stretches(line.samples, line.marks)


def binary_inputs(model: nn.Module, example: Example, device: torch.device) -> dict[int, bool]:
    """Per module (by ``id``): whether the tensor inputs of its every call were binary, found by
    one forward of ``example`` in train mode without grad (values are what counts: no backward
    is needed); the model is left as it was."""
    with Restored(model, example, device):
        probe = Probe(model, device)
        with probe, torch.no_grad():
            model(*example.args, **dict(example.kwargs))
    return {key: record.binary for key, record in probe.records.items()}


# ---------------------------------------------------------------- progress


class _Progress:
    """The profile's steps as a stage of :data:`memoplan.progress.REPORTER`: a bar with the time
    left on a terminal, one line elsewhere; with ``-v`` a line per step."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled
        self.done_steps = 0
        self._stage = contextlib.ExitStack()

    def __enter__(self) -> _Progress:
        if self.enabled:
            self._stage.enter_context(REPORTER.stage("measuring the training step", self.total, "steps"))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled and self.done_steps and exc[0] is None:
            REPORTER.advance()  # the last step has finished
        self._stage.close()

    def step(self, label: str) -> None:
        """Step ``label`` starts (the one before it has finished)."""
        if self.enabled:
            if self.done_steps:
                REPORTER.advance()
            REPORTER.detail(f"profile: {label} step")
        self.done_steps += 1


def as_example(example: Example | torch.Tensor | Sequence[Any]) -> Example:
    if isinstance(example, Example):
        return example
    if isinstance(example, torch.Tensor):
        return Example((example,))
    if isinstance(example, (tuple, list)):
        return Example(tuple(example))
    raise TypeError(
        f"example must be a memoplan.specs.Example, a Tensor or a tuple of arguments, not {type(example).__name__}"
    )


def input_metas(example: Example) -> tuple[TensorMeta, ...]:
    metas = []
    for root, tree in (("args", tuple(example.args)), ("kwargs", dict(example.kwargs))):
        for path, leaf in pytree.tree_flatten_with_path(tree)[0]:
            if isinstance(leaf, torch.Tensor):
                name = root + pytree.keystr(path)
                metas.append(TensorMeta(name, tuple(leaf.shape), _dtype_name(leaf.dtype)))
    return tuple(metas)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
