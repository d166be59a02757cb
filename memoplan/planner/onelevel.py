"""Planner stage: one search over one level of candidates, its set settled by measurement,
refined, measured once more and written with its header (:func:`plan_level`).
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from memoplan.planner import levels, search, trial
from memoplan.planner.advice import recommendation
from memoplan.planner.budgets import mode_line
from memoplan.planner.config import Planner, RefineOptions
from memoplan.planner.profiling.schema import Profile
from memoplan.planner.profiling.shard import SHARDS
from memoplan.planner.profiling.shrink import ESTIMATING as _ESTIMATING
from memoplan.planner.profiling.target import hard_mode, no_real_step, planned_peak_name, unplanned_peak_name
from memoplan.planner.search import calibrate
from memoplan.planner.search.held import Predictor
from memoplan.planner.search.refine import refine as refine_plan
from memoplan.planner.search.write import provenance, under_header
from memoplan.planner.trial import (
    BudgetMissed,
    PlanResult,
    Search,
    checked,
    draft_plan,
    empty_choice,
    limit_of,
    missed_budget,
    within,
)
from memoplan.specs import Example
from memoplan.syntax import ast
from memoplan.syntax.formatter import format_selector


def plan_level(
    model: nn.Module,
    example: Example,
    budget: search.Budget,
    planner: Search,
    hard: bool,
    prof: Profile,
    progress: bool,
    refine: RefineOptions | None,
    preset: str | None,
    *,
    nested: str,
    widened: str | None = None,
) -> PlanResult:
    """:func:`make_plan` over one level of candidates (``nested``: ``levels.WHOLE``, ``levels.ALL``, ...); ``widened``: why."""
    items, packed = levels.candidates(prof, nested, planner.blocks, planner.uses, model)
    planner = replace(planner, packed=packed)  # inputs seen binary: `compress input = bit`
    peak, met = _fixed_rules(model, example, budget, planner, hard, prof, items)
    if met is not None:
        return met
    base = search.unplanned_base(peak, items)
    choice = planner(items, budget, base)
    limit = choice.limit
    least_set = False  # the plan is the least-peak set (refined): what MP601 then reports
    try:
        choice, after = settled(model, example, items, choice, planner, base, hard, prof)
    except BudgetMissed as missed:
        if not widened:
            raise
        # The widened search refines its least-peak set before refusing: split regions may reach the limit.
        least = Search(Planner.OPTIMAL)(items, search.Bytes(choice.minimum_peak), base)
        note = f"no set measures within the limit; refined from the least-peak set ({missed.peak} B)"
        choice = replace(least, budget=choice.budget, limit=limit, status=search.Status.OK, reason=note)
        after, least_set = missed.peak, True
    refined = None
    draft = draft_plan(choice, items, model, {}, planner)
    if refine is not None and refine.levels:
        weights = {name: prof.subtree_saved_bytes(name) for name in prof.names}
        refined = refine_plan(model, example, draft, refine, baseline=after, weights=weights, progress=progress)
        draft = refined.plan
        # Verify by measurement: the budget is checked against the plan as written.
        after = trial.measure(model, example, draft)
    estimated, after = _final_check(model, example, draft, after)
    header = _header(model, prof, preset, hard, choice, widened, draft, refined, estimated, after, limit, nested)
    plan = under_header(draft, draft_plan(choice, items, model, header, planner), planner.start)
    result = PlanResult(plan, choice, prof.peak_bytes, after, limit, hard, refined)
    if hard and not result.met:
        raise replace(missed_budget(limit, after, choice.minimum_peak, least_measured=least_set), result=result)
    return result


def _fixed_rules(
    model, example, budget, planner: Search, hard: bool, prof: Profile, items
) -> tuple[int, PlanResult | None]:
    """The peak the search works from: the unplanned one, or what the hand-written rules leave
    (measured); and the result when those rules alone meet the budget (None otherwise)."""
    peak = prof.peak_bytes
    if not planner.fixed:
        return peak, None
    fixed = draft_plan(None, items, model, {}, planner)
    peak = trial.measure(model, example, fixed)
    if within(budget, peak, prof.peak_bytes) and _ESTIMATING.get() and no_real_step(model) is None:
        peak = checked(model, example, fixed)  # estimated within: one real step says so
    if not within(budget, peak, prof.peak_bytes):
        return peak, None
    limit = limit_of(budget, prof.peak_bytes)
    assert planner.start is not None, "fixed rules come from a start plan"
    choice = empty_choice(budget, peak, prof.peak_bytes)
    return peak, PlanResult(planner.start, choice, prof.peak_bytes, peak, limit, hard)


def _header(
    model, prof: Profile, preset, hard: bool, choice, widened, draft: ast.Plan, refined, estimated, after, limit, nested
) -> dict[str, str]:
    """The plan header of one level's plan: provenance, budget mode, the search, the peaks, advice."""
    header = {
        **provenance("memoplan plan", prof),
        **({"preset": preset} if preset else {}),
        "budget mode": hard_mode(model) if hard else mode_line(False),
        **search.describe(choice),
        **({"widened": widened} if widened else {}),
        **(_refined_recompute(draft, choice, prof) if refined is not None else {}),
        **({"refinement": refined.summary()} if refined is not None else {}),
        unplanned_peak_name(prof): f"{prof.peak_bytes} B",
        **estimated,
        planned_peak_name(model): f"{after} B",
    }
    if limit is not None:
        header["budget limit"] = f"{limit} B"
    regions = [format_selector(s.selector) for s in draft.statements if isinstance(s, ast.ModuleRule)]
    advice = recommendation(prof, model, regions, limit, after, nested=nested != levels.WHOLE)
    if advice:
        header["recommendation"] = advice
    return header


def _final_check(model: nn.Module, example: Example, draft: ast.Plan, after: int) -> tuple[dict[str, str], int]:
    """The header lines that say how the planned peak was found, and that peak: one real planned
    step checks a plan whose every trial was estimated; a sharded step is one rank's estimate, and
    a step that cannot run here (a meta model, a GPU not here) is the estimate alone."""
    why = no_real_step(model)
    if why is not None:  # one rank of a sharded step runs only under torch.distributed; a meta model nowhere
        return {("sharded" if SHARDS.get() > 1 else "not run"): why}, after
    if _ESTIMATING.get():
        estimated = {"planned peak on fake tensors": f"{after} B (every trial of the search estimated)"}
        return estimated, checked(model, example, draft)
    return {}, after


def settled(model, example, items, choice: search.Choice, planner: Search, base: int, hard: bool, prof: Profile):
    """(choice, measured peak): the search's set, settled by measured trials for a hard budget
    (:func:`memoplan.planner.search.calibrate.settled`), predicted from the profile's bytes
    between module boundaries where it has them and no hand-written rule changes the step."""

    def measure(c: search.Choice) -> int:
        return trial.measure(model, example, draft_plan(c, items, model, {}, planner))

    held = prof.held
    predictor = None
    if held is not None and not planner.fixed and planner.planner is Planner.OPTIMAL:
        predictor = Predictor(items, held.peaks, held.windows, base)
    trials = calibrate.Trials(items, planner, base, measure, missed_budget, predictor)
    return calibrate.settled(trials, choice, hard)


def _refined_recompute(plan: ast.Plan, choice: search.Choice, prof: Profile) -> dict[str, str]:
    """The header's ``recompute`` for the refined plan's regions, when refinement changed them.

    Each region costs its module's measured forward time (a region of chunks or segments too:
    backward replays each part once).  ``(proven least)`` belongs to the search's set only.
    """
    regions = [
        format_selector(stmt.selector)
        for stmt in plan.statements
        if isinstance(stmt, ast.ModuleRule)
        and any(isinstance(p, (ast.Checkpoint, ast.TemporalChunk)) for p in stmt.policies)
    ]
    if tuple(regions) == tuple(choice.names):
        return {}
    seconds = sum(prof[name].recompute_seconds for name in regions if name in prof)
    return {"recompute": search.recompute_line(seconds, len(regions), "(after refinement)")}
