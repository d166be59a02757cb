"""A chain without blocks: ``nn.Sequential`` of 48 x (``Linear(256, 256)``, ``GELU``), as a memoplan spec.

    .venv/bin/python -m memoplan plan --model benchmarks/flat_chain.py:build \\
        --example benchmarks/flat_chain.py:example --budget 35% -o flat.memplan

No module but the whole chain saves memory when checkpointed (each child keeps its input either
way): runs of children do, written as ``checkpoint segments = k`` or ``split = [...]``.
"""

from __future__ import annotations

import torch
from torch import nn


class FlatChain(nn.Module):
    def __init__(self, depth: int = 48, width: int = 256) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.GELU())])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def build() -> nn.Module:
    torch.manual_seed(0)
    return FlatChain()


def example(batch: int = 2048, width: int = 256) -> tuple[torch.Tensor]:
    return (torch.randn(batch, width, generator=torch.Generator().manual_seed(1)),)
