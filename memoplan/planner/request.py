"""Planner stage: what a planning run is asked to do, checked before any model is loaded.

A :class:`PlanRequest` holds the options of ``memoplan plan`` (and of :func:`memoplan.plan`)
as typed, frozen values; :meth:`PlanRequest.check` refuses the combinations that cannot
plan (no budget, ``--dtr`` completing a plan, sublinear options without the sublinear
planner, ...) with :class:`PlanRequestError`, a :class:`ValueError` whose text the command
line prints after ``memoplan plan: error:`` (exit status 2).  :meth:`PlanRequest.preset`
is the preset the options make: the named one (else the default) with the budget, its
mode and the planner given over it.  Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memoplan.planner.budgets import budget_from_ast, is_hard, parse_coverage
from memoplan.planner.config import Planner
from memoplan.planner.knobs import KNOBS, refused_choice
from memoplan.planner.presets import DEFAULT, PRESETS, PlannerPreset, parse_budget

if TYPE_CHECKING:  # pragma: no cover
    from memoplan.planner.plan import PlanResult
    from memoplan.planner.presets import BudgetLike
    from memoplan.syntax import ast

__all__ = ["PlanRequest", "PlanRequestError", "plan"]


# the knobs of the table with a word to check that the request holds (preset, planner)
CHOICE_KNOBS = tuple(k.name for k in KNOBS if k.request and k.kind == "choice")


class PlanRequestError(ValueError):
    """Options that cannot plan together; ``str(error)`` says which and what to give instead."""


@dataclass(frozen=True)
class PlanRequest:
    """The options of one planning run.

    ``budget``: ``--budget`` text (``4 GiB``, ``50% hint``, ``checkpoint-half``); ``preset``: a name of
    :data:`~memoplan.planner.presets.PRESETS`; ``planner``: a :class:`Planner` value
    (``optimal``, ``greedy``, ``sublinear``); ``hint``: the budget is a hint, whatever it
    says; ``nested``: offer each block's children too (optimal planner, byte budget);
    ``dtr``: write a plan with one ``dtr`` block; ``sublinear_options``: the sublinear
    search's options given (their spellings, for the message); ``coverage``: ``--coverage``
    text (a share or a count of the candidates), instead of ``budget``; ``start``: a plan to
    complete, written at ``start_name``; ``sources``: the model and the example are given
    (a new plan needs both).
    """

    budget: str | None = None
    coverage: str | None = None
    preset: str | None = None
    planner: str | None = None
    hint: bool = False
    nested: bool = False
    dtr: bool = False
    sublinear_options: tuple[str, ...] = ()
    start: ast.Plan | None = None
    start_name: str | None = None
    sources: bool = True
    device: bool = False  # the budget may be the device's, `device [- SIZE]` (the command line's)

    def check(self) -> None:
        """Refuse, before any work, a request that cannot plan (:class:`PlanRequestError`)."""
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

    def budget_and_mode(self, parsed: tuple[BudgetLike | None, bool | None] | None = None):
        """(budget, hard): ``parsed`` (default: :attr:`budget` parsed), else the completed plan's
        own budget statement; ``hint`` makes it a hint."""
        if parsed is None:
            parsed = parse_budget(self.budget, device=self.device) if self.budget is not None else (None, None)
        budget, hard = parsed
        if self.coverage is not None:
            try:
                budget = parse_coverage(self.coverage)
            except ValueError as exc:
                raise PlanRequestError(str(exc)) from None
        if self.budget is None and self.coverage is None and self.start is not None and self.start.budget is not None:
            budget, hard = budget_from_ast(self.start.budget), is_hard(self.start.budget)
        return budget, (False if self.hint else hard)

    def make_preset(self, parsed: tuple[BudgetLike | None, bool | None] | None = None) -> PlannerPreset:
        """The preset this request plans with: the named one (else the default) under the options."""
        budget, hard = self.budget_and_mode(parsed)
        block = self.sublinear_block()
        planner = Planner(self.planner) if self.planner else (Planner.SUBLINEAR if block is not None else None)
        base = PRESETS[self.preset] if self.preset else DEFAULT
        return base.with_overrides(planner=planner, budget=budget, hard=hard)

    def check_preset(self, preset: PlannerPreset, *, sublinear: bool) -> None:
        """Refuse what the preset makes impossible; ``sublinear``: the sublinear search is configured."""
        if sublinear and preset.planner is not Planner.SUBLINEAR:
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


def plan(
    model,
    example,
    budget: str | None = None,
    *,
    coverage: str | None = None,
    preset: str | None = None,
    planner: str | None = None,
    hint: bool = False,
    nested: bool = False,
    start=None,
    sublinear=None,
    profile=None,
    method: str = "auto",
    progress: bool = False,
    step=None,
    device=None,
    device_memory=None,
) -> PlanResult:
    """Plan ``model`` on ``example`` for ``budget`` (``"4 GiB"``, ``"50%"``, ``"60% hint"``,
    ``"checkpoint-half"``), a ``coverage`` (``"60%"`` or ``"5"`` of the candidate modules) or a ``preset`` (``safe``, ``balanced``, ``memory``, ``exhaustive``), as
    ``memoplan plan`` does; return the :class:`~memoplan.planner.plan.PlanResult`: ``.plan``
    (a :class:`memoplan.syntax.ast.Plan`, with its ``budget`` statement; ``format_plan`` writes
    it) and the figures (``measured_before``, ``measured_after``, ``met``, ``regions``).

    ``example``: a tensor, a tuple of arguments or a :class:`memoplan.specs.Example`.
    ``planner``: ``optimal``, ``greedy`` or ``sublinear``; ``hint``: the budget is not
    enforced; ``nested``: offer each block's children too; ``start``: a plan (``Plan``, path or
    text) whose rules are kept and completed; ``sublinear``: a
    :class:`memoplan.syntax.blocks.SublinearConfig` (with ``planner="sublinear"``); ``profile``:
    a :class:`~memoplan.planner.profile.Profile` already taken, else one is taken by ``method``
    (``auto``, ``measured``, ``estimated``); ``step``: the training step planned for, a
    :class:`memoplan.syntax.blocks.StepConfig` (default ``start``'s), written as the plan's `step` block;
    ``device`` and ``device_memory``: the device planned for and its capacity (``"cuda"``, ``"80GiB"``
    or bytes), as ``--device`` and ``--device-memory`` (:func:`memoplan.planner.aim.aimed`; ``budget="device"``
    is the device's memory less what the model holds).  Impossible combinations raise
    :class:`PlanRequestError` (a :class:`ValueError`) before the model runs; a hard budget
    that no plan meets raises :class:`memoplan.PlanError` (MP601).  ``model`` is not changed.
    """
    from dataclasses import replace

    from memoplan.api import as_plan
    from memoplan.planner.aim import aimed, device_budget_refused
    from memoplan.planner.budgets import DeviceBudget
    from memoplan.planner.profile import as_example
    from memoplan.planner.write import with_budget

    parsed_start = None if start is None else as_plan(start)
    request = PlanRequest(
        budget=budget,
        coverage=coverage,
        preset=preset,
        planner=planner,
        hint=hint,
        nested=nested,
        sublinear_options=("`sublinear`",) if sublinear is not None else (),
        start=parsed_start,
        start_name=None if parsed_start is None else parsed_start.file,
        device=True,
    )
    request.check()
    chosen = request.make_preset()
    if isinstance(chosen.budget, DeviceBudget):  # `device [- SIZE]`: bytes once on the device
        device_budget_refused(chosen.budget, device, device_memory)
    request.check_preset(chosen, sublinear=sublinear is not None or request.sublinear_block() is not None)
    request.check_nested(chosen)
    if sublinear is None and request.sublinear_block() is not None:
        sublinear = _config_of(request.sublinear_block())
    from memoplan.planner.write import with_step
    from memoplan.step import make_step, running

    config = _step_config(step, parsed_start)  # the `step` block of `start` with `step` over it
    ran = make_step(config)
    aim = aimed(model, as_example(example), device, device_memory, ran, method=method, plan=parsed_start)
    with aim as (model, example), running(ran):
        chosen = _on_device(chosen, model, device, device_memory, config)
        options = {"named": preset is not None, "nested": nested, "sublinear": sublinear, "start": parsed_start}
        result = _search(chosen, model, example, profile, method, progress, config, options)
    return replace(result, plan=with_step(with_budget(result.plan, chosen.budget, chosen.hard), config, "."))


def _on_device(chosen: PlannerPreset, model, device, device_memory, config) -> PlannerPreset:
    """``chosen`` with a device budget turned into its bytes: the device's less what the model holds there."""
    from dataclasses import replace

    from memoplan.planner.aim import device_budget_limit
    from memoplan.planner.budgets import DeviceBudget

    if not isinstance(chosen.budget, DeviceBudget):
        return chosen
    limit = device_budget_limit(chosen.budget, model, device, device_memory, config, lambda line: None)
    return replace(chosen, budget=limit)


def _search(chosen, model, example, profile, method: str, progress: bool, config, options) -> PlanResult:
    """The preset's search over ``profile``, else over one taken now by ``method`` for ``config``'s step."""
    from memoplan.planner.estimate import take_profile

    if profile is None:
        profile = take_profile(
            model, example, method=method, progress=progress, shards=config.shards, optimizer=config.optimizer
        )
    else:  # MP604: a profile of another step than the one planned
        from memoplan.planner.stamp import check_same_step
        from memoplan.planner.target import target_for

        check_same_step(profile, model, config, example, target_for(model).device, "the profile")
    return chosen.run(model, example, prof=profile, progress=progress, **options)


def _config_of(block):
    from memoplan.syntax.blocks import config_of

    return config_of(block)


def _step_config(step, start):
    """The step ``plan`` plans for: ``start``'s `step` block with the keys ``step`` sets (those
    that differ from the default step) over it; MP254 where they contradict the block."""
    from dataclasses import fields

    from memoplan.step import merged, step_block
    from memoplan.syntax.blocks import StepConfig

    written, spans = step_block(start)
    default = StepConfig()
    given = {} if step is None else {f.name: getattr(step, f.name) for f in fields(step)}
    given = {k: v for k, v in given.items() if written is None or v != getattr(default, k)}
    return merged(written, spans, given, None if start is None else start.source)
