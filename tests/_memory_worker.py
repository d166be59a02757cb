"""One rank of tests/runtime/test_memory_block.py's distributed case: `memory { atomic_clean_policy = 0 }`
under DDP (gradient_as_bucket_view off: trained; on: refused) and FSDP2 (refused).

Run as ``python _memory_worker.py RANK WORLD FOLDER``; writes ``FOLDER/rank{RANK}.pt``.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
from _ddp_worker import entry, serve
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import memoplan
from memoplan.diagnostics import PlanError

PLAN = "memplan 1\nmodule body.1 { checkpoint }\nmemory { atomic_clean_policy = 0 }\n"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.Sequential(nn.Linear(16, 16), nn.GELU()), nn.Linear(16, 4))

    def forward(self, x):
        return self.body(x)


def train(base: Net, rank: int, planned: bool, **ddp) -> dict:
    model = copy.deepcopy(base)
    if planned:
        memoplan.apply(model, PLAN)
    wrapped = DDP(model, **ddp)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
    flat = []
    for step in range(3):
        x = torch.randn(6, 8, generator=torch.Generator().manual_seed(10 * rank + step))
        wrapped(x).square().sum().backward()
        flat.append(len({p.grad.untyped_storage().data_ptr() for p in model.parameters()}) == 1)
        opt.step()
        opt.zero_grad(set_to_none=step % 2 == 0)  # both ways of zeroing
    return {"params": [p.detach().clone() for p in model.parameters()], "flat": flat}


def refused(base: Net, wrap) -> str | None:
    model = copy.deepcopy(base)
    memoplan.apply(model, PLAN)
    wrapped = wrap(model)
    try:
        wrapped(torch.randn(6, 8))
    except PlanError as error:
        return error.codes[0]
    return None


def work(rank: int) -> dict:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    base = Net()
    return {
        "unplanned": train(base, rank, False),
        "planned": train(base, rank, True),
        "bucket_view": refused(base, lambda m: DDP(m, gradient_as_bucket_view=True)),
        "fsdp": refused(base, fully_shard),
    }


if __name__ == "__main__":
    rank, world, folder = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    entry(lambda: serve(rank, world, folder, folder, work))
