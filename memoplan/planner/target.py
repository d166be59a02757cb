"""The device a step is planned for, which need not be this machine's, and models built on meta.

Large models are built on the meta device (``with torch.device("meta"):``, accelerate's
``init_empty_weights``): every parameter and buffer has its shape and dtype and no storage.
Such a model cannot run a real step, but its estimate (:mod:`memoplan.planner.estimate`) needs
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
(:mod:`memoplan.planner.cuda_allocator`).  :meth:`Target.kernels_text` says which, for the
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

from memoplan.planner.shard import SHARDS

__all__ = [
    "TARGET",
    "Target",
    "aimed_at",
    "fake_kernels",
    "fake_like",
    "hard_mode",
    "is_meta",
    "no_real_step",
    "not_runnable",
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
    return "hard (verified by measurement)" if no_real_step(model) is None else "hard (verified on fake tensors)"


def planned_peak_name(model: nn.Module) -> str:
    """The header's name for the planned peak: measured, or on fake tensors (sharded, or not runnable here)."""
    if _shards() > 1:
        return "planned peak per rank on fake tensors"
    return "measured peak after" if no_real_step(model) is None else "planned peak on fake tensors"


def unplanned_peak_name(prof: Any) -> str:
    """The header's name for the unplanned peak: measured, or found on fake tensors."""
    fake = prof.method == "estimated" or prof.peak_method == "fake-tensor"
    return "unplanned peak on fake tensors" if fake else "measured peak before"
