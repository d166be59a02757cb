"""Planner stage: a set of checkpoints' peak predicted from the unplanned step's live bytes between
module boundaries (:class:`memoplan.planner.profiling.held.Held`, which says why it holds).

Each chosen candidate holds off what it saves beyond what it keeps (its ``saving``: the bytes
checkpointing it frees) over its window of stretches; the predicted peak is the largest stretch
peak less what the chosen candidates hold off in it (:func:`held_peak`).  The least recompute
within a predicted limit (:func:`held_optimal`) is found in pure Python where the windows nest,
else by a mixed-integer program (scipy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from memoplan.planner.search.chain import Chain, Item
from memoplan.planner.search.choice import Choice, make_choice
from memoplan.planner.search.exact import DEFAULT_TIME_LIMIT, EXACT_IN_FLOAT, path_rows, solve_binary, solved_set
from memoplan.planner.search.forest import Option, frontier


def held_peak(
    peaks: Sequence[int],
    windows: Mapping[str, tuple[int, int, int]],
    items: Sequence[Item],
    chosen: Sequence[int],
    *,
    kept: bool = True,
) -> int | None:
    """The predicted peak of checkpointing ``chosen`` (indices into ``items``); None when a chosen
    candidate has no window (called more than once, say), or nothing was recorded.

    With ``kept``, a save variant also holds, through its backward, the outputs it keeps that
    autograd would not have saved (:func:`kept_unsaved`); the fast search leaves that out, and
    :func:`memoplan.planner.search.calibrate._predicted` checks its set with it."""
    if not peaks:
        return None
    change = [0] * (len(peaks) + 1)  # what the chosen hold off, as differences between stretches
    extra = kept_unsaved(items) if kept else {}
    for i in chosen:
        item = items[i]
        window = windows.get(item.name)
        if window is None:
            return None
        first, last, done = window
        change[first] += item.saving
        change[last] -= item.saving
        change[last] -= extra.get(i, 0)
        change[done] += extra.get(i, 0)
    off = 0
    peak = 0
    for k, bytes_ in enumerate(peaks):
        off += change[k]
        peak = max(peak, bytes_ - off)
    return peak


def kept_unsaved(items: Sequence[Item]) -> dict[int, int]:
    """Per save variant (by index): the bytes it keeps that autograd does not save, alive until
    its region's backward ends: what it keeps beyond the plain checkpoint's input, less the part
    autograd saves anyway (its ``saved_bytes`` less its ``transient``)."""
    plain = {item.name: item.input_bytes for item in items if not item.save}
    return {
        i: max(0, item.input_bytes - plain[item.name] - (item.saved_bytes - item.transient))
        for i, item in enumerate(items)
        if item.save and item.name in plain
    }


def held_optimal(
    items: Sequence[Item],
    peaks: Sequence[int],
    windows: Mapping[str, tuple[int, int, int]],
    limit: int,
    budget,
    *,
    base_bytes: int,
    floor: int,
    kept: bool = False,
    time_limit: float = DEFAULT_TIME_LIMIT,
) -> Choice | None:
    """The least recompute time whose predicted peak (:func:`held_peak`) is within ``limit``,
    over the candidates that have windows; None when no such set exists or the solver proves none.

    Without ``kept``, what a save variant keeps through its own backward is left out: then every
    stretch asks only that the chosen candidates holding off in it hold off its excess, and where
    the windows nest (a chain) that is solved by :func:`_nested`, in pure Python.  With ``kept``
    it is counted, as :func:`held_peak` counts it, by a mixed-integer program beside
    :func:`memoplan.planner.search.exact.exact`'s (one binary per candidate that saves bytes, at
    most one on each root-to-leaf path, a row per stretch that can go over the limit), which the
    windows that do not nest need too.  The choice's ``estimated_peak`` stays the cost model's
    (the header's "cost model" lines); its note gives the predicted peak; ``floor`` is its
    ``minimum_peak`` (the cost model's)."""
    if not peaks:
        return None
    chain = Chain(items, base_bytes, nested_ok=True)
    useful = [i for i in range(chain.n) if chain.d[i] > 0 and items[i].name in windows]
    members = set(useful)
    extra = {i: e for i, e in kept_unsaved(items).items() if i in members and e > 0} if kept else {}
    rows: dict[tuple[tuple[int, int], ...], int] = {}  # (candidate, bytes it lowers) per stretch -> its excess
    for k, bytes_ in enumerate(peaks):
        lowers = [(i, chain.d[i]) for i in useful if windows[items[i].name][0] <= k < windows[items[i].name][1]]
        raises = [(i, -e) for i, e in extra.items() if windows[items[i].name][1] <= k < windows[items[i].name][2]]
        if bytes_ - sum(e for _, e in raises) <= limit:
            continue  # within the limit whatever is chosen
        if bytes_ > limit and not lowers:
            return None  # nothing checkpointed can lower this stretch
        key = tuple(sorted(lowers + raises))
        rows[key] = max(rows.get(key, bytes_ - limit), bytes_ - limit)
    chosen: tuple[int, ...] | None = ()
    proven = True
    if rows and not extra:
        needs = {frozenset(i for i, _ in key): need for key, need in rows.items()}
        nested = _nested(chain, useful, windows, needs)
        if nested is not _UNNESTED:
            if nested is None:
                return None  # proven: no set of these candidates meets every stretch
            assert isinstance(nested, tuple)
            chosen = nested
        else:
            chosen, proven = _programmed(chain, useful, rows, peaks, windows, limit, kept, time_limit)
    elif rows:
        chosen, proven = _programmed(chain, useful, rows, peaks, windows, limit, kept, time_limit)
    if chosen is None:
        return None
    return _choice(chain, peaks, windows, chosen, limit, budget, floor, proven)


def _programmed(
    chain: Chain, useful: Sequence[int], rows, peaks, windows, limit: int, kept: bool, time_limit: float
) -> tuple[tuple[int, ...] | None, bool]:
    """:func:`held_optimal`'s program for ``rows`` ((candidate, bytes) per stretch -> excess):
    the set, and whether it is proven least; (None, False) where the program found none or is
    unavailable (scipy not installed, byte counts past exact floating point)."""
    if max(peaks) > EXACT_IN_FLOAT:
        return None, False
    column = {i: k for k, i in enumerate(useful)}
    # A row of savings only, whose candidates include another such row's and whose excess is no
    # larger, is met whenever that one is: only the others go to the solver, in units of the
    # byte counts' greatest common divisor (exact for integers).
    plain = {frozenset(i for i, _ in key): need for key, need in rows.items() if all(b > 0 for _, b in key)}
    kept_rows = [
        (key, need)
        for key, need in rows.items()
        if not (
            all(b > 0 for _, b in key)
            and any(other < frozenset(i for i, _ in key) and more >= need for other, more in plain.items())
        )
    ]
    unit = math.gcd(*(abs(b) for key, _ in kept_rows for _, b in key)) or 1
    program: list[tuple[dict[int, int], float, float]] = [
        ({column[i]: b // unit for i, b in key}, -(-need // unit), math.inf) for key, need in kept_rows
    ]
    program.extend(path_rows(chain, useful, column))
    try:
        result = solve_binary(program, [chain.t[i] for i in useful], time_limit)
    except ImportError:
        return None, False

    def fits(chosen: Sequence[int]) -> bool:
        peak = held_peak(peaks, windows, chain.items, chosen, kept=kept)
        return peak is not None and peak <= limit

    solved = solved_set(result, useful, column, fits, chain, time_limit)
    return solved.chosen, solved.proven


def _choice(chain: Chain, peaks, windows, chosen: Sequence[int], limit: int, budget, floor: int, proven: bool):
    """``chosen`` as a :class:`Choice` whose note gives its predicted peak."""
    predicted = held_peak(peaks, windows, chain.items, chosen)
    note = (
        f"chosen by the step's live bytes between module boundaries, which predict a peak of {predicted} B "
        "(the cost model's sum counts bytes not live at the planned peak)"
    )
    found = make_choice(chain, "exact", budget, chosen, None, floor, proven=proven, reason=note)
    return replace(found, limit=limit)


#: States the search over nested windows keeps before it leaves the question to the program.
MAX_STATES = 50_000

#: What :func:`_nested` answers where it cannot: the windows do not nest, or the states grew too many.
_UNNESTED = object()


def _nested(
    chain: Chain,
    useful: Sequence[int],
    windows: Mapping[str, tuple[int, int, int]],
    needs: Mapping[frozenset[int], int],
) -> tuple[int, ...] | None | object:
    """The least-recompute set by a search over the candidates in window order, where every
    window lies inside the one before it (a chain's modules: each later module's forward ends
    later and its backward starts earlier); ``_UNNESTED`` where they do not, or the states grow
    past ``MAX_STATES``; None when no set meets every stretch.

    With nested windows the candidates holding off in a stretch are the first ``p`` in that order,
    so each stretch asks that the first ``p`` candidates' savings together reach its excess.  The
    search takes the candidates one by one, keeping per set of candidates the choices so far
    exclude (the relatives of what is chosen: a module and its parts, its save variants) the
    Pareto frontier of (savings, seconds), the savings counted up to the largest excess still ahead.
    """
    items = chain.items
    order = sorted(useful, key=lambda i: (windows[items[i].name][0], -windows[items[i].name][1], i))
    spans = [windows[items[i].name] for i in order]
    if any(not (a[0] <= b[0] and b[1] <= a[1]) for a, b in zip(spans, spans[1:])):
        return _UNNESTED
    position = {i: p for p, i in enumerate(order)}
    needed = [0] * (len(order) + 1)  # needed[p]: what the first p candidates must save together
    for cover, need in needs.items():
        p = max((position[i] + 1 for i in cover), default=0)
        if p == 0:
            return None
        needed[p] = max(needed[p], need)
    ahead = list(needed)
    for p in range(len(order) - 1, -1, -1):
        ahead[p] = max(ahead[p], ahead[p + 1])
    related = [
        frozenset(q for q in range(p + 1, len(order)) if _related(chain, i, order[q])) for p, i in enumerate(order)
    ]
    states: dict[frozenset[int], list[Option]] = {frozenset(): [(0, 0.0, ())]}
    for p, i in enumerate(order):
        grown: dict[frozenset[int], list[Option]] = {}
        cap = ahead[p + 1]
        for blocked, options in states.items():
            rest = blocked - {p}
            for saved, seconds, chosen in options:
                grown.setdefault(rest, []).append((min(saved, cap), seconds, chosen))
                if p not in blocked:
                    taken = (min(saved + chain.d[i], cap), seconds + chain.t[i], (*chosen, i))
                    grown.setdefault(rest | related[p], []).append(taken)
        states = {}
        for blocked, options in grown.items():
            kept = frontier([state for state in options if state[0] >= needed[p + 1]])
            if kept:
                states[blocked] = kept
        if not states:
            return None
        if sum(len(o) for o in states.values()) > MAX_STATES:
            return _UNNESTED
    best = min((state for options in states.values() for state in options), key=lambda s: (s[1], len(s[2])))
    return tuple(sorted(best[2]))


def _related(chain: Chain, a: int, b: int) -> bool:
    """One of the two candidates contains the other (or they are one module's save variants)."""
    return a in chain.ancestors(b) or b in chain.ancestors(a)


@dataclass(frozen=True)
class Predictor:
    """The prediction over one set of candidates: a choice's predicted peak, and the search of
    the least recompute within a predicted limit."""

    items: Sequence[Item]
    peaks: Sequence[int]
    windows: Mapping[str, tuple[int, int, int]]
    base_bytes: int

    def peak(self, choice: Choice) -> int | None:
        return held_peak(self.peaks, self.windows, self.items, choice.checkpointed)

    def search(self, limit: int, budget, floor: int, *, kept: bool = False) -> Choice | None:
        return held_optimal(
            self.items, self.peaks, self.windows, limit, budget, base_bytes=self.base_bytes, floor=floor, kept=kept
        )
