"""Planner stage: the named presets of ``memoplan plan --preset NAME``.

A :class:`PlannerPreset` fixes everything ``memoplan plan`` decides besides the model: which
:class:`~memoplan.planner.config.Planner` searches, the budget used when none is given, whether
it is hard, and which measured refinement levels
(:class:`~memoplan.planner.config.RefineOptions`, run by :mod:`memoplan.planner.search.refine`) run
with how many trials.  :data:`PRESETS` is the registry (the CLI's ``--preset`` choices come
from it); explicit options override fields with :meth:`PlannerPreset.with_overrides`.  This
module is pure Python (no torch), so the command line can build its parser without importing
torch.  The typed configs live in :mod:`memoplan.planner.config` (re-exported here), so
:mod:`memoplan.planner.plan` and :mod:`memoplan.planner.search.refine` never import this module: the
one edge between them is :meth:`PlannerPreset.run`'s call of the planner's entry point.

The presets and the coverage budgets
====================================

``budgets.Preset`` (``--budget checkpoint-half|checkpoint-three-quarters|checkpoint-all``, formerly
``speed|balanced|memory``) is a *budget*: the share of the candidate modules checkpointed,
50/75/100%, largest activations first.  A planner preset is a
*strategy*; its default budget is a coverage budget or, for ``memory`` and ``exhaustive``,
:class:`~memoplan.planner.budgets.LeastPeak`: no limit, the least measured peak the planner
reaches (every search :func:`~memoplan.planner.plan.make_plan` widens to when a hard budget is
missed is run and measured, and the lowest plan is kept).

=============== =========================== ========= ================================== ==============
preset          default budget              planner   refinement levels                  trials / level
=============== =========================== ========= ================================== ==============
``safe``        checkpoint-half             optimal   none: plain checkpoints            --
``balanced``    checkpoint-three-quarters   optimal   narrow, unwrap                     8
``memory``      least peak                  optimal   split, temporal, narrow, unwrap,   8
                                                      save
``exhaustive``  least peak                  optimal   split, temporal, narrow, unwrap,   no limit
                                                      save
=============== =========================== ========= ================================== ==============

What each trades: ``safe`` recomputes the least (half the candidates, no measured trials);
``balanced`` recomputes more for a lower peak and spends up to 16 measured steps removing
checkpoints that do not pay; ``memory`` spends the most planning time (several searches, each
refined) and recomputes whatever the least peak needs -- whole chains, every block, time chunks;
``exhaustive`` spends more planning time still for a peak at most ``memory``'s.  The planner
searches byte budgets (``--budget 4 GiB``, ``--budget 50%``); a coverage budget takes its
share directly.  ``safe`` and ``balanced`` write plans that are bit-exact (checkpoints only,
``compress input = bit`` where inputs are binary); ``memory`` and ``exhaustive`` may write
``temporal_chunk``, which is equivalent up to float reassociation (``memoplan verify`` checks
it to 5e-5).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from memoplan.planner.budgets import Budget, Bytes, Coverage, DeviceBudget, FractionOfPeak, LeastPeak, Preset
from memoplan.planner.config import ALL_LEVELS, Level, Planner, RefineOptions
from memoplan.syntax.blocks import SublinearConfig

if TYPE_CHECKING:  # pragma: no cover
    from memoplan.planner.plan import PlanResult

__all__ = [
    "ALL_LEVELS",
    "DEFAULT",
    "PRESETS",
    "Level",
    "Planner",
    "PlannerPreset",
    "RefineOptions",
]


BudgetLike = Budget | Preset | LeastPeak | DeviceBudget  # a device budget: bytes before a run


@dataclass(frozen=True)
class PlannerPreset:
    """What ``memoplan plan`` does: planner, default budget and mode, and refinement."""

    name: str
    summary: str  # one line, for --help and the docs
    planner: Planner = Planner.OPTIMAL
    budget: BudgetLike = Preset.BALANCED  # used when no --budget is given
    hard: bool = True  # a hard budget is verified by measurement; False: a hint
    refine: RefineOptions = RefineOptions(levels=())

    def __post_init__(self) -> None:
        if not isinstance(self.planner, Planner):
            raise TypeError(f"planner must be a Planner, got {self.planner!r}")
        if not isinstance(self.budget, (Bytes, FractionOfPeak, Coverage, Preset, LeastPeak, DeviceBudget)):
            raise TypeError(
                f"budget must be search.Bytes, FractionOfPeak, Coverage, Preset or LeastPeak, got {self.budget!r}"
            )
        if not isinstance(self.hard, bool):
            raise TypeError(f"hard must be a bool, got {self.hard!r}")
        if not isinstance(self.refine, RefineOptions):
            raise TypeError(f"refine must be RefineOptions, got {self.refine!r}")

    @property
    def levels(self) -> tuple[Level, ...]:
        return self.refine.levels

    def with_overrides(
        self,
        *,
        planner: Planner | None = None,
        budget: BudgetLike | None = None,
        hard: bool | None = None,
    ) -> PlannerPreset:
        """This preset with the fields given explicitly (not None) replaced."""
        changes: dict[str, Any] = {}
        if planner is not None:
            changes["planner"] = planner
        if budget is not None:
            changes["budget"] = budget
        if hard is not None:
            changes["hard"] = hard
        return replace(self, **changes) if changes else self

    def run(
        self,
        model,
        example,
        *,
        prof=None,
        progress: bool = True,
        named: bool = True,
        nested: bool = False,
        sublinear: SublinearConfig | None = None,
        start=None,
        trials: str | None = None,
    ) -> PlanResult:
        """Plan ``model`` on ``example`` with this preset (:func:`memoplan.planner.plan.make_plan`).

        ``named``: write ``# preset: NAME`` in the plan's header (not when the preset is only
        the defaults under explicit options).  ``nested``: offer each block's children too.
        ``sublinear``: the sublinear search's settings (with ``planner`` sublinear).  ``start``:
        a hand-written plan (``memoplan.syntax.ast.Plan``) to complete, its rules kept as written.
        ``trials``: ``estimated`` or ``measured`` (default: as the profile was taken; see make_plan).
        """
        from memoplan.planner.plan import make_plan

        assert not isinstance(self.budget, DeviceBudget), "a device budget is bytes once the model is on the device"
        return make_plan(
            model,
            example,
            self.budget,
            planner=self.planner,
            hard=self.hard,
            prof=prof,
            progress=progress,
            refine=self.refine,
            preset=self.name if named else None,
            nested=nested,
            sublinear=sublinear,
            start=start,
            trials=trials,
        )


SAFE = PlannerPreset(
    "safe",
    "plain checkpoints of the largest half of the candidates, no refinement (bit-exact)",
    budget=Preset.SPEED,
)
BALANCED = PlannerPreset(
    "balanced",
    "checkpoints, then narrow or drop each one that does not lower the measured peak (bit-exact)",
    budget=Preset.BALANCED,
    refine=RefineOptions(levels=(Level.NARROW, Level.UNWRAP), max_trials=8),
)
MEMORY = PlannerPreset(
    "memory",
    "the least peak the planner reaches: every search measured (checkpoints, runs of a chain, time chunks, "
    "parts of blocks), split regions, chunk time, narrow or drop useless checkpoints",
    budget=LeastPeak(),
    refine=RefineOptions(levels=ALL_LEVELS, max_trials=8, segments=(2,), chunks=(2, 4)),
)
EXHAUSTIVE = PlannerPreset(
    "exhaustive",
    "as memory, with more segment and chunk counts and no limit on trials (slow)",
    budget=LeastPeak(),
    refine=RefineOptions(levels=ALL_LEVELS, max_trials=None, segments=(2, 3, 4), chunks=(2, 4, 8)),
)

#: The registry: name -> preset, from least to most work.
PRESETS: dict[str, PlannerPreset] = {p.name: p for p in (SAFE, BALANCED, MEMORY, EXHAUSTIVE)}

#: What ``memoplan plan`` starts from without ``--preset``: the given budget, no refinement.
DEFAULT = SAFE
