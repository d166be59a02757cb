"""Planner stage: a model, an example and a budget in; a reviewed, measured plan out.

profile (measure) -> chain of candidates -> search (pure) -> plan AST -> apply to a copy and
measure again -> optional measured refinement (:mod:`memoplan.planner.refine`) -> measure
the final plan.  A ``hard`` budget is verified by that last measurement: when the measured
peak is over the limit the result says so, with the smallest peak the cost model can reach.
Named presets of these choices are in :mod:`memoplan.planner.presets`.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field, replace

from torch import nn

from memoplan.diagnostics import Diagnostic, PlanError
from memoplan.measure import gc_frozen
from memoplan.planner import calibrate, levels, opsave, search, segments, tell
from memoplan.planner.advice import recommendation
from memoplan.planner.config import Planner, RefineOptions
from memoplan.planner.profile import profile
from memoplan.planner.refine import Refinement, measure_plan
from memoplan.planner.refine import refine as refine_plan
from memoplan.planner.schema import Profile, chain, default_candidates
from memoplan.planner.shard import SHARDS
from memoplan.planner.shrink import ESTIMATING as _ESTIMATING
from memoplan.planner.shrink import StepOutOfMemory, is_out_of_memory
from memoplan.planner.target import aimed_at, hard_mode, no_real_step, planned_peak_name, unplanned_peak_name
from memoplan.planner.write import (  # noqa: F401  (kept importable from here)
    comment_line,
    compressed,
    provenance,
    rebased,
    sublinear_summary,
    under_header,
    with_sources,
    with_state_rules,
)
from memoplan.progress import REPORTER
from memoplan.resolver import resolve
from memoplan.specs import Example
from memoplan.syntax import ast
from memoplan.syntax.blocks import SublinearConfig
from memoplan.syntax.formatter import format_selector


@dataclass(frozen=True)
class PlanResult:
    plan: ast.Plan
    choice: search.Choice
    measured_before: int  # bytes, one unplanned training step (the profile's peak)
    measured_after: int  # bytes, one step with the plan
    limit: int | None  # the byte limit the budget resolved to (None: coverage)
    hard: bool
    refinement: Refinement | None = None  # the measured refinement, when levels ran

    @property
    def met(self) -> bool:
        return self.limit is None or self.measured_after <= self.limit

    @property
    def region_modules(self) -> tuple[str, ...]:
        """The selectors of the plan's rules that make regions (``checkpoint`` or ``temporal_chunk``), in order."""
        return tuple(
            format_selector(stmt.selector)
            for stmt in self.plan.statements
            if isinstance(stmt, ast.ModuleRule)
            and any(isinstance(p, (ast.Checkpoint, ast.TemporalChunk)) for p in stmt.policies)
        )

    @property
    def regions(self) -> int:
        """Rules of the plan that make checkpoint regions (``checkpoint`` or ``temporal_chunk``)."""
        return len(self.region_modules)


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
    save = [...]``, :mod:`memoplan.planner.opsave`), solved exactly (a MILP, with a time limit);
    ``whole``: whole candidates only; ``nested``: parts required (an error for another planner or
    a coverage budget).  Every measurement runs on a copy: ``model`` and the RNG are unchanged.

    Before refusing a hard budget the search widens itself (runs of a chain, time chunks, parts
    with split regions: the header's ``widened``); when none meets the limit, MP601 names the
    least-peak plan of every level (:func:`_least_peak`), and a hint budget writes that plan.

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
        how = _fixed_by(start, model, how)
    least = isinstance(budget, search.LeastPeak)
    deep = nested or (not whole and planner is Planner.OPTIMAL and isinstance(budget, search.ByteBudget))
    if (deep or least) and not whole:
        how = replace(how, uses=levels.op_uses_of(model, example, prof, progress))
    estimating = _trials(trials, prof)

    def searched(estimate: bool) -> PlanResult:
        # Estimated trials run on fake tensors (memoplan.planner.estimate.estimate_plan), and one
        # real planned step checks the result.
        token, shards = _ESTIMATING.set(estimate), SHARDS.set(prof.shards)
        try:
            if least:
                return _least_peak(model, example, how, prof, progress, refine, preset, whole=whole)
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
    least-peak plan of every level (:func:`_least_peak`): MP601 names it, a hint budget writes it.

    A hint budget is searched as a hard one (measured), so that a plan within the limit is found
    where one exists; only the header's ``budget mode`` says ``hint``.
    """
    args = (model, example, budget, how, True, prof, progress, refine, preset)
    try:
        return levels.as_hint(_make_plan(*args, nested=first), hard)
    except BudgetMissed as first_miss:
        missed = first_miss
    misses = [missed]
    if _chain_container(model, prof, how) is not None:  # a chain without blocks: runs of its children
        try:
            segmented = _segmented(
                model, example, budget, how, prof, preset, missed, progress, parts=first != levels.WHOLE
            )
            return levels.as_hint(segmented, hard)
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
            return levels.as_hint(_make_plan(*args, nested=deeper, widened=widened), hard)
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
    best = _least_peak(model, example, how, prof, progress, refine, preset, whole=whole, found=found)
    limit = misses[0].limit
    if best.measured_after > limit and hard:
        why = levels.explained(model, example, best.plan, best.measured_after, prof)
        least = _missed(limit, best.measured_after, best.choice.minimum_peak, least_measured=True, why=why)
        raise replace(least, result=best)
    advice = recommendation(prof, model, best.region_modules, limit, best.measured_after, nested=not whole)
    return levels.over_budget(best, budget, limit, hard, advice)


def _least_peak(
    model, example, how: Search, prof: Profile, progress: bool, refine, preset, *, whole: bool = False, found=()
) -> PlanResult:
    """The plan with the least measured peak of every level :func:`make_plan` searches.

    Each search runs for a limit no plan meets (0 B), so each ends in its least-peak plan,
    refined and measured: whole candidates, their parts, the leaves inside them, their save
    variants, runs of a chain, time chunks of stateful regions, and everything at once (parts,
    save variants, split regions).  The lowest measured peak is kept (the first among equals:
    the level with the fewest kinds of rules); ``found``: (what, plan) already measured by the
    caller, which count too.  Its header says which level it came from and what the others
    measured.  ``whole``: whole candidates and runs of a chain only.
    """
    zero = search.Bytes(0)
    how = replace(how, planner=Planner.OPTIMAL)

    def searched(levels, level: str, what: str):
        args = (model, example, zero, how, True, prof, progress, levels, preset)
        return lambda: _make_plan(*args, nested=level, widened=what)

    attempts = [(levels.LEVELS[levels.WHOLE], searched(refine, levels.WHOLE, "least"))]
    if not whole:
        attempts += [
            (levels.LEVELS[level], searched(refine, level, levels.LEVELS[level]))
            for level in (levels.PARTS, levels.LEAVES, levels.SAVES)
        ]
    if _chain_container(model, prof, how) is not None:
        unplanned = BudgetMissed((), limit=0, peak=prof.peak_bytes)
        attempts.append(
            ("runs of a chain", lambda: _segmented(model, example, zero, how, prof, preset, unplanned, progress))
        )
    for wider, deeper, offered in levels.widenings(model, prof, refine, how.start is not None):
        if deeper == levels.WHOLE or not whole:
            attempts.append((offered, searched(wider, deeper, offered)))
    found = list(found)
    with REPORTER.stage("looking for the least peak", len(attempts), "searches") if progress else nullcontext():
        for what, attempt in attempts:
            if progress:
                REPORTER.detail(f"least peak: searching {what}")
            try:
                attempt()
            except BudgetMissed as missed:
                if missed.result is not None:
                    found.append((what, missed.result))
            if progress:
                REPORTER.advance()
    return _lowest(found, model, how, prof)


def _lowest(found, model, how: Search, prof: Profile) -> PlanResult:
    """The plan of least measured peak among ``found`` ((what, plan) pairs), its header saying so."""
    if not found:  # nothing to checkpoint: the unplanned step is the least
        plan = _draft(None, [], model, provenance("memoplan plan", prof), how)
        choice = _empty_choice(search.LeastPeak(), prof.peak_bytes, prof.peak_bytes)
        return PlanResult(plan, choice, prof.peak_bytes, prof.peak_bytes, None, True)
    what, best = min(found, key=lambda f: f[1].measured_after)
    others = "; ".join(f"{w}: {r.measured_after} B" for w, r in found)
    # What the level's search for 0 B said of its limit (`budget`, `widened`, `recommendation`...) is not this plan's.
    skip = (
        "# budget",
        "# widened:",
        "# status:",
        "# note:",
        "# cost model, peak after:",
        "# least of:",
        "# recommendation:",
    )
    lines = [line for line in best.plan.header_comments.leading if not line.startswith(skip)]
    at = next((i for i, line in enumerate(lines) if line.startswith("# planner:")), len(lines))
    lines[at + 1 : at + 1] = [
        comment_line(f"budget: {search.LeastPeak().describe(prof.peak_bytes)}"),
        comment_line(f"least of: {others}; kept {what}"),
    ]
    plan = replace(best.plan, header_comments=replace(best.plan.header_comments, leading=tuple(lines)))
    choice = replace(best.choice, budget=search.LeastPeak(), limit=None, status=search.Status.OK)
    return replace(best, plan=plan, choice=choice, limit=None)


def _chain_container(model: nn.Module, prof: Profile, how: Search) -> str | None:
    """The ``nn.Sequential`` whose children are the candidates, when runs of them may be regions.

    That is the default candidates' parent (the root too, for a model that is itself an
    ``nn.Sequential``: ``module ""`` selects it), when it is an ``nn.Sequential`` that
    ``segments``/``split`` may cut (MP306), has at least 3 children and is not fixed by a
    completed plan.
    """
    names = default_candidates(prof)
    if not names:
        return None
    parent = names[0].rpartition(".")[0]
    if how.blocks(parent):
        return None
    module = model.get_submodule(parent)
    if type(module).forward is not nn.Sequential.forward or len(module._modules) < 3:
        return None
    return parent


def _segmented(
    model, example, budget, how: Search, prof: Profile, preset, missed: BudgetMissed, progress: bool, *, parts=False
):
    """A plan of runs of the chain container's children (:mod:`memoplan.planner.segments`), measured.

    Two splits are measured: the least-peak split of the cost model (``split = [...]``) and Chen
    et al.'s sqrt(n) near-equal runs (``segments = k``).  Every split recomputes the container
    once, so the lower measured peak wins; MP601 (``BudgetMissed``) when it is over the limit.
    ``missed``: what the search before it measured at the least; ``parts``: that search offered the
    children's parts too (the header's ``widened`` says which).
    """
    parent = _chain_container(model, prof, how)
    assert parent is not None, "called only when there is a chain container"
    children = list(model.get_submodule(parent)._modules)
    paths = [f"{parent}.{c}" if parent else c for c in children]
    links = {link.name: link for link in chain(prof, paths)}
    saved = [links[p].saved_bytes if p in links else 0 for p in paths]
    inputs = [links[p].input_bytes if p in links else 0 for p in paths]
    rest = prof.peak_bytes - sum(saved)
    least = segments.least_peak_split(saved, inputs)
    chen = segments.split_cost(saved, inputs, segments.sqrt_split(len(children)))
    options = [(least, ast.Checkpoint(split=tuple(children[i] for i in least.starts[1:])), "least-peak split")]
    if chen.starts != least.starts:
        options.append((chen, ast.Checkpoint(segments=chen.runs), "Chen et al.'s sqrt(n) segments"))
    limit = _limit(budget, prof.peak_bytes)
    seconds = prof[parent].forward_seconds
    shown = parent or "the model itself"
    best = None
    for split, policy, what in options:
        term = ast.SelectorTerm(path=ast.PathPattern(tuple(ast.Name(p) for p in parent.split("."))))
        why = comment_line(
            f"{what}: {split.runs} regions over {len(children)} children, estimated {rest + split.cost} B"
        )
        rule = ast.ModuleRule(ast.Selector(term), (policy,), comments=ast.Comments(leading=(why,)))
        plan = _draft(None, [], model, {}, how, rules=(rule,))
        peak = _measure(model, example, plan)
        if progress:
            tell.split_measured(what, shown, split.runs, peak)
        if best is None or peak < best[0]:
            best = (peak, split, rule, what)
    assert best is not None, "options holds the least-peak split at least"
    peak, split, rule, what = best
    if (
        _ESTIMATING.get() and no_real_step(model) is None
    ):  # the splits' trials were estimated: one real step checks the one kept
        peak = _checked(model, example, _draft(None, [], model, {}, how, rules=(rule,)))
    status = search.Status.OK if limit is None or rest + split.cost <= limit else search.Status.MISSED
    choice = search.Choice(
        f"segments ({what} of {shown}, the least of {len(options)} measured)",
        budget,
        (0,),
        (parent,),
        rest + split.cost,
        prof.peak_bytes,
        seconds,
        limit,
        status,
        rest + least.cost,
        proven_optimal=False,
    )
    one = "its children or their parts" if parts else "its children"
    widened = (
        f"runs of the children of {shown} offered: checkpointing {one} one region each measures "
        f"{missed.peak} B at the least, over the limit {missed.limit} B"
    )
    header = {
        **provenance("memoplan plan", prof),
        **({"preset": preset} if preset else {}),
        "budget mode": hard_mode(model),
        **search.describe(choice),
        "widened": widened,
        unplanned_peak_name(prof): f"{prof.peak_bytes} B",  # as _make_plan names them: measured, or on fake tensors
        planned_peak_name(model): f"{peak} B",
        **({"budget limit": f"{limit} B"} if limit is not None else {}),
    }
    plan = _draft(None, [], model, header, how, rules=(rule,))
    result = PlanResult(plan, choice, prof.peak_bytes, peak, limit, True)
    if not result.met:
        raise replace(_missed(limit, peak, rest + least.cost, least_measured=True), result=result)
    return result


def _make_plan(
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
    peak = prof.peak_bytes
    if planner.fixed:  # what the hand-written rules leave is what the search works from
        fixed = _draft(None, items, model, {}, planner)
        peak = _measure(model, example, fixed)
        if _within(budget, peak, prof.peak_bytes) and _ESTIMATING.get() and no_real_step(model) is None:
            peak = _checked(model, example, fixed)  # estimated within: one real step says so
        if _within(budget, peak, prof.peak_bytes):
            limit = _limit(budget, prof.peak_bytes)
            assert planner.start is not None, "fixed rules come from a start plan"
            return PlanResult(
                planner.start, _empty_choice(budget, peak, prof.peak_bytes), prof.peak_bytes, peak, limit, hard
            )
    base = search.unplanned_base(peak, items)
    choice = planner(items, budget, base)
    limit = choice.limit
    least_set = False  # the plan is the least-peak set (refined): what MP601 then reports
    try:
        choice, after = _settled(model, example, items, choice, planner, base, hard)
    except BudgetMissed as missed:
        if not widened:
            raise
        # The widened search refines its least-peak set before refusing: split regions may reach the limit.
        least = Search(Planner.OPTIMAL)(items, search.Bytes(choice.minimum_peak), base)
        note = f"no set measures within the limit; refined from the least-peak set ({missed.peak} B)"
        choice = replace(least, budget=choice.budget, limit=limit, status=search.Status.OK, reason=note)
        after, least_set = missed.peak, True
    refined = None
    draft = _draft(choice, items, model, {}, planner)
    if refine is not None and refine.levels:
        weights = {name: prof.subtree_saved_bytes(name) for name in prof.names}
        refined = refine_plan(model, example, draft, refine, baseline=after, weights=weights, progress=progress)
        draft = refined.plan
        # Verify by measurement: the budget is checked against the plan as written.
        after = _measure(model, example, draft)
    estimated, after = _final_check(model, example, draft, after)
    header = {
        **provenance("memoplan plan", prof),
        **({"preset": preset} if preset else {}),
        "budget mode": hard_mode(model) if hard else "hint",
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
    plan = under_header(draft, _draft(choice, items, model, header, planner), planner.start)
    result = PlanResult(plan, choice, prof.peak_bytes, after, limit, hard, refined)
    if hard and not result.met:
        raise replace(_missed(limit, after, choice.minimum_peak, least_measured=least_set), result=result)
    return result


def _final_check(model: nn.Module, example: Example, draft: ast.Plan, after: int) -> tuple[dict[str, str], int]:
    """The header lines that say how the planned peak was found, and that peak: one real planned
    step checks a plan whose every trial was estimated; a sharded step is one rank's estimate, and
    a step that cannot run here (a meta model, a GPU not here) is the estimate alone."""
    why = no_real_step(model)
    if why is not None:  # one rank of a sharded step runs only under torch.distributed; a meta model nowhere
        return {("sharded" if SHARDS.get() > 1 else "not run"): why}, after
    if _ESTIMATING.get():
        estimated = {"planned peak on fake tensors": f"{after} B (every trial of the search estimated)"}
        return estimated, _checked(model, example, draft)
    return {}, after


def _settled(model, example, items, choice: search.Choice, planner: Search, base: int, hard: bool):
    """(choice, measured peak): the search's set, settled by measured trials for a hard budget
    (:func:`memoplan.planner.calibrate.settled`)."""

    def measure(c: search.Choice) -> int:
        return _measure(model, example, _draft(c, items, model, {}, planner))

    return calibrate.settled(calibrate.Trials(items, planner, base, measure, _missed), choice, hard)


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


def _draft(
    choice: search.Choice | None, items, model: nn.Module, header: dict[str, str], how: Search, rules=()
) -> ast.Plan:
    """The plan of ``choice`` (None: ``rules``, or no rule of the planner's), after the fixed rules of ``how``."""
    if choice is None:
        lines = tuple(comment_line(f"{key}: {value}") for key, value in header.items())
        plan = ast.Plan(1, tuple(rules), header_comments=ast.Comments(leading=lines))
    else:
        plan = search.to_plan(choice, items, header=header, allow_over_budget=True)
    plan = with_state_rules(compressed(plan, how.packed), model, skip=how.stateful)
    if how.start is None:
        return plan
    start = how.start
    header_comments = replace(
        start.header_comments, leading=(*start.header_comments.leading, *plan.header_comments.leading)
    )
    return replace(start, statements=(*start.statements, *plan.statements), header_comments=header_comments)


def _measure(model: nn.Module, example: Example, plan: ast.Plan) -> int:
    """Measured peak of one step with ``plan``, on a copy; the model and the RNG are left as they were.

    Estimated on fake tensors instead while planning from an estimated profile (``_ESTIMATING``)."""
    return measure_plan(model, example, plan)


def _checked(model: nn.Module, example: Example, plan: ast.Plan) -> int:
    """One real planned step of ``plan``: its measured peak (StepOutOfMemory when it does not fit)."""
    from memoplan.planner.shrink import out_of_memory_as

    token = _ESTIMATING.set(False)
    try:
        with out_of_memory_as("planned"):
            return measure_plan(model, example, plan)
    finally:
        _ESTIMATING.reset(token)


@dataclass(frozen=True)
class Search:
    """The search that chooses a set of checkpoints for a budget: the planner, its settings, and
    the hand-written plan it completes (``start``) with what that plan fixes."""

    planner: Planner
    sublinear: SublinearConfig = SublinearConfig()
    start: ast.Plan | None = None
    regions: frozenset[str] = frozenset()  # checkpointed, compressed, chunked or evicted (`dtr`) by ``start``
    kept: frozenset[str] = frozenset()  # marked `keep` by ``start``: never recomputed, nor any part
    stateful: frozenset[str] = frozenset()  # modules whose state ``start`` already threads
    packed: frozenset[str] = frozenset()  # candidates with binary inputs: checkpointed with `compress input = bit`
    # What each candidate's op families make and cost (memoplan.planner.opsave), for save variants.
    uses: Mapping[str, opsave.OpUse] | None = field(default=None, compare=False)

    @property
    def fixed(self) -> bool:
        return self.start is not None and (bool(self.start.rules) or self.start.block(ast.BlockKind.DTR) is not None)

    def blocks(self, name: str) -> bool:
        """Whether a candidate would touch what ``start`` fixed."""
        inside = lambda a, b: a == b or b.startswith(a + ".") or a == ""  # noqa: E731  a contains b
        return any(inside(name, p) or inside(p, name) for p in self.regions | self.kept)

    def __call__(self, items, budget, base: int) -> search.Choice:
        if isinstance(budget, (search.Coverage, search.Preset)):
            return search.greedy_coverage(items, budget, base_bytes=base)
        if self.planner is Planner.GREEDY:
            return search.greedy_bytes(items, budget, base_bytes=base)
        if self.planner is Planner.SUBLINEAR:
            found = search.sublinear(items, budget, self.sublinear, base_bytes=base)
            return replace(found.choice, planner=sublinear_summary(self.sublinear, found.report))
        return search.optimal(items, budget, base_bytes=base)


def _fixed_by(start: ast.Plan, model: nn.Module, how: Search) -> Search:
    """``how`` completing ``start``: which modules its rules fix (resolved against ``model``)."""
    resolved = resolve(start, model)
    return replace(
        how,
        start=start,
        # A `dtr` block's candidates are its own: the planner adds no rule over them.
        regions=frozenset(m.path for m in resolved.modules if m.changes_forward or m.evict is not None),
        kept=frozenset(m.path for m in resolved.modules if m.keep is not None),
        stateful=frozenset(m.path for m in resolved.modules if m.state is not None),
    )


def _limit(budget, unplanned: int) -> int | None:
    """The byte limit of a byte budget; None for a coverage budget, which has none."""
    return budget.limit(unplanned) if isinstance(budget, (search.Bytes, search.FractionOfPeak)) else None


def _within(budget, peak: int, unplanned: int) -> bool:
    """Whether a measured ``peak`` meets a byte budget (a coverage budget always asks for rules)."""
    limit = _limit(budget, unplanned)
    return limit is not None and peak <= limit


def _empty_choice(budget, peak: int, unplanned: int) -> search.Choice:
    return search.Choice(
        "none: the plan's own rules meet the budget",
        budget,
        (),
        (),
        peak,
        unplanned,
        0.0,
        _limit(budget, unplanned),
        search.Status.OK,
        peak,
    )


@dataclass
class BudgetMissed(PlanError):
    """MP601: no plan of the search measured within the hard ``limit``; ``peak``: the least it measured."""

    limit: int = 0
    peak: int = 0
    result: PlanResult | None = None  # the measured plan that missed, when one was written


def _missed(limit, peak: int, minimum: int, *, least_measured: bool = False, why=()) -> BudgetMissed:
    """MP601 for a measured ``peak`` over ``limit``; ``least_measured``: ``peak`` is the least-peak
    plan's; ``why``: more help lines (the peak's composition, the next step)."""
    if least_measured:
        reach = (
            f"the least-peak plan checkpointing reaches measures {peak} B ({peak / 2**20:.2f} MiB; "
            f"the planner's cost model put it at {minimum} B)"
        )
    else:
        reach = f"the smallest peak reachable by checkpointing is about {minimum} B ({minimum / 2**20:.2f} MiB)"
    return BudgetMissed(
        (
            Diagnostic(
                "MP601",
                f"the hard budget {limit} B cannot be met: measured peak {peak} B",
                help="\n        ".join((f"{reach}; raise the budget or write it as `hint`", *why)),
            ),
        ),
        limit=limit,
        peak=peak,
    )
