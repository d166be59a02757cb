"""Memonger stage: from a captured program to an :class:`ArenaPlan` — which buffers, where.

Pure functions of a :class:`Program`.  Every buffer that an op can write through its
``out=`` variant goes into the arena (Caffe2's memonger shares every blob it can), and
the assignment packs them by live range.

The arena is resident: at any moment a call holds the whole arena plus what its ops
allocate themselves (ops without an ``out=`` variant, the model's outputs), where eager
holds only what is live.  ``ArenaPlan`` carries both estimates: eager's peak (the most
bytes live at one step in the captured order) and the arena's (its size plus the most
bytes live outside it at one step).  ``lay_out(..., slack=s)`` instead leaves buffers out,
the largest first, until the arena's estimate is within ``s`` of eager's; on a chain
whose every step holds as much as the peak (an MLP) or where the outputs are as large
as the intermediates, that leaves the arena empty — measured in docs/benchmarks.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memoplan.memonger.order import linearize
from memoplan.memonger.program import Program
from memoplan.memonger.ranges import Buffer, LiveRange, live_ranges
from memoplan.memonger.stats import Layout, layout

LEFT_OUT = "left out of the arena: with it, a call's estimated peak would be over eager's by more than the slack"


@dataclass(frozen=True)
class ArenaPlan:
    """The captured program, its arena layout (over ``arena_buffers``, in that order) and the settings."""

    program: Program
    layout: Layout
    arena_buffers: tuple[int, ...]  # indices into program.buffers, in layout order
    algo: str
    ordering: str
    left_out: tuple[int, ...] = ()  # buffers out= could write, left out to keep the peak
    eager_peak: int = 0  # estimated bytes live at once in eager
    arena_peak: int = 0  # estimated: the arena plus the most bytes live outside it at once

    @property
    def outside(self) -> tuple[int, ...]:
        """Buffers allocated by their ops on every call."""
        chosen = set(self.arena_buffers)
        return tuple(i for i in range(len(self.program.buffers)) if i not in chosen)

    def note(self, buffer: int) -> str:
        return LEFT_OUT if buffer in self.left_out else self.program.buffers[buffer].note


def _ranges(program: Program, order: Sequence[int], indices: Sequence[int]) -> tuple[LiveRange, ...]:
    buffers = [Buffer(program.buffers[i].size, program.buffers[i].producer, program.buffers[i].users) for i in indices]
    return live_ranges(order, buffers)


def peak_of(ranges: Sequence[LiveRange]) -> int:
    """The most bytes live at one position (unaligned)."""
    events: dict[int, int] = {}
    for r in ranges:
        events[r.start] = events.get(r.start, 0) + r.size
        events[r.end + 1] = events.get(r.end + 1, 0) - r.size
    best = live = 0
    for position in sorted(events):
        live += events[position]
        best = max(best, live)
    return best


def lay_out(
    program: Program, *, algo: str = "greedy", ordering: str = "topological", slack: float | None = None
) -> ArenaPlan:
    """Assign the arena's buffers offsets; with ``slack``, leave buffers out until the estimate is within it."""
    everything = range(len(program.buffers))
    eager = peak_of(_ranges(program, tuple(range(len(program.steps))), everything))
    order = linearize(program.deps, ordering)
    chosen = sorted(program.arena_buffers(), key=lambda i: (-program.buffers[i].size, i))
    left_out: list[int] = []
    while True:
        kept = sorted(chosen)
        result = layout(
            program.deps,
            [Buffer(program.buffers[i].size, program.buffers[i].producer, program.buffers[i].users) for i in kept],
            algo=algo if slack is None else "greedy",
            ordering=ordering,
        )
        taken = set(kept)
        estimate = result.assignment.size + peak_of(_ranges(program, order, [i for i in everything if i not in taken]))
        if slack is None or estimate <= eager * (1 + slack) or not chosen:
            break
        left_out.append(chosen.pop(0))
    if slack is not None and algo != "greedy":
        result = layout(
            program.deps,
            [Buffer(program.buffers[i].size, program.buffers[i].producer, program.buffers[i].users) for i in kept],
            algo=algo,
            ordering=ordering,
        )
        estimate = result.assignment.size + peak_of(_ranges(program, order, [i for i in everything if i not in taken]))
    return ArenaPlan(program, result, tuple(kept), algo, ordering, tuple(sorted(left_out)), eager, estimate)
