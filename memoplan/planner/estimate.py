"""Estimated profile: the full-size step's bytes on fake tensors, its times from a smaller real run.

A model whose unplanned step does not fit cannot be measured at full size, yet a planner needs
its bytes: what every module saves, its inputs and outputs, the step's peak.  Those are shape
arithmetic, so :func:`estimate` runs the training step once under torch's ``FakeTensorMode``
(tensors with shapes, dtypes, devices and storages of the right size, and no data): the same
probe as :func:`memoplan.planner.profile.profile` (saved-tensor hooks, module hooks) and the same
live-storage meter as :func:`memoplan.measure.measure_step` watch it, so every byte figure is what
the real step would allocate, with nothing allocated (on CUDA each storage is rounded up to the
caching allocator's 512-byte blocks).  Parameters and buffers are swapped for fake copies for
that step and put back after it; the model is left exactly as it was.

What has no shape: times, and whether a module's inputs are binary (spikes).  Both come from a
real :func:`~memoplan.planner.profile.profile` of a smaller example (the batch halved until it
fits, :func:`memoplan.planner.shrink.shrinking`, or the one given as ``calibration``): each
module's forward time is scaled by the ratio of its forward FLOPs at full size to its FLOPs at
the small size (``torch.utils.flop_counter``'s formulas, counted on fake tensors; a module
without matrix FLOPs scales with its input elements), and the step time by the ratio of the
whole step's FLOPs.  When even batch 1 does not fit, times are the FLOPs at the throughput of a
matrix product measured on the device.

:func:`take_profile` is what the commands call: ``measured`` (real steps), ``estimated``, or
``auto``: measure, and estimate when the real step runs out of memory (with a note).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from memoplan.measure import LiveStorageMeter, LossFn, gc_paused, step_device, training_step, warm_up
from memoplan.planner.copies import estimate_copy
from memoplan.planner.cuda_allocator import Simulator, block_bytes
from memoplan.planner.module_hooks import Probe, Record, module_profile, tensor_bytes, unique_storages
from memoplan.planner.profile import as_example, binary_inputs, input_metas, on_device, profile
from memoplan.planner.schema import Profile
from memoplan.planner.shard import SHARDS, gathered_bytes, optimizer_state_bytes
from memoplan.planner.shrink import describe_example, is_out_of_memory, shrink, shrinking
from memoplan.planner.snapshot import Restored
from memoplan.planner.target import TARGET, Target, fake_like, is_meta, not_runnable, target_for
from memoplan.specs import Example
from memoplan.version import __version__

__all__ = ["METHODS", "FakeStepFailed", "estimate", "sharded_estimate", "take_profile"]

METHODS = ("auto", "measured", "estimated")

#: The CUDA caching allocator hands out blocks in multiples of this many bytes.
CUDA_BLOCK = 512


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

    ``options`` go to :func:`~memoplan.planner.profile.profile` or :func:`estimate`
    (``device``, ``repeats``, ``progress``, ``loss_fn``).  ``note`` receives the line that says
    an out-of-memory error switched ``auto`` to the estimate.  ``fake_peak`` (``auto`` only):
    every byte figure is found on fake tensors (exact on every model tested, one fake step)
    instead of by the real peak and probe steps; one timed step runs for real.
    """
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
    """One FSDP2 rank's profile (:mod:`memoplan.planner.shard`): the step on the rank's own batch
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
        timed, modules=tuple(modules), peak_bytes=fake.peak_bytes, unattributed_saved_bytes=fake.unattributed
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
    """The profile :func:`~memoplan.planner.profile.profile` would measure, without running the
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


# ---------------------------------------------------------------- the fake step


@dataclass
class FakeStep:
    """What one training step on fake tensors showed: peak, probe records, FLOPs per module."""

    peak_bytes: int
    records: dict[int, Record]
    unattributed: int
    flops: dict[int, int] = field(default_factory=dict)  # id(module) -> forward FLOPs, its subtree's
    total_flops: int = 0  # the whole step's, backward included
    fallbacks: tuple[tuple[str, str], ...] = ()  # (operator, its fake kernel's error): run for real on zeros
    reserved_bytes: int = 0  # on CUDA: what the caching allocator would reserve at most (cuda_allocator)


class _FakeProbe(Probe):
    """The profile's probe on fake tensors: storages are told apart by their C++ identity (a fake
    storage has no address) and values are not read (binary inputs come from the calibration)."""

    def _storage_key(self, storage: torch.UntypedStorage) -> int:
        return int(storage._cdata)

    def _is_binary(self, tensor: torch.Tensor) -> bool:
        return True


class _Flops(TorchDispatchMode):
    """FLOPs of every op (``torch.utils.flop_counter``'s formulas, no decomposition), added to each
    module running (the probe's stack) and to the total."""

    def __init__(self, probe: Probe) -> None:
        super().__init__()
        self.probe = probe
        self.per_module: dict[int, int] = {}
        self.total = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            count = int(formula(*args, **kwargs, out_val=out))
            self.total += count
            for key in set(self.probe._stack):
                self.per_module[key] = self.per_module.get(key, 0) + count
        return out


class _AllocatorMeter(LiveStorageMeter):
    """The live-storage meter with CUDA storages rounded up as the caching allocator rounds them;
    sharded over ``shards`` ranks, each gradient counts ``1/shards`` once it is accumulated."""

    def __init__(self, shards: int = 1, widen: tuple[int, int] = (1, 1), *, cuda: bool = False) -> None:
        super().__init__()
        self.shards = shards
        self.widen = widen  # a sharded gradient is kept in a dtype this much wider (fp32 of bf16: (4, 2))
        self.cuda = cuda
        self.simulator = Simulator() if cuda else None  # what the caching allocator would reserve
        self._sharded: set[int] = set()

    def shard(self, storage: torch.UntypedStorage) -> None:
        """Count ``storage`` (a gradient FSDP2 reduce-scatters) at ``1/shards`` from now on."""
        key = id(storage)
        self._sharded.add(key)
        entry = self._live.get(key)
        if entry is not None:
            nbytes = self._nbytes(storage)
            self.current_bytes += nbytes - entry[0]
            self._live[key] = (nbytes, entry[1])
            if self.simulator is not None:  # the whole gradient freed, its shard allocated
                self.simulator.free(key)
                self.simulator.allocate(key, nbytes)

    def _see(self, storage: torch.UntypedStorage, *, known: bool) -> None:
        new = id(storage) not in self._live
        super()._see(storage, known=known)
        if self.simulator is not None and new and id(storage) in self._live:
            self.simulator.allocate(id(storage), self._live[id(storage)][0])

    def _freed(self, key: int) -> None:
        super()._freed(key)
        if self.simulator is not None:
            self.simulator.free(key)

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> Any:
        if func is not torch.ops.aten.lift_fresh.default:
            return super().__torch_dispatch__(func, types, args, kwargs)
        # A constant of the model's code (``torch.tensor(...)``): the real step allocates it before
        # any operator runs, and ``lift_fresh`` returns it as it is, so the CPU's live-storage meter
        # never counts it; here ``lift_fresh`` makes its fake copy, counted only on CUDA (whose
        # allocator sees the real constant).
        out = func(*args, **(kwargs or {}))
        if out.device.type == "cuda":
            self._see(out.untyped_storage(), known=False)
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        return out

    def _nbytes(self, storage: torch.UntypedStorage) -> int:
        nbytes = storage.nbytes()
        if id(storage) in self._sharded:
            nbytes = -(-nbytes * self.widen[0] // (self.widen[1] * self.shards))
        if self.cuda or storage.device.type == "cuda":
            return block_bytes(nbytes)
        return nbytes


def fake_step(
    model: nn.Module, example: Example, target: torch.device, loss_fn: LossFn | None = None, *, peak_only: bool = False
) -> FakeStep:
    """One training step of ``model`` on fake tensors: its peak, probe and FLOPs; model left as it was.
    ``peak_only``: the peak alone (no probe records, no FLOPs: what a planned trial needs).

    Code that branches on whether it is being traced (transformers skips a causal mask for real
    data and builds one for fake tensors) is shown real tensors' branch first; when that branch
    needs the data (``DataDependentOutputException``), the step is run again on the traced branch.
    An operator whose fake kernel refuses inputs its real kernel takes runs for real on zeros
    (:class:`_RealKernelFallback`; ``FakeStep.fallbacks`` names it).  Anything else the step raises
    (an out-of-memory error aside) is raised as :class:`FakeStepFailed`, from the original error.
    """
    from torch._subclasses.fake_tensor import DataDependentOutputException

    fallback = _RealKernelFallback()
    try:
        try:
            with _as_real_data(hide_fakes=True):
                return _fake_step(model, example, target, loss_fn, peak_only, fallback)
        except DataDependentOutputException:
            pass
        with _as_real_data(hide_fakes=False):
            return _fake_step(model, example, target, loss_fn, peak_only, fallback)
    except Exception as exc:  # noqa: BLE001  the model's code or an operator, on fake tensors
        if is_out_of_memory(exc) or isinstance(exc, FakeStepFailed):
            raise
        raise FakeStepFailed(exc, *fallback.refusal(exc)) from exc


class FakeStepFailed(Exception):
    """The training step could not run on fake tensors (the estimate): ``cause`` is what it raised.

    ``operator`` is the operator whose fake kernel raised it, when one did; ``real_kernel_refused``
    says that its real kernel, run on zeros of the same shapes, refused the inputs too (so the
    inputs, not the estimate, are wrong); ``data_dependent`` that the step reads tensor values
    (``.item()``, ``.tolist()``, ``nonzero``, a branch on data), which fake tensors do not have.
    """

    def __init__(self, cause: Exception, operator: str | None = None, real_kernel_refused: bool = False) -> None:
        from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

        self.cause = cause
        self.operator = operator
        self.real_kernel_refused = real_kernel_refused
        self.data_dependent = isinstance(cause, (DataDependentOutputException, DynamicOutputShapeException))
        text = str(cause).strip()
        described = f"{type(cause).__name__}: {text.splitlines()[0]}" if text else type(cause).__name__
        where = f" in {operator}" if operator and operator not in described else ""
        super().__init__(f"estimating one training step on fake tensors raised {described}{where}")


class _RealKernelFallback(TorchDispatchMode):
    """Just above the fake mode: an operator whose fake kernel raises (``aten._grouped_mm``'s wants
    bfloat16, as CUDA's kernel does, while the CPU's takes float32) runs its real kernel on zeros of
    the inputs' shapes, dtypes and devices (``torch``'s fallback for operators without a fake
    kernel), and its outputs become fake tensors of the real outputs' metadata; the zeros are not
    seen by the meter (the outputs are, as every operator's are).  Not for a data-dependent error
    (the zeros would give a wrong shape) nor an in-place view; when the real kernel refuses too,
    the fake kernel's error is raised.  ``fallbacks``: each operator that fell back and why."""

    def __init__(self) -> None:
        super().__init__()
        self.fallbacks: dict[str, str] = {}
        self._refusal: tuple[BaseException, str, bool] | None = None

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> Any:
        from torch._subclasses.fake_tensor import (
            DataDependentOutputException,
            DynamicOutputShapeException,
            FakeTensor,
            run_fallback_kernel,
        )

        kwargs = kwargs or {}
        try:
            return func(*args, **kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException) as exc:
            self._refusal = (exc, str(func), False)
            raise
        except Exception as exc:
            flat, spec = pytree.tree_flatten((args, kwargs))
            fakes = [a for a in flat if isinstance(a, FakeTensor)]
            if not fakes or is_out_of_memory(exc):
                raise
            try:
                out = run_fallback_kernel(fakes[0].fake_mode, func, flat, spec, exc)  # type: ignore[arg-type]
            except Exception:  # noqa: BLE001  the real kernel refuses these inputs too: the fake kernel's error
                self._refusal = (exc, str(func), True)
                raise exc from None
            text = str(exc).strip()
            self.fallbacks.setdefault(str(func), f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}")
            return out

    def refusal(self, exc: BaseException) -> tuple[str | None, bool]:
        """The operator that raised ``exc`` (None when no operator did) and whether its real kernel
        refused too."""
        if self._refusal is not None and self._refusal[0] is exc:
            return self._refusal[1], self._refusal[2]
        return None, False


def _fake_step(
    model: nn.Module,
    example: Example,
    target: torch.device,
    loss_fn: LossFn | None,
    peak_only: bool,
    fallback: _RealKernelFallback,
) -> FakeStep:
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    shards = SHARDS.get()
    compute = _mixed_precision(shards)
    aim = target_for(model, target)
    kernels = aim.kernels  # the target's own, or the CPU's standing in for a CUDA device not here
    with Restored(model, example, kernels):
        _fake_state(model, mode, kernels)
        convert = lambda v: fake_like(mode, v, kernels) if isinstance(v, torch.Tensor) else v  # noqa: E731
        args = pytree.tree_map(convert, tuple(example.args))
        kwargs = pytree.tree_map(convert, dict(example.kwargs))
        widen = (1, 1)
        if compute is not None:
            args, kwargs, widen = _in_compute_dtype(model, mode, compute, (args, kwargs))
        probe = _FakeProbe(model, kernels)
        flops = _Flops(probe)
        meter = _AllocatorMeter(shards, widen, cuda=aim.device.type == "cuda")
        hooks = [
            p.register_post_accumulate_grad_hook(lambda p: meter.shard(p.grad.untyped_storage()))
            for p in model.parameters()
            if shards > 1 and p.requires_grad
        ]
        warm_up()
        try:
            with mode, fallback, _quiet_fake_kernels(), gc_paused(), meter, contextlib.ExitStack() as watching:
                if not peak_only:  # the probe and the FLOP counter, inside the meter as always
                    watching.enter_context(probe)
                    watching.enter_context(flops)
                output, loss = training_step(model, args, kwargs, loss_fn)
                if not peak_only:
                    probe.kept_by(output)
                del output, loss
        finally:
            for hook in hooks:
                hook.remove()
        gathered = gathered_bytes(model, shards)
        reserved = meter.simulator.peak_reserved + gathered if meter.simulator is not None else 0
        peak = meter.peak_bytes + gathered
        found = tuple(fallback.fallbacks.items())
        return FakeStep(peak, probe.records, probe.unattributed, flops.per_module, flops.total, found, reserved)


class _DropFakeKernelTracebacks(logging.Filter):
    """torch logs the traceback of a fake kernel that raised before raising it; memoplan handles
    that error itself (a fallback, or a diagnostic), so the traceback is not printed."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("failed while attempting to run meta")


@contextlib.contextmanager
def _quiet_fake_kernels() -> Iterator[None]:
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    drop = _DropFakeKernelTracebacks()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


@contextlib.contextmanager
def _as_real_data(*, hide_fakes: bool) -> Iterator[None]:
    """While the fake step runs: ``torch.equal`` of a fake tensor is False (a training step's
    buffers changed: memoplan's buffer tracking asks), and with ``hide_fakes`` transformers'
    ``is_fake_tensor`` says no, so it takes the branch it takes for real data."""
    from torch._subclasses.fake_tensor import FakeTensor

    equal = torch.equal

    def fake_equal(a: Any, b: Any) -> bool:
        return False if isinstance(a, FakeTensor) or isinstance(b, FakeTensor) else equal(a, b)

    hf = sys.modules.get("transformers.utils.import_utils") if hide_fakes else None
    is_fake = getattr(hf, "is_fake_tensor", None)
    # Without a mask or a cache, transformers reads the position ids to find packed sequences;
    # positions it makes itself (an arange) hold none, which is what the estimate assumes.
    masks = sys.modules.get("transformers.masking_utils") if hide_fakes else None
    packed = getattr(masks, "find_packed_sequence_indices", None)
    torch.equal = fake_equal  # type: ignore[assignment]  # for the fake step only; put back after it
    if is_fake is not None:
        hf.is_fake_tensor = lambda x: False  # type: ignore[union-attr]
    if packed is not None:
        masks.find_packed_sequence_indices = lambda position_ids: None  # type: ignore[union-attr]
    try:
        yield
    finally:
        torch.equal = equal
        if is_fake is not None:
            hf.is_fake_tensor = is_fake  # type: ignore[union-attr]
        if packed is not None:
            masks.find_packed_sequence_indices = packed  # type: ignore[union-attr]


def _mixed_precision(shards: int) -> torch.dtype | None:
    """The compute dtype of FSDP2's ``MixedPrecisionPolicy`` in the running step (sharded steps only)."""
    from memoplan.step import current

    step = current()
    return step.mixed_precision if step is not None and shards > 1 else None


def _in_compute_dtype(model: nn.Module, mode: Any, dtype: torch.dtype, inputs: Any) -> tuple[Any, Any, tuple[int, int]]:
    """FSDP2 with ``MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=float32)`` on fake state:
    each floating parameter gathered in ``dtype`` (shared ones stay shared), the forward's floating
    inputs cast to it (``cast_forward_inputs``); returns the inputs and how much wider the fp32
    gradient shards are than the gradients autograd makes."""
    cast: dict[int, nn.Parameter] = {}
    with mode:
        for module in model.modules():
            for name, p in list(module._parameters.items()):
                if p is None or not p.is_floating_point():
                    continue
                if id(p) not in cast:
                    cast[id(p)] = nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad)
                module._parameters[name] = cast[id(p)]
        args, kwargs = pytree.tree_map(
            lambda v: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v, inputs
        )
    width = torch.empty((), dtype=dtype).element_size()
    return args, kwargs, (4, width)


def _fake_state(model: nn.Module, mode: Any, device: torch.device) -> None:
    """Swap every parameter and buffer for a fake copy on ``device`` with its dtype (shared ones
    stay shared; meta ones and fake ones of another mode made anew, :func:`fake_like`); the
    caller's snapshot puts the real ones back."""
    fakes: dict[int, Any] = {}  # fake parameters (nn.Parameter) and buffers, by the real one's id
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                if id(p) not in fakes:
                    fakes[id(p)] = nn.Parameter(fake_like(mode, p.detach(), device), requires_grad=p.requires_grad)
                module._parameters[name] = fakes[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None:
                if id(b) not in fakes:
                    fakes[id(b)] = fake_like(mode, b, device)
                module._buffers[name] = fakes[id(b)]


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
    :func:`memoplan.planner.refine.measure_plan` measures, with nothing of the step allocated."""
    from memoplan import api

    example = as_example(example)
    target = target_for(model).device  # the command's target (TARGET), else where the model is
    clone = api.apply(estimate_copy(model), plan)
    return fake_step(clone, example, target, peak_only=True).peak_bytes
