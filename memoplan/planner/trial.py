"""Planner stage: what every search of :func:`memoplan.planner.plan.make_plan` shares.

The :class:`Search` that chooses a set for a budget (the planner, its settings, the hand-written
plan it completes), the plan of a choice (:func:`draft_plan`) and its measurement (:func:`measure`,
:func:`checked`), a budget's byte limit, the :class:`PlanResult` a search returns, and MP601
(:class:`BudgetMissed`) when a hard budget is missed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from torch import nn

from memoplan.diagnostics import Diagnostic, PlanError
from memoplan.planner import search
from memoplan.planner.config import Planner
from memoplan.planner.profiling.shrink import ESTIMATING as _ESTIMATING
from memoplan.planner.search import opsave
from memoplan.planner.search.refine import Refinement, measure_plan
from memoplan.planner.search.write import comment_line, compressed, sublinear_summary, with_state_rules
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
    # What each candidate's op families make and cost (memoplan.planner.search.opsave), for save variants.
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


def fixed_by(start: ast.Plan, model: nn.Module, how: Search) -> Search:
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


def draft_plan(
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


def measure(model: nn.Module, example: Example, plan: ast.Plan) -> int:
    """Measured peak of one step with ``plan``, on a copy; the model and the RNG are left as they were.

    Estimated on fake tensors instead while planning from an estimated profile (``_ESTIMATING``)."""
    return measure_plan(model, example, plan)


def checked(model: nn.Module, example: Example, plan: ast.Plan) -> int:
    """One real planned step of ``plan``: its measured peak (StepOutOfMemory when it does not fit)."""
    from memoplan.planner.profiling.shrink import out_of_memory_as

    token = _ESTIMATING.set(False)
    try:
        with out_of_memory_as("planned"):
            return measure_plan(model, example, plan)
    finally:
        _ESTIMATING.reset(token)


def limit_of(budget, unplanned: int) -> int | None:
    """The byte limit of a byte budget; None for a coverage budget, which has none."""
    return budget.limit(unplanned) if isinstance(budget, (search.Bytes, search.FractionOfPeak)) else None


def within(budget, peak: int, unplanned: int) -> bool:
    """Whether a measured ``peak`` meets a byte budget (a coverage budget always asks for rules)."""
    limit = limit_of(budget, unplanned)
    return limit is not None and peak <= limit


def empty_choice(budget, peak: int, unplanned: int) -> search.Choice:
    return search.Choice(
        "none: the plan's own rules meet the budget",
        budget,
        (),
        (),
        peak,
        unplanned,
        0.0,
        limit_of(budget, unplanned),
        search.Status.OK,
        peak,
    )


@dataclass
class BudgetMissed(PlanError):
    """MP601: no plan of the search measured within the hard ``limit``; ``peak``: the least it measured."""

    limit: int = 0
    peak: int = 0
    result: PlanResult | None = None  # the measured plan that missed, when one was written


def missed_budget(limit, peak: int, minimum: int, *, least_measured: bool = False, why=()) -> BudgetMissed:
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
