"""Memonger stage: from a captured program to an :class:`ArenaPlan` — which buffers, where.

Pure functions of a :class:`Program`.  Every buffer that an op can write through an
``out=`` form can go into the arena (Caffe2's memonger shares every blob it can), and
the assignment packs them by live range.  A pointwise op whose input is read there for
the last time writes its result over that input (Caffe2's in-place sharing): both
buffers hold one slot, whose range runs from the first write to the last read.

The arena is resident: at any moment a call holds the whole arena plus what its ops
allocate themselves (ops without an ``out=`` form, the model's outputs), where eager
holds only what is live.  ``ArenaPlan`` carries both estimates: eager's peak (the most
bytes live at one step in the captured order) and the arena's (its size plus the most
bytes live outside it at one step).  ``lay_out(..., slack=s)`` (the block's
``peak_slack``) leaves buffers out until the arena's estimate is within ``s`` of eager's:
each time the one, among those live where the arena holds most, whose leaving lowers
the estimate most; then it takes back, the largest first, those that still fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memoplan.memonger.assign import aligned, lower_bound
from memoplan.memonger.order import linearize
from memoplan.memonger.program import Program
from memoplan.memonger.ranges import Buffer, LiveRange, live_ranges
from memoplan.memonger.stats import Layout, layout

LEFT_OUT = "left out of the arena: with it, a call's estimated peak would be over eager's by more than the slack"


@dataclass(frozen=True)
class ArenaPlan:
    """The captured program, its arena layout (one range per slot, in slot order) and the settings.

    ``slots``: per slot, the buffers it holds in the order they are written — one, or a chain
    where a pointwise op writes its result over its input's buffer (read there for the last time).
    """

    program: Program
    layout: Layout
    slots: tuple[tuple[int, ...], ...]  # indices into program.buffers
    algo: str
    ordering: str
    left_out: tuple[int, ...] = ()  # buffers out= could write, left out to keep the peak
    eager_peak: int = 0  # estimated bytes live at once in eager
    arena_peak: int = 0  # estimated: the arena plus the most bytes live outside it at once
    slack: float | None = None  # the peak_slack it was laid out with (None: every buffer it could take)

    @property
    def arena_buffers(self) -> tuple[int, ...]:
        """Every buffer in the arena, in buffer order."""
        return tuple(sorted(i for slot in self.slots for i in slot))

    @property
    def outside(self) -> tuple[int, ...]:
        """Buffers allocated by their ops on every call."""
        chosen = set(self.arena_buffers)
        return tuple(i for i in range(len(self.program.buffers)) if i not in chosen)

    @property
    def baseline_bytes(self) -> int:
        """The arena's buffers, each its own allocation."""
        return sum(self.program.buffers[i].size for i in self.arena_buffers)

    def slot_of(self) -> dict[int, int]:
        return {buffer: slot for slot, held in enumerate(self.slots) for buffer in held}

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
    """Assign the arena's buffers offsets; with ``slack``, leave buffers out until a call's estimated
    peak is within ``slack`` of eager's (``None``: every buffer an ``out=`` form can write)."""
    everything = range(len(program.buffers))
    eager = peak_of(_ranges(program, tuple(range(len(program.steps))), everything))
    order = linearize(program.deps, ordering)
    ranges = dict(zip(everything, _ranges(program, order, everything)))
    chosen = set(program.arena_buffers())
    target = None if slack is None else eager * (1 + slack)
    if target is not None:
        chosen = _within(program, chosen, ranges, target)

    def arranged() -> tuple[tuple[tuple[int, ...], ...], Layout, int]:
        slots = _chains(program, chosen, ranges)
        result = layout(program.deps, [_slot_buffer(program, held) for held in slots], algo=algo, ordering=ordering)
        outside = [ranges[i] for i in everything if i not in chosen]
        return slots, result, result.assignment.size + peak_of(outside)

    slots, result, estimate = arranged()
    while target is not None and chosen and estimate > target:  # the layout came out over the bound
        chosen.discard(_victim(program, chosen, ranges))
        slots, result, estimate = arranged()
    left_out = tuple(sorted(set(program.arena_buffers()) - chosen))
    return ArenaPlan(program, result, slots, algo, ordering, left_out, eager, estimate, slack)


def _chains(program: Program, chosen: set[int], ranges: dict[int, LiveRange]) -> tuple[tuple[int, ...], ...]:
    """The chosen buffers as slots, in the order their first buffer is written: a buffer shares
    the slot of the buffer its pointwise producer may write over (``BufferInfo.over``) when,
    in this order, that producer is the other buffer's last reader."""
    following: dict[int, int] = {}
    for i in sorted(chosen):
        over = program.buffers[i].over
        if over in chosen and over not in following and ranges[over].end == ranges[i].start:
            following[over] = i
    joined = set(following.values())
    slots = []
    for first in sorted(chosen - joined, key=lambda i: (ranges[i].start, i)):
        held = [first]
        while held[-1] in following:
            held.append(following[held[-1]])
        slots.append(tuple(held))
    return tuple(slots)


def _slot_buffer(program: Program, held: Sequence[int]) -> Buffer:
    """A slot as one buffer: written by its first buffer's producer, read until its last buffer's last reader."""
    infos = [program.buffers[i] for i in held]
    users = sorted({u for info in infos for u in info.users} | {info.producer for info in infos[1:]})
    return Buffer(max(info.size for info in infos), infos[0].producer, tuple(users))


def _slot_ranges(program: Program, chosen: set[int], ranges: dict[int, LiveRange]) -> list[LiveRange]:
    return [
        LiveRange(held[0], ranges[held[0]].start, ranges[held[-1]].end, max(ranges[i].size for i in held))
        for held in _chains(program, chosen, ranges)
    ]


def _estimate(program: Program, chosen: set[int], ranges: dict[int, LiveRange]) -> int:
    """A call's peak were the arena at its lower bound: the most bytes the chosen buffers' slots
    hold at once (aligned) plus the most the others hold at once."""
    outside = [r for i, r in ranges.items() if i not in chosen]
    return lower_bound(_slot_ranges(program, chosen, ranges)) + peak_of(outside)


def _victim(program: Program, chosen: set[int], ranges: dict[int, LiveRange]) -> int:
    """The buffer whose leaving lowers the estimate most: one in a slot live where the slots hold
    most (only those make the arena smaller), the larger on a tie."""
    slots = _slot_ranges(program, chosen, ranges)
    members = {held[0]: held for held in _chains(program, chosen, ranges)}
    at_peak = [i for first in _live_at_peak(slots, [r.buffer for r in slots]) for i in members[first]]
    return min(at_peak, key=lambda i: (_estimate(program, chosen - {i}, ranges), -ranges[i].size, i))


def _live_at_peak(chosen_ranges: Sequence[LiveRange], indices: Sequence[int]) -> list[int]:
    events: dict[int, int] = {}
    for r in chosen_ranges:
        events[r.start] = events.get(r.start, 0) + aligned(r.size)
        events[r.end + 1] = events.get(r.end + 1, 0) - aligned(r.size)
    best, where, live = -1, 0, 0
    for position in sorted(events):
        live += events[position]
        if live > best:
            best, where = live, position
    return [i for i, r in zip(indices, chosen_ranges) if r.start <= where <= r.end]


def _within(program: Program, chosen: set[int], ranges: dict[int, LiveRange], target: float) -> set[int]:
    """Leave buffers out, the best victim first, until the estimate is within ``target``; then take
    back, the largest first, those that still fit."""
    chosen = set(chosen)
    left: list[int] = []
    while chosen and _estimate(program, chosen, ranges) > target:
        victim = _victim(program, chosen, ranges)
        chosen.discard(victim)
        left.append(victim)
    for i in sorted(left, key=lambda i: (-ranges[i].size, i)):
        if _estimate(program, chosen | {i}, ranges) <= target:
            chosen.add(i)
    return chosen
