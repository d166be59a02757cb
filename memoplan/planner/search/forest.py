"""Exact search for nested candidates by their trees: Pareto frontiers of (bytes saved, time).

:func:`memoplan.planner.search.exact.exact` states the nested question -- the least recompute time
whose estimated peak ``unplanned - sum d_i + max r_i`` is within the limit, at most one candidate on
each root-to-leaf path -- as a mixed-integer program.  The candidates the planner builds are a few
small trees (a block, its ``save`` variants, its parts and theirs), so the same question has a
direct answer that is much cheaper than the solver's cuts and heuristics:

* Fix a cap ``m`` on the transient (each distinct ``r_i`` in turn): only candidates with
  ``r_i <= m`` may be chosen, and a set is within the limit when it saves at least
  ``T = unplanned - limit + m``.  The least set over all caps is the least set: at the cap equal
  to its own largest transient the least set is one of that cap's answers, and every cap's answer
  is within the limit.
* Under a cap, each tree offers its legal sets (the candidate itself, or any legal sets of its
  children together), kept as a Pareto frontier of (bytes saved, seconds): one option per amount
  saved, only those that no option saving as much beats in time.  Savings are counted up to
  ``T`` (saving more does not help), so the frontier never holds more options than there are
  distinct amounts below ``T``.  The trees' frontiers are then combined the same way, and the
  cap's answer is the quickest option that saves ``T``.
* Options no quicker than the best set found at an earlier cap are dropped as they are made.

Byte counts are integers, so the peak is exact; seconds are added in floating point, and the set
returned is checked again against the exact model.  Where a frontier would grow past
``max_options`` combinations (chains whose times are almost proportional to their bytes can make
every amount distinct), :func:`forest_search` gives up and answers None: the caller then runs the
mixed-integer program.  The answer depends on the candidates only, never on the machine.
"""

from __future__ import annotations

import math

from memoplan.planner.search.chain import Chain

__all__ = ["DEFAULT_MAX_OPTIONS", "Option", "forest_search", "frontier"]

#: Combinations of options one search may make (over all caps) before it gives up.
DEFAULT_MAX_OPTIONS = 2_000_000

#: An option: (bytes saved, capped at the target; seconds; the candidates it checkpoints).
Option = tuple[int, float, tuple[int, ...]]


class _TooLarge(Exception):
    """The search made more combinations than it may."""


def forest_search(chain: Chain, limit: int, *, max_options: int = DEFAULT_MAX_OPTIONS) -> tuple[int, ...] | None:
    """The legal set of least recompute seconds with ``chain.peak(set) <= limit``, or None.

    None when no legal set is within the limit, or when the search would make more than
    ``max_options`` combinations (then nothing is known).  Expects ``chain.unplanned > limit``.
    """
    useful = [i for i in range(chain.n) if chain.d[i] > 0]
    members = set(useful)
    children: dict[int, list[int]] = {i: [] for i in [-1, *useful]}
    for i in useful:  # each useful candidate under its innermost useful ancestor
        children[next((a for a in chain.ancestors(i) if a in members), -1)].append(i)
    search = _Search(chain, max_options)
    for cap in sorted({chain.r[i] for i in useful}):
        if search.best <= 0:
            break  # no set is quicker than no time
        try:
            search.at_cap(cap, chain.unplanned - limit + cap, children)
        except _TooLarge:
            return None
    if search.best_set is None:
        return None
    chosen = tuple(sorted(search.best_set))
    if chain.peak(chosen) > limit or chain.clash(chosen) is not None:  # pragma: no cover - a bug guard
        raise AssertionError(f"forest_search: the set {chosen} fails the exact model")
    return chosen


class _Search:
    """The search's state across caps: the best set so far and the combinations made."""

    def __init__(self, chain: Chain, max_options: int) -> None:
        self.chain = chain
        self.left = max_options
        self.best = math.inf
        self.best_set: tuple[int, ...] | None = None

    def at_cap(self, cap: int, target: int, children: dict[int, list[int]]) -> None:
        """Improve the best set with the sets whose transients are at most ``cap`` and save ``target``."""
        options = self._below(-1, cap, target, children)
        done = [o for o in options if o[0] >= target]
        if done:
            saved, seconds, chosen = min(done, key=lambda o: (o[1], o[2]))
            if seconds < self.best:
                self.best, self.best_set = seconds, chosen

    def _below(self, node: int, cap: int, target: int, children: dict[int, list[int]]) -> list[Option]:
        """The frontier of legal sets inside ``node`` (the node itself excluded; -1: the whole forest)."""
        parts = []
        for child in children[node]:
            inside = self._below(child, cap, target, children)
            if self.chain.r[child] <= cap:
                inside.append((min(self.chain.d[child], target), self.chain.t[child], (child,)))
            part = frontier(inside)
            if not part:
                return []  # every set in there is slower than the best found: so is every set here
            parts.append(part)
        # What the parts not yet combined can still save at most (a frontier's first option saves most).
        rest = [0] * (len(parts) + 1)
        for k in range(len(parts) - 1, -1, -1):
            rest[k] = rest[k + 1] + parts[k][0][0]
        # Only the whole forest must reach the target: inside a tree any amount may be combined later.
        need = target if node == -1 else 0
        options: list[Option] = [(0, 0.0, ())]
        for k, part in enumerate(parts):
            options = self._combined(options, part, target, need - rest[k + 1])
            if not options:
                break
        return options

    def _combined(self, a: list[Option], b: list[Option], target: int, least: int) -> list[Option]:
        """Each option of ``a`` with each of ``b`` (disjoint subtrees) saving at least ``least``, on their frontier."""
        self.left -= len(a) * len(b)
        if self.left < 0:
            raise _TooLarge
        best = self.best
        made = [
            (saved, seconds, x[2] + y[2])
            for x in a
            for y in b
            if (seconds := x[1] + y[1]) < best and (saved := min(x[0] + y[0], target)) >= least
        ]
        return frontier(made)


def frontier(options: list[Option]) -> list[Option]:
    """The options that no other saving as many bytes beats in seconds (ties: the first in order);
    most bytes first, each quicker than the one before (also :mod:`memoplan.planner.search.held`'s)."""
    options.sort(key=lambda o: (-o[0], o[1], o[2]))
    kept: list[Option] = []
    quickest = math.inf
    for option in options:
        if option[1] < quickest:
            kept.append(option)
            quickest = option[1]
    return kept
