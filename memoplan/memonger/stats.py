"""Memonger stage: the layout of a graph's buffers — order, live ranges, assignment — and its figures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memoplan.memonger.assign import ALIGNMENT, DP_MAX_STEPS, Assignment, assign, lower_bound, verify_assignments
from memoplan.memonger.order import linearize
from memoplan.memonger.ranges import Buffer, LiveRange, live_ranges


@dataclass(frozen=True)
class Stats:
    """``baseline``: every buffer its own allocation; ``arena``: the assigned arena; ``lower_bound``:
    the most (aligned) bytes live at one position, which no static plan can go under."""

    buffers: int
    baseline_bytes: int
    arena_bytes: int
    lower_bound_bytes: int
    optimal: bool

    @property
    def ratio_to_bound(self) -> float:
        return self.arena_bytes / self.lower_bound_bytes if self.lower_bound_bytes else 1.0


@dataclass(frozen=True)
class Layout:
    order: tuple[int, ...]  # steps in the order they run
    ranges: tuple[LiveRange, ...]  # one per buffer, in buffer order
    assignment: Assignment
    stats: Stats


def stats_of(ranges: Sequence[LiveRange], assignment: Assignment, *, alignment: int = ALIGNMENT) -> Stats:
    return Stats(
        buffers=len(ranges),
        baseline_bytes=sum(r.size for r in ranges),
        arena_bytes=assignment.size,
        lower_bound_bytes=lower_bound(ranges, alignment),
        optimal=assignment.optimal,
    )


def layout(
    deps: Sequence[Sequence[int]],
    buffers: Sequence[Buffer],
    *,
    algo: str = "greedy",
    ordering: str = "topological",
    alignment: int = ALIGNMENT,
    max_steps: int = DP_MAX_STEPS,
) -> Layout:
    """Linearize, find live ranges, assign, and check the assignment (``AssertionError`` if it is wrong)."""
    order = linearize(deps, ordering)
    ranges = live_ranges(order, buffers)
    assignment = assign(ranges, algo, alignment=alignment, max_steps=max_steps)
    problems = verify_assignments(ranges, assignment, alignment=alignment)
    if problems:  # a bug in memoplan, never the user's: stop before any code uses it
        raise AssertionError("memonger produced a wrong assignment: " + "; ".join(problems[:3]))
    return Layout(order, ranges, assignment, stats_of(ranges, assignment, alignment=alignment))
