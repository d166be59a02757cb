"""Planner stage: the plan of least measured peak over every level the search offers
(:func:`least_peak`), which a refused budget names and a hint budget writes.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace

from memoplan.planner import levels, search
from memoplan.planner.chainruns import chain_container, segmented
from memoplan.planner.config import Planner
from memoplan.planner.onelevel import plan_level
from memoplan.planner.profiling.schema import Profile
from memoplan.planner.search.write import comment_line, provenance
from memoplan.planner.trial import BudgetMissed, PlanResult, Search, draft_plan, empty_choice
from memoplan.progress import REPORTER


def least_peak(
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
        return lambda: plan_level(*args, nested=level, widened=what)

    attempts = [(levels.LEVELS[levels.WHOLE], searched(refine, levels.WHOLE, "least"))]
    if not whole:
        attempts += [
            (levels.LEVELS[level], searched(refine, level, levels.LEVELS[level]))
            for level in (levels.PARTS, levels.LEAVES, levels.SAVES)
        ]
    if chain_container(model, prof, how) is not None:
        unplanned = BudgetMissed((), limit=0, peak=prof.peak_bytes)
        attempts.append(
            ("runs of a chain", lambda: segmented(model, example, zero, how, prof, preset, unplanned, progress))
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
        plan = draft_plan(None, [], model, provenance("memoplan plan", prof), how)
        choice = empty_choice(search.LeastPeak(), prof.peak_bytes, prof.peak_bytes)
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
