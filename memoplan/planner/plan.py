"""Planner stage: a model, an example and a budget in; a reviewed, measured plan out.

profile (measure) -> chain of candidates -> search (pure) -> plan AST -> apply to a copy and
measure again -> optional measured refinement (:mod:`memoplan.planner.search.refine`) -> measure
the final plan.  A ``hard`` budget is verified by that last measurement: when the measured
peak is over the limit the result says so, with the smallest peak the cost model can reach.
Named presets of these choices are in :mod:`memoplan.planner.presets`.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import replace

from torch import nn

from memoplan.measure import gc_frozen
from memoplan.planner import levels, search, tell
from memoplan.planner.advice import recommendation
from memoplan.planner.chainruns import chain_container, segmented
from memoplan.planner.config import Planner, RefineOptions
from memoplan.planner.least import least_peak
from memoplan.planner.onelevel import plan_level
from memoplan.planner.profiling.profile import profile
from memoplan.planner.profiling.schema import Profile
from memoplan.planner.profiling.shard import SHARDS
from memoplan.planner.profiling.shrink import ESTIMATING as _ESTIMATING
from memoplan.planner.profiling.shrink import StepOutOfMemory, is_out_of_memory
from memoplan.planner.profiling.target import aimed_at
from memoplan.planner.search.write import (  # noqa: F401  (kept importable from here)
    comment_line,
    compressed,
    provenance,
    rebased,
    sublinear_summary,
    under_header,
    with_sources,
    with_state_rules,
)
from memoplan.planner.trial import (  # noqa: F401  (PlanResult, BudgetMissed and Search kept importable from here)
    BudgetMissed,
    PlanResult,
    Search,
    fixed_by,
    missed_budget,
)
from memoplan.progress import REPORTER
from memoplan.specs import Example
from memoplan.syntax import ast
from memoplan.syntax.blocks import SublinearConfig


def make_plan(
    model: nn.Module,
    example: Example,
    budget: search.Budget | search.Preset | search.LeastPeak,
    *,
    planner: Planner = Planner.OPTIMAL,
    hard: bool = True,
    prof: Profile | None = None,
    progress: bool = True,
    refine: RefineOptions | None = None,
    preset: str | None = None,
    nested: bool = False,
    sublinear: SublinearConfig | None = None,
    start: ast.Plan | None = None,
    trials: str | None = None,
    whole: bool = False,
) -> PlanResult:
    """Plan ``model`` for ``budget``; raise :class:`PlanError` (MP601) when a hard budget is missed.

    A hard budget is checked by measuring one step with the plan; when the measurement
    is over the limit, the search is repeated with the estimate's limit lowered by the
    overshoot (up to ``calibrate.MAX_REFINEMENTS`` times) before giving up.  ``refine`` runs measured
    refinement levels on the result; the refined plan is measured once more and that
    measurement is what the budget is checked against.  ``preset`` names it in the header.
    The optimal planner's search for a byte budget offers, beside whole candidates, every part of
    each that saves memory (:func:`nested_candidates`) and their save variants (``checkpoint
    save = [...]``, :mod:`memoplan.planner.search.opsave`), solved exactly (a MILP, with a time limit);
    ``whole``: whole candidates only; ``nested``: parts required (an error for another planner or
    a coverage budget).  Every measurement runs on a copy: ``model`` and the RNG are unchanged.

    Before refusing a hard budget the search widens itself (runs of a chain, time chunks, parts
    with split regions: the header's ``widened``); when none meets the limit, MP601 names the
    least-peak plan of every level (:func:`least_peak`), and a hint budget writes that plan.

    ``sublinear``: the sublinear search's settings (``planner=Planner.SUBLINEAR``; default: MegEngine's).

    ``start``: a hand-written plan to complete (``memoplan plan PLAN``).  Its rules are fixed: no
    candidate overlaps a module it checkpoints, compresses, chunks or marks ``keep`` (nor its
    ancestors or descendants); every measurement is of its rules with the planner's, and the cost
    model's base is the measured peak of its rules alone.  The result is ``start`` with the
    planner's rules and header after its own, or ``start`` itself when its rules meet the budget.
    Measured refinement does not run on a completed plan (it could edit the fixed rules).

    ``trials`` (:func:`_trials`): ``"estimated"``, each on fake tensors and the written plan checked
    by one real step (with a measured profile, real trials again when that misses a hard budget or
    a trial cannot be estimated); ``"measured"``, real steps; None (default): as the profile was taken.
    """
    if nested and (planner is not Planner.OPTIMAL or isinstance(budget, (search.Coverage, search.Preset))):
        raise ValueError("nested candidates need the optimal planner and a byte budget (bytes or a share of the peak)")
    if sublinear is not None and planner is not Planner.SUBLINEAR:
        raise ValueError("sublinear settings need the sublinear planner")
    prof = prof or profile(model, example, progress=progress)
    how = Search(planner, sublinear or SublinearConfig())
    if start is not None:
        if refine is not None and refine.levels:
            raise ValueError("measured refinement does not run on a completed plan")
        how = fixed_by(start, model, how)
    least = isinstance(budget, search.LeastPeak)
    deep = nested or (not whole and planner is Planner.OPTIMAL and isinstance(budget, search.ByteBudget))
    if (deep or least) and not whole:
        how = replace(how, uses=levels.op_uses_of(model, example, prof, progress))
    estimating = _trials(trials, prof)

    def searched(estimate: bool) -> PlanResult:
        # Estimated trials run on fake tensors (memoplan.planner.profiling.estimate.estimate_plan), and one
        # real planned step checks the result.
        token, shards = _ESTIMATING.set(estimate), SHARDS.set(prof.shards)
        try:
            if least:
                return least_peak(model, example, how, prof, progress, refine, preset, whole=whole)
            first = levels.ALL if deep else levels.WHOLE
            return _widening(model, example, budget, how, hard, prof, progress, refine, preset, first, start)
        finally:
            _ESTIMATING.reset(token)
            SHARDS.reset(shards)

    with gc_frozen():  # each trial's collection walks its own objects only
        return _search(model, prof, searched, estimating, progress)


def _search(model: nn.Module, prof: Profile, searched, estimating: bool, progress: bool) -> PlanResult:
    """``searched`` as the trials say (:func:`_estimated_first`), aimed at the profile's target device."""
    with aimed_at(model, prof):
        if not estimating or prof.method == "estimated":
            return searched(estimating)
        return _estimated_first(searched, progress)


#: Whether a search with real trials follows a miss of this one (:func:`_estimated_first`): its
#: misses are then raised as they are, before the least-peak plan of every level is looked for.
_SEARCHED_AGAIN: ContextVar[bool] = ContextVar("memoplan_plan_searched_again", default=False)


def _estimated_first(searched, progress: bool) -> PlanResult:
    """``searched(True)`` (every trial on fake tensors, the plan checked by one real step), else
    ``searched(False)`` (real trials) when its plan measures over a hard budget or a trial could
    not be estimated.  Running out of memory is raised as it is."""
    token = _SEARCHED_AGAIN.set(True)
    try:
        return searched(True)
    except Exception as exc:  # noqa: BLE001  any failure of the estimate: the measured search decides
        if isinstance(exc, StepOutOfMemory) or is_out_of_memory(exc):
            raise
        if isinstance(exc, BudgetMissed):
            why = "no plan found measures within the budget"
        else:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            why = f"a trial could not be estimated ({type(exc).__name__}: {first})"
    finally:
        _SEARCHED_AGAIN.reset(token)
    if progress:
        REPORTER.say(f"estimated trials: {why}; searching again with real steps (slower)")
    return searched(False)


TRIALS = ("estimated", "measured")


def _trials(trials: str | None, prof: Profile) -> bool:
    """Whether the search's trials are estimated on fake tensors (``trials``: see :func:`make_plan`)."""
    if trials is None:
        return prof.method == "estimated"
    if trials not in TRIALS:
        raise ValueError(f"trials must be one of {', '.join(TRIALS)}, not {trials!r}")
    if trials == "measured" and prof.method == "estimated":
        raise ValueError("measured trials need a measured profile: the unplanned step of this one does not fit")
    return trials == "estimated"


def _widening(
    model, example, budget, how: Search, hard: bool, prof: Profile, progress: bool, refine, preset, first: str, start
):
    """The search for ``budget`` over the ``first`` candidates, widened (runs of a chain, time
    chunks, parts of blocks with split regions) when they miss it; when every search misses, the
    least-peak plan of every level (:func:`least_peak`): MP601 names it, a hint budget writes it.

    A hint budget is searched as a hard one (measured), so that a plan within the limit is found
    where one exists; only the header's ``budget mode`` says ``hint``.
    """
    args = (model, example, budget, how, True, prof, progress, refine, preset)
    try:
        return levels.as_hint(plan_level(*args, nested=first), hard)
    except BudgetMissed as first_miss:
        missed = first_miss
    misses = [missed]
    if chain_container(model, prof, how) is not None:  # a chain without blocks: runs of its children
        try:
            runs = segmented(model, example, budget, how, prof, preset, missed, progress, parts=first != levels.WHOLE)
            return levels.as_hint(runs, hard)
        except BudgetMissed as also:
            misses.append(also)
    what = "checkpoints of whole blocks" if first == levels.WHOLE else "checkpoints of blocks and their parts"
    tried = "whole blocks" if first == levels.WHOLE else "blocks or their parts"
    for wider, deeper, offered in levels.widenings(model, prof, refine, start is not None):
        widened = f"{offered} offered: {what} measure {missed.peak} B at the least, over the limit {missed.limit} B"
        if progress:
            tell.widened(missed.peak, missed.limit, offered, widened, tried=tried)
        args = (model, example, budget, replace(how, planner=Planner.OPTIMAL), True, prof, progress, wider, preset)
        try:
            return levels.as_hint(plan_level(*args, nested=deeper, widened=widened), hard)
        except BudgetMissed as also:
            misses.append(also)
    return _refused(model, example, budget, how, hard, prof, progress, refine, preset, misses, first == levels.WHOLE)


def _refused(model, example, budget, how: Search, hard: bool, prof, progress, refine, preset, misses, whole: bool):
    """No search met the limit: the least-peak plan of every level, raised as MP601 (hard) or
    written as the hint's plan; the plans the searches measured count among the levels.  When a
    search with real trials follows (the estimated trials missed), the least miss is raised to it."""
    if _SEARCHED_AGAIN.get():
        raise min(misses, key=lambda missed: missed.peak)
    found = [("the budget's search", m.result) for m in misses if m.result is not None]
    if progress:
        REPORTER.say("no plan meets the budget: looking for the least peak of every level")
    best = least_peak(model, example, how, prof, progress, refine, preset, whole=whole, found=found)
    limit = misses[0].limit
    if best.measured_after > limit and hard:
        why = levels.explained(model, example, best.plan, best.measured_after, prof)
        least = missed_budget(limit, best.measured_after, best.choice.minimum_peak, least_measured=True, why=why)
        raise replace(least, result=best)
    advice = recommendation(prof, model, best.region_modules, limit, best.measured_after, nested=not whole)
    return levels.over_budget(best, budget, limit, hard, advice)
