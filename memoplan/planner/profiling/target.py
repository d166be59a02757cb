"""The device a step is planned for, which need not be this machine's, and models built on meta.

Large models are built on the meta device (``with torch.device("meta"):``, accelerate's
``init_empty_weights``): every parameter and buffer has its shape and dtype and no storage.
Such a model cannot run a real step, but its estimate (:mod:`memoplan.planner.profiling.estimate`) needs
none: for the fake step its parameters and buffers become fake tensors of the *target* device
with their own dtypes, and the example's tensors (inline, or from a factory, on any device)
follow.  So the kernels are the target's (on meta, SDPA would take the math path and save every
attention matrix; on the CPU or CUDA it takes a flash kernel that saves only the output and the
log-sum-exp).

The target is ``--device`` (default: where the model is, the CPU for a meta model).  A CUDA
target needs no GPU here: where torch can run CUDA kernels on fake tensors (a GPU is present)
the step runs on fake CUDA tensors; otherwise on fake CPU tensors, whose kernels allocate what
CUDA's do for the ops of a training step (the CPU flash-attention kernel saves what CUDA's
does), with every storage counted as the CUDA caching allocator rounds it
(:mod:`memoplan.planner.profiling.cuda_allocator`).  :meth:`Target.kernels_text` says which, for the
profile table and the plan's header.

A step that cannot run here (a meta model, a CUDA target without a GPU) is only estimated:
:func:`not_runnable` says why, and the measured paths refuse it (``MP413``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memoplan.diagnostics import Diagnostic, PlanError
from memoplan.planner.profiling.shard import SHARDS

__all__ = [
    "TARGET",
    "Target",
    "aimed_at",
    "fake_kernels",
    "fake_like",
    "hard_mode",
    "is_meta",
    "memory_size",
    "not_measurable",
    "no_real_step",
    "not_runnable",
    "parse_device",
    "planned_peak_name",
    "profiled_target",
    "target_for",
    "unplanned_peak_name",
]


@dataclass(frozen=True)
class Target:
    """Where the step is planned to run (``device``) and whose kernels the fake step runs (``kernels``)."""

    device: torch.device
    kernels: torch.device
    memory: int | None = None  # the device's capacity in bytes (--device-memory), when given

    @property
    def stand_in(self) -> bool:
        """The CPU's kernels stand in for a CUDA device this machine lacks."""
        return self.kernels.type != self.device.type

    def kernels_text(self) -> str:
        """What ran the fake step, for a profile's table and a plan's header."""
        if self.stand_in:
            return (
                f"cpu kernels standing in for {self.device.type} (no {self.device.type} device here), "
                f"storages rounded as the {self.device.type} caching allocator rounds them"
            )
        if self.device.type == "cuda":
            return "cuda kernels on fake tensors, storages rounded as the caching allocator rounds them"
        return f"{self.device.type} kernels on fake tensors"


#: The target of the command running (set by the CLI and by :func:`memoplan.planner.plan.make_plan`
#: from the profile), read by the fake steps that have no device of their own: the planner's trials.
TARGET: contextvars.ContextVar[Target | None] = contextvars.ContextVar("memoplan_target", default=None)


def is_meta(model: nn.Module) -> bool:
    """Whether ``model`` has a parameter or buffer without storage: on the meta device, or a fake
    tensor (a model built under the user's own ``FakeTensorMode``)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return any(t.is_meta or isinstance(t, FakeTensor) for t in _state(model))


def fake_like(mode: Any, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A fake tensor of ``mode`` like ``tensor`` on ``device``: ``mode.from_tensor`` of a real
    tensor already there (views of one storage stay views of one); made anew from its shape,
    strides and dtype otherwise — a meta tensor, one on another device, or a fake tensor (a model
    built under the user's own ``FakeTensorMode``: converting another mode's fake tensor corrupts
    torch's memory, a segmentation fault or ``corrupted double-linked list`` later in the run)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if tensor.device == device and not isinstance(tensor, FakeTensor) and not tensor.is_meta:
        return mode.from_tensor(tensor)
    with mode:
        fake = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device=device)
    return fake.requires_grad_(tensor.requires_grad) if tensor.requires_grad else fake


def _state(model: nn.Module) -> Iterator[torch.Tensor]:
    yield from model.parameters()
    yield from model.buffers()


def fake_kernels(device: torch.device) -> torch.device:
    """The device whose kernels a fake step planned for ``device`` runs: ``device`` itself, or
    the CPU for a CUDA device when no GPU is here (torch's CUDA kernels need one, even on fake
    tensors: SDPA aborts the process without it)."""
    if device.type == "cuda" and not torch.cuda.is_available():
        return torch.device("cpu")
    return device


def target_for(model: nn.Module, device: torch.device | str | None = None, memory: int | None = None) -> Target:
    """The target of a step of ``model``: ``device``, else the one the command set (:data:`TARGET`),
    else where the model's parameters are (the CPU for a meta model)."""
    if device is None:
        set_here = TARGET.get()
        if set_here is not None:
            return set_here if memory is None else Target(set_here.device, set_here.kernels, memory)
        device = next((t.device for t in _state(model) if not t.is_meta), torch.device("cpu"))
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return Target(device, fake_kernels(device), memory)


def not_runnable(model: nn.Module, device: torch.device | str | None = None) -> str | None:
    """Why no real step of ``model`` can run here (on ``device``), or None when one can."""
    if is_meta(model):
        return "the model has no storage (built on the meta device, or under a FakeTensorMode)"
    if device is not None and torch.device(device).type == "cuda" and not torch.cuda.is_available():
        return "no CUDA device here"
    return None


# ---------------------------------------------------------------- the device and capacity a user names


def parse_device(text: str | None, *, estimating: bool = False) -> torch.device | None:
    """``--device`` ``text`` as a torch.device, or None when not given; MP506 when it cannot run here.

    ``estimating``: the command can estimate its steps on fake tensors (``profile``, ``plan``
    without ``--method measured``), so a CUDA device this machine lacks is a target: the steps
    are planned for it.  The command line's ``--device`` and the Python API's ``device``."""

    if text is None:
        return None
    try:
        device = torch.device(text)
    except RuntimeError:
        raise PlanError(
            (Diagnostic("MP506", f"`--device {text}` is not a device", help="e.g. cpu, cuda or cuda:1"),)
        ) from None
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if estimating and not count:
            return device  # planned for a GPU this machine lacks: estimated, nothing runs on it
        if not count or (device.index or 0) >= count:
            raise PlanError(
                (
                    Diagnostic(
                        "MP506",
                        f"`--device {text}`: {f'only {count} CUDA devices here' if count else 'no CUDA device here'}",
                        help="leave out --device to run on the CPU"
                        + (
                            ""
                            if count
                            else "; `memoplan profile` and `plan` estimate a step for a CUDA device without one"
                        ),
                    ),
                )
            )
    elif device.type != "cpu":
        raise PlanError((Diagnostic("MP506", f"`--device {text}`: only cpu and cuda are supported"),))
    return device


def not_measurable(why: str, what: str) -> Diagnostic:
    """MP413: a measured path given a model no real step of which can run here."""
    return Diagnostic(
        "MP413",
        f"{what} runs real training steps, and {why}",
        help="`memoplan profile` and `memoplan plan` estimate its step on fake tensors (`--method estimated`, "
        "what `auto` does for it); to run real steps, build a smaller model for real (`memoplan docs meta`)",
    )


def memory_size(text: str | int | None) -> int | None:
    """A device's capacity in bytes from ``SIZE`` text (``80GiB``) or a count of bytes (None: not
    given); MP509 when it is not a positive size.  ``--device-memory`` and the API's ``device_memory``."""
    if text is None:
        return None
    if isinstance(text, int) and not isinstance(text, bool) and text > 0:
        return text
    text = str(text)
    from memoplan.planner.budgets import Bytes, budget_from_ast, budget_statement

    try:  # read as a budget statement reads a size
        stmt = budget_statement(text, "--device-memory")
        size = None if stmt.mode is not None else budget_from_ast(stmt)
    except (ValueError, PlanError):
        size = None
    if not isinstance(size, Bytes) or size.amount <= 0:
        raise PlanError((Diagnostic("MP509", f"`--device-memory {text}` is not a size", help="e.g. `80GiB`"),))
    return size.amount


# ---------------------------------------------------------------- what the planner's header says


def _shards() -> int:
    return SHARDS.get()


def profiled_target(model: nn.Module, prof: Any):
    """The target the profile was taken for (None for a merged profile of several devices)."""
    try:
        return target_for(model, prof.device)
    except RuntimeError:
        return None


@contextlib.contextmanager
def aimed_at(model: nn.Module, prof: Any) -> Iterator[None]:
    """While planning from ``prof``: the command's target, else the one the profile was taken for."""
    token = TARGET.set(TARGET.get() or profiled_target(model, prof))
    try:
        yield
    finally:
        TARGET.reset(token)


def no_real_step(model: nn.Module) -> str | None:
    """Why the planned step cannot be checked by a real step here: sharded, a meta model, a GPU not here."""
    if _shards() > 1:
        return f"over {_shards()} FSDP2 ranks: one rank's peak, estimated, not checked by a real step"
    aim = TARGET.get()
    why = not_runnable(model, aim.device if aim is not None else None)
    return None if why is None else f"estimated, not checked by a real step: {why}"


def hard_mode(model: nn.Module) -> str:
    """The header's ``budget mode`` of a hard budget: by measurement, or where no step runs here by the estimate."""
    from memoplan.planner.budgets import mode_line

    return mode_line(True, estimated=no_real_step(model) is not None)


def planned_peak_name(model: nn.Module) -> str:
    """The header's name for the planned peak: measured, or on fake tensors (sharded, or not runnable here)."""
    if _shards() > 1:
        return "planned peak per rank on fake tensors"
    return "measured peak after" if no_real_step(model) is None else "planned peak on fake tensors"


def unplanned_peak_name(prof: Any) -> str:
    """The header's name for the unplanned peak: measured, or found on fake tensors."""
    fake = prof.method == "estimated" or prof.peak_method == "fake-tensor"
    return "unplanned peak on fake tensors" if fake else "measured peak before"
