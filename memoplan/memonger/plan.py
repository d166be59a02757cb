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
bytes live outside it at one step), each also with what every op allocates and frees
inside it at its step (a convolution's workspace).  ``lay_out(..., slack=s)`` (the block's
``peak_slack``) leaves buffers out until both of the arena's estimates are within ``s`` of eager's:
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
    eager_peak_inside: int = 0  # eager_peak with what each op allocates and frees inside it at its step
    arena_peak_inside: int = 0  # arena_peak likewise

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
    sizes = _Sizes(program, linearize(program.deps, ordering), slack)
    chosen = set(program.arena_buffers())
    if slack is not None:
        chosen = sizes.within(chosen)

    def arranged() -> tuple[tuple[tuple[int, ...], ...], Layout, tuple[int, int]]:
        slots = sizes.chains(chosen)
        result = layout(program.deps, [_slot_buffer(program, held) for held in slots], algo=algo, ordering=ordering)
        return slots, result, sizes.peaks(chosen, result.assignment.size)

    slots, result, estimate = arranged()
    while slack is not None and chosen and not sizes.fits(estimate):  # the layout came out over the bound
        chosen.discard(sizes.victim(chosen))
        slots, result, estimate = arranged()
    left_out = tuple(sorted(set(program.arena_buffers()) - chosen))
    return ArenaPlan(
        program,
        result,
        slots,
        algo,
        ordering,
        left_out,
        sizes.eager[0],
        estimate[0],
        slack,
        sizes.eager[1],
        estimate[1],
    )


def _slot_buffer(program: Program, held: Sequence[int]) -> Buffer:
    """A slot as one buffer: written by its first buffer's producer, read until its last buffer's last reader."""
    infos = [program.buffers[i] for i in held]
    users = sorted({u for info in infos for u in info.users} | {info.producer for info in infos[1:]})
    return Buffer(max(info.size for info in infos), infos[0].producer, tuple(users))


class _Sizes:
    """The estimates of a call's peak for a choice of buffers, and the choice of ``peak_slack``.

    A peak is estimated twice: from the buffers alone (what the live-storage meter sees) and
    with what each op allocates and frees inside it at its step (a convolution's workspace,
    what the profiler and a CUDA allocator see).  A choice fits when both are within the slack
    of eager's.
    """

    def __init__(self, program: Program, order: Sequence[int], slack: float | None) -> None:
        self.program = program
        everything = range(len(program.buffers))
        self.ranges = dict(zip(everything, _ranges(program, order, everything)))
        self.position = {step: i for i, step in enumerate(order)}
        self.made_by = {info.producer: i for i, info in enumerate(program.buffers)}
        workspaces = program.workspaces or (0,) * len(program.steps)
        self.workspaces = workspaces
        eager = _ranges(program, tuple(range(len(program.steps))), everything)
        inside = [LiveRange(-1, step, step, size) for step, size in enumerate(workspaces) if size]
        self.eager = (peak_of(eager), peak_of(list(eager) + inside))
        self.slack = slack

    def chains(self, chosen: set[int]) -> tuple[tuple[int, ...], ...]:
        """The chosen buffers as slots, in the order their first buffer is written: a buffer shares
        the slot of the buffer its pointwise producer may write over (``BufferInfo.over``) when,
        in this order, that producer is the other buffer's last reader."""
        ranges = self.ranges
        following: dict[int, int] = {}
        for i in sorted(chosen):
            over = self.program.buffers[i].over
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

    def slot_ranges(self, slots: Sequence[Sequence[int]]) -> list[LiveRange]:
        """Each slot's range: from its first buffer's write to its last buffer's last read."""
        r = self.ranges
        return [LiveRange(held[0], r[held[0]].start, r[held[-1]].end, max(r[i].size for i in held)) for held in slots]

    def peaks(self, chosen: set[int], arena: int) -> tuple[int, int]:
        """A call's peak with an arena of ``arena`` bytes: the arena plus the most bytes live
        outside it at once, without and with what the ops allocate inside."""
        outside = [r for i, r in self.ranges.items() if i not in chosen]
        inside = []
        for step, size in enumerate(self.workspaces):
            buffer = self.made_by.get(step)
            if buffer in chosen:
                size = self.program.buffers[buffer].scratch  # the form's, not the op's
            if size:
                inside.append(LiveRange(-1, self.position[step], self.position[step], size))
        return arena + peak_of(outside), arena + peak_of(outside + inside)

    def ratio(self, peaks: tuple[int, int]) -> float:
        """How far over the limit the worse of the two estimates is (1.0: at it)."""
        limit = 1 + (self.slack or 0.0)
        return max(p / (e * limit) if e else 1.0 for p, e in zip(peaks, self.eager))

    def fits(self, peaks: tuple[int, int]) -> bool:
        return self.ratio(peaks) <= 1.0

    def estimate(self, chosen: set[int]) -> tuple[int, int]:
        """The peaks were the arena at its lower bound (the most aligned bytes its slots hold at once)."""
        return self.peaks(chosen, lower_bound(self.slot_ranges(self.chains(chosen))))

    def victim(self, chosen: set[int]) -> int:
        """The buffer whose leaving lowers the estimate most: one in a slot live where the slots hold
        most (only those make the arena smaller), the larger on a tie."""
        slots = self.chains(chosen)
        members = {held[0]: held for held in slots}
        at_peak = [i for first in _live_at_peak(self.slot_ranges(slots)) for i in members[first]]
        return min(at_peak, key=lambda i: (self.ratio(self.estimate(chosen - {i})), -self.ranges[i].size, i))

    def within(self, chosen: set[int]) -> set[int]:
        """Leave buffers out, the best victim first, until the estimate fits; then take back, the
        largest first, those that still fit."""
        chosen = set(chosen)
        left: list[int] = []
        while chosen and not self.fits(self.estimate(chosen)):
            victim = self.victim(chosen)
            chosen.discard(victim)
            left.append(victim)
        for i in sorted(left, key=lambda i: (-self.ranges[i].size, i)):
            if self.fits(self.estimate(chosen | {i})):
                chosen.add(i)
        return chosen


def _live_at_peak(slots: Sequence[LiveRange]) -> list[int]:
    """The first buffers of the slots live where the slots hold the most aligned bytes."""
    events: dict[int, int] = {}
    for r in slots:
        events[r.start] = events.get(r.start, 0) + aligned(r.size)
        events[r.end + 1] = events.get(r.end + 1, 0) - aligned(r.size)
    best, where, live = -1, 0, 0
    for position in sorted(events):
        live += events[position]
        if live > best:
            best, where = live, position
    return [r.buffer for r in slots if r.start <= where <= r.end]
