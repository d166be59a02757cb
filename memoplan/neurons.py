"""Stateful spiking neurons that speak memoplan's state protocol (see memoplan.runtime.state).

:class:`LIF` is a multi-step leaky integrate-and-fire neuron: it takes ``(T, ...)``
inputs, returns ``(T, ...)`` binary spikes, and keeps its membrane potential ``v``
between calls until :meth:`LIF.reset` (or :func:`reset`) — so a sequence may be fed
in pieces, which is what temporal chunking does.  Its spike function is a
Heaviside step with a sigmoid surrogate gradient.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class _Spike(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, alpha: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.alpha = alpha
        return (x >= 0).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(ctx.alpha * x)
        return grad * ctx.alpha * s * (1 - s), None


def spike(x: torch.Tensor, alpha: float = 4.0) -> torch.Tensor:
    """Heaviside step of ``x`` (1 where ``x >= 0``) with a sigmoid surrogate gradient."""
    return _Spike.apply(x, alpha)


class LIF(nn.Module):
    """Multi-step LIF neuron: ``v += (x - (v - v_reset)) / tau``; spike when ``v >= threshold``; hard reset."""

    def __init__(self, tau: float = 2.0, threshold: float = 1.0, v_reset: float = 0.0, alpha: float = 4.0):
        super().__init__()
        self.tau = tau
        self.threshold = threshold
        self.v_reset = v_reset
        self.alpha = alpha
        self.v: torch.Tensor | float = v_reset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.v
        if not isinstance(v, torch.Tensor):
            v = torch.full_like(x[0], v)
        spikes = []
        # unbind, not x[t]: one backward for all steps instead of a full-size
        # zero-padded gradient per step.
        for x_t in x.unbind(0):
            v = v + (x_t - (v - self.v_reset)) / self.tau
            s = spike(v - self.threshold, self.alpha)
            v = v * (1 - s) + self.v_reset * s
            spikes.append(s)
        self.v = v
        return torch.stack(spikes)

    def reset(self) -> None:
        self.v = self.v_reset

    # memoplan's state protocol
    def memoplan_state(self) -> dict[str, Any]:
        return {"v": self.v}

    def memoplan_load_state(self, state: dict[str, Any]) -> None:
        self.v = state["v"]

    def extra_repr(self) -> str:
        return f"tau={self.tau}, threshold={self.threshold}, v_reset={self.v_reset}"


def reset(model: nn.Module) -> None:
    """Reset every neuron of ``model`` (anything with a ``reset()`` that holds state)."""
    from memoplan.runtime.state import is_stateful

    for module in model.modules():
        reset = getattr(module, "reset", None)
        if is_stateful(module) and callable(reset):
            reset()
