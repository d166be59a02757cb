"""Planner stage: choose which modules of a chain to checkpoint under a typed budget, as a plan AST.

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
covers its whole subtree (as :func:`memoplan.planner.profile.chain` measures it), so a parent's
``saved_bytes`` is at least the sum of its candidate children's.  A set C is legal when it
holds at most one candidate on any root-to-leaf path (a checkpoint inside a checkpointed
region would only recompute twice); checkpointing a parent replaces its whole subtree's bytes,
its children's included, by its input.  So ``peak(C) = unplanned - sum_{i in C} d_i + max_{i in C}
s_i`` holds unchanged, with the unplanned peak ``B0 + sum of s_r over the roots r`` (a parent's
bytes already count its children's).
:func:`estimate`, :func:`minimum_peak`, :func:`greedy_bytes` and :func:`optimal` accept nested
candidates (:func:`optimal` hands them to :func:`memoplan.planner.exact.exact`, a mixed-integer
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
* :func:`memoplan.planner.exact.exact` -- exact for nested candidates too: a mixed-integer
  linear program (``scipy.optimize.milp``) with a time limit and a greedy fallback.
* :func:`sublinear` -- Chen et al. / MegEngine ``SublinearMemoryConfig``: a search over
  ``thresh_nr_try`` bottleneck thresholds, refined by a seeded genetic algorithm.

Floating point: times are floats, so "exact" means the optimal time is within a relative
1e-9 of the true minimum (pruning keeps that much slack; tests compare with brute force and
with a DP over bytes).  Pure Python: no numpy, no torch.
"""

from __future__ import annotations

import concurrent.futures
import enum
import math
import multiprocessing
import random
import unicodedata
from bisect import bisect_left, insort
from dataclasses import dataclass
from fractions import Fraction
from itertools import compress
from typing import Mapping, Sequence, Union

from memoplan.syntax import ast
from memoplan.syntax.blocks import SublinearConfig

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
    "Item",
    "Preset",
    "Status",
    "SublinearResult",
    "budget_from_ast",
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

# The optimal planner's default search bound, in frontier states (see ``optimal``).
DEFAULT_MAX_STATES = 2_000_000

# Relative slack of every pruning test: a state is dropped only when its lower bound exceeds
# the incumbent by more than this, so float rounding in the bounds never loses the optimum.
_SLACK = 1e-9


# ---------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Item:
    """One candidate module of the chain (see the module docstring for the cost model)."""

    name: str  # its path in ``model.named_modules()``
    saved_bytes: int  # kept for backward when not checkpointed
    input_bytes: int  # kept when checkpointed (the region's input)
    forward_seconds: float  # recompute cost

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "" in self.name.split("."):
            raise ValueError(f"an item needs a module path like `layers.0.attn`, got {self.name!r}")
        for field_name in ("saved_bytes", "input_bytes"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{self.name}: {field_name} must be an integer >= 0, got {value!r}")
        t = self.forward_seconds
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"{self.name}: forward_seconds must be a finite number >= 0, got {t!r}")

    @property
    def saving(self) -> int:
        """Bytes that checkpointing this module saves before the transient: s - x."""
        return self.saved_bytes - self.input_bytes


class _Chain:
    """A validated chain (or forest of nested candidates) with its columns, as the planners read it.

    ``parent[i]`` is the index of the innermost other candidate that contains candidate i (by
    module path), or -1; ``nested`` says whether any candidate has one.  Disjoint candidates
    are the chain case, and every planner reads them; nested ones are refused unless
    ``nested_ok`` (see "Nested candidates" in the module docstring).
    """

    def __init__(self, items: Sequence[Item], base_bytes: int, *, nested_ok: bool = False) -> None:
        items = tuple(items)
        if isinstance(base_bytes, bool) or not isinstance(base_bytes, int) or base_bytes < 0:
            raise ValueError(f"base_bytes must be an integer >= 0, got {base_bytes!r}")
        index: dict[str, int] = {}
        for item in items:
            if not isinstance(item, Item):
                raise TypeError(f"expected Item, got {type(item).__name__}")
            if item.name in index:
                raise ValueError(f"module `{item.name}` appears twice in the chain")
            index[item.name] = len(index)
        self.parent = [_innermost_outer(item.name, index) for item in items]
        self.nested = any(p >= 0 for p in self.parent)
        if self.nested and not nested_ok:
            i = next(i for i, p in enumerate(self.parent) if p >= 0)
            # Both would be checkpoint regions, one inside the other (MP305).
            raise ValueError(
                f"candidates must be disjoint for this planner: `{items[i].name}` is inside "
                f"`{items[self.parent[i]].name}` (optimal and greedy_bytes accept nested candidates)"
            )
        inner = [0] * len(items)  # bytes of each candidate's candidate children together
        for i, p in enumerate(self.parent):
            if p >= 0:
                inner[p] += items[i].saved_bytes
        for i, item in enumerate(items):
            if inner[i] > item.saved_bytes:
                raise ValueError(
                    f"`{item.name}` saves {item.saved_bytes} B, less than the {inner[i]} B of the candidates "
                    "inside it: a candidate's saved_bytes must cover its whole subtree"
                )
        self.items = items
        self.n = len(items)
        self.base = base_bytes
        self.s = [i.saved_bytes for i in items]
        self.x = [i.input_bytes for i in items]
        self.d = [i.saved_bytes - i.input_bytes for i in items]
        self.t = [float(i.forward_seconds) for i in items]
        # A parent's bytes already hold its children's: only the roots add up.
        self.unplanned = base_bytes + sum(s for s, p in zip(self.s, self.parent) if p < 0)

    def ancestors(self, i: int):
        """The candidates that contain candidate i, innermost first."""
        p = self.parent[i]
        while p >= 0:
            yield p
            p = self.parent[p]

    def clash(self, chosen: Sequence[int]) -> tuple[int, int] | None:
        """A (candidate, ancestor) pair both in ``chosen``, or None if the set is legal."""
        members = set(chosen)
        for i in members:
            for a in self.ancestors(i):
                if a in members:
                    return i, a
        return None

    def peak(self, chosen: Sequence[int]) -> int:
        if not chosen:
            return self.unplanned
        return self.unplanned - sum(self.d[i] for i in chosen) + max(self.s[i] for i in chosen)

    def seconds(self, chosen: Sequence[int]) -> float:
        return math.fsum(self.t[i] for i in chosen)


def _innermost_outer(name: str, index: Mapping[str, int]) -> int:
    """The index of the longest proper path prefix of ``name`` in ``index``, or -1."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        found = index.get(".".join(parts[:cut]))
        if found is not None:
            return found
    return -1


@dataclass(frozen=True)
class Estimate:
    """What the cost model expects of one set of checkpoints."""

    peak: int  # bytes
    seconds: float  # recompute time


def estimate(items: Sequence[Item], checkpointed: Sequence[int], *, base_bytes: int = 0) -> Estimate:
    """The cost model for one set of checkpointed items (indices into ``items``).

    Items may nest; a set holding a candidate and one that contains it is refused (``ValueError``).
    """
    chain = _Chain(items, base_bytes, nested_ok=True)
    chosen = sorted(set(checkpointed))
    if chosen and not (0 <= chosen[0] and chosen[-1] < chain.n):
        raise IndexError("checkpointed index out of range")
    pair = chain.clash(chosen)
    if pair is not None:
        inner, outer = (chain.items[k].name for k in pair)
        raise ValueError(f"`{inner}` and `{outer}` are both checkpointed, but one is inside the other")
    return Estimate(chain.peak(chosen), chain.seconds(chosen))


# ---------------------------------------------------------------- budgets


def _exact_fraction(value) -> Fraction:
    """A number as an exact fraction; floats are read as the decimal they print as (0.6 -> 3/5)."""
    if isinstance(value, bool):
        raise TypeError("a budget amount is a number, not a bool")
    if isinstance(value, Fraction):
        return value
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float) and math.isfinite(value):
        return Fraction(repr(value))
    raise TypeError(f"not a finite number: {value!r}")


def _share(value, what: str) -> Fraction:
    """``value`` as an exact fraction in (0, 1], or ValueError naming ``what`` it is."""
    exact = _exact_fraction(value)
    if not 0 < exact <= 1:
        raise ValueError(f"{what} is in (0, 1], got {value!r}")
    return exact


def _percent(share: Fraction) -> str:
    """``share`` as a percentage: whole numbers exactly, others as ``%g`` prints them."""
    pct = share * 100
    return str(pct.numerator) if pct.denominator == 1 else f"{float(pct):g}"


def _size(n: int) -> str:
    """Bytes for people: ``12.0 MiB``."""
    if n < 1024:
        return f"{n} B"
    for unit, factor in (("KiB", 1024), ("MiB", 1024**2), ("GiB", 1024**3)):
        if n < 1024 * factor:
            return f"{n / factor:.1f} {unit}"
    return f"{n / 1024**4:.1f} TiB"


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.1f} us"


@dataclass(frozen=True)
class Bytes:
    """A byte budget: the estimated peak must be at most ``amount`` bytes."""

    amount: int

    def __post_init__(self) -> None:
        if isinstance(self.amount, bool) or not isinstance(self.amount, int) or self.amount < 0:
            raise ValueError(f"a byte budget is an integer >= 0, got {self.amount!r}")

    def limit(self, unplanned_peak: int) -> int:
        return self.amount

    def describe(self, unplanned_peak: int) -> str:
        return f"{_size(self.amount)} ({self.amount} B)"


@dataclass(frozen=True)
class FractionOfPeak:
    """A share of the unplanned estimated peak, in (0, 1]: ``budget 60%`` or ``budget 0.6``.

    The limit is ``floor(fraction * unplanned)`` bytes, computed exactly (0.6 is 3/5, not the
    binary float just below it).
    """

    fraction: Fraction

    def __post_init__(self) -> None:
        object.__setattr__(self, "fraction", _share(self.fraction, "a fraction of the unplanned peak"))

    @classmethod
    def percent(cls, value: int | float | Fraction) -> FractionOfPeak:
        return cls(_exact_fraction(value) / 100)

    def limit(self, unplanned_peak: int) -> int:
        return math.floor(unplanned_peak * self.fraction)

    def describe(self, unplanned_peak: int) -> str:
        return f"{_percent(self.fraction)}% of the unplanned peak = {_size(self.limit(unplanned_peak))}"


@dataclass(frozen=True)
class Coverage:
    """A share of the candidates, in (0, 1], taken largest ``saved_bytes`` first.

    ``count(n) = ceil(share * n)``: at least that share of the candidates is covered.
    """

    share: Fraction

    def __post_init__(self) -> None:
        object.__setattr__(self, "share", _share(self.share, "a coverage share"))

    def count(self, candidates: int) -> int:
        return math.ceil(candidates * self.share)

    def describe(self, unplanned_peak: int) -> str:
        return f"{_percent(self.share)}% of the candidates, largest activations first"


class Preset(enum.Enum):
    """SpikingJelly's selective budgets: the share of candidates checkpointed."""

    SPEED = Fraction(1, 2)
    BALANCED = Fraction(3, 4)
    MEMORY = Fraction(1)

    @property
    def coverage(self) -> Coverage:
        return Coverage(self.value)


ByteBudget = Union[Bytes, FractionOfPeak]
Budget = Union[Bytes, FractionOfPeak, Coverage]


def budget_from_ast(budget: ast.Budget) -> ByteBudget:
    """The typed budget of a plan's ``budget`` statement (its hard/hint mode is the caller's)."""
    amount = budget.amount
    if isinstance(amount, ast.Size):
        return Bytes(amount.bytes)
    if isinstance(amount, ast.Percent):
        return FractionOfPeak.percent(amount.value)
    return FractionOfPeak(amount)


def _byte_limit(budget: ByteBudget, unplanned: int) -> int:
    if not isinstance(budget, (Bytes, FractionOfPeak)):
        raise TypeError(f"this planner needs a byte budget (Bytes or FractionOfPeak), got {type(budget).__name__}")
    return budget.limit(unplanned)


# ---------------------------------------------------------------- results


class Status(enum.Enum):
    OK = "ok"  # the estimate is within the limit (or there is no byte limit)
    MISSED = "missed"  # this heuristic found no set within the limit, but one exists
    INFEASIBLE = "infeasible"  # no set of checkpoints is within the limit


@dataclass(frozen=True)
class Choice:
    """A planner's decision and what the cost model expects of it."""

    planner: str
    budget: Budget | None
    checkpointed: tuple[int, ...]  # indices into the chain, ascending
    names: tuple[str, ...]  # their module paths, in the same order
    estimated_peak: int  # bytes, for this set
    unplanned_peak: int  # bytes, with nothing checkpointed
    recompute_seconds: float
    limit: int | None  # the byte limit the budget resolved to (None: coverage or no budget)
    status: Status
    minimum_peak: int  # the smallest estimate any set of checkpoints reaches
    # True where the answer is exact for the cost model: the least recompute time within the
    # limit or, if none is, the least reachable peak (the optimal planner, search complete).
    proven_optimal: bool = False
    # Why the planner could not prove its answer least where it was asked to, e.g. the exact
    # planner's greedy fallback ("" when there is nothing to say).
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status is Status.OK


class BudgetError(ValueError):
    """A choice that does not meet its byte budget was about to become a plan."""

    def __init__(self, choice: Choice) -> None:
        self.choice = choice
        what = (
            "no set of checkpoints reaches it"
            if choice.status is Status.INFEASIBLE
            else f"planner `{choice.planner}` found no set that reaches it (the optimal planner would)"
        )
        super().__init__(
            f"budget {_size(choice.limit or 0)} not met: {what}; the smallest reachable estimated "
            f"peak is {_size(choice.minimum_peak)} ({choice.minimum_peak} B)"
        )


def _choice(
    chain: _Chain,
    planner: str,
    budget,
    chosen,
    limit: int | None,
    floor: int | None = None,
    proven: bool = False,
    reason: str = "",
) -> Choice:
    chosen = tuple(sorted(chosen))
    peak = chain.peak(chosen)
    if floor is None:
        floor = _minimum(chain)[0]
    if limit is None or peak <= limit:
        status = Status.OK
    else:
        status = Status.INFEASIBLE if floor > limit else Status.MISSED
    return Choice(
        planner=planner,
        budget=budget,
        checkpointed=chosen,
        names=tuple(chain.items[i].name for i in chosen),
        estimated_peak=peak,
        unplanned_peak=chain.unplanned,
        recompute_seconds=chain.seconds(chosen),
        limit=limit,
        status=status,
        minimum_peak=floor,
        proven_optimal=proven,
        reason=reason,
    )


def _settled(chain: _Chain, planner: str, budget, limit: int) -> tuple[Choice | None, int, tuple[int, ...]]:
    """What an exact planner answers without searching, and the least reachable peak with its set.

    The choice is the empty set when nothing need be checkpointed, the least-peak set when no
    set meets ``limit`` (both proven), else None: the planner must search.
    """
    floor, floor_set = _minimum(chain)
    if chain.unplanned <= limit:
        return _choice(chain, planner, budget, (), limit, floor, proven=True), floor, floor_set
    if floor > limit:
        return _choice(chain, planner, budget, floor_set, limit, floor, proven=True), floor, floor_set
    return None, floor, floor_set


# ---------------------------------------------------------------- exact minimum peak


def _minimum(chain: _Chain) -> tuple[int, tuple[int, ...]]:
    """The least estimated peak over all sets, and the set that reaches it (cap enumeration)."""
    if chain.nested:
        return _minimum_nested(chain)
    useful = sorted((i for i in range(chain.n) if chain.d[i] > 0), key=lambda i: (chain.s[i], i))
    best_peak, best_cut = chain.unplanned, 0
    saved = 0
    for k, i in enumerate(useful):
        saved += chain.d[i]
        last = k + 1 == len(useful) or chain.s[useful[k + 1]] != chain.s[i]
        if last:  # every useful module with s <= s_i, transient s_i
            peak = chain.unplanned - saved + chain.s[i]
            if peak < best_peak:
                best_peak, best_cut = peak, k + 1
    return best_peak, tuple(sorted(useful[:best_cut]))


def _minimum_nested(chain: _Chain) -> tuple[int, tuple[int, ...]]:
    """:func:`_minimum` for nested candidates: for each cap m, the legal set of most savings.

    For a cap m, the candidates with s <= m that save bytes are *eligible*, and the most a
    legal set of them saves is a tree recurrence: ``best(i) = max(d_i if eligible, sum of
    best(c) over i's children)``.  Caps are taken in rising order; when a candidate becomes
    eligible only its ancestors' values change, so each cap costs the depth of the tree.  The
    set of the best cap is rebuilt top-down at the end.
    """
    s, d, parent = chain.s, chain.d, chain.parent
    useful = sorted((i for i in range(chain.n) if d[i] > 0), key=lambda i: (s[i], i))
    own = [0] * chain.n  # d_i once eligible
    below = [0] * chain.n  # sum of best(c) over the children c
    best = [0] * chain.n
    saved = 0  # sum of best(r) over the roots r
    best_peak, best_cap = chain.unplanned, None
    for k, i in enumerate(useful):
        own[i] = d[i]
        node = i
        while True:  # push the change up to the roots
            value = max(own[node], below[node])
            delta = value - best[node]
            if delta == 0:
                break
            best[node] = value
            node = parent[node]
            if node < 0:
                saved += delta
                break
            below[node] += delta
        if k + 1 == len(useful) or s[useful[k + 1]] != s[i]:
            peak = chain.unplanned - saved + s[i]
            if peak < best_peak:
                best_peak, best_cap = peak, s[i]
    if best_cap is None:
        return chain.unplanned, ()
    chosen = _most_savings(chain, [d[i] > 0 and s[i] <= best_cap for i in range(chain.n)])
    return chain.peak(chosen), chosen


def _most_savings(chain: _Chain, eligible: Sequence[bool]) -> tuple[int, ...]:
    """A legal set of eligible candidates with the largest sum of savings (children win ties)."""
    children: list[list[int]] = [[] for _ in range(chain.n)]
    for i, p in enumerate(chain.parent):
        if p >= 0:
            children[p].append(i)
    best = [0] * chain.n
    for i in sorted(range(chain.n), key=lambda i: -_depth(chain, i)):  # children before parents
        below = sum(best[c] for c in children[i])
        best[i] = max(chain.d[i], below) if eligible[i] else below
    chosen = []
    todo = [i for i in range(chain.n) if chain.parent[i] < 0]
    while todo:
        i = todo.pop()
        if eligible[i] and chain.d[i] > sum(best[c] for c in children[i]):
            chosen.append(i)
        else:
            todo.extend(children[i])
    return tuple(sorted(chosen))


def _depth(chain: _Chain, i: int) -> int:
    return sum(1 for _ in chain.ancestors(i))


def unplanned_base(peak_bytes: int, items: Sequence[Item]) -> int:
    """B0 for a measured unplanned peak: what it holds beyond the candidates' saved bytes.

    Only the outermost candidates count: a nested candidate's bytes are inside its parent's,
    so with nested candidates the unplanned estimate stays ``peak_bytes`` (or more, when the
    candidates' own bytes exceed it, and B0 is then 0).
    """
    chain = _Chain(items, 0, nested_ok=True)
    return max(0, peak_bytes - chain.unplanned)


def minimum_peak(items: Sequence[Item], *, base_bytes: int = 0) -> tuple[int, tuple[int, ...]]:
    """The smallest estimated peak any set of checkpoints reaches, and one set that reaches it.

    For a transient cap m the best set holds every module with s <= m that saves bytes
    (d > 0); the least of those estimates over the distinct m, and the empty set, is exact.
    For nested candidates the best set for a cap is the legal one of most savings (a tree
    recurrence, see :func:`_minimum_nested`).
    """
    return _minimum(_Chain(items, base_bytes, nested_ok=True))


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
    chain = _Chain(items, base_bytes)
    ranked = sorted(range(chain.n), key=lambda i: (-chain.s[i], i))
    return _choice(chain, COVERAGE_PLANNER, coverage, ranked[: coverage.count(chain.n)], None)


def greedy_bytes(items: Sequence[Item], budget: ByteBudget, *, base_bytes: int = 0) -> Choice:
    """Add candidates by largest saving ``saved - input`` (ties: chain order) until the estimate fits.

    Nested candidates: a candidate inside, or containing, one already taken is skipped.  The
    result is the first prefix of that order within the limit, so a larger budget gives a
    prefix of the smaller budget's set: never more recompute time.  The transient term can make
    every prefix miss a limit that another set meets; then the status is ``MISSED`` (and the set
    is the prefix with the lowest estimate), never a silent overshoot.
    """
    chain = _Chain(items, base_bytes, nested_ok=True)
    limit = _byte_limit(budget, chain.unplanned)
    return _choice(chain, "greedy", budget, _greedy(chain, limit), limit)


def _greedy(chain: _Chain, limit: int) -> list[int]:
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
        transient = max(transient, chain.s[i])
        peak = chain.unplanned - saved + transient
        if peak <= limit:
            return order[: k + 1]
        if peak < best_peak:
            best_peak, best_cut = peak, k + 1
    return order[:best_cut]


# ---------------------------------------------------------------- optimal


class _Fenwick:
    """Prefix sums of (bytes, seconds) over efficiency ranks, for the LP bound of every cap."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.d = [0] * (n + 1)
        self.t = [0.0] * (n + 1)
        self.top = 1 << max(0, n.bit_length() - 1) if n else 0

    def add(self, rank: int, d: int, t: float) -> None:
        pos = rank + 1
        while pos <= self.n:
            self.d[pos] += d
            self.t[pos] += t
            pos += pos & -pos

    def below(self, need: int) -> tuple[int, int, float]:
        """The longest prefix of ranks whose bytes stay below ``need``: (length, bytes, seconds)."""
        pos, d, t = 0, 0, 0.0
        step = self.top
        while step:
            nxt = pos + step
            if nxt <= self.n and d + self.d[nxt] < need:
                pos, d, t = nxt, d + self.d[nxt], t + self.t[nxt]
            step >>= 1
        return pos, d, t


class _Bound:
    """LP relaxation of "cover ``need`` bytes at least cost" over a fixed efficiency-ordered list.

    ``lp(lo, need)`` uses the items at positions >= lo: whole items by rising seconds per byte,
    then a fraction of the next.  It is a lower bound on every integer cover of those items.
    """

    __slots__ = ("cum_d", "cum_t", "eff")

    def __init__(self, ds: Sequence[int], ts: Sequence[float]) -> None:
        cum_d, cum_t = [0], [0.0]
        for d, t in zip(ds, ts):
            cum_d.append(cum_d[-1] + d)
            cum_t.append(cum_t[-1] + t)
        self.cum_d, self.cum_t = cum_d, cum_t
        self.eff = [t / d for d, t in zip(ds, ts)]

    def lp(self, lo: int, need: int) -> float:
        cum_d = self.cum_d
        target = cum_d[lo] + need
        q = bisect_left(cum_d, target, lo + 1)
        if q >= len(cum_d):
            return math.inf
        return self.cum_t[q - 1] - self.cum_t[lo] + (target - cum_d[q - 1]) * self.eff[q - 1]


def _interval(f, top: int, limit: float) -> range:
    """The x in 0..top with f(x) <= limit, for f convex there (+inf allowed only on a prefix)."""
    if top <= 3:
        inside = [x for x in range(top + 1) if f(x) <= limit]
        return range(inside[0], inside[-1] + 1) if inside else range(0)
    a, z = 0, top
    while a < z:  # the least x of least f
        m = (a + z) // 2
        here = f(m)
        if here == math.inf or f(m + 1) < here:
            a = m + 1
        else:
            z = m
    if f(a) > limit:
        return range(0)
    first = a
    while first > 0 and f(first - 1) <= limit:
        first -= 1
    last = a
    while last < top and f(last + 1) <= limit:
        last += 1
    return range(first, last + 1)


def _solve_core(chain: _Chain, order: list[int], need: int, incumbent: float, effort: list[int]):
    """Exact least-seconds cover of ``need`` bytes by an expanding core (Pisinger's minknap, covering form).

    ``order`` is by seconds per byte; runs of identical modules (same d and t) form one block
    taken k at a time.  Start from the LP's integer part (the blocks before the break, all
    taken) and widen a core of free blocks around the break, one block per side in turn: a state
    may take some of the next block after the core, or give back some of the next one before it.
    A state is dropped when another has at least its bytes for at most its seconds, or when its
    LP bound (the cheapest bytes after the core still to add, or the dearest before it to give
    back) exceeds the incumbent; the bound is convex in k, so the k kept form an interval.
    ``effort[0]`` is the number of states it may still generate (shared by every cap); it
    stops early when that runs out.  Returns (seconds, chosen or None if nothing beat
    ``incumbent``, whether the search ran to the end).
    """
    d, t = chain.d, chain.t
    blocks: list[tuple[int, float, list[int]]] = []
    for i in order:
        if blocks and blocks[-1][0] == d[i] and blocks[-1][1] == t[i]:
            blocks[-1][2].append(i)
        else:
            blocks.append((d[i], t[i], [i]))
    n = len(blocks)
    bound = _Bound([bd * len(m) for bd, _, m in blocks], [bt * len(m) for _, bt, m in blocks])
    cum_d, cum_t, eff = bound.cum_d, bound.cum_t, bound.eff
    lp = bound.lp
    brk = bisect_left(cum_d, need) - 1  # blocks 0..brk-1 fall short, 0..brk cover
    if brk >= n:
        return incumbent, None, True
    best, best_node = incumbent, None
    limit = best + abs(best) * _SLACK
    states: list[tuple[int, float, tuple | None]] = [(cum_d[brk], cum_t[brk], None)]
    lo, hi = brk, brk  # the core is blocks lo..hi-1; blocks < lo are taken, >= hi are not
    grow_up = True
    complete = True
    while states and best > 0 and (lo > 0 or hi < n):
        if effort[0] < 0:
            complete = False
            break
        if (grow_up and hi < n) or lo == 0:
            k, hi, sign = hi, hi + 1, 1
        else:
            lo -= 1
            k, sign = lo, -1
        grow_up = not grow_up
        dk, tk, members = blocks[k]
        count = len(members)

        def lower(b: int, c: float) -> float:
            if b < need:
                return c + lp(hi, need - b)
            # give back the dearest bytes before the core, fractionally, down to the need
            target = cum_d[lo] - (b - need)
            if target <= 0:
                return c - cum_t[lo]
            q = bisect_left(cum_d, target, 0, lo + 1) - 1  # cum_d[q] < target <= cum_d[q+1]
            return c - (cum_t[lo] - cum_t[q + 1]) - (cum_d[q + 1] - target) * eff[q]

        grown = []
        if count == 1:  # the common case: keep the state, and/or flip the one module
            db, dc = sign * dk, sign * tk
            for b, c, node in states:
                if lower(b, c) <= limit:
                    grown.append((b, c, node))
                nb, nc = b + db, c + dc
                if lower(nb, nc) <= limit:
                    grown.append((nb, nc, (k, sign, node)))
                    if nb >= need and nc < best:
                        best, best_node = nc, (k, sign, node)
                        limit = best + abs(best) * _SLACK
            states = []  # (filtered below)
        for b, c, node in states:
            if sign > 0:  # take j of block k; +inf (nothing left to add) only for small j
                pick = _interval(lambda j: lower(b + j * dk, c + j * tk), count, limit)
            else:  # give back count - x of block k; +inf only for small x
                kept = _interval(lambda x: lower(b - (count - x) * dk, c - (count - x) * tk), count, limit)
                pick = range(count - kept.stop + 1, count - kept.start + 1) if kept else kept
            for j in pick:
                state = (b + sign * j * dk, c + sign * j * tk, (k, sign * j, node) if j else node)
                if state[0] >= need and state[1] < best:
                    best, best_node = state[1], state[2]
                    limit = best + abs(best) * _SLACK
                grown.append(state)
        effort[0] -= len(grown)
        # Pareto filter: more bytes for no more seconds wins (for equal bytes the cheaper one is
        # met first); the stable sort keeps it deterministic.
        grown.sort(key=lambda state: (state[0], -state[1]))
        states = []
        cheapest = math.inf
        for state in reversed(grown):
            if state[1] < cheapest:
                states.append(state)
                cheapest = state[1]
        states.reverse()
    if best_node is None:
        return incumbent, None, complete
    chosen = set(i for _, _, m in blocks[:brk] for i in m)
    node = best_node
    while node is not None:
        k, j, node = node
        members = blocks[k][2]
        chosen.update(members[:j]) if j > 0 else chosen.difference_update(members[len(members) + j :])
    return best, sorted(chosen), complete


def optimal(
    items: Sequence[Item],
    budget: ByteBudget,
    *,
    base_bytes: int = 0,
    max_states: int | None = DEFAULT_MAX_STATES,
) -> Choice:
    """The least recompute time whose estimated peak is within the budget (exact for the model).

    If no set is within the limit the status is ``INFEASIBLE``, ``minimum_peak`` is the smallest
    reachable estimate and the set is one that reaches it.  Ties in seconds are broken in a
    fixed way (deterministic), not by peak.

    ``max_states`` bounds the search (frontier states generated, over all caps; ``None``: no
    bound).  Profiles built from a handful of activation shapes, and random ones, need a few
    hundred thousand at 5,000 modules; chains whose recompute times are almost exactly
    proportional to the bytes they save, with every size distinct, are subset-sum problems and
    can need far more.  When the bound is reached the best set found so far is returned -- still
    within the budget -- with ``proven_optimal=False``.  The bound counts states, not seconds,
    so the result does not depend on the machine.

    Nested candidates (one inside another) are not a chain: they go to
    :func:`memoplan.planner.exact.exact` (a mixed-integer program, default time limit, greedy
    fallback), and ``max_states`` does not apply.
    """
    chain = _Chain(items, base_bytes, nested_ok=True)
    if chain.nested:
        from memoplan.planner.exact import exact  # exact imports this module

        return exact(items, budget, base_bytes=base_bytes)
    limit = _byte_limit(budget, chain.unplanned)
    settled, floor, _ = _settled(chain, "optimal", budget, limit)
    if settled is not None:
        return settled
    d, s, t = chain.d, chain.s, chain.t
    order = sorted((i for i in range(chain.n) if d[i] > 0), key=lambda i: (t[i] / d[i], -d[i], i))
    rank = {i: r for r, i in enumerate(order)}

    # LP bound and greedy cover of every cap, caps ascending, modules entering a Fenwick tree.
    fen = _Fenwick(len(order))
    caps = []  # (lp bound, cap, greedy seconds, greedy cut rank)
    by_cap = sorted(order, key=lambda i: (s[i], i))
    total = 0
    for k, i in enumerate(by_cap):
        fen.add(rank[i], d[i], t[i])
        total += d[i]
        if k + 1 < len(by_cap) and s[by_cap[k + 1]] == s[i]:
            continue
        cap = s[i]
        need = chain.unplanned + cap - limit
        if total < need:
            continue
        pos, got, sec = fen.below(need)
        nxt = order[pos]  # the module that completes the cover (it has entered: bytes rise there)
        caps.append((sec + (need - got) * t[nxt] / d[nxt], cap, sec + t[nxt], pos))
    caps.sort(key=lambda c: (c[0], c[1]))

    # The incumbent: the cheapest greedy cover.
    _, cap0, _, pos0 = min(caps, key=lambda c: (c[2], c[1]))
    best_set = [i for i in order[: pos0 + 1] if s[i] <= cap0]
    best = math.fsum(t[i] for i in best_set)
    effort = [math.inf if max_states is None else max_states]
    proven = True
    for bound, cap, _, _ in caps:
        if best <= 0 or bound > best + abs(best) * _SLACK:
            break
        eligible = [i for i in order if s[i] <= cap]
        best, found, proven = _solve_core(chain, eligible, chain.unplanned + cap - limit, best, effort)
        if found is not None:
            best_set = found
        if not proven:
            break
    return _choice(chain, "optimal", budget, best_set, limit, floor, proven=proven)


# ---------------------------------------------------------------- sublinear (Chen et al. + MegEngine)


@dataclass(frozen=True)
class GeneticReport:
    """How the genetic refinement compared with the best threshold."""

    thresholds: tuple[int, ...]  # the bottleneck thresholds tried, in bytes
    best_threshold: int
    threshold_checkpointed: tuple[int, ...]  # the best threshold candidate's set (chain indices)
    threshold: Estimate  # the best threshold candidate
    genetic: Estimate  # the best candidate after the generations (the chosen one)
    improved: bool  # the genetic search found a strictly better candidate
    seconds_saved: float  # threshold.seconds - genetic.seconds
    bytes_saved: int  # threshold.peak - genetic.peak
    generations: int
    evaluations: int  # candidates evaluated, thresholds included


@dataclass(frozen=True)
class SublinearResult:
    choice: Choice
    report: GeneticReport


def _score(columns, genome: bytes) -> tuple[int, float, int]:
    """Fitness key, smaller is better: (bytes over the limit, seconds, peak with the bottleneck floored)."""
    d, t, s, unplanned, lb, limit = columns[:6]
    if any(genome):
        peak = unplanned - sum(compress(d, genome)) + max(lb, max(compress(s, genome)))
    else:
        peak = unplanned
    return (max(0, peak - limit), math.fsum(compress(t, genome)), peak)


def _repair(columns, genome: bytes, grow: bool) -> bytes:
    """Local improvement of one candidate (so the genetic search is a memetic one).

    ``grow``: while over the limit, add modules, cheapest seconds per byte first, where that
    lowers the estimate.  Then, within the limit, drop checkpoints, dearest first, while it stays
    within.  With no budget the limit is 0, so only the first step runs: it lowers memory.
    """
    d, t, s, unplanned, lb, limit, best_first, worst_first = columns
    chosen = bytearray(genome)
    saved = sum(compress(d, chosen))
    sizes = sorted(compress(s, chosen))
    peak = unplanned - saved + max(lb, sizes[-1]) if sizes else unplanned
    if grow:
        for g in best_first:
            if peak <= limit:
                break
            if chosen[g]:
                continue
            new = unplanned - saved - d[g] + max(lb, s[g], sizes[-1] if sizes else 0)
            if new < peak:
                chosen[g] = 1
                saved += d[g]
                insort(sizes, s[g])
                peak = new
    if peak <= limit:
        for g in worst_first:
            if not chosen[g]:
                continue
            at = bisect_left(sizes, s[g])
            top = sizes[-1] if at < len(sizes) - 1 else (sizes[-2] if len(sizes) > 1 else None)
            new = unplanned if top is None else unplanned - saved + d[g] + max(lb, top)
            if new <= limit:
                chosen[g] = 0
                saved -= d[g]
                del sizes[at]
                peak = new
    return bytes(chosen)


def _evaluate(columns, genomes: Sequence[bytes], grow: bool) -> list[tuple[bytes, tuple[int, float, int]]]:
    """Repair and score a batch of candidates.

    A module-level function of plain data, so a process pool can run it; the result does not
    depend on which worker runs it.
    """
    out = []
    for genome in genomes:
        fixed = _repair(columns, genome, grow)
        out.append((fixed, _score(columns, fixed)))
    return out


class _Evaluator:
    """Evaluates batches of candidates, inline or split in order over an executor's workers."""

    def __init__(self, columns, workers: int, executor) -> None:
        self.columns = columns
        self.workers = workers
        self.executor = executor
        self.count = 0

    def __call__(self, genomes: list[bytes], grow: bool) -> list[tuple[bytes, tuple[int, float, int]]]:
        self.count += len(genomes)
        if self.executor is None or self.workers <= 1 or len(genomes) < 2:
            return _evaluate(self.columns, genomes, grow)
        size = -(-len(genomes) // self.workers)
        chunks = [genomes[k : k + size] for k in range(0, len(genomes), size)]
        futures = [self.executor.submit(_evaluate, self.columns, chunk, grow) for chunk in chunks]
        return [pair for future in futures for pair in future.result()]


def _thresholds(sizes: Sequence[int], tries: int, lb: int) -> list[int]:
    """``tries`` bottleneck thresholds spread by rank over the distinct sizes, none below ``lb``.

    A threshold between two sizes acts like the smaller one, so the distinct sizes (and ``lb``
    itself, which admits everything not above it) are all the thresholds there are.
    """
    levels = sorted({v for v in sizes if v > lb} | ({lb} if any(v <= lb for v in sizes) else set()))
    if len(levels) <= tries:
        return levels
    return sorted({levels[math.ceil((k + 1) * len(levels) / tries) - 1] for k in range(tries)})


def sublinear(
    items: Sequence[Item],
    budget: ByteBudget | None = None,
    config: SublinearConfig = SublinearConfig(),
    *,
    base_bytes: int = 0,
    seed: int = 0,
    executor: concurrent.futures.Executor | None = None,
) -> SublinearResult:
    """Chen et al.'s threshold search refined by a genetic algorithm (MegEngine semantics).

    With per-module regions a "segment" is one module and its recompute memory is its
    ``saved_bytes``, so Chen's memory threshold bounds the bottleneck: threshold b checkpoints
    every module with s <= b that saves bytes (d > 0); under a byte budget, checkpoints are then
    dropped, dearest seconds per byte first, while the estimate stays within it.
    ``thresh_nr_try`` thresholds are tried, spread over the distinct sizes, none below
    ``lb_memory``.  Fitness, lexicographic: bytes over the limit, recompute seconds, estimated
    peak; with no budget the limit is 0, so the search minimises memory first (MegEngine's
    objective).  The bottleneck is never counted below ``lb_memory`` -- memory reserved for
    recompute anyway -- so no candidate wins by making the bottleneck smaller than that.

    The genetic algorithm (``genetic_nr_iter`` generations, ``genetic_pool_size`` candidates)
    starts from the threshold candidates, breeds by tournament selection, two-point crossover
    along the chain and bit-flip mutation, repairs each child (:func:`_repair`) and keeps the
    best distinct candidates of parents and children (elitist), so it is never worse than the
    threshold search.  All randomness comes from ``random.Random(seed)`` in this process;
    candidates are evaluated on ``config.workers`` workers (a spawn process pool, or the given
    ``executor``) in fixed chunks, so the result does not depend on the number of workers.
    """
    chain = _Chain(items, base_bytes)
    limit = None if budget is None else _byte_limit(budget, chain.unplanned)
    lb = config.lb_memory
    genes = [i for i in range(chain.n) if chain.d[i] > 0]
    n = len(genes)
    gd = [chain.d[i] for i in genes]
    gs = [chain.s[i] for i in genes]
    gt = [chain.t[i] for i in genes]
    best_first = sorted(range(n), key=lambda g: (gt[g] / gd[g], -gd[g], g))
    columns = (gd, gt, gs, chain.unplanned, lb, 0 if limit is None else limit, best_first, best_first[::-1])

    thresholds = _thresholds(gs, config.thresh_nr_try, lb)
    seeds = [bytes(1 if gs[g] <= b else 0 for g in range(n)) for b in thresholds] or [bytes(n)]

    own_pool = None
    workers = config.workers
    if executor is None and workers > 1 and n and config.genetic_nr_iter:
        # spawn: safe whatever threads the caller (torch) started; the evaluation is plain data.
        own_pool = executor = concurrent.futures.ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn")
        )
    try:
        evaluate = _Evaluator(columns, workers, executor)
        scored: dict[bytes, tuple[int, float, int]] = {}
        firsts = []
        for genome, key in evaluate(seeds, False):
            scored.setdefault(genome, key)
            firsts.append(genome)
        best_index = min(range(len(firsts)), key=lambda k: (scored[firsts[k]], firsts[k]))
        threshold_best = firsts[best_index]
        rng = random.Random(seed)
        pool_size = config.genetic_pool_size
        generations = config.genetic_nr_iter if n else 0

        def rank(genomes) -> list[bytes]:
            return sorted(set(genomes), key=lambda g: (scored[g], g))[:pool_size]

        def mutate(genome: bytes) -> bytes:
            child = bytearray(genome)
            for g in rng.sample(range(n), min(n, rng.randint(1, 3))):
                child[g] ^= 1
            return bytes(child)

        population = rank(firsts)
        for _ in range(generations):
            children = []
            for _ in range(pool_size):
                a = min((population[rng.randrange(len(population))] for _ in range(3)), key=lambda g: (scored[g], g))
                b = min((population[rng.randrange(len(population))] for _ in range(3)), key=lambda g: (scored[g], g))
                if n > 1 and rng.random() < 0.9:
                    lo, hi = sorted(rng.sample(range(n + 1), 2))
                    a = a[:lo] + b[lo:hi] + a[hi:]
                children.append(mutate(a))
            repaired = []
            for genome, key in evaluate(children, True):
                scored.setdefault(genome, key)
                repaired.append(genome)
            population = rank(population + repaired)
        evaluations = evaluate.count
    finally:
        if own_pool is not None:
            own_pool.shutdown()

    winner = population[0]
    chosen = [genes[g] for g in range(n) if winner[g]]
    threshold_set = [genes[g] for g in range(n) if threshold_best[g]]
    choice = _choice(chain, "sublinear", budget, chosen, limit)
    before = Estimate(chain.peak(threshold_set), chain.seconds(threshold_set))
    after = Estimate(choice.estimated_peak, choice.recompute_seconds)
    report = GeneticReport(
        thresholds=tuple(thresholds),
        best_threshold=thresholds[best_index] if thresholds else lb,
        threshold_checkpointed=tuple(threshold_set),
        threshold=before,
        genetic=after,
        improved=scored[winner] < scored[threshold_best],
        seconds_saved=before.seconds - after.seconds,
        bytes_saved=before.peak - after.peak,
        generations=generations,
        evaluations=evaluations,
    )
    return SublinearResult(choice, report)


# ---------------------------------------------------------------- to a plan


def _comment(text: str) -> str:
    """One comment line: whitespace runs become one space, control characters are escaped."""
    text = " ".join(str(text).split())
    out = []
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cs"):
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return ("# " + "".join(out)).rstrip()


def describe(choice: Choice) -> dict[str, str]:
    """Provenance entries a planner knows: planner, budget, estimated peak before/after, recompute."""
    entries = {"planner": choice.planner}
    if choice.budget is not None:
        entries["budget"] = choice.budget.describe(choice.unplanned_peak)
    entries["estimated peak before"] = f"{_size(choice.unplanned_peak)} ({choice.unplanned_peak} B)"
    entries["estimated peak after"] = f"{_size(choice.estimated_peak)} ({choice.estimated_peak} B)"
    entries["recompute"] = recompute_line(
        choice.recompute_seconds, len(choice.checkpointed), "(proven least)" if choice.proven_optimal and choice.ok else ""
    )
    if choice.status is not Status.OK:
        entries["status"] = f"{choice.status.value}: smallest reachable estimate {_size(choice.minimum_peak)}"
    if choice.reason:
        entries["note"] = choice.reason
    return entries


def recompute_line(seconds: float, modules: int, note: str = "") -> str:
    """The header's ``recompute`` value: ``14.5 ms over 3 modules`` and an optional note."""
    line = f"{_duration(seconds)} over {modules} module{'s' if modules != 1 else ''}"
    return f"{line} {note}" if note else line


def _reason(item: Item) -> str:
    saving = item.saving
    verb = f"saves {_size(saving)}" if saving >= 0 else f"costs {_size(-saving)}"
    kept = f"{_size(item.saved_bytes)} saved -> {_size(item.input_bytes)} input"
    return f"{verb} ({kept}) for {_duration(item.forward_seconds)} of recompute"


def to_plan(
    choice: Choice,
    items: Sequence[Item],
    *,
    header: Mapping[str, str],
    allow_over_budget: bool = False,
) -> ast.Plan:
    """An ordinary plan: one ``module <path> { checkpoint }`` rule per chosen module, in chain order.

    Each rule carries a comment saying why it was chosen; ``header`` (tool and torch versions,
    device, input shapes, budget, planner, estimated peaks -- see :func:`describe`) becomes the
    plan's leading comments, ``# key: value``, in the mapping's order.  A choice whose status is
    not OK raises :class:`BudgetError` unless ``allow_over_budget``.
    """
    if choice.status is not Status.OK and not allow_over_budget:
        raise BudgetError(choice)
    by_name = {item.name: item for item in items}
    rules = []
    for name in choice.names:
        item = by_name.get(name)
        if item is None:
            raise ValueError(f"the choice names `{name}`, which is not in the chain")
        path = ast.PathPattern(tuple(ast.Name(part) for part in name.split(".")))
        rules.append(
            ast.ModuleRule(
                selector=ast.Selector(ast.SelectorTerm(path=path)),
                policies=(ast.Checkpoint(),),
                comments=ast.Comments(leading=(_comment(_reason(item)),)),
            )
        )
    lines = tuple(_comment(f"{key}: {value}") for key, value in header.items())
    return ast.Plan(version=1, statements=tuple(rules), header_comments=ast.Comments(leading=lines))
