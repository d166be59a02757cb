"""Planner stage: what a planning run is asked to do, checked before any model is loaded.

A :class:`PlanRequest` holds the options of ``memoplan plan`` (and of :func:`memoplan.plan`)
as typed, frozen values: the knobs of :data:`memoplan.planner.knobs.KNOBS`, the plan completed,
the device planned for.  Its budget is read once (:attr:`PlanRequest.wanted`, an
:class:`~memoplan.planner.budgets.AskedBudget`: the typed amount, hard or hint, the device's form).
:meth:`PlanRequest.check` refuses the combinations that cannot plan (no budget, ``--dtr``
completing a plan, sublinear options without the sublinear planner, ...) with
:class:`PlanRequestError`, a :class:`ValueError` whose text the command line prints after
``memoplan plan: error:`` (exit status 2), and returns the preset the request plans with: the
named one (else the default) with the budget, its mode and the planner given over it.
:func:`memoplan.planner.pipeline.run` plans it.  Pure Python: no torch (but for ``--budget
device``'s check of the device).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from memoplan.planner.budgets import AskedBudget, DeviceBudget, budget_from_ast, is_hard, parse_coverage, read_budget
from memoplan.planner.config import Planner
from memoplan.planner.knobs import KNOBS, refused_choice
from memoplan.planner.presets import DEFAULT, PRESETS, PlannerPreset

if TYPE_CHECKING:  # pragma: no cover
    from memoplan.syntax import ast

__all__ = ["PlanRequest", "PlanRequestError"]


# the knobs of the table with a word to check that the request holds (preset, planner, method)
CHOICE_KNOBS = tuple(k.name for k in KNOBS if k.request and k.kind == "choice")


class PlanRequestError(ValueError):
    """Options that cannot plan together; ``str(error)`` says which and what to give instead."""


@dataclass(frozen=True)
class PlanRequest:
    """The options of one planning run.

    ``budget``: ``--budget`` text (``4 GiB``, ``50% hint``, ``checkpoint-half``, ``device - 2GiB``;
    read once into :attr:`wanted`); ``preset``: a name of
    :data:`~memoplan.planner.presets.PRESETS`; ``planner``: a :class:`Planner` value
    (``optimal``, ``greedy``, ``sublinear``); ``hint``: the budget is a hint, whatever it
    says; ``nested``: offer each block's children too (optimal planner, byte budget);
    ``dtr``: write a plan with one ``dtr`` block; ``method``: how the profile and the trials are
    taken (``auto``, ``measured``, ``estimated``); ``sublinear_options``: the sublinear
    search's options given (their spellings, for the message); ``coverage``: ``--coverage``
    text (a share or a count of the candidates), instead of ``budget``; ``start``: a plan to
    complete, written at ``start_name``; ``sources``: the model and the example are given
    (a new plan needs both); ``device`` and ``device_memory``: the device planned for and its
    capacity, as ``--device`` and ``--device-memory`` give them (text, or a torch.device and bytes).
    """

    budget: str | None = None
    coverage: str | None = None
    preset: str | None = None
    planner: str | None = None
    hint: bool = False
    nested: bool = False
    dtr: bool = False
    method: str = "auto"
    sublinear_options: tuple[str, ...] = ()
    start: ast.Plan | None = None
    start_name: str | None = None
    sources: bool = True
    device: object = None
    device_memory: object = None

    @cached_property
    def wanted(self) -> AskedBudget | None:
        """The budget asked, read once (MP100, MP203, MP509... for text that is not one): ``budget``,
        else ``coverage``, else the completed plan's own ``budget`` statement; None: the preset's."""
        if self.budget is not None:
            return read_budget(self.budget)
        if self.coverage is not None:
            try:
                return AskedBudget(parse_coverage(self.coverage))
            except ValueError as exc:
                raise PlanRequestError(str(exc)) from None
        if self.start is not None and self.start.budget is not None:
            return AskedBudget(budget_from_ast(self.start.budget), is_hard(self.start.budget))
        return None

    def check(self) -> PlannerPreset:
        """Refuse, before any work, a request that cannot plan (:class:`PlanRequestError`; MP509 for
        ``--budget device`` where no device says its size); the preset it plans with."""
        self.check_options()
        preset = self.make_preset()
        if isinstance(preset.budget, DeviceBudget):  # bytes once the model is on the device
            from memoplan.planner.profiling.aim import device_budget_refused

            device_budget_refused(preset.budget, self.device, self.device_memory)
        self.check_preset(preset)
        self.check_nested(preset)
        return preset

    def check_options(self) -> None:
        """The options alone: the sources, one budget, the words of the knobs' choices."""
        if self.start is None and not self.sources:
            raise PlanRequestError("give --model and --example, or a plan to complete")
        if self.coverage is not None and self.budget is not None:
            raise PlanRequestError("--coverage and --budget are two budgets: give one")
        given = self.budget is not None or self.coverage is not None or self.preset is not None
        if not given and (self.start is None or self.start.budget is None):
            raise PlanRequestError("give --budget B or --preset NAME (or both)")
        for name in CHOICE_KNOBS:  # the words of memoplan.planner.knobs' table
            refused = refused_choice(name, getattr(self, name))
            if refused:
                raise PlanRequestError(refused)

    def sublinear_block(self):
        """The ``sublinear`` block of the plan completed (None: none)."""
        from memoplan.syntax import ast

        return None if self.start is None else self.start.block(ast.BlockKind.SUBLINEAR)

    def make_preset(self) -> PlannerPreset:
        """The preset this request plans with: the named one (else the default) under the options."""
        wanted = self.wanted
        budget, hard = (None, None) if wanted is None else (wanted.amount, wanted.hard)
        block = self.sublinear_block()
        planner = Planner(self.planner) if self.planner else (Planner.SUBLINEAR if block is not None else None)
        base = PRESETS[self.preset] if self.preset else DEFAULT
        return base.with_overrides(planner=planner, budget=budget, hard=False if self.hint else hard)

    def check_preset(self, preset: PlannerPreset) -> None:
        """Refuse what the preset makes impossible (the sublinear search set without its planner, ...)."""
        if (self.sublinear_options or self.sublinear_block() is not None) and preset.planner is not Planner.SUBLINEAR:
            given = ", ".join(self.sublinear_options) or f"the `sublinear` block of {self.start_name}"
            raise PlanRequestError(f"{given} set the sublinear search: add --planner sublinear")
        if self.start is not None and preset.levels:
            raise PlanRequestError(
                f"preset {preset.name} refines by measurement, which could edit the rules of "
                f"{self.start_name}; complete a plan with --budget (and --planner) instead"
            )
        if self.dtr and self.start is not None:
            raise PlanRequestError("--dtr writes a new plan; it does not complete one")

    def check_nested(self, preset: PlannerPreset) -> None:
        """``nested`` needs the optimal planner and a byte budget."""
        from memoplan.planner.budgets import Coverage, Preset

        if self.nested and (preset.planner is not Planner.OPTIMAL or isinstance(preset.budget, (Coverage, Preset))):
            raise PlanRequestError("--nested needs the optimal planner and a byte budget (e.g. 50%)")
