"""Example model: a small CNN classifier for 3x32x32 images.

Structure (module paths as in ``named_modules()``)::

    features            nn.Sequential of ConvBlock, children 0..4
    features.N.conv     nn.Conv2d
    features.N.bn       nn.BatchNorm2d
    features.N.act      nn.ReLU or nn.GELU
    pool                nn.AdaptiveAvgPool2d(1)
    dropout             nn.Dropout (before the classifier)
    classifier          nn.Linear(64, num_classes)
"""

from __future__ import annotations

import torch
from torch import nn

BATCH = 8
NUM_CLASSES = 10

# (in_channels, out_channels, stride, activation) of each ConvBlock.
_BLOCKS: tuple[tuple[int, int, int, str], ...] = (
    (3, 16, 1, "relu"),
    (16, 32, 2, "relu"),
    (32, 32, 1, "gelu"),
    (32, 64, 2, "relu"),
    (64, 64, 1, "gelu"),
)


class ConvBlock(nn.Module):
    """Conv2d (3x3, no bias) -> BatchNorm2d -> ReLU or GELU."""

    def __init__(self, in_channels: int, out_channels: int, *, stride: int = 1, activation: str = "relu") -> None:
        super().__init__()
        if activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be 'relu' or 'gelu', not {activation!r}")
        self.conv = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        self.act: nn.Module = nn.ReLU() if activation == "relu" else nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class CNN(nn.Module):
    """ConvBlocks, global average pooling, dropout and a linear classifier."""

    def __init__(self, num_classes: int = NUM_CLASSES, dropout: float = 0.1) -> None:
        super().__init__()
        self.features = nn.Sequential(
            *(ConvBlock(cin, cout, stride=s, activation=act) for cin, cout, s, act in _BLOCKS)
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(_BLOCKS[-1][1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = torch.flatten(self.pool(x), 1)
        return self.classifier(self.dropout(x))


def build() -> nn.Module:
    return CNN()


def example(batch: int = BATCH) -> tuple[torch.Tensor]:
    """A batch of images, shape ``(batch, 3, 32, 32)``."""
    return (torch.randn(batch, 3, 32, 32),)
