"""One training step on fake tensors (torch's ``FakeTensorMode``): every module's saved, input
and output bytes, the step's peak (rounded up to the CUDA allocator's blocks on CUDA) and each
module's FLOPs, with nothing allocated; parameters and buffers swapped for fake copies during
the step and put back after it.  An operator with no fake kernel runs its real kernel on data of
the right shape, or the step fails with :class:`FakeStepFailed`.  :mod:`memoplan.planner.profiling.estimate`
builds a profile from it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from memoplan.measure import LiveStorageMeter, LossFn, gc_paused, training_step, warm_up
from memoplan.planner.profiling.cuda_allocator import Simulator, block_bytes
from memoplan.planner.profiling.held import Held, boundaries, stretches
from memoplan.planner.profiling.module_hooks import Probe, Record
from memoplan.planner.profiling.shard import SHARDS, gathered_bytes
from memoplan.planner.profiling.shrink import is_out_of_memory
from memoplan.planner.profiling.snapshot import Restored
from memoplan.planner.profiling.target import fake_like, target_for
from memoplan.specs import Example

#: The CUDA caching allocator hands out blocks in multiples of this many bytes.
CUDA_BLOCK = 512


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
    held: Held = Held((), {})  # its live bytes between module boundaries (memoplan.planner.profiling.held)


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

    def __init__(
        self, shards: int = 1, widen: tuple[int, int] = (1, 1), *, cuda: bool = False, record: bool = False
    ) -> None:
        super().__init__(record=record)
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
        meter = _AllocatorMeter(shards, widen, cuda=aim.device.type == "cuda", record=not peak_only)
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
                    watching.enter_context(boundaries(model)(meter.mark))
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
        held = stretches(meter.samples, meter.marks, gathered) if meter.samples is not None else Held((), {})
        return FakeStep(peak, probe.records, probe.unattributed, flops.per_module, flops.total, found, reserved, held)


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
