"""Memonger stage: live ranges — when each buffer of a linearized graph is defined and last used.

A *buffer* is one allocation the graph makes: a step's output together with every
view of it.  Its live range runs from the position of the step that writes it to the
position of the last step that reads it (through any view), both included: a step's
output never shares bytes with the inputs it reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Buffer:
    """One allocation: its size in bytes, the step that writes it, the steps that read it."""

    size: int
    producer: int
    users: tuple[int, ...] = ()


@dataclass(frozen=True)
class LiveRange:
    """Buffer ``buffer`` is live from position ``start`` to ``end`` (both included) of the order."""

    buffer: int
    start: int
    end: int
    size: int

    def overlaps(self, other: LiveRange) -> bool:
        return self.start <= other.end and other.start <= self.end


def live_ranges(order: Sequence[int], buffers: Sequence[Buffer]) -> tuple[LiveRange, ...]:
    """The live range of every buffer, in buffer order, under the linear ``order`` of steps."""
    position = {step: i for i, step in enumerate(order)}
    ranges = []
    for index, buffer in enumerate(buffers):
        start = position[buffer.producer]
        end = max((position[u] for u in buffer.users), default=start)
        if end < start:
            raise ValueError(f"buffer {index} is read before step {buffer.producer} writes it")
        ranges.append(LiveRange(index, start, end, buffer.size))
    return tuple(ranges)


def interference(ranges: Sequence[LiveRange]) -> Iterator[tuple[int, int]]:
    """Every pair ``(i, j)``, ``i < j`` as indices into ``ranges``, whose live ranges overlap (a sweep)."""
    by_start = sorted(range(len(ranges)), key=lambda i: (ranges[i].start, i))
    active: list[int] = []
    for i in by_start:
        start = ranges[i].start
        active = [j for j in active if ranges[j].end >= start]
        for j in active:
            yield (min(i, j), max(i, j))
        active.append(i)


def live_bytes_at(ranges: Sequence[LiveRange], position: int) -> int:
    return sum(r.size for r in ranges if r.start <= position <= r.end)
