"""Greedy planners: a coverage share of the candidates, or largest savings first until a byte limit."""

from __future__ import annotations

from collections.abc import Sequence

from memoplan.planner.budgets import ByteBudget, Coverage, Preset, byte_limit
from memoplan.planner.search.chain import Chain, Item
from memoplan.planner.search.choice import Choice, make_choice

__all__ = ["COVERAGE_PLANNER", "greedy_bytes", "greedy_coverage", "greedy_set"]


# ---------------------------------------------------------------- greedy


#: What a coverage budget's :class:`Choice` names as its planner: no search runs, the share is taken.
COVERAGE_PLANNER = "coverage (largest activations first)"


def greedy_coverage(items: Sequence[Item], coverage: Coverage | Preset, *, base_bytes: int = 0) -> Choice:
    """Checkpoint the top ``coverage`` share of the candidates by ``saved_bytes`` (ties: chain order).

    SpikingJelly's selective budgets.  There is no byte limit, so the status is always OK; the
    estimate may even rise (a candidate that saves nothing still adds its transient).
    """
    if isinstance(coverage, Preset):
        coverage = coverage.coverage
    if not isinstance(coverage, Coverage):
        raise TypeError(f"greedy_coverage needs a Coverage or a Preset, got {type(coverage).__name__}")
    chain = Chain(items, base_bytes)
    ranked = sorted(range(chain.n), key=lambda i: (-chain.s[i], i))
    return make_choice(chain, COVERAGE_PLANNER, coverage, ranked[: coverage.count(chain.n)], None)


def greedy_bytes(items: Sequence[Item], budget: ByteBudget, *, base_bytes: int = 0) -> Choice:
    """Add candidates by largest saving ``saved - input`` (ties: chain order) until the estimate fits.

    Nested candidates: a candidate inside, or containing, one already taken is skipped.  The
    result is the first prefix of that order within the limit, so a larger budget gives a
    prefix of the smaller budget's set: never more recompute time.  The transient term can make
    every prefix miss a limit that another set meets; then the status is ``MISSED`` (and the set
    is the prefix with the lowest estimate), never a silent overshoot.
    """
    chain = Chain(items, base_bytes, nested_ok=True)
    limit = byte_limit(budget, chain.unplanned)
    return make_choice(chain, "greedy", budget, greedy_set(chain, limit), limit)


def greedy_set(chain: Chain, limit: int) -> list[int]:
    """:func:`greedy_bytes`'s set: the first prefix within ``limit``, else the prefix of lowest estimate."""
    if chain.unplanned <= limit:
        return []
    order = []
    taken = [False] * chain.n
    taken_inside = [False] * chain.n  # some candidate inside this one is taken
    for i in sorted((i for i in range(chain.n) if chain.d[i] > 0), key=lambda i: (-chain.d[i], i)):
        outer = list(chain.ancestors(i))
        if taken_inside[i] or any(taken[a] for a in outer):
            continue
        order.append(i)
        taken[i] = True
        for a in outer:
            taken_inside[a] = True
    saved, transient = 0, 0
    best_peak, best_cut = chain.unplanned, 0
    for k, i in enumerate(order):
        saved += chain.d[i]
        transient = max(transient, chain.r[i])
        peak = chain.unplanned - saved + transient
        if peak <= limit:
            return order[: k + 1]
        if peak < best_peak:
            best_peak, best_cut = peak, k + 1
    return order[:best_cut]
