"""Planner stage: the fixed time one checkpoint region costs on a device, measured.

Checkpointing a module costs, besides recomputing it, a fixed amount per region: its call goes
through :func:`memoplan.runtime.checkpoint.run_checkpointed` (the buffer and argument guards, the
saved RNG state, ``torch.utils.checkpoint``'s frame and saved-tensor hooks) in forward, and in
backward the first unpacked tensor sets up and runs the replay.  The recompute figure of a
candidate (its forward time in the profile) does not hold that, so without it twenty small
regions look as cheap as four large ones of the same recompute.  :func:`region_seconds` measures
it once per profile: a chain of ``REGIONS`` tiny modules (an elementwise product of 8 numbers,
whose own forward is a few microseconds) stepped forward and backward, each module once as its
own checkpoint region and once plain, interleaved over ``ROUNDS`` rounds; the median difference
per region is the figure (the tiny forward it replays is in it).  On the 2-core CPU machine of
``docs/benchmarks.md`` it was about 0.2 ms a region, some 0.05% of the Llama step there.

The profile keeps the figure (``Profile.region_seconds``) and every candidate of the search carries
it (:attr:`memoplan.planner.search.chain.Item.region_seconds`): the search's time for a set is its
recompute plus this cost once per region (see "The cost model" in :mod:`memoplan.planner.search`).
Nothing here uses the global random state: the tiny modules are filled with constants.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from memoplan.runtime.checkpoint import run_checkpointed

__all__ = ["OPS", "REGIONS", "ROUNDS", "region_seconds", "save_op_seconds"]

#: Tiny regions in the measured chain, and the rounds whose median is taken.
REGIONS = 16
ROUNDS = 7


class _Tiny(nn.Module):
    """An elementwise product with 8 weights: a region whose own recompute is next to nothing."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((8,), 1.0, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def region_seconds(device: torch.device | str) -> float:
    """Seconds one checkpoint region costs on ``device`` beyond its recompute (>= 0; see the module)."""
    device = torch.device(device)
    if device.type == "meta":
        return 0.0
    chain = [_Tiny(device) for _ in range(REGIONS)]
    x = torch.full((2, 8), 0.5, device=device)

    def step(checkpointed: bool) -> float:
        _synchronized(device)
        start = time.perf_counter()
        y = x
        for tiny in chain:
            y = run_checkpointed(tiny, _Tiny.forward, (y,), {}) if checkpointed else tiny(y)
        y.sum().backward()
        _synchronized(device)
        return time.perf_counter() - start

    return max(0.0, _median_difference(step, False, True) / REGIONS)


def _median_difference(step, base, other) -> float:
    """The median over ``ROUNDS`` rounds of ``step(other) - step(base)``, the order alternating
    round by round, after one warm-up of each (the first calls import and allocate)."""
    with torch.enable_grad():
        step(base), step(other)
        differences = []
        for r in range(ROUNDS):
            order = (base, other) if r % 2 else (other, base)
            took = {c: step(c) for c in order}
            differences.append(took[other] - took[base])
    return statistics.median(differences)


#: Operators in each region of :func:`save_op_seconds`'s chain.
OPS = 8


class _Ops(nn.Module):
    """``OPS`` elementwise operators on 8 numbers: a region whose own work is next to nothing."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((8,), 1.0, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(OPS // 2):
            x = (x * self.weight).tanh()
        return x


def save_op_seconds(device: torch.device | str) -> float:
    """Seconds each operator of a region with ``checkpoint save = [...]`` costs on ``device`` beyond
    a plain region's (>= 0): torch's selective checkpointing runs every operator of the region,
    in forward and in its replay, through a dispatch mode that decides what to keep.  Measured as
    :func:`region_seconds` is: a chain of ``REGIONS`` regions of ``OPS`` operators, each region
    plain and then keeping ``matmul`` outputs (none here: every operator pays the decision and
    none is kept), interleaved over ``ROUNDS`` rounds; the median difference per operator."""
    device = torch.device(device)
    if device.type == "meta":
        return 0.0
    chain = [_Ops(device) for _ in range(REGIONS)]
    x = torch.full((2, 8), 0.5, device=device)

    def step(save: tuple[str, ...]) -> float:
        _synchronized(device)
        start = time.perf_counter()
        y = x
        for ops in chain:
            y = run_checkpointed(ops, _Ops.forward, (y,), {}, save=save)
        y.sum().backward()
        _synchronized(device)
        return time.perf_counter() - start

    return max(0.0, _median_difference(step, (), ("matmul",)) / (REGIONS * OPS))


def _synchronized(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
