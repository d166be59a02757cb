"""The optimal chain planner: per transient cap a covering knapsack, LP bounds from a Fenwick tree.

See "The planners" in :mod:`memoplan.planner.search`; nested candidates go to
:func:`memoplan.planner.search.exact.exact`.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Sequence

from memoplan.planner.budgets import ByteBudget, byte_limit
from memoplan.planner.search.chain import Chain, Item
from memoplan.planner.search.choice import Choice, make_choice, settled_choice
from memoplan.planner.search.exact import exact
from memoplan.planner.search.forest import forest_search

__all__ = ["DEFAULT_MAX_STATES", "optimal"]

# The optimal planner's default search bound, in frontier states (see ``optimal``).
DEFAULT_MAX_STATES = 2_000_000

# Relative slack of every pruning test: a state is dropped only when its lower bound exceeds
# the incumbent by more than this, so float rounding in the bounds never loses the optimum.
_SLACK = 1e-9


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


def _blocks(chain: Chain, order: list[int]) -> list[tuple[int, float, list[int]]]:
    """Runs of identical modules (same bytes and seconds) in ``order``, as (d, t, members)."""
    d, t = chain.d, chain.t
    blocks: list[tuple[int, float, list[int]]] = []
    for i in order:
        if blocks and blocks[-1][0] == d[i] and blocks[-1][1] == t[i]:
            blocks[-1][2].append(i)
        else:
            blocks.append((d[i], t[i], [i]))
    return blocks


def _lower_bound(bound: _Bound, need: int, lo: int, hi: int) -> Callable[[int, float], float]:
    """The LP bound of a state (bytes, seconds) while the core is blocks ``lo..hi-1``."""
    cum_d, cum_t, eff, lp = bound.cum_d, bound.cum_t, bound.eff, bound.lp

    def lower(b: int, c: float) -> float:
        if b < need:
            return c + lp(hi, need - b)
        # give back the dearest bytes before the core, fractionally, down to the need
        target = cum_d[lo] - (b - need)
        if target <= 0:
            return c - cum_t[lo]
        q = bisect_left(cum_d, target, 0, lo + 1) - 1  # cum_d[q] < target <= cum_d[q+1]
        return c - (cum_t[lo] - cum_t[q + 1]) - (cum_d[q + 1] - target) * eff[q]

    return lower


# The best cover so far: (seconds, its node, the pruning limit).
_Best = tuple[float, "tuple | None", float]
_State = tuple[int, float, "tuple | None"]


def _grow_single(states: list[_State], lower, k: int, sign: int, dk: int, tk: float, need: int, best: _Best):
    """States after flipping block ``k`` of one module (the common case), or keeping it."""
    seconds, best_node, limit = best
    db, dc = sign * dk, sign * tk
    grown = []
    for b, c, node in states:
        if lower(b, c) <= limit:
            grown.append((b, c, node))
        nb, nc = b + db, c + dc
        if lower(nb, nc) <= limit:
            grown.append((nb, nc, (k, sign, node)))
            if nb >= need and nc < seconds:
                seconds, best_node = nc, (k, sign, node)
                limit = seconds + abs(seconds) * _SLACK
    return grown, (seconds, best_node, limit)


def _grow_block(states: list[_State], lower, k: int, sign: int, block: tuple, need: int, best: _Best):
    """States after taking (``sign`` > 0) or giving back some of block ``k``'s modules."""
    seconds, best_node, limit = best
    dk, tk, members = block
    count = len(members)
    grown = []
    for b, c, node in states:
        if sign > 0:  # take j of block k; +inf (nothing left to add) only for small j
            pick = _interval(lambda j, b=b, c=c: lower(b + j * dk, c + j * tk), count, limit)
        else:  # give back count - x of block k; +inf only for small x
            kept = _interval(lambda x, b=b, c=c: lower(b - (count - x) * dk, c - (count - x) * tk), count, limit)
            pick = range(count - kept.stop + 1, count - kept.start + 1) if kept else kept
        for j in pick:
            state = (b + sign * j * dk, c + sign * j * tk, (k, sign * j, node) if j else node)
            if state[0] >= need and state[1] < seconds:
                seconds, best_node = state[1], state[2]
                limit = seconds + abs(seconds) * _SLACK
            grown.append(state)
    return grown, (seconds, best_node, limit)


def _pareto(grown: list[_State]) -> list[_State]:
    """More bytes for no more seconds wins (for equal bytes the cheaper one is met first); the
    stable sort keeps it deterministic."""
    grown.sort(key=lambda state: (state[0], -state[1]))
    states = []
    cheapest = math.inf
    for state in reversed(grown):
        if state[1] < cheapest:
            states.append(state)
            cheapest = state[1]
    states.reverse()
    return states


def _chosen(blocks: list[tuple[int, float, list[int]]], brk: int, node: tuple | None) -> list[int]:
    """The modules of the cover: every block before the break, edited by the nodes' moves."""
    chosen = set(i for _, _, m in blocks[:brk] for i in m)
    while node is not None:
        k, j, node = node
        members = blocks[k][2]
        chosen.update(members[:j]) if j > 0 else chosen.difference_update(members[len(members) + j :])
    return sorted(chosen)


def _solve_core(chain: Chain, order: list[int], need: int, incumbent: float, effort: list[float]):
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
    blocks = _blocks(chain, order)
    n = len(blocks)
    bound = _Bound([bd * len(m) for bd, _, m in blocks], [bt * len(m) for _, bt, m in blocks])
    cum_d, cum_t = bound.cum_d, bound.cum_t
    brk = bisect_left(cum_d, need) - 1  # blocks 0..brk-1 fall short, 0..brk cover
    if brk >= n:
        return incumbent, None, True
    best: _Best = (incumbent, None, incumbent + abs(incumbent) * _SLACK)
    states: list[_State] = [(cum_d[brk], cum_t[brk], None)]
    lo, hi = brk, brk  # the core is blocks lo..hi-1; blocks < lo are taken, >= hi are not
    grow_up = True
    complete = True
    while states and best[0] > 0 and (lo > 0 or hi < n):
        if effort[0] < 0:
            complete = False
            break
        if (grow_up and hi < n) or lo == 0:
            k, hi, sign = hi, hi + 1, 1
        else:
            lo -= 1
            k, sign = lo, -1
        grow_up = not grow_up
        lower = _lower_bound(bound, need, lo, hi)
        dk, tk, members = blocks[k]
        if len(members) == 1:
            grown, best = _grow_single(states, lower, k, sign, dk, tk, need, best)
        else:
            grown, best = _grow_block(states, lower, k, sign, blocks[k], need, best)
        effort[0] -= len(grown)
        states = _pareto(grown)
    if best[1] is None:
        return incumbent, None, complete
    return best[0], _chosen(blocks, brk, best[1]), complete


def _nested(chain: Chain, items: Sequence[Item], budget: ByteBudget, base_bytes: int) -> Choice:
    """The exact answer for nested candidates: by their trees, else by the mixed-integer program."""
    limit = byte_limit(budget, chain.unplanned)
    settled, floor, _ = settled_choice(chain, "exact", budget, limit)
    if settled is not None:
        return settled
    chosen = forest_search(chain, limit)
    if chosen is None:  # too large for the frontiers (a set within the limit exists: settled said so)
        return exact(items, budget, base_bytes=base_bytes)
    return make_choice(chain, "exact", budget, chosen, limit, floor, proven=True)


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
    :func:`memoplan.planner.search.forest.forest_search` (the trees' frontiers, exact), or where its
    frontiers grow too large to :func:`memoplan.planner.search.exact.exact` (a mixed-integer program,
    default time limit, greedy fallback); ``max_states`` does not apply.
    """
    chain = Chain(items, base_bytes, nested_ok=True)
    if chain.nested:
        return _nested(chain, items, budget, base_bytes)
    limit = byte_limit(budget, chain.unplanned)
    settled, floor, _ = settled_choice(chain, "optimal", budget, limit)
    if settled is not None:
        return settled
    d, s, t = chain.d, chain.r, chain.t  # caps on the transient
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
    return make_choice(chain, "optimal", budget, best_set, limit, floor, proven=proven)
