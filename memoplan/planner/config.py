"""Planner stage: the planner's typed configs -- which search, which refinement levels, how many trials.

Pure data (no torch): :mod:`memoplan.planner.plan` and :mod:`memoplan.planner.search.refine` read them,
and the named presets of :mod:`memoplan.planner.presets` are built from them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["ALL_LEVELS", "Level", "Planner", "RefineOptions"]


class Planner(enum.Enum):
    """Which search chooses the checkpoints for a byte budget (:mod:`memoplan.planner.search`)."""

    OPTIMAL = "optimal"
    GREEDY = "greedy"
    SUBLINEAR = "sublinear"


class Level(enum.Enum):
    """A measured refinement level (:mod:`memoplan.planner.search.refine`)."""

    SPLIT = "split"  # checkpointed nn.Sequential regions -> `checkpoint segments = N`
    TEMPORAL = "temporal"  # checkpointed regions with stateful modules -> `temporal_chunk N dim 0`
    NARROW = "narrow"  # a checkpointed module -> its heaviest child, when the peak does not rise
    UNWRAP = "unwrap"  # drop region rules whose removal does not raise the peak
    SAVE = "save"  # plain checkpoints -> `checkpoint save = [matmul, attention]`, when the peak does not rise


ALL_LEVELS: tuple[Level, ...] = (Level.SPLIT, Level.TEMPORAL, Level.NARROW, Level.UNWRAP, Level.SAVE)


@dataclass(frozen=True)
class RefineOptions:
    """Which refinement levels run, in order, and how many trials each may take.

    ``max_trials`` bounds the measured trials of each level (``None``: no bound; an edit the
    resolver refuses costs no measurement and does not count);
    ``segments`` are the region counts the ``split`` level tries, ``chunks`` the chunk counts
    of ``temporal``.
    """

    levels: tuple[Level, ...] = ALL_LEVELS
    max_trials: int | None = 8
    segments: tuple[int, ...] = (2,)
    chunks: tuple[int, ...] = (2, 4)

    def __post_init__(self) -> None:
        levels = tuple(self.levels)
        if not all(isinstance(level, Level) for level in levels) or len(set(levels)) != len(levels):
            raise ValueError(f"levels must be distinct Level values, got {self.levels!r}")
        object.__setattr__(self, "levels", levels)
        trials = self.max_trials
        if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int) or trials < 1):
            raise ValueError(f"max_trials must be a positive integer or None, got {trials!r}")
        for name in ("segments", "chunks"):
            values = tuple(getattr(self, name))
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 2 for v in values):
                raise ValueError(f"{name} must be integers >= 2, got {values!r}")
            object.__setattr__(self, name, values)
