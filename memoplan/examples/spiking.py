"""Example model: a multi-step spiking CNN of leaky integrate-and-fire neurons over T time steps.

Structure (module paths as in ``named_modules()``)::

    blocks              nn.Sequential of SpikingBlock, children 0..3
    blocks.N.conv       nn.Conv2d (3x3, no bias)
    blocks.N.bn         nn.BatchNorm2d
    blocks.N.lif        LIFNeuron
    pool                nn.AdaptiveAvgPool2d(1)
    dropout             nn.Dropout (before the head)
    head                nn.Linear(64, num_classes)

The input is ``(T, B, C, H, W)``.  Every block flattens time into the batch for
the convolution and BatchNorm (so BatchNorm sees all time steps at once, the
"multi-step" layout), then the neuron steps over dim 0 (time).  The neuron's
membrane potential is local to one forward call: it starts at zero every call,
so there is no state carried between calls to reset.  The head averages the
pooled spikes over time (firing rates).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

T = 8
BATCH = 4
IN_CHANNELS = 2
NUM_CLASSES = 10

# (in_channels, out_channels, stride) of each SpikingBlock.
_BLOCKS: tuple[tuple[int, int, int], ...] = (
    (IN_CHANNELS, 16, 1),
    (16, 32, 2),
    (32, 32, 1),
    (32, 64, 2),
)


class SurrogateSpike(torch.autograd.Function):
    """Heaviside step forward, sigmoid-derivative surrogate gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, alpha: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.alpha = alpha
        return (x >= 0).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        sig = torch.sigmoid(ctx.alpha * x)
        return grad_output * ctx.alpha * sig * (1 - sig), None


def spike(x: torch.Tensor, alpha: float = 4.0) -> torch.Tensor:
    """``heaviside(x)`` (1.0 where ``x >= 0``) with a surrogate gradient of sharpness ``alpha``."""
    return SurrogateSpike.apply(x, alpha)


class LIFNeuron(nn.Module):
    """Leaky integrate-and-fire neuron over time (dim 0) with hard reset to zero.

    Per step: ``v = v + (x - v) / tau``; ``s = heaviside(v - v_th)``; ``v = v * (1 - s)``.
    Takes ``(T, ...)`` input currents and returns ``(T, ...)`` binary spikes.
    """

    def __init__(
        self, tau: float = 2.0, v_threshold: float = 1.0, surrogate_alpha: float = 4.0
    ) -> None:
        super().__init__()
        self.tau = tau
        self.v_threshold = v_threshold
        self.surrogate_alpha = surrogate_alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = torch.zeros_like(x[0])  # membrane potential: local to this call
        spikes = []
        for x_t in x.unbind(0):
            v = v + (x_t - v) / self.tau
            s = spike(v - self.v_threshold, self.surrogate_alpha)
            v = v * (1.0 - s)
            spikes.append(s)
        return torch.stack(spikes)

    def extra_repr(self) -> str:
        return f"tau={self.tau}, v_threshold={self.v_threshold}"


class SpikingBlock(nn.Module):
    """Conv2d -> BatchNorm2d over all time steps at once, then a LIFNeuron over time."""

    def __init__(self, in_channels: int, out_channels: int, *, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        self.lif = LIFNeuron(v_threshold=0.5)  # about 14% of neurons fire per step on the example

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps, batch = x.shape[:2]
        y = self.bn(self.conv(x.flatten(0, 1)))  # (T*B, C, H, W)
        return self.lif(y.unflatten(0, (steps, batch)))  # (T, B, C, H, W)


class SpikingCNN(nn.Module):
    """Four SpikingBlocks, spatial pooling, firing rates over time, dropout and a linear head."""

    def __init__(self, num_classes: int = NUM_CLASSES, dropout: float = 0.1) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            *(SpikingBlock(cin, cout, stride=s) for cin, cout, s in _BLOCKS)
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(_BLOCKS[-1][1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps, batch = x.shape[:2]
        x = self.blocks(x)  # (T, B, C, H, W) spikes
        x = self.pool(x.flatten(0, 1)).flatten(1)  # (T*B, C)
        rates = x.unflatten(0, (steps, batch)).mean(0)  # (B, C)
        return self.head(self.dropout(rates))


def build() -> nn.Module:
    return SpikingCNN()


def example(steps: int = T, batch: int = BATCH) -> tuple[torch.Tensor]:
    """Binary (0/1) float32 events, shape ``(steps, batch, 2, 32, 32)``, about 20% ones."""
    return ((torch.rand(steps, batch, IN_CHANNELS, 32, 32) < 0.2).float(),)
