"""Planner stage: checkpoint segments for chains without blocks (Chen et al.'s sqrt(n) and the least-peak split).

A flat ``nn.Sequential`` (48 x ``Linear`` + ``GELU``) has no block worth checkpointing on its
own: each child keeps its input whether it is checkpointed or not.  Runs of consecutive
children are what save memory: a region over children ``[i, j)`` keeps only child ``i``'s
input and frees every activation inside it until backward replays it.  The language writes
such runs as ``checkpoint segments = k`` (near-equal runs) or ``checkpoint split = [...]``
(runs starting at the named children) on the ``Sequential``.

The cost model is the chain planners' (see :mod:`memoplan.planner.search`) over runs instead of
modules.  A split of the children ``0..n-1`` into runs starting at ``b_0 = 0 < b_1 < ... < b_k``
estimates::

    peak(split) = rest + sum_r x[b_r] + max_r (sum of s over run r)

where ``s`` is each child's saved bytes (its subtree's), ``x`` its input bytes and ``rest``
what no split changes.  Every split recomputes the whole container once in backward, so
recompute time is the same for all of them: the best split for any budget is the one with the
least peak, which :func:`least_peak_split` finds exactly (for each cap on a run's bytes, a
sliding-window minimum over where the last run starts; O(n) per cap, one cap per distinct run
total).  :func:`sqrt_split` is Chen et al.'s ``ceil(sqrt(n))`` near-equal runs, as
``segments = k`` cuts them.  Pure Python: no torch.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Split", "least_peak_split", "split_cost", "sqrt_split"]


@dataclass(frozen=True)
class Split:
    """Runs of a chain's children: ``starts`` are the indices where each run starts (the first is 0)."""

    starts: tuple[int, ...]
    kept: int  # bytes: the inputs the runs keep (sum of x at the starts)
    transient: int  # bytes: the largest run's saved bytes, live again while backward replays it

    @property
    def cost(self) -> int:
        """What the split adds to the bytes no split changes: kept inputs and the transient."""
        return self.kept + self.transient

    @property
    def runs(self) -> int:
        return len(self.starts)


def split_cost(saved: Sequence[int], inputs: Sequence[int], starts: Sequence[int]) -> Split:
    """The :class:`Split` of runs starting at ``starts`` (ascending, the first 0) over the chain."""
    n = len(saved)
    if len(inputs) != n or not n:
        raise ValueError("saved and inputs must be the same non-empty length")
    bounds = [*starts, n]
    if bounds[0] != 0 or any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"run starts must ascend from 0 below {n}, got {list(starts)}")
    transient = max(sum(saved[a:b]) for a, b in zip(bounds, bounds[1:]))
    return Split(tuple(starts), sum(inputs[i] for i in starts), transient)


def sqrt_split(n: int) -> tuple[int, ...]:
    """Chen et al.'s ``ceil(sqrt(n))`` near-equal runs, cut where ``checkpoint segments = k`` cuts them."""
    if n < 1:
        raise ValueError("a chain has at least one child")
    k = math.ceil(math.sqrt(n))
    return segment_starts(n, k)


def segment_starts(n: int, k: int) -> tuple[int, ...]:
    """Where ``segments = k`` starts its runs over ``n`` children: the first ``n % k`` runs one longer."""
    k = min(k, n)
    size, extra = divmod(n, k)
    starts, at = [], 0
    for r in range(k):
        starts.append(at)
        at += size + (1 if r < extra else 0)
    return tuple(starts)


def least_peak_split(saved: Sequence[int], inputs: Sequence[int]) -> Split:
    """The split with the least ``kept + transient`` (exact; the fewest runs among equals).

    For each cap M on a run's saved bytes (every distinct run total at or above the largest
    child), the least kept bytes of a split whose runs all fit under M is a shortest path over
    run starts, found with a sliding-window minimum; the best over the caps is the answer.
    """
    n = len(saved)
    if len(inputs) != n or not n:
        raise ValueError("saved and inputs must be the same non-empty length")
    prefix = [0]
    for s in saved:
        prefix.append(prefix[-1] + s)
    caps = sorted({prefix[j] - prefix[i] for i in range(n) for j in range(i + 1, n + 1)})
    caps = [m for m in caps if m >= max(saved)]
    best: Split | None = None
    for cap in caps:
        if best is not None and cap >= best.cost:
            break  # the transient alone is already over the best total
        starts = _least_kept(prefix, inputs, cap)
        found = split_cost(saved, inputs, starts)
        if best is None or (found.cost, found.runs) < (best.cost, best.runs):
            best = found
    assert best is not None
    return best


def _least_kept(prefix: Sequence[int], inputs: Sequence[int], cap: int) -> tuple[int, ...]:
    """Run starts whose runs each hold at most ``cap`` bytes, with the least kept input bytes.

    ``cost[j]`` is the least kept bytes of runs covering children ``[0, j)``; a run ``[i, j)``
    fits when ``prefix[j] - prefix[i] <= cap``, so its start ranges over a window that only
    moves right as ``j`` grows: a monotone deque keeps the window's minimum of ``cost[i] + x[i]``
    (ties to the later start: fewer, longer runs before it).
    """
    n = len(inputs)
    cost = [0] + [math.inf] * n
    back = [0] * (n + 1)
    window: deque[int] = deque()
    low = 0
    for j in range(1, n + 1):
        i = j - 1
        value = cost[i] + inputs[i]
        while window and cost[window[-1]] + inputs[window[-1]] >= value:
            window.pop()
        window.append(i)
        while prefix[j] - prefix[low] > cap:
            low += 1
        while window and window[0] < low:
            window.popleft()
        start = window[0]
        cost[j], back[j] = cost[start] + inputs[start], start
    starts, j = [], n
    while j > 0:
        j = back[j]
        starts.append(j)
    return tuple(reversed(starts))
