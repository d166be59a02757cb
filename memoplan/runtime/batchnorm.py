"""Runtime stage: BatchNorm inside temporal chunks, with the statistics of the whole batch.

A temporal chunk sees a slice of the time axis.  A BatchNorm inside it (time folded
into the batch, as spiking networks do) would normalise each slice with that slice's
own statistics, and its gradient would miss the terms that tie every time step to
the batch mean and variance.  :func:`memoplan.runtime.chunking.run_chunked` makes the
chunks equivalent instead, in passes over the chunks:

1. A *statistics pass* per training-mode ``batch_norm`` call of the module's
   forward, in call order: every chunk runs as a checkpointed region up to that
   call and returns the per-channel mean and biased variance of that call's input
   (``torch.var_mean``).  The chunks' figures are combined exactly (counts, means
   and squared deviations), with autograd, into the batch's mean and variance.
2. The *main pass*: every chunk runs whole, each ``batch_norm`` call normalising
   with the combined statistics, which enter the region as explicit inputs, so
   backward hands their gradient to the statistics passes' regions, whose
   recompute turns it into the missing gradient terms of the inputs and weights.

Between passes the module's buffers, the stateful modules' state and the RNG are
put back, so each pass starts from what the step started from.  Running
statistics and ``num_batches_tracked`` are then updated once, from the combined
statistics, as ``nn.BatchNorm`` would have updated them.

The calls are intercepted with a ``TorchFunctionMode`` on
``torch.nn.functional.batch_norm``, so any module that normalises through it is
covered (``nn.BatchNorm1d/2d/3d``, subclasses, SpikingJelly's layers).  Equivalent
up to floating-point reassociation: statistics are summed chunk by chunk.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

__all__ = ["Pass", "Snapshot", "combine", "given_statistics", "normalising_modules", "update_running"]

# The keyword the statistics travel under into a chunk's region (popped before the module sees it).
STATS_KEYWORD = "__memoplan_batch_statistics__"

_SIGNATURE = inspect.signature(F.batch_norm)


def normalising_modules(roots: Sequence[nn.Module]) -> list[nn.modules.batchnorm._BatchNorm]:
    """The BatchNorm modules under ``roots`` that normalise with batch statistics now."""
    found: dict[int, nn.modules.batchnorm._BatchNorm] = {}
    for root in roots:
        for module in root.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and (
                module.training or (module.running_mean is None and module.running_var is None)
            ):
                found.setdefault(id(module), module)
    return list(found.values())


@dataclass
class Call:
    """One training-mode ``batch_norm`` call, as the first chunk of the main pass made it."""

    running_mean: torch.Tensor | None
    running_var: torch.Tensor | None
    momentum: float | None  # the factor the module passed (1 / num_batches_tracked when momentum is None)


@dataclass
class Pass:
    """One pass over the chunks: how many statistics are known, and what the latest chunk did."""

    known: int  # batch_norm calls whose combined statistics are given; call `known` is measured
    record: list[Call] | None = None  # the calls of the next forward, when wanted
    measured: bool = False  # the latest chunk stopped at call `known` and returned its statistics


class _Measured(Exception):
    def __init__(self, result: tuple[torch.Tensor, torch.Tensor, int]) -> None:
        super().__init__("statistics measured")
        self.result = result


class _GivenStatistics(TorchFunctionMode):
    def __init__(self, stats: Sequence[torch.Tensor], local: Sequence[torch.Tensor], run: Pass) -> None:
        super().__init__()
        self.stats = stats  # the batch's mean0, var0, mean1, var1, ...
        self.local = local  # this chunk's own, the same way
        self.run = run
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.batch_norm:
            return func(*args, **kwargs)
        bound = _SIGNATURE.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        if not a["training"]:
            return func(*args, **kwargs)
        x = a["input"]
        index, self.calls = self.calls, self.calls + 1
        if self.run.record is not None:
            self.run.record.append(Call(a["running_mean"], a["running_var"], a["momentum"]))
        if index == self.run.known:
            mean, var = _Statistics.apply(x)
            raise _Measured((mean, var, _count(x)))
        i = slice(2 * index, 2 * index + 2)
        return _Normalize.apply(x, *self.stats[i], *self.local[i], a["weight"], a["bias"], a["eps"])


class _Statistics(torch.autograd.Function):
    """Per-channel mean and biased variance of ``x`` over every dim but 1, in two passes.

    ``torch.var_mean`` over several dims is about ten times slower on CPU than a
    mean followed by the mean of squared deviations (same figures to rounding);
    the backward, ``(g_mean + 2 g_var (x - mean)) / n``, keeps only ``x``.
    """

    @staticmethod
    def forward(ctx, x):
        dims, shape = _per_channel(x)
        xc = x.to(_compute_dtype(x))
        mean = xc.mean(dims)
        var = (xc - mean.view(shape)).square_().mean(dims)
        ctx.save_for_backward(x, mean)
        return mean, var

    @staticmethod
    def backward(ctx, grad_mean, grad_var):
        x, mean = ctx.saved_tensors
        _, shape = _per_channel(x)
        n = _count(x)
        dx = torch.zeros((), dtype=mean.dtype, device=mean.device)
        if grad_mean is not None:
            dx = dx + (grad_mean / n).view(shape)
        if grad_var is not None:
            dx = dx + (x.to(mean.dtype) - mean.view(shape)) * (2 * grad_var / n).view(shape)
        return dx.expand(x.shape).to(x.dtype)


class _Normalize(torch.autograd.Function):
    """BatchNorm with the batch's statistics, for one chunk of the batch.

    The gradient of the input is taken here centred on this chunk's own means
    (of ``g = dy * weight`` and ``g * x_hat``), and the centring is handed back as
    gradients of the chunk's own mean and variance, which the statistics pass's
    recompute turns into the same per-element terms.  Mathematically the usual
    BatchNorm gradient; numerically it keeps each path's gradient small where
    ``dy`` is nearly constant per channel, instead of two large terms that cancel
    only after the layers below have been differentiated.
    """

    @staticmethod
    def forward(ctx, x, mean, var, local_mean, local_var, weight, bias, eps):
        _, shape = _per_channel(x)
        rstd = torch.rsqrt(var + eps)
        scale = rstd if weight is None else rstd * weight
        y = (x.to(mean.dtype) - mean.view(shape)) * scale.view(shape)
        if bias is not None:
            y = y + bias.view(shape)
        ctx.save_for_backward(x, mean, rstd, local_mean, weight)
        ctx.has_bias = bias is not None
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, mean, rstd, local_mean, weight = ctx.saved_tensors
        dims, shape = _per_channel(x)
        n = _count(x)
        dy = dy.to(mean.dtype)
        xhat = (x.to(mean.dtype) - mean.view(shape)) * rstd.view(shape)
        # Accumulated in float64, as ATen's CPU BatchNorm does.
        sum_dy = dy.sum(dims, dtype=torch.float64).to(mean.dtype)
        sum_dy_xhat = (dy * xhat).sum(dims, dtype=torch.float64).to(mean.dtype)
        w = torch.ones_like(rstd) if weight is None else weight.to(mean.dtype)
        a = sum_dy * w / n  # this chunk's mean of g
        c = sum_dy_xhat * w / n  # and of g * x_hat
        dx = ((dy * w.view(shape) - a.view(shape) - xhat * c.view(shape)) * rstd.view(shape)).to(x.dtype)
        grad_mean = -rstd * sum_dy * w
        grad_var = -0.5 * rstd * rstd * sum_dy_xhat * w
        grad_local_mean = n * (rstd * a + rstd * rstd * c * (local_mean - mean))
        grad_local_var = 0.5 * n * rstd * rstd * c
        grad_weight = sum_dy_xhat if weight is not None else None
        grad_bias = sum_dy if ctx.has_bias else None
        return dx, grad_mean, grad_var, grad_local_mean, grad_local_var, grad_weight, grad_bias, None


def given_statistics(fn: Callable[..., Any], run: Pass, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with the ``batch_norm`` calls normalising with the given statistics.

    The statistics come in ``kwargs[STATS_KEYWORD]``: the batch's and this
    chunk's own, ``(mean, var)`` per known call, flat; when ``run`` measures, the
    call stops at batch_norm call ``run.known`` and returns that call's
    ``(mean, var, count)`` over this chunk instead of the forward's output.
    """
    stats, local = kwargs.pop(STATS_KEYWORD)
    try:
        with _GivenStatistics(stats, local, run):
            return fn(*args, **kwargs)
    except _Measured as measured:
        run.measured = True
        return measured.result


def combine(
    parts: Sequence[tuple[torch.Tensor, torch.Tensor]], counts: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The batch's (mean, biased variance, count) from each chunk's, exactly (with autograd)."""
    total = sum(counts)
    mean = _tensor_sum([n * m for (m, _), n in zip(parts, counts)]) / total
    var = _tensor_sum([n * (v + (m - mean) ** 2) for (m, v), n in zip(parts, counts)]) / total
    return mean, var, total


def _tensor_sum(terms: Sequence[torch.Tensor]) -> torch.Tensor:
    """``sum(terms)`` typed as a tensor: the same additions, left to right from ``0 + terms[0]``."""
    return cast(torch.Tensor, sum(terms))  # 0 + a tensor is a tensor; a batch has at least one chunk


def update_running(calls: Sequence[Call], stats: Sequence[torch.Tensor], counts: Sequence[int]) -> None:
    """Update running statistics once per call, as ``F.batch_norm`` does in training mode."""
    with torch.no_grad():
        for i, call in enumerate(calls):
            total = counts[i]
            if call.running_mean is None or call.running_var is None:
                continue
            f = call.momentum if call.momentum is not None else 0.0
            mean, var = stats[2 * i], stats[2 * i + 1]
            call.running_mean.mul_(1 - f).add_(mean.to(call.running_mean.dtype), alpha=f)
            unbiased = var * (total / (total - 1))
            call.running_var.mul_(1 - f).add_(unbiased.to(call.running_var.dtype), alpha=f)


class Snapshot:
    """The values of every buffer under ``roots``, to put back between passes."""

    def __init__(self, roots: Sequence[nn.Module]) -> None:
        self._entries = [(owner, name, tensor, tensor.detach().clone()) for owner, name, tensor in _buffers(roots)]

    def restore(self) -> None:
        with torch.no_grad():
            for owner, name, tensor, value in self._entries:
                owner._buffers[name] = tensor
                if not torch.equal(tensor, value):
                    tensor.copy_(value)

    def counters(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(num_batches_tracked, its current value)`` of every BatchNorm, to keep after the main pass."""
        return [
            (tensor, tensor.detach().clone())
            for owner, name, tensor, _ in self._entries
            if name == "num_batches_tracked" and isinstance(owner, nn.modules.batchnorm._BatchNorm)
        ]


def _buffers(roots: Sequence[nn.Module]) -> Iterator[tuple[nn.Module, str, torch.Tensor]]:
    seen: set[int] = set()
    for root in roots:
        for module in root.modules():
            if id(module) in seen:
                continue
            seen.add(id(module))
            for name, tensor in module._buffers.items():
                if tensor is not None:
                    yield module, name, tensor


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for half precision inputs (as BatchNorm computes), else the input's own."""
    return torch.promote_types(x.dtype, torch.float32)


def _per_channel(x: torch.Tensor) -> tuple[list[int], list[int]]:
    """The dims a per-channel figure of ``x`` reduces over, and the shape that broadcasts it back."""
    return [0, *range(2, x.dim())], [1, x.shape[1]] + [1] * (x.dim() - 2)


def _count(x: torch.Tensor) -> int:
    return x.numel() // x.shape[1] if x.dim() > 1 and x.shape[1] else 0
