"""Memonger stage: from a model and its example to an :class:`ArenaPlan` — capture, then lay out.

``plan_arena`` is the one entry point ``memoplan.apply``, ``memoplan compile`` and
``memoplan explain`` use: capture the program, linearize its steps in the block's
``ordering``, take the live ranges of the buffers that go into the arena and assign
them with the block's ``algo``; the layout is verified before it is returned.
"""

from __future__ import annotations

from dataclasses import dataclass

from memoplan.memonger.program import Program
from memoplan.memonger.ranges import Buffer
from memoplan.memonger.stats import Layout, layout


@dataclass(frozen=True)
class ArenaPlan:
    """The captured program, its arena layout (over the arena buffers, in that order) and the settings."""

    program: Program
    layout: Layout
    arena_buffers: tuple[int, ...]  # indices into program.buffers, in layout order
    algo: str
    ordering: str

    @property
    def outside(self) -> tuple[int, ...]:
        """Buffers allocated by their ops on every call (no out= variant, or an output)."""
        return tuple(i for i, b in enumerate(self.program.buffers) if not b.arena)


def lay_out(program: Program, *, algo: str = "greedy", ordering: str = "topological") -> ArenaPlan:
    """The arena layout of a captured program (pure: no torch)."""
    arena = program.arena_buffers()
    buffers = [
        Buffer(program.buffers[i].size, program.buffers[i].producer, program.buffers[i].users) for i in arena
    ]
    return ArenaPlan(program, layout(program.deps, buffers, algo=algo, ordering=ordering), arena, algo, ordering)
