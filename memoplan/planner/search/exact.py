"""Exact planner for nested candidates: a mixed-integer linear program, with a greedy fallback.

The chain planner :func:`memoplan.planner.search.optimal.optimal` is a fast special-purpose search for
disjoint candidates.  When candidates nest (``layers.3`` and ``layers.3.mlp``, a forest by
module path), :func:`exact` states the same question -- the least recompute time whose
estimated peak is within the limit, under the cost model of :mod:`memoplan.planner.search`
(see "Nested candidates" there) -- as a mixed-integer linear program and hands it to HiGHS
through ``scipy.optimize.milp``.

The program
===========

One binary z_i per candidate that saves bytes (d_i = s_i - x_i > 0; no other candidate can
lower the estimate, and each costs time >= 0).  The transient max_{i in C} s_i is a staircase
over the distinct sizes m_1 < m_2 < ... < m_K of those candidates: a binary w_k says "a region of
at least m_k bytes is checkpointed", and the transient is sum_k (m_k - m_{k-1}) w_k (m_0 = 0)::

    minimise    sum_i t_i z_i
    subject to  sum_{i on P} z_i <= 1            for every root-to-leaf path P (legal sets only)
                z_i <= w_k(i)                    for every candidate i, where m_k(i) = s_i
                w_k >= w_{k+1}                   for k = 1 .. K-1
                sum_i d_i z_i - sum_k (m_k - m_{k-1}) w_k >= unplanned - limit

Since ``peak(C) = unplanned - sum_{i in C} d_i + max_{i in C} s_i``, the last row is
``peak(C) <= limit`` once every w_k takes its least value, 1 up to the largest size chosen and
0 above; a larger w only makes the row harder to meet, so the program is exact.  The w would
take integral values without being declared integer, but declaring them lets HiGHS branch on
the transient itself, which on 200 nested candidates made the slowest budgets some 20 times
faster.  (A single variable T >= s_i z_i states the same, but its relaxation is much weaker:
with it HiGHS was slower again, and at 200 candidates its tolerances once proved a set least
that was not.)  Byte columns are divided by their greatest common divisor (the right-hand side
rounded up, which is exact for integers), and the objective is scaled so the largest time is
1e6, which keeps HiGHS's absolute gap (1e-6) far below any difference of recompute times that
matters.  The relative gap is 0: HiGHS stops only when the answer is proven least up to its
tolerances.  The solver's set is checked again with the exact integer model before it is
returned.

Fallback
========

The answer is ``proven_optimal=False``, with :attr:`Choice.reason` saying why, when scipy is
not installed, when a byte count is too large to be exact in the solver's floating point
(above 2**53, where the program cannot state the cost model exactly), when the time limit stops
HiGHS, or when the solver fails.  The set is then the better of the solver's best set (if it
found one) and the greedy set (:func:`memoplan.planner.search.greedy.greedy_bytes`, or, where greedy
misses, the set of least estimated peak), so a budget that some set meets is always met.  Only
a run stopped by its time limit depends on the machine.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from memoplan.planner.budgets import ByteBudget, byte_limit
from memoplan.planner.search.chain import Chain, Item
from memoplan.planner.search.choice import Choice, make_choice, settled_choice
from memoplan.planner.search.greedy import greedy_set

__all__ = ["DEFAULT_TIME_LIMIT", "exact"]

#: Seconds HiGHS may spend on one budget before the best set found so far is used.
DEFAULT_TIME_LIMIT = 10.0

# Integers up to this are exact as doubles, so the program is exact for byte counts below it.
EXACT_IN_FLOAT = 2**53

# The largest recompute time becomes this many objective units (see the module docstring).
_OBJECTIVE_SCALE = 1e6


@dataclass(frozen=True)
class _Solved:
    """What the solver returned: a set within the limit (or None), and whether it is proven least."""

    chosen: tuple[int, ...] | None
    proven: bool
    reason: str  # why it is not proven ("" when it is)


def exact(
    items: Sequence[Item],
    budget: ByteBudget,
    *,
    base_bytes: int = 0,
    time_limit: float = DEFAULT_TIME_LIMIT,
) -> Choice:
    """The least recompute time within the budget, for nested (or disjoint) candidates.

    Reports like :func:`memoplan.planner.search.optimal.optimal`: when no legal set is within the
    limit the status is ``INFEASIBLE`` (proven: the least reachable peak is exact) and the set
    is one that reaches ``minimum_peak``.  Otherwise the status is ``OK`` and, where HiGHS
    proved its set least within ``time_limit`` seconds, ``proven_optimal`` holds and the
    planner is ``"exact"``; see the module docstring for the fallback and its
    :attr:`~memoplan.planner.search.choice.Choice.reason`.
    """
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not time_limit > 0:
        raise ValueError(f"time_limit is a number of seconds > 0, got {time_limit!r}")
    chain = Chain(items, base_bytes, nested_ok=True)
    limit = byte_limit(budget, chain.unplanned)
    settled, floor, floor_set = settled_choice(chain, "exact", budget, limit)
    if settled is not None:
        return settled

    solved = _solve(chain, limit, float(time_limit))
    if solved.proven:
        return make_choice(chain, "exact", budget, solved.chosen, limit, floor, proven=True)
    fallback = greedy_set(chain, limit)
    if chain.peak(fallback) > limit:  # greedy missed; the least-peak set is within the limit
        fallback = list(floor_set)
    if solved.chosen is not None and chain.seconds(solved.chosen) < chain.seconds(fallback):
        reason = f"{solved.reason}; the best set it found is used, not proven least"
        return make_choice(chain, "exact", budget, solved.chosen, limit, floor, reason=reason)
    reason = f"{solved.reason}; greedy fallback, not proven least"
    return make_choice(chain, "greedy", budget, fallback, limit, floor, reason=reason)


def _solve(chain: Chain, limit: int, time_limit: float) -> _Solved:
    """Build the program of the module docstring for ``chain`` and ``limit``, and run HiGHS."""
    try:
        import scipy.optimize  # noqa: F401  (solve_binary's)
    except ImportError:
        return _Solved(None, False, "exact solver unavailable: scipy is not installed (pip install 'memoplan[plan]')")

    s, d, t = chain.r, chain.d, chain.t  # the staircase is over the transients (saved_bytes but for variants)
    useful = [i for i in range(chain.n) if d[i] > 0]
    need = chain.unplanned - limit  # bytes the set must save beyond its transient; > 0 here
    if max([chain.unplanned, *(s[i] for i in useful)]) > EXACT_IN_FLOAT:
        return _Solved(None, False, "byte counts above 2**53 are not exact in the solver's floating point")
    unit = math.gcd(*(s[i] for i in useful), *(d[i] for i in useful))  # > 0: every d is
    sizes = sorted({s[i] for i in useful})  # m_1 < ... < m_K
    column = {i: k for k, i in enumerate(useful)}  # z_i
    step = {m: len(useful) + k for k, m in enumerate(sizes)}  # w_k, by its size m_k

    rows: list[tuple[dict[int, int], float, float]] = []  # (coefficients, lower, upper)
    # Savings minus transient >= need, in units of `unit` (the left side is a multiple of it).
    savings = {column[i]: d[i] // unit for i in useful}
    for below, m in zip([0, *sizes], sizes):
        savings[step[m]] = -((m - below) // unit)
    rows.append((savings, -(-need // unit), math.inf))
    # The staircase: w_k >= w_{k+1}, and z_i <= w_k(i) for every candidate.
    for m, higher in zip(sizes, sizes[1:]):
        rows.append(({step[m]: 1, step[higher]: -1}, 0, math.inf))
    for i in useful:
        rows.append(({step[s[i]]: 1, column[i]: -1}, 0, math.inf))
    rows.extend(path_rows(chain, useful, column))
    result = solve_binary(rows, [t[i] for i in useful] + [0.0] * len(sizes), time_limit)
    return solved_set(result, useful, column, lambda chosen: chain.peak(chosen) <= limit, chain, time_limit)


def path_rows(chain: Chain, useful: Sequence[int], column: dict[int, int]) -> list[tuple[dict[int, int], float, float]]:
    """Legal sets: at most one candidate on each root-to-leaf path (paths through ``useful`` ones)."""
    rows: list[tuple[dict[int, int], float, float]] = []
    inner = {a for i in useful for a in chain.ancestors(i)}
    for i in useful:
        if i in inner:
            continue  # not a leaf: its paths are rows of the leaves below it
        path = [i, *(a for a in chain.ancestors(i) if a in column)]
        if len(path) > 1:
            rows.append(({column[k]: 1 for k in path}, -math.inf, 1))
    return rows


def solve_binary(rows: Sequence[tuple[dict[int, int], float, float]], times: Sequence[float], time_limit: float):
    """HiGHS's answer to: binary columns, least ``sum times[c] * z_c`` under ``rows`` (coefficients
    by column, lower and upper bound); scipy's ``OptimizeResult``.  Times are scaled so the largest
    is ``_OBJECTIVE_SCALE`` units (see the module docstring)."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import csr_matrix

    columns = len(times)
    data, row_of, col_of = [], [], []
    for r, (coefficients, _, _) in enumerate(rows):
        for c, value in coefficients.items():
            data.append(value)
            row_of.append(r)
            col_of.append(c)
    matrix = csr_matrix((data, (row_of, col_of)), shape=(len(rows), columns))
    top = max(times)
    # Divide before multiplying: 1e6 / top overflows to inf for a subnormal top (found by hypothesis).
    objective = [t / top * _OBJECTIVE_SCALE if top > 0 else 0.0 for t in times]
    with _solver_output_silenced():
        return milp(
            np.array(objective),
            integrality=np.ones(columns),
            bounds=Bounds(np.zeros(columns), np.ones(columns)),
            constraints=LinearConstraint(matrix, [r[1] for r in rows], [r[2] for r in rows]),
            options={"time_limit": time_limit, "mip_rel_gap": 0.0},
        )


def solved_set(result, useful: Sequence[int], column: dict[int, int], fits, chain: Chain, time_limit: float) -> _Solved:
    """The set in HiGHS's ``result``, checked again by ``fits(chosen)`` (the exact integer model)
    and for legality, and whether it is proven least."""
    chosen = None
    if result.x is not None:
        chosen = tuple(i for i in useful if result.x[column[i]] > 0.5)
        if not fits(chosen) or chain.clash(chosen) is not None:
            # The solver's tolerances let through a set that the exact model refuses.
            if result.status == 0:
                return _Solved(None, False, "the solver's set fails the exact model (numerical trouble)")
            chosen = None
    if result.status == 0 and chosen is not None:
        return _Solved(chosen, True, "")
    if result.status == 1:
        found = "after finding a set" if chosen is not None else "before finding any set within the budget"
        return _Solved(chosen, False, f"the exact solver stopped at its time limit ({time_limit:g} s) {found}")
    return _Solved(chosen, False, f"the exact solver failed: {result.message}")


@contextlib.contextmanager
def _solver_output_silenced():
    """Keep the solver's own diagnostics (printed from C to file descriptor 1) out of memoplan's output."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # no real stdout (e.g. captured): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
