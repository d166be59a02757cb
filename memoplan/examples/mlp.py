"""Example model: a deep MLP of Linear + activation layers, used by the memory tests.

Structure (module paths as in ``named_modules()``)::

    layers              nn.Sequential, children 0..2*depth-1
    layers.2i           nn.Linear(width, width)
    layers.2i+1         nn.GELU or nn.ReLU

GELU saves its own input for backward, an extra tensor per layer that
checkpointing can drop; ReLU saves its output, the very tensor the next Linear
saves anyway, so ReLU layers add no saved memory of their own.
"""

from __future__ import annotations

import torch
from torch import nn

DEPTH = 20
WIDTH = 512
BATCH = 1024

_ACTIVATIONS: dict[str, type[nn.Module]] = {"gelu": nn.GELU, "relu": nn.ReLU}


class MLP(nn.Module):
    """``depth`` x (Linear(width, width) -> activation) in one flat ``nn.Sequential``."""

    def __init__(self, depth: int = DEPTH, width: int = WIDTH, activation: str = "gelu") -> None:
        super().__init__()
        if activation not in _ACTIVATIONS:
            choices = sorted(_ACTIVATIONS)
            raise ValueError(f"activation must be one of {choices}, not {activation!r}")
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), _ACTIVATIONS[activation]()]
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def build(depth: int = DEPTH, width: int = WIDTH, activation: str = "gelu") -> nn.Module:
    return MLP(depth, width, activation)


def example(batch: int = BATCH, width: int = WIDTH) -> tuple[torch.Tensor]:
    """A batch of inputs, shape ``(batch, width)``."""
    return (torch.randn(batch, width),)
