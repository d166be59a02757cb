"""Planner stage: the levels a search offers (whole candidates, parts, leaves, save variants, all),
the wider searches a missed budget tries, and how a refused budget's plan is written and explained.

Helpers of :mod:`memoplan.planner.plan`, apart so that each module holds one idea: which
candidates a level offers (:func:`links`, with :func:`save_variants` from
:mod:`memoplan.planner.search.opsave`), which searches widen a missed hard budget (:func:`widenings`), and
the header and help of the least-peak plan a refusal names (:func:`over_budget`, :func:`as_hint`,
:func:`explained`).
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from memoplan.planner.budgets import mode_line
from memoplan.planner.config import Level, RefineOptions
from memoplan.planner.profiling import anatomy
from memoplan.planner.profiling.schema import Profile, chain, default_candidates, nested_candidates
from memoplan.planner.profiling.shrink import is_out_of_memory
from memoplan.planner.search import opsave
from memoplan.planner.search.chain import Item
from memoplan.planner.search.write import comment_line
from memoplan.progress import REPORTER
from memoplan.runtime.state import is_stateful
from memoplan.specs import Example
from memoplan.syntax import ast

#: The candidate sets a search offers (:func:`links`).
WHOLE, PARTS, LEAVES, SAVES, ALL = "whole", "parts", "leaves", "saves", "all"

#: What each level offers, as the least-peak search names it.
LEVELS = {
    WHOLE: "whole candidates",
    PARTS: "parts of blocks",
    LEAVES: "leaves of blocks",
    SAVES: "op-level saves of whole candidates",
}


def explained(model: nn.Module, example: Example, plan: ast.Plan, least: int, prof: Profile) -> list[str]:
    """MP601's explanation of the least-peak ``plan``, which measures ``least`` bytes
    (:func:`memoplan.planner.profiling.anatomy.explanation`): its peak's composition from two real steps,
    where the step runs for real (a measured profile)."""
    peak = None
    if prof.method == "measured" and prof.shards == 1:
        try:
            peak = anatomy.composition(model, example, plan)
        except Exception:  # noqa: BLE001  the refusal stands without its composition
            peak = None
    if peak is not None:
        peak = replace(peak, optimizer_state=prof.optimizer_state_bytes)
    return anatomy.explanation(peak, least, prof.peak_bytes, shards=prof.shards)


def as_hint(result, hard: bool):
    """``result`` (searched as a hard budget) as a hint budget's plan when ``hard`` is False."""
    if hard:
        return result
    lines = tuple(
        comment_line(f"budget mode: {mode_line(False)}") if line.startswith("# budget mode:") else line
        for line in result.plan.header_comments.leading
    )
    plan = replace(result.plan, header_comments=replace(result.plan.header_comments, leading=lines))
    return replace(result, plan=plan, hard=False)


def over_budget(best, budget, limit: int, hard: bool, advice: str | None = None):
    """The least-peak plan written for ``budget`` (a hint, or a hard budget it meets after all);
    ``advice``: the header's recommendation for ``limit`` (:func:`memoplan.planner.advice.recommendation`)."""
    lines = []
    for line in best.plan.header_comments.leading:
        if line.startswith("# recommendation:"):
            continue  # said of another limit (the least-peak search's): ``advice`` replaces it
        if line.startswith("# budget:"):
            lines.append(comment_line(f"budget mode: {mode_line(hard)}"))
            line = comment_line(f"budget: {budget.describe(best.measured_before)}; the least-peak plan of every level")
        lines.append(line)
    lines.append(comment_line(f"budget limit: {limit} B"))
    if advice:
        lines.append(comment_line(f"recommendation: {advice}"))
    plan = replace(best.plan, header_comments=replace(best.plan.header_comments, leading=tuple(lines)))
    choice = replace(best.choice, budget=budget, limit=limit)
    return replace(best, plan=plan, choice=choice, limit=limit, hard=hard)


def widenings(model: nn.Module, prof: Profile, refine: RefineOptions | None, completing: bool):
    """The wider searches to try, in order, before refusing a hard budget: (refinement, level, what is offered).

    Candidates holding stateful modules (spiking neurons, recurrent cells) are first offered whole
    with their time axis chunked (``temporal_chunk`` 2, 4 or 8, what the hand-written spiking plans
    do); then every search offers the parts of the blocks, with split regions and chunks.  A
    completed plan's search refines nothing (a level could edit the fixed rules).
    """
    stateful = holds_state(model, default_candidates(prof))
    if stateful and not completing:
        yield with_level(refine, Level.TEMPORAL), WHOLE, "time chunks of stateful regions"
    wider = None if completing else with_level(with_level(refine, Level.TEMPORAL) if stateful else refine, Level.SPLIT)
    yield wider, ALL, "parts of blocks, their op-level saves and split regions"


def holds_state(model: nn.Module, names) -> bool:
    """Whether any of the modules at ``names`` holds a stateful module (``temporal_chunk`` applies)."""
    for name in names:
        try:
            module = model.get_submodule(name)
        except AttributeError:
            continue
        if any(is_stateful(sub) for sub in module.modules()):
            return True
    return False


def with_level(refine: RefineOptions | None, level: Level) -> RefineOptions:
    """``refine`` with ``level`` first when it does not run it already: ``split`` with 2, 3 or 4
    segments, ``temporal`` with 2, 4 or 8 chunks."""
    refine = refine or RefineOptions(levels=())
    if level in refine.levels:
        return refine
    if level is Level.SPLIT:
        return replace(refine, levels=(Level.SPLIT, *refine.levels), segments=(2, 3, 4))
    return replace(refine, levels=(level, *refine.levels), chunks=(2, 4, 8))


def links(prof: Profile, level: str):
    """The candidates of one level: whole candidates (also those of ``saves``), their direct
    children (``parts``), the innermost modules inside them that save memory (``leaves``), or
    all of these at once (``all``, nested)."""
    if level in (WHOLE, SAVES):
        return chain(prof)
    names = nested_candidates(prof)
    if level == ALL:
        return chain(prof, names, nested=True)
    outer = default_candidates(prof)
    if level == PARTS:
        return chain(prof, [n for n in names if n.rpartition(".")[0] in outer])
    inner = [n for n in names if n not in outer]
    return chain(prof, [n for n in inner if not any(m.startswith(n + ".") for m in inner)])


def save_variants(items, uses, packed: frozenset[str], model: nn.Module, per_op: float = 0.0) -> list[Item]:
    """The save variants (:mod:`memoplan.planner.search.opsave`) of ``items`` by ``uses``, where a region
    may save: not with bit-packed inputs (``packed``) or stateful modules inside (MP325); ``per_op``:
    what each operator of such a region costs beyond a plain one (the profile's ``save_op_seconds``)."""
    if not uses:
        return []
    found = []
    for item in items:
        if item.name in packed or holds_state(model, [item.name]):
            continue
        found += opsave.variants(item, uses.get(item.name), per_op)
    return found


def op_uses_of(model: nn.Module, example: Example, prof: Profile, progress: bool):
    """What each candidate's op families make and cost (:func:`memoplan.planner.search.opsave.op_uses`),
    for the save variants; None where the step cannot run for real (an estimated or sharded
    profile) or the forward fails (the search then offers no variant)."""
    if prof.method != "measured" or prof.shards > 1:
        return None
    try:
        return opsave.op_uses(model, example, nested_candidates(prof))
    except Exception as exc:  # noqa: BLE001  a variant is an option: without one the search still runs
        if is_out_of_memory(exc):
            return None
        if progress:
            REPORTER.detail(f"no save variants ({type(exc).__name__}: {exc})")
        return None


def kept_input(link, packed: frozenset[str]) -> int:
    """What a checkpoint of ``link`` keeps: its input (bit-packed where ``packed``), and what the
    model's output keeps of the region's bytes."""
    return (link.packed_input_bytes if link.name in packed else link.input_bytes) + link.kept_bytes


def candidates(prof: Profile, level: str, blocked, uses, model: nn.Module) -> tuple[list[Item], frozenset[str]]:
    """The items of one ``level`` but those ``blocked`` (fixed by a completed plan), each module's
    save variants right after it (so the plan's rules stay in order), and the candidates whose
    inputs the profile proves binary (checkpointed with ``compress input = bit``).  Every item
    carries the profile's fixed cost of a region (``region_seconds``)."""
    found = [link for link in links(prof, level) if not blocked(link.name)]
    packed = frozenset(link.name for link in found if link.input_binary and link.packed_input_bytes < link.input_bytes)
    items = [Item(link.name, link.saved_bytes, kept_input(link, packed), link.forward_seconds) for link in found]
    if level in (SAVES, ALL):
        per_op = prof.save_op_seconds
        items = [v for item in items for v in (item, *save_variants([item], uses, packed, model, per_op))]
    if (
        prof.region_seconds
    ):  # each region's fixed cost, measured with the profile (memoplan.planner.profiling.regioncost)
        items = [replace(item, region_seconds=prof.region_seconds) for item in items]
    return items, packed
