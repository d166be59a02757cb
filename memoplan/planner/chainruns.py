"""Planner stage: runs of a chain's children as regions (``checkpoint segments``/``split``),
for a chain without blocks (:func:`segmented`).
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from memoplan.planner import search, tell, trial
from memoplan.planner.profiling.schema import Profile, chain, default_candidates
from memoplan.planner.profiling.shrink import ESTIMATING as _ESTIMATING
from memoplan.planner.profiling.target import hard_mode, no_real_step, planned_peak_name, unplanned_peak_name
from memoplan.planner.search import segments
from memoplan.planner.search.write import comment_line, provenance
from memoplan.planner.trial import BudgetMissed, PlanResult, Search, checked, draft_plan, limit_of, missed_budget
from memoplan.syntax import ast


def chain_container(model: nn.Module, prof: Profile, how: Search) -> str | None:
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


def segmented(
    model, example, budget, how: Search, prof: Profile, preset, missed: BudgetMissed, progress: bool, *, parts=False
):
    """A plan of runs of the chain container's children (:mod:`memoplan.planner.search.segments`), measured.

    Two splits are measured: the least-peak split of the cost model (``split = [...]``) and Chen
    et al.'s sqrt(n) near-equal runs (``segments = k``).  Every split recomputes the container
    once, so the lower measured peak wins; MP601 (``BudgetMissed``) when it is over the limit.
    ``missed``: what the search before it measured at the least; ``parts``: that search offered the
    children's parts too (the header's ``widened`` says which).
    """
    parent = chain_container(model, prof, how)
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
    limit = limit_of(budget, prof.peak_bytes)
    seconds = prof[parent].forward_seconds
    shown = parent or "the model itself"
    best = _least_measured(model, example, how, parent, options, rest, len(children), progress)
    peak, split, rule, what = best
    if (
        _ESTIMATING.get() and no_real_step(model) is None
    ):  # the splits' trials were estimated: one real step checks the one kept
        peak = checked(model, example, draft_plan(None, [], model, {}, how, rules=(rule,)))
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
        unplanned_peak_name(prof): f"{prof.peak_bytes} B",  # as plan_level names them: measured, or on fake tensors
        planned_peak_name(model): f"{peak} B",
        **({"budget limit": f"{limit} B"} if limit is not None else {}),
    }
    plan = draft_plan(None, [], model, header, how, rules=(rule,))
    result = PlanResult(plan, choice, prof.peak_bytes, peak, limit, True)
    if not result.met:
        raise replace(missed_budget(limit, peak, rest + least.cost, least_measured=True), result=result)
    return result


def _least_measured(model, example, how: Search, parent: str, options, rest: int, children: int, progress: bool):
    """(peak, split, rule, what) of the split in ``options`` whose plan measures the least peak (the
    first among equals)."""
    shown = parent or "the model itself"
    best = None
    for split, policy, what in options:
        term = ast.SelectorTerm(path=ast.PathPattern(tuple(ast.Name(p) for p in parent.split("."))))
        why = comment_line(f"{what}: {split.runs} regions over {children} children, estimated {rest + split.cost} B")
        rule = ast.ModuleRule(ast.Selector(term), (policy,), comments=ast.Comments(leading=(why,)))
        plan = draft_plan(None, [], model, {}, how, rules=(rule,))
        peak = trial.measure(model, example, plan)
        if progress:
            tell.split_measured(what, shown, split.runs, peak)
        if best is None or peak < best[0]:
            best = (peak, split, rule, what)
    assert best is not None, "options holds the least-peak split at least"
    return best
