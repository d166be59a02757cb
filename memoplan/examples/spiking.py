"""Example model: a multi-step spiking CNN — four conv blocks of LIF neurons over T = 8 time steps.

Structure (module paths as in ``named_modules()``)::

    blocks              nn.Sequential of SpikingBlock, children 0..3
    blocks.N            SpikingBlock, an nn.Sequential of:
    blocks.N.conv         MultiStepConv2d (3x3, no bias), time folded into the batch
    blocks.N.bn           MultiStepBatchNorm2d, time folded into the batch
    blocks.N.lif          LIFNeuron (memoplan.neurons.LIF): steps over time, keeps its state
    pool                nn.AdaptiveAvgPool2d(1)
    dropout             nn.Dropout (before the head)
    head                nn.Linear(CHANNELS[-1], num_classes)

The input is ``(T, B, C, H, W)`` binary spikes (event frames).  Conv and BatchNorm
see all time steps at once (``(T*B, C, H, W)``, the "multi-step" layout, so
BatchNorm's statistics cover every step), then the neuron steps over dim 0 (time).

The neurons are :class:`memoplan.neurons.LIF`: the membrane potential is kept
between calls, so a sequence may be fed in pieces (what ``temporal_chunk`` does);
call :func:`memoplan.neurons.reset` (or :func:`reset`) between independent
sequences.  Every block's input is binary — the image for block 0, the previous
block's spikes after that — which is what ``compress input = bit`` needs.

The blocks keep the 32x32 resolution and the same width, so every block holds
the same activation memory (the regime where per-block checkpointing pays most;
see docs/benchmarks.md).
"""

from __future__ import annotations

import torch
from torch import nn

from memoplan import neurons
from memoplan.neurons import LIF

T = 8
BATCH = 8
IN_CHANNELS = 2
SIZE = 32
NUM_CLASSES = 10
#: Output channels of the four blocks (3x3 convolutions, stride 1, padding 1).
CHANNELS: tuple[int, ...] = (32, 32, 32, 32)
#: LIF firing threshold: about 10-15% of neurons fire per step on the example.
THRESHOLD = 0.5


class MultiStepConv2d(nn.Conv2d):
    """``nn.Conv2d`` over ``(T, B, C, H, W)``: time folded into the batch, then unfolded."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.flatten(0, 1)).unflatten(0, x.shape[:2])


class MultiStepBatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` over ``(T, B, C, H, W)``: statistics over every time step and sample."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.flatten(0, 1)).unflatten(0, x.shape[:2])


class LIFNeuron(LIF):
    """:class:`memoplan.neurons.LIF` under this example's name (same dynamics, same state protocol)."""


class SpikingBlock(nn.Sequential):
    """conv -> bn (all time steps at once) -> lif (step by step); binary spikes in, binary spikes out."""

    def __init__(self, in_channels: int, out_channels: int, *, stride: int = 1) -> None:
        super().__init__()
        self.conv = MultiStepConv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn = MultiStepBatchNorm2d(out_channels)
        self.lif = LIFNeuron(threshold=THRESHOLD)


class SpikingCNN(nn.Module):
    """Four SpikingBlocks, spatial pooling, firing rates over time, dropout and a linear head."""

    def __init__(
        self,
        num_classes: int = NUM_CLASSES,
        channels: tuple[int, ...] = CHANNELS,
        in_channels: int = IN_CHANNELS,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        widths = (in_channels, *channels)
        self.blocks = nn.Sequential(*(SpikingBlock(cin, cout) for cin, cout in zip(widths, widths[1:])))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(channels[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps, batch = x.shape[:2]
        x = self.blocks(x)  # (T, B, C, H, W) spikes
        x = self.pool(x.flatten(0, 1)).flatten(1)  # (T*B, C)
        rates = x.unflatten(0, (steps, batch)).mean(0)  # (B, C)
        return self.head(self.dropout(rates))


def build() -> nn.Module:
    return SpikingCNN()


def reset(model: nn.Module) -> None:
    """Reset every neuron's membrane potential (:func:`memoplan.neurons.reset`)."""
    neurons.reset(model)


def example(steps: int = T, batch: int = BATCH, size: int = SIZE) -> tuple[torch.Tensor]:
    """Binary (0/1) float32 events, shape ``(steps, batch, 2, size, size)``, about 20% ones."""
    return ((torch.rand(steps, batch, IN_CHANNELS, size, size) < 0.2).float(),)
