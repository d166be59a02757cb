"""A model for the out-of-memory tests (tests/planner/test_oom.py): the bundled transformer at a size whose
unplanned step holds a few times what a checkpointed one does.  Plans name it by path,
``tests/oom_models.py:build``."""

from __future__ import annotations

import torch
from torch import nn

from memoplan.examples import transformer

BATCH = 32
SEQ = 64


def build() -> nn.Module:
    torch.manual_seed(0)
    return transformer.build()


def example() -> tuple[torch.Tensor]:
    torch.manual_seed(1)
    return transformer.example(batch=BATCH, seq=SEQ)
