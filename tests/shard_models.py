"""A model whose parameters and gradients outweigh its activations, for the FSDP2 tests
(tests/planner/test_shards.py): sharded over ranks it needs much less memory per rank.

``build()``: ``blocks`` of ``Linear(WIDTH, WIDTH) -> GELU``; ``example(rank)``: each rank's own
batch of ``BATCH`` rows (the per-rank batch: what ``memoplan plan --shards`` is given).
"""

from __future__ import annotations

import os

import torch
from torch import nn

DEPTH, WIDTH, BATCH = 16, 1024, 512


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build() -> nn.Module:
    torch.manual_seed(0)
    return Net()


def example(rank: int = 0) -> tuple[torch.Tensor]:
    """The rank's batch: ``BATCH`` rows, or ``SHARD_MODELS_BATCH`` from the environment (a second shape)."""
    g = torch.Generator().manual_seed(10 + rank)
    return (torch.randn(int(os.environ.get("SHARD_MODELS_BATCH", BATCH)), WIDTH, generator=g),)
