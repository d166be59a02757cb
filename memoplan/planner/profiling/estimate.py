"""Estimated profile: the full-size step's bytes on fake tensors, its times from a smaller real run.

A model whose unplanned step does not fit cannot be measured at full size, yet a planner needs
its bytes: what every module saves, its inputs and outputs, the step's peak.  Those are shape
arithmetic, so :func:`estimate` runs the training step once under torch's ``FakeTensorMode``
(tensors with shapes, dtypes, devices and storages of the right size, and no data): the same
probe as :func:`memoplan.planner.profiling.profile.profile` (saved-tensor hooks, module hooks) and the same
live-storage meter as :func:`memoplan.measure.measure_step` watch it, so every byte figure is what
the real step would allocate, with nothing allocated (on CUDA each storage is rounded up to the
caching allocator's 512-byte blocks).  Parameters and buffers are swapped for fake copies for
that step and put back after it; the model is left exactly as it was.

What has no shape: times, and whether a module's inputs are binary (spikes).  Both come from a
real :func:`~memoplan.planner.profiling.profile.profile` of a smaller example (the batch halved until it
fits, :func:`memoplan.planner.profiling.shrink.shrinking`, or the one given as ``calibration``): each
module's forward time is scaled by the ratio of its forward FLOPs at full size to its FLOPs at
the small size (``torch.utils.flop_counter``'s formulas, counted on fake tensors; a module
without matrix FLOPs scales with its input elements), and the step time by the ratio of the
whole step's FLOPs.  When even batch 1 does not fit, times are the FLOPs at the throughput of a
matrix product measured on the device.

:func:`~memoplan.planner.profiling.fake_step.fake_step` (:mod:`memoplan.planner.profiling.fake_step`) is that step.
:func:`take_profile` is what the commands call: ``measured`` (real steps), ``estimated``, or
``auto``: measure, and estimate when the real step runs out of memory (with a note).
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from memoplan.measure import LossFn, step_device
from memoplan.planner.profiling.copies import estimate_copy
from memoplan.planner.profiling.fake_step import FakeStep, FakeStepFailed, fake_step
from memoplan.planner.profiling.held import held_fields
from memoplan.planner.profiling.module_hooks import Record, module_profile, tensor_bytes, unique_storages
from memoplan.planner.profiling.profile import as_example, binary_inputs, input_metas, on_device, profile
from memoplan.planner.profiling.schema import Profile
from memoplan.planner.profiling.shard import SHARDS, optimizer_state_bytes
from memoplan.planner.profiling.shrink import describe_example, is_out_of_memory, shrink, shrinking
from memoplan.planner.profiling.target import TARGET, Target, is_meta, not_runnable, target_for
from memoplan.specs import Example
from memoplan.version import __version__

# The fake step itself is memoplan.planner.profiling.fake_step; ``fake_step`` and ``FakeStepFailed`` are
# re-exported here, where the commands and tests import them.
__all__ = ["METHODS", "FakeStepFailed", "estimate", "fake_step", "sharded_estimate", "take_profile"]

METHODS = ("auto", "measured", "estimated")


def take_profile(
    model: nn.Module,
    example: Example | torch.Tensor | Sequence[Any],
    *,
    method: str = "auto",
    note: Callable[[str], None] | None = None,
    fake_peak: bool = False,
    shards: int = 1,
    optimizer: str = "none",
    **options: Any,
) -> Profile:
    """A profile by ``method``: ``measured``, ``estimated``, or ``auto`` (measure; estimate on OOM).

    ``options`` go to :func:`~memoplan.planner.profiling.profile.profile` or :func:`estimate`
    (``device``, ``repeats``, ``progress``, ``loss_fn``).  ``note`` receives the line that says
    an out-of-memory error switched ``auto`` to the estimate.  ``fake_peak`` (``auto`` only):
    every byte figure is found on fake tensors (exact on every model tested, one fake step)
    instead of by the real peak and probe steps; one timed step runs for real.

    The profile records the step it was taken for (:mod:`memoplan.planner.profiling.stamp`).
    """
    from memoplan.planner.profiling.stamp import stamped
    from memoplan.step import current

    prof = _by_method(
        model, example, method=method, note=note, fake_peak=fake_peak, shards=shards, optimizer=optimizer, **options
    )
    step = current()
    return stamped(prof, model, step.config if step is not None else None)


def _by_method(
    model: nn.Module,
    example: Example | torch.Tensor | Sequence[Any],
    *,
    method: str = "auto",
    note: Callable[[str], None] | None = None,
    fake_peak: bool = False,
    shards: int = 1,
    optimizer: str = "none",
    **options: Any,
) -> Profile:
    """:func:`take_profile` before the step is recorded."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
    aim = TARGET.get()
    if options.get("device") is None and aim is not None and not_runnable(model, aim.device) is not None:
        options["device"] = aim.device  # the command's target, a device not here
    why = not_runnable(model, options.get("device"))
    if why is not None:  # a meta model, or a GPU not here: nothing runs for real, the step is estimated
        if method == "measured":
            raise ValueError(f"--method measured needs real steps, and {why}: estimate it (`estimated`)")
        method = "estimated"
    if shards > 1 or optimizer != "none":
        return sharded_estimate(
            model, example, shards, optimizer, method=method, note=note, fake_peak=fake_peak, **options
        )
    if method == "estimated":
        return estimate(model, example, note=note, **options)
    if method == "measured":
        return profile(model, example, **options)
    try:
        if fake_peak:
            return _with_fake_peak(model, example, options, note)
        return profile(model, example, **options)
    except BaseException as exc:
        if not is_out_of_memory(exc):
            raise
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    gc.collect()  # the traceback (gone with the except block) held the failed step's tensors
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    if note is not None:
        note(f"note: the unplanned step ran out of memory ({message}); estimating its profile instead")
    return estimate(model, example, note=note, **options)


def sharded_estimate(
    model: nn.Module,
    example: Any,
    shards: int,
    optimizer: str,
    *,
    method: str = "estimated",
    note=None,
    fake_peak: bool = False,
    **options: Any,
) -> Profile:
    """One FSDP2 rank's profile (:mod:`memoplan.planner.profiling.shard`): the step on the rank's own batch
    (``example``) on fake tensors, its gradients and gathered parameters as sharded over
    ``shards`` ranks, and the optimizer state that rank keeps.  A sharded step does not run
    here, so ``method`` ``measured`` is refused; one rank (``shards`` 1) is estimated only for the
    optimizer state (or measured with ``measured``)."""
    if shards < 1:
        raise ValueError(f"shards must be a positive integer, not {shards!r}")
    if shards > 1 and method == "measured":
        raise ValueError(
            "a sharded step runs only under torch.distributed: its profile is estimated (not --method measured)"
        )
    if shards > 1 and note is not None:
        note(
            f"estimating the step of one of {shards} FSDP2 ranks (parameters, gradients, optimizer state sharded 1/{shards})"
        )
    if shards == 1:
        prof = take_profile(model, example, method=method, note=note, fake_peak=fake_peak, **options)
    else:
        token = SHARDS.set(shards)
        try:
            prof = estimate(model, example, note=note, **options)
        finally:
            SHARDS.reset(token)
    return replace(prof, shards=shards, optimizer_state_bytes=optimizer_state_bytes(model, optimizer, shards))


def _with_fake_peak(
    model: nn.Module, example: Any, options: dict[str, Any], note: Callable[[str], None] | None = None
) -> Profile:
    """A profile whose bytes are found on fake tensors (exact on every model tested) and whose
    times are measured: one real timed step at the full size, then the fake step (the real step
    first: one that does not fit fails before the fake step takes any room), and whether each
    module's inputs are binary from a real forward (no grad) of the example cut to batch 1.  The whole
    measured profile when it runs on another device (a moved copy) or the step cannot run on
    fake tensors (``note`` says so, and names an operator run for real on zeros)."""
    timed = profile(model, example, **options, peak_bytes=0, probe=False)
    full = as_example(example)
    here = step_device(model, full.args, full.kwargs)
    target = torch.device(options["device"]) if options.get("device") is not None else here
    if target != here:
        return profile(model, example, **options)
    try:
        fake = fake_step(model, full, target, options.get("loss_fn"))
    except FakeStepFailed as exc:  # the real peak and probe steps
        if note is not None:
            note(f"note: {exc}; measuring the peak with real steps instead")
        return profile(model, example, **options)
    _note_fallbacks(fake, note)
    tiny = full
    while (smaller := shrink(tiny)) is not None:
        tiny = smaller
    seen = binary_inputs(model, tiny, target)
    modules = []
    for name, module in model.named_modules():
        record = fake.records.get(id(module), Record())
        binary = seen.get(id(module), False) and record.calls > 0
        modules.append(module_profile(name, module, record, timed[name].forward_seconds, binary))
    return replace(
        timed,
        modules=tuple(modules),
        peak_bytes=fake.peak_bytes,
        unattributed_saved_bytes=fake.unattributed,
        **held_fields(fake.held),
    )


def estimate(
    model: nn.Module,
    example: Example | torch.Tensor | Sequence[Any],
    *,
    device: torch.device | str | None = None,
    repeats: int = 3,
    progress: bool = True,
    loss_fn: LossFn | None = None,
    calibration: Example | None = None,
    note: Callable[[str], None] | None = None,
) -> Profile:
    """The profile :func:`~memoplan.planner.profiling.profile.profile` would measure, without running the
    full-size step for real; ``method == "estimated"`` (see the module's documentation).

    ``calibration`` is the smaller example whose real run gives the times and binary inputs
    (default: the example with its batch cut to a quarter, then halved until it fits).  ``note``
    receives a line for each stage (default: stderr when ``progress``).
    """
    if note is None:
        note = (lambda line: print(line, file=sys.stderr, flush=True)) if progress else (lambda line: None)
    example = as_example(example)
    why = not_runnable(model, device)
    if why is not None:  # nothing runs for real: the bytes from the fake step, the times from its FLOPs
        aim = target_for(model, device)
        note(f"estimating on fake tensors ({describe_example(example)}) for {aim.device}: {why}, so no real step runs")
        note(f"kernels: {aim.kernels_text()}")
        full = fake_step(model, example, aim.device, loss_fn)
        _note_fallbacks(full, note)
        return _assemble(model, example, aim, full, None, repeats)
    model, example, target = on_device(model, example, device)
    note(f"estimating on fake tensors ({describe_example(example)})")
    full = fake_step(model, example, target, loss_fn)
    _note_fallbacks(full, note)
    # Only the times of the smaller run are used: no peak step, no probe (binary inputs below).
    options: dict[str, Any] = {
        "repeats": repeats,
        "progress": progress,
        "loss_fn": loss_fn,
        "peak_bytes": 0,
        "probe": False,
    }
    small: Profile | None = None
    try:
        if calibration is not None:
            small_example, small = calibration.to(target), profile(model, calibration.to(target), **options)
        else:
            # A quarter of the batch first: a try that runs out of memory costs time and fragments the heap.
            small_example, small = shrinking(example, lambda ex: profile(model, ex, **options), first=2)
    except BaseException as exc:
        if not is_out_of_memory(exc):
            raise
        small = None  # not even batch 1 fits: times from FLOPs
    if small is not None:
        reduced = fake_step(model, small_example, target, loss_fn)
        binary = binary_inputs(model, small_example, target)
        note(f"times calibrated by a real run of {describe_example(small_example)}")
        return _assemble(model, example, target_for(model, target), full, (small, reduced, binary), repeats)
    return _assemble(model, example, target_for(model, target), full, None, repeats)


def _note_fallbacks(step: FakeStep, note: Callable[[str], None] | None) -> None:
    """Say which operators ran for real on zeros (their fake kernel refused), and why."""
    if note is None:
        return
    for operator, error in step.fallbacks:
        note(
            f"note: {operator} has no fake kernel for these inputs on this device ({error}); "
            "it ran for real on zeros of the same shapes (not counted; its outputs are, as any operator's)"
        )


# ---------------------------------------------------------------- the profile


def _ratio(full: int, small: int) -> float | None:
    return full / small if full > 0 and small > 0 else None


def _assemble(
    model: nn.Module,
    example: Example,
    aim: Target,
    full: FakeStep,
    calibration: tuple[Profile, FakeStep, dict[int, bool]] | None,
    repeats: int,
) -> Profile:
    """The estimated profile: bytes from the fake step ``full``; times (and binary inputs) from
    ``calibration``, the smaller real run's profile, its fake step and its binary inputs, else
    from FLOPs at the device's measured throughput."""
    small, reduced, binary_in = calibration if calibration is not None else (None, None, {})
    throughput = None if small is not None else _throughput(aim.kernels)
    modules = []
    for name, module in model.named_modules():
        key = id(module)
        record = full.records.get(key, Record())
        flops = full.flops.get(key, 0)
        if small is not None and reduced is not None and name in small:
            measured = small[name]
            little = reduced.records.get(key, Record())
            scale = _ratio(flops, reduced.flops.get(key, 0)) or _ratio(record.input_numel, little.input_numel) or 1.0
            seconds = measured.forward_seconds * scale
            binary = binary_in.get(key, False) and record.calls > 0
        else:
            seconds = flops / throughput if throughput else 0.0
            binary = False
        modules.append(module_profile(name, module, record, seconds, binary))
    if small is not None and reduced is not None:
        step = small.step_seconds * (
            _ratio(full.total_flops, reduced.total_flops) or full.peak_bytes / max(1, reduced.peak_bytes)
        )
    else:
        step = 3 * full.total_flops / throughput if throughput else 0.0
    return Profile(
        modules=tuple(modules),
        peak_bytes=int(full.peak_bytes),
        peak_method="fake-tensor",
        step_seconds=float(step),
        parameter_bytes=sum(tensor_bytes(p) for p in unique_storages(model.parameters())),
        unattributed_saved_bytes=full.unattributed,
        inputs=input_metas(example),
        device=str(aim.device),
        torch_version=torch.__version__,
        memoplan_version=__version__,
        repeats=small.repeats if small is not None else 0,
        method="estimated",
        kernels=str(aim.kernels) if aim.stand_in else "",
        model_device="meta" if is_meta(model) else "",
        reserved_bytes=full.reserved_bytes,
        region_seconds=small.region_seconds if small is not None else 0.0,
        save_op_seconds=small.save_op_seconds if small is not None else 0.0,
        **held_fields(full.held),
    )


def _throughput(device: torch.device) -> float:
    """FLOP/s of a 256x256 float32 matrix product on ``device`` (the best of a few)."""
    a = torch.randn(256, 256, device=device)
    best = float("inf")
    for _ in range(5):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        a @ a
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * 256**3 / max(best, 1e-9)


def estimate_plan(model: nn.Module, example: Example | torch.Tensor | Sequence[Any], plan: Any) -> int:
    """The peak of one training step of a copy of ``model`` with ``plan``, on fake tensors: what
    :func:`memoplan.planner.search.refine.measure_plan` measures, with nothing of the step allocated."""
    from memoplan import api

    example = as_example(example)
    target = target_for(model).device  # the command's target (TARGET), else where the model is
    clone = api.apply(estimate_copy(model), plan)
    return fake_step(clone, example, target, peak_only=True).peak_bytes
