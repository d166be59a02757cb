"""Memonger stage: assign every buffer an offset in one arena, and check an assignment.

Pure functions of live ranges.  Two buffers whose live ranges overlap must not share
a byte; any others may.  Offsets and sizes are rounded up to ``alignment`` bytes, so
a view of any dtype starts on a boundary its kernels accept.

* ``greedy`` (Caffe2's largest-first): buffers from the largest down, each into the
  best free gap left by the buffers already placed that live at the same time: the
  smallest gap it fits in (lowest offset on ties), else on top of them.
* ``dp``: an exact search for the smallest arena.  Every optimal assignment can be
  rebuilt by taking its buffers in the order of their offsets and dropping each one to
  the lowest offset where it fits, so the search walks placement orders, placing each
  buffer at its lowest fit, remembers the placements it has seen, cuts any branch that
  is no better than the best found, and stops at the lower bound.  It starts from the
  greedy answer and is bounded by ``max_steps`` placements tried (a count, not a clock, so the
  same graph gives the same arena on every machine); when the bound is hit it returns
  the best found, at worst greedy's, with ``optimal=False``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from memoplan.memonger.ranges import LiveRange, interference

ALGOS = ("greedy", "dp")
ALIGNMENT = 64
DP_MAX_STEPS = 20_000


@dataclass(frozen=True)
class Assignment:
    """Where each buffer lives: ``offsets[i]`` for ``ranges[i]``; ``size``: the arena's bytes."""

    offsets: tuple[int, ...]
    size: int
    algo: str
    optimal: bool  # proven optimal (dp reached the lower bound or finished its search)
    steps: int = 0  # placements the dp search tried


def aligned(n: int, alignment: int = ALIGNMENT) -> int:
    return -(-n // alignment) * alignment


def lower_bound(ranges: Sequence[LiveRange], alignment: int = ALIGNMENT) -> int:
    """The most aligned bytes live at one position: no assignment can be smaller."""
    events: dict[int, int] = {}
    for r in ranges:
        events[r.start] = events.get(r.start, 0) + aligned(r.size, alignment)
        events[r.end + 1] = events.get(r.end + 1, 0) - aligned(r.size, alignment)
    best = live = 0
    for position in sorted(events):
        live += events[position]
        best = max(best, live)
    return best


def conflicts_of(ranges: Sequence[LiveRange]) -> list[list[int]]:
    """For each buffer, the buffers whose live ranges overlap its own."""
    found: list[list[int]] = [[] for _ in ranges]
    for i, j in interference(ranges):
        found[i].append(j)
        found[j].append(i)
    return found


def assign(
    ranges: Sequence[LiveRange], algo: str = "greedy", *, alignment: int = ALIGNMENT, max_steps: int = DP_MAX_STEPS
) -> Assignment:
    if algo == "greedy":
        return assign_greedy(ranges, alignment=alignment)
    if algo == "dp":
        return assign_dp(ranges, alignment=alignment, max_steps=max_steps)
    raise ValueError(f"unknown algo {algo!r}; expected one of {ALGOS}")


def assign_greedy(ranges: Sequence[LiveRange], *, alignment: int = ALIGNMENT) -> Assignment:
    sizes = [aligned(r.size, alignment) for r in ranges]
    conflicts = conflicts_of(ranges)
    offsets: list[int | None] = [None] * len(ranges)
    for i in sorted(range(len(ranges)), key=lambda i: (-sizes[i], ranges[i].start, i)):
        taken = [(o, o + sizes[j]) for j in conflicts[i] if (o := offsets[j]) is not None]
        offsets[i] = _best_fit(taken, sizes[i])
    final = tuple(o or 0 for o in offsets)
    size = max((o + s for o, s in zip(final, sizes)), default=0)
    return Assignment(final, size, "greedy", size == lower_bound(ranges, alignment))


def _best_fit(taken: list[tuple[int, int]], size: int) -> int:
    """The start of the smallest gap of at least ``size`` bytes between ``taken`` spans, else the top."""
    best: tuple[int, int] | None = None  # (gap length, offset)
    cursor = 0
    for start, end in sorted(taken):
        if start > cursor and start - cursor >= size and (best is None or start - cursor < best[0]):
            best = (start - cursor, cursor)
        cursor = max(cursor, end)
    return cursor if best is None else best[1]


def _lowest_fit(taken: list[tuple[int, int]], size: int) -> int:
    cursor = 0
    for start, end in sorted(taken):
        if start - cursor >= size:
            return cursor
        cursor = max(cursor, end)
    return cursor


def assign_dp(ranges: Sequence[LiveRange], *, alignment: int = ALIGNMENT, max_steps: int = DP_MAX_STEPS) -> Assignment:
    greedy = assign_greedy(ranges, alignment=alignment)
    bound = lower_bound(ranges, alignment)
    if greedy.size <= bound:
        return Assignment(greedy.offsets, greedy.size, "dp", True)
    sizes = [aligned(r.size, alignment) for r in ranges]
    conflicts = conflicts_of(ranges)
    order = sorted(range(len(ranges)), key=lambda i: (-sizes[i], ranges[i].start, i))
    best_size, best_offsets = greedy.size, list(greedy.offsets)
    # Placements seen, by a running hash of their (buffer, offset) pairs (Zobrist-style: updated
    # in O(1) per placement).  A collision could only skip a branch, never make a layout wrong.
    seen: set[int] = set()
    key = 0
    steps = 0
    placed: dict[int, int] = {}

    def search(peak: int) -> bool:
        """Place the rest; False when the step bound is reached (stop everything)."""
        nonlocal steps, key, best_size, best_offsets
        if len(placed) == len(ranges):
            if peak < best_size:
                best_size = peak
                best_offsets = [placed[i] for i in range(len(ranges))]
            return True
        for i in order:
            if i in placed:
                continue
            steps += 1
            if steps > max_steps:
                return False
            taken = [(placed[j], placed[j] + sizes[j]) for j in conflicts[i] if j in placed]
            offset = _lowest_fit(taken, sizes[i])
            top = max(peak, offset + sizes[i])
            if top >= best_size:
                continue
            placed[i] = offset
            token = hash((i, offset))
            key ^= token
            if key not in seen:
                seen.add(key)
                if not search(top):
                    del placed[i]
                    key ^= token
                    return False
            del placed[i]
            key ^= token
            if best_size <= bound:
                return True
        return True

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 2 * len(ranges) + 1000))  # one frame per buffer placed
    try:
        finished = search(0)
    finally:
        sys.setrecursionlimit(limit)
    return Assignment(tuple(best_offsets), best_size, "dp", finished or best_size <= bound, min(steps, max_steps))


def verify_assignments(
    ranges: Sequence[LiveRange],
    assignment: Assignment | Sequence[int],
    *,
    alignment: int = ALIGNMENT,
    arena_size: int | None = None,
) -> list[str]:
    """Every way ``assignment`` is wrong, in words; empty when it is right.

    Wrong: two buffers whose live ranges overlap share a byte, an offset is negative or
    not a multiple of ``alignment``, a buffer reaches past the arena.
    """
    offsets = assignment.offsets if isinstance(assignment, Assignment) else tuple(assignment)
    if arena_size is None and isinstance(assignment, Assignment):
        arena_size = assignment.size
    problems = []
    if len(offsets) != len(ranges):
        return [f"{len(offsets)} offsets for {len(ranges)} buffers"]
    for r, offset in zip(ranges, offsets):
        if offset < 0 or offset % alignment:
            problems.append(f"buffer {r.buffer}: offset {offset} is not a non-negative multiple of {alignment}")
        if arena_size is not None and offset + r.size > arena_size:
            problems.append(f"buffer {r.buffer}: bytes {offset}..{offset + r.size} reach past the arena ({arena_size})")
    for i, j in interference(ranges):
        a, b = ranges[i], ranges[j]
        if a.size and b.size and offsets[i] < offsets[j] + b.size and offsets[j] < offsets[i] + a.size:
            problems.append(
                f"buffers {a.buffer} and {b.buffer} are live together (positions {max(a.start, b.start)}.."
                f"{min(a.end, b.end)}) and share bytes {max(offsets[i], offsets[j])}.."
                f"{min(offsets[i] + a.size, offsets[j] + b.size)}"
            )
    return problems
