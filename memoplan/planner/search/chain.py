"""The planner's cost model: candidate items, the validated chain (or forest), estimates, least peak.

See :mod:`memoplan.planner.search` for the cost model and the nested candidates.  Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Chain", "Estimate", "Item", "estimate", "least_peak", "minimum_peak", "unplanned_base"]


# ---------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Item:
    """One candidate module of the chain (see :mod:`memoplan.planner.search` for the cost model).

    A *variant* (``save`` not empty) is the same module checkpointed with ``save = [...]``: it
    frees the same ``saved_bytes``, keeps its input and the saved ops' outputs (``input_bytes``),
    recomputes the rest (``forward_seconds``), and its recompute brings back only
    ``transient_bytes`` (what the kept outputs do not already hold).  A chain holding a variant
    holds the module's plain item too.

    ``region_seconds`` is the fixed time its checkpoint region costs beyond the recompute (the
    region's call, its saved-tensor hooks, the replay's setup: :mod:`memoplan.planner.profiling.regioncost`);
    the search charges ``forward_seconds + region_seconds`` for checkpointing it.
    """

    name: str  # its path in ``model.named_modules()``
    saved_bytes: int  # kept for backward when not checkpointed
    input_bytes: int  # kept when checkpointed (the region's input)
    forward_seconds: float  # recompute cost
    transient_bytes: int | None = None  # live again while backward recomputes it; None: saved_bytes
    save: tuple[str, ...] = ()  # the op families a variant keeps (``checkpoint save = [...]``)
    region_seconds: float = 0.0  # the fixed cost of its checkpoint region, beyond the recompute

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "" in self.name.split("."):
            raise ValueError(f"an item needs a module path like `layers.0.attn`, got {self.name!r}")
        for field_name in ("saved_bytes", "input_bytes", "transient_bytes"):
            value = getattr(self, field_name)
            if value is None and field_name == "transient_bytes":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{self.name}: {field_name} must be an integer >= 0, got {value!r}")
        if not isinstance(self.save, tuple) or not all(isinstance(f, str) and f for f in self.save):
            raise ValueError(f"{self.name}: save must be a tuple of op family names, got {self.save!r}")
        for field_name in ("forward_seconds", "region_seconds"):
            t = getattr(self, field_name)
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
                raise ValueError(f"{self.name}: {field_name} must be a finite number >= 0, got {t!r}")

    @property
    def transient(self) -> int:
        """What recomputing it brings back: ``transient_bytes``, else ``saved_bytes``."""
        return self.saved_bytes if self.transient_bytes is None else self.transient_bytes

    @property
    def saving(self) -> int:
        """Bytes that checkpointing this module saves before the transient: s - x."""
        return self.saved_bytes - self.input_bytes


class Chain:
    """A validated chain (or forest of nested candidates) with its columns, as the planners read it.

    ``parent[i]`` is the index of the innermost other candidate that contains candidate i (by
    module path), or -1; ``nested`` says whether any candidate has one.  Disjoint candidates
    are the chain case, and every planner reads them; nested ones are refused unless
    ``nested_ok`` (see "Nested candidates" in :mod:`memoplan.planner.search`).
    """

    def __init__(self, items: Sequence[Item], base_bytes: int, *, nested_ok: bool = False) -> None:
        items = tuple(items)
        if isinstance(base_bytes, bool) or not isinstance(base_bytes, int) or base_bytes < 0:
            raise ValueError(f"base_bytes must be an integer >= 0, got {base_bytes!r}")
        index: dict[str, int] = {}
        seen: set[tuple[str, tuple[str, ...]]] = set()
        for i, item in enumerate(items):
            if not isinstance(item, Item):
                raise TypeError(f"expected Item, got {type(item).__name__}")
            if (item.name, item.save) in seen:
                raise ValueError(f"module `{item.name}` appears twice in the chain")
            seen.add((item.name, item.save))
            if not item.save:
                index[item.name] = i
        self.parent = _parents(items, index)
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
        self.r = [i.transient for i in items]  # the transient of each (saved_bytes but for variants)
        # What checkpointing each costs: its recompute, and its region's fixed cost (0 unless measured).
        self.t = [float(i.forward_seconds) + float(i.region_seconds) for i in items]
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
        return self.unplanned - sum(self.d[i] for i in chosen) + max(self.r[i] for i in chosen)

    def seconds(self, chosen: Sequence[int]) -> float:
        return math.fsum(self.t[i] for i in chosen)


def _parents(items: Sequence[Item], plain: Mapping[str, int]) -> list[int]:
    """Each candidate's innermost container among the candidates (-1: none).

    A module's variants and its plain checkpoint exclude one another, and every part inside it:
    they are stacked as a path above it (first variant outermost, the plain item innermost), so
    "at most one candidate on any root-to-leaf path" holds for them as for nested modules.
    """
    parent = [_innermost_outer(item.name, plain) for item in items]
    stacks: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        if item.save:
            stacks.setdefault(item.name, []).append(i)
    for path, variants in stacks.items():
        if path not in plain:
            raise ValueError(f"the save variant of `{path}` needs its plain candidate in the chain too")
        for above, below in zip(variants, [*variants[1:], plain[path]]):
            parent[below] = above
        parent[variants[0]] = _innermost_outer(path, plain)
    return parent


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
    seconds: float  # recompute time, with each region's fixed cost (``Item.region_seconds``)


def estimate(items: Sequence[Item], checkpointed: Sequence[int], *, base_bytes: int = 0) -> Estimate:
    """The cost model for one set of checkpointed items (indices into ``items``).

    Items may nest; a set holding a candidate and one that contains it is refused (``ValueError``).
    """
    chain = Chain(items, base_bytes, nested_ok=True)
    chosen = sorted(set(checkpointed))
    if chosen and not (0 <= chosen[0] and chosen[-1] < chain.n):
        raise IndexError("checkpointed index out of range")
    pair = chain.clash(chosen)
    if pair is not None:
        inner, outer = (chain.items[k].name for k in pair)
        raise ValueError(f"`{inner}` and `{outer}` are both checkpointed, but one is inside the other")
    return Estimate(chain.peak(chosen), chain.seconds(chosen))


# ---------------------------------------------------------------- exact minimum peak


def least_peak(chain: Chain) -> tuple[int, tuple[int, ...]]:
    """The least estimated peak over all sets, and the set that reaches it (cap enumeration)."""
    if chain.nested:
        return _minimum_nested(chain)
    r = chain.r
    useful = sorted((i for i in range(chain.n) if chain.d[i] > 0), key=lambda i: (r[i], i))
    best_peak, best_cut = chain.unplanned, 0
    saved = 0
    for k, i in enumerate(useful):
        saved += chain.d[i]
        last = k + 1 == len(useful) or r[useful[k + 1]] != r[i]
        if last:  # every useful module with r <= r_i, transient r_i
            peak = chain.unplanned - saved + r[i]
            if peak < best_peak:
                best_peak, best_cut = peak, k + 1
    return best_peak, tuple(sorted(useful[:best_cut]))


def _minimum_nested(chain: Chain) -> tuple[int, tuple[int, ...]]:
    """:func:`least_peak` for nested candidates: for each cap m, the legal set of most savings.

    For a cap m, the candidates with s <= m that save bytes are *eligible*, and the most a
    legal set of them saves is a tree recurrence: ``best(i) = max(d_i if eligible, sum of
    best(c) over i's children)``.  Caps are taken in rising order; when a candidate becomes
    eligible only its ancestors' values change, so each cap costs the depth of the tree.  The
    set of the best cap is rebuilt top-down at the end.
    """
    s, d, parent = chain.r, chain.d, chain.parent  # caps on the transient
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


def _most_savings(chain: Chain, eligible: Sequence[bool]) -> tuple[int, ...]:
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


def _depth(chain: Chain, i: int) -> int:
    return sum(1 for _ in chain.ancestors(i))


def unplanned_base(peak_bytes: int, items: Sequence[Item]) -> int:
    """B0 for a measured unplanned peak: what it holds beyond the candidates' saved bytes.

    Only the outermost candidates count: a nested candidate's bytes are inside its parent's,
    so with nested candidates the unplanned estimate stays ``peak_bytes`` (or more, when the
    candidates' own bytes exceed it, and B0 is then 0).
    """
    chain = Chain(items, 0, nested_ok=True)
    return max(0, peak_bytes - chain.unplanned)


def minimum_peak(items: Sequence[Item], *, base_bytes: int = 0) -> tuple[int, tuple[int, ...]]:
    """The smallest estimated peak any set of checkpoints reaches, and one set that reaches it.

    For a transient cap m the best set holds every module with s <= m that saves bytes
    (d > 0); the least of those estimates over the distinct m, and the empty set, is exact.
    For nested candidates the best set for a cap is the legal one of most savings (a tree
    recurrence, see :func:`_minimum_nested`).
    """
    return least_peak(Chain(items, base_bytes, nested_ok=True))
