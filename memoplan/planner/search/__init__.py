"""Planner stage: choose which modules of a chain to checkpoint under a typed budget, as a plan AST.

This module is the planners' public surface; each idea lives in its own module:
:mod:`~memoplan.planner.search.chain` (items, the chain, estimates, least peak),
:mod:`~memoplan.planner.budgets` (budget types), :mod:`~memoplan.planner.search.choice` (results),
:mod:`~memoplan.planner.search.greedy`, :mod:`~memoplan.planner.search.optimal` (with
:mod:`~memoplan.planner.search.exact` beside it), :mod:`~memoplan.planner.search.sublinear` and
:mod:`~memoplan.planner.search.write` (choice to plan AST).

Planners here are pure functions of a chain of candidate modules and a budget: no torch, no
measurement, no clock, no global random state.  Each returns a :class:`Choice` that says
which modules to checkpoint and what the cost model expects of that; :func:`to_plan` turns a
choice into an ordinary ``.memplan`` AST (one ``module <path> { checkpoint }`` rule per chosen
module, each with a comment saying why) that ``format_plan`` prints and a person can review.

The cost model
==============

A chain is a sequence of candidate modules in execution order, each an :class:`Item`:

* ``saved_bytes`` (s) -- activation bytes the module keeps for backward when it is *not*
  checkpointed;
* ``input_bytes`` (x) -- bytes of its input kept when it *is* checkpointed (a checkpoint region
  keeps only its input);
* ``forward_seconds`` (t) -- what recomputing it costs.

In a chain the candidates are disjoint modules (none contains another; nested candidates are
below), so every chosen module is its own checkpoint region; ``base_bytes`` (B0) is memory that
no decision changes (parameters, their gradients, outputs).  For a set C of checkpointed
modules::

    peak(C)    = B0 + sum_{i not in C} s_i + sum_{i in C} x_i + max_{i in C} s_i   (last term 0 if C is empty)
    seconds(C) = sum_{i in C} t_i

The last term of ``peak`` is the *transient* (the *bottleneck* in Chen et al.'s words):
backward recomputes one region at a time, and while it does, that region's activations are
live again.  ``peak(C)`` with C empty is the *unplanned peak*.  Writing d_i = s_i - x_i (what
checkpointing i saves), ``peak(C) = unplanned - sum_{i in C} d_i + max_{i in C} s_i``; a module
with d_i <= 0 can never lower the estimate.  Recompute seconds are summed with ``math.fsum``
(exactly rounded, so the figure does not depend on the order of the sum).  It is an estimate
from a profile: allocator rounding, fragmentation and the timing of gradient buffers are not
in it, which is why a ``hard`` budget is verified by measurement after planning.

Nested candidates.  Candidates may also contain one another (``layers.3`` and
``layers.3.mlp``): they then form a forest by module path, and ``saved_bytes`` of a candidate
covers its whole subtree (as :func:`memoplan.planner.profiling.profile.chain` measures it), so a parent's
``saved_bytes`` is at least the sum of its candidate children's.  A set C is legal when it
holds at most one candidate on any root-to-leaf path (a checkpoint inside a checkpointed
region would only recompute twice); checkpointing a parent replaces its whole subtree's bytes,
its children's included, by its input.  So ``peak(C) = unplanned - sum_{i in C} d_i + max_{i in C}
s_i`` holds unchanged, with the unplanned peak ``B0 + sum of s_r over the roots r`` (a parent's
bytes already count its children's).
:func:`estimate`, :func:`minimum_peak`, :func:`greedy_bytes` and :func:`optimal` accept nested
candidates (:func:`optimal` hands them to :func:`memoplan.planner.search.exact.exact`, a mixed-integer
program); :func:`greedy_coverage` and :func:`sublinear` take disjoint ones only.

Budgets are typed: :class:`Bytes` (a peak in bytes), :class:`FractionOfPeak` (a share of the
unplanned peak, from ``budget 60%`` or ``budget 0.6``) and :class:`Coverage` (a share of the
candidates, largest ``saved_bytes`` first; :class:`Preset` ``SPEED``/``BALANCED``/``MEMORY`` are
50/75/100%).  A byte limit is never silently exceeded: every :class:`Choice` carries a
:class:`Status`; ``INFEASIBLE`` means no set of checkpoints reaches the limit and
``minimum_peak`` is then the smallest estimate any set reaches (exact, see
:func:`minimum_peak`); ``MISSED`` means this (heuristic) planner found no set although one
exists.

The planners
============

* :func:`greedy_coverage` -- the top share of candidates by ``saved_bytes``.
* :func:`greedy_bytes` -- add candidates by largest saving d_i until the estimate fits.
* :func:`optimal` -- exact: the least recompute time with ``peak <= limit``.  It enumerates the
  transient cap m over the distinct ``saved_bytes`` (for a cap m, only modules with s_i <= m may
  be chosen and the estimate charges m: an upper bound that is exact at the cap of the optimal
  set), so each cap is a covering knapsack: save at least ``need_m = unplanned + m - limit``
  bytes (sum of d_i) at least cost.  The LP bound of every cap comes from one Fenwick tree
  (O(n log n) for all caps); caps are solved in order of that bound and the search stops when
  the bound exceeds the best time found.  Each cap is solved exactly by a Pareto frontier of
  (bytes, seconds) states grown from the LP break outwards (an expanding core, as in
  Pisinger's minknap) with dominance pruning and LP-bound pruning; runs of identical modules
  are one block taken k at a time.  The search is bounded by ``max_states`` (deterministic);
  ``Choice.proven_optimal`` says whether it ran to the end (near-subset-sum chains, where
  recompute time is almost exactly proportional to the bytes saved and every size differs, can
  stop early: the result is then the best set found, still within the budget).
* :func:`memoplan.planner.search.exact.exact` -- exact for nested candidates too: a mixed-integer
  linear program (``scipy.optimize.milp``) with a time limit and a greedy fallback.
* :func:`sublinear` -- Chen et al. / MegEngine ``SublinearMemoryConfig``: a search over
  ``thresh_nr_try`` bottleneck thresholds, refined by a seeded genetic algorithm.

Floating point: times are floats, so "exact" means the optimal time is within a relative
1e-9 of the true minimum (pruning keeps that much slack; tests compare with brute force and
with a DP over bytes).  Pure Python: no numpy, no torch.
"""

from memoplan.planner.budgets import (
    Budget,
    ByteBudget,
    Bytes,
    Coverage,
    FractionOfPeak,
    LeastPeak,
    Preset,
    budget_from_ast,
    parse_coverage,
)
from memoplan.planner.search.chain import Estimate, Item, estimate, minimum_peak, unplanned_base
from memoplan.planner.search.choice import BudgetError, Choice, Status
from memoplan.planner.search.greedy import COVERAGE_PLANNER, greedy_bytes, greedy_coverage
from memoplan.planner.search.optimal import DEFAULT_MAX_STATES, optimal
from memoplan.planner.search.sublinear import GeneticReport, SublinearResult, sublinear
from memoplan.planner.search.write import describe, recompute_line, to_plan

__all__ = [
    "DEFAULT_MAX_STATES",
    "Budget",
    "BudgetError",
    "ByteBudget",
    "Bytes",
    "COVERAGE_PLANNER",
    "Choice",
    "Coverage",
    "Estimate",
    "FractionOfPeak",
    "GeneticReport",
    "LeastPeak",
    "Item",
    "Preset",
    "Status",
    "SublinearResult",
    "budget_from_ast",
    "parse_coverage",
    "describe",
    "estimate",
    "greedy_bytes",
    "greedy_coverage",
    "minimum_peak",
    "optimal",
    "recompute_line",
    "sublinear",
    "to_plan",
    "unplanned_base",
]
