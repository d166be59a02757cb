"""Planner stage: ``memoplan plan --budget B --dtr`` — a ``dtr`` block whose threshold meets a budget.

profile (measure) -> the ``dtr`` block's candidates (the resolver's rule) -> their chain ->
:func:`memoplan.planner.dtr.sim.threshold_for` (the largest threshold predicted to fit) ->
measure one step with it (under the sum loss and a mean-square loss, the larger peak), and lower
the threshold by any overshoot (a few times) -> the plan,
its header saying what the simulator predicted and what was measured.

A byte budget is needed (bytes or a share of the unplanned peak); coverage budgets name
shares of checkpointed modules, which eviction does not have.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch import nn

from memoplan.diagnostics import Diagnostic, PlanError
from memoplan.planner.budgets import (
    ByteBudget,
    Bytes,
    FractionOfPeak,
    byte_limit,
    format_duration,
    format_size,
    mode_line,
)
from memoplan.planner.dtr.sim import Simulation, candidates_from_chain, parameter_bytes, simulate, threshold_for
from memoplan.planner.profiling.profile import profile
from memoplan.planner.profiling.schema import Profile, chain
from memoplan.planner.search.refine import measure_plan
from memoplan.planner.search.write import provenance
from memoplan.progress import REPORTER, size
from memoplan.resolver import resolve
from memoplan.specs import Example
from memoplan.syntax import ast, parse

__all__ = ["DtrPlanResult", "MAX_CORRECTIONS", "make_dtr_plan", "dtr_candidates"]

#: Measured overshoots corrected by lowering the threshold, at most.
MAX_CORRECTIONS = 4


@dataclass(frozen=True)
class DtrPlanResult:
    plan: ast.Plan
    threshold: int
    simulation: Simulation
    measured_before: int
    measured_after: int
    predicted_after: int
    limit: int
    hard: bool

    @property
    def met(self) -> bool:
        return self.measured_after <= self.limit


def dtr_candidates(model: nn.Module) -> tuple[str, ...]:
    """The modules a ``dtr`` block with no rules beside it would evict (model order)."""
    probe = parse("memplan 1\ndtr { eviction_threshold = 1 B }\n", "<dtr candidates>")
    return tuple(m.path for m in resolve(probe, model).modules if m.evict is not None)


def mean_square_loss(output) -> torch.Tensor:
    """The mean of the squares of every floating-point tensor of ``output`` (a model output's
    ``logits`` too): a loss that allocates output-sized temporaries in forward and backward, where
    the default sum allocates none.  A plan's budget must hold under such a loss as well."""
    leaves = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not leaves and isinstance(getattr(output, "logits", None), torch.Tensor):
        leaves = [output.logits]
    if not leaves:
        raise ValueError("the model's output holds no floating-point tensor to take a loss of")
    loss = leaves[0].float().square().mean()
    for leaf in leaves[1:]:
        loss = loss + leaf.float().square().mean()
    return loss


def _measure(model: nn.Module, example: Example, plan: ast.Plan) -> int:
    """The plan's step peak under the default (sum) loss and a mean-square loss, the larger.

    The ``dtr`` threshold is enforced where candidates start and end; what a loss allocates after
    the last one (the output's square and its gradient) and a block's own activations come on top,
    so the budget is checked under a loss that allocates, not only under the sum."""
    return max(measure_plan(model, example, plan), measure_plan(model, example, plan, loss_fn=mean_square_loss))


def make_dtr_plan(
    model: nn.Module,
    example: Example,
    budget: ByteBudget,
    *,
    hard: bool = True,
    prof: Profile | None = None,
    progress: bool = True,
) -> DtrPlanResult:
    """A plan with one ``dtr`` block meeting ``budget`` (see the module docstring); MP602 when none can."""
    if not isinstance(budget, (Bytes, FractionOfPeak)):
        raise PlanError(
            (
                Diagnostic(
                    "MP602",
                    "`--dtr` needs a byte budget: bytes (`4 GiB`) or a share of the unplanned peak (`50%`)",
                    help="coverage budgets (checkpoint-half, checkpoint-three-quarters, checkpoint-all) count checkpointed modules",
                ),
            )
        )
    prof = prof or profile(model, example, progress=progress)
    limit = byte_limit(budget, prof.peak_bytes)
    names = dtr_candidates(model)
    links = chain(prof, names)
    own, outside = parameter_bytes(model, [link.name for link in links])
    calls = candidates_from_chain(links, own)
    minimum = min((c.evictable_bytes for c in calls if c.evictable_bytes), default=0)
    minimum = min(minimum, 2**20)  # every candidate may be evicted; never above the language's default
    # The threshold is enforced where candidates start and end; inside one, its own activations
    # (and the loss's temporaries, the size of the output) come on top.  Plan below the limit by
    # that much when a threshold fits there, else at the limit itself.
    margin = max((link.saved_bytes for link in links), default=0) + prof[""].output_bytes
    found = threshold_for(calls, prof.peak_bytes, limit - margin, minimum=minimum, outside_grads=outside)
    if found is None:
        margin = 0
        found = threshold_for(calls, prof.peak_bytes, limit, minimum=minimum, outside_grads=outside)
    if found is None:
        # Evicting everything it may is the least eviction reaches: refused for a hard budget,
        # written (and reported as missed) for a hint.
        floor = max(sum(c.kept_bytes for c in calls), 1)
        everything = simulate(calls, floor, minimum=minimum, outside_grads=outside)
        if hard:
            least = everything.predicted_peak(prof.peak_bytes)
            raise _missed(limit, least, measured=False, why=_explained(model, example, None, least, prof))
        found = floor, everything
    threshold, sim = found
    predicted = sim.predicted_peak(prof.peak_bytes)
    measured = 0
    for attempt in range(MAX_CORRECTIONS + 1):
        plan = _plan(threshold, minimum, sim, prof, limit, predicted, None, hard, margin)
        measured = _measure(model, example, plan)
        if progress:
            REPORTER.say(
                f"evicting above {size(threshold)} at run time: measured peak {size(measured)} "
                f"(the limit {size(limit)}, predicted {size(predicted)})"
            )
            REPORTER.detail(
                f"dtr threshold {threshold} B: predicted peak {predicted} B, measured {measured} B (limit {limit} B)"
            )
        if measured <= limit or attempt == MAX_CORRECTIONS:
            break
        lower = threshold - (measured - limit)
        floor = sum(c.kept_bytes for c in calls)
        if lower < floor:
            break
        threshold, sim = lower, simulate(calls, lower, minimum=minimum, outside_grads=outside)
        predicted = sim.predicted_peak(prof.peak_bytes)
    if measured > limit and hard:
        raise _missed(limit, measured, measured=True, why=_explained(model, example, plan, measured, prof))
    plan = _plan(threshold, minimum, sim, prof, limit, predicted, measured, hard, margin)
    return DtrPlanResult(plan, threshold, sim, prof.peak_bytes, measured, predicted, limit, hard)


def _plan(
    threshold: int,
    minimum: int,
    sim: Simulation,
    prof: Profile,
    limit: int,
    predicted: int,
    measured: int | None,
    hard: bool,
    margin: int = 0,
) -> ast.Plan:
    header = {
        **provenance("memoplan plan --dtr", prof),
        "budget mode": mode_line(hard),
        "budget limit": f"{format_size(limit)} ({limit} B)",
        "margin": (
            f"planned {format_size(margin)} ({margin} B) below the limit: the largest candidate's own activations "
            "and the output's size for the loss, which come on top of the threshold inside a block"
            if margin
            else "none: no threshold fits below the limit by the peak inside a block"
        ),
        "measured peak before": f"{prof.peak_bytes} B",
        "simulated": (
            f"peak {predicted} B, tracked peak {sim.tracked_peak} B, {sim.evictions} evictions, "
            f"{sim.recomputes} recomputes ({format_duration(sim.recompute_seconds)})"
        ),
    }
    if measured is not None:
        header["measured peak after"] = f"{measured} B (the larger of a sum loss's step and a mean-square loss's)"
    leading = tuple(f"# {key}: {value}" for key, value in header.items())
    block = ast.ConfigBlock(
        ast.BlockKind.DTR,
        (
            ast.ConfigEntry("eviction_threshold", ast.Size(threshold, ast.Unit.B)),
            ast.ConfigEntry("evictee_minimum_size", ast.Size(minimum, ast.Unit.B)),
        ),
        comments=ast.Comments(leading=("# the largest threshold the simulator predicts within the budget",)),
    )
    return ast.Plan(version=1, statements=(block,), header_comments=ast.Comments(leading=leading))


def _explained(model: nn.Module, example: Example, plan, least: int, prof: Profile) -> list[str]:
    """MP602's explanation (:func:`memoplan.planner.profiling.anatomy.explanation`): the least budget eviction
    meets, and the composition of the peak of ``plan``'s step (None: the unplanned step's)."""
    from memoplan.planner.profiling import anatomy

    try:
        peak = anatomy.composition(model, example, plan)
    except Exception:  # noqa: BLE001  the refusal stands without its composition
        peak = None
    return anatomy.explanation(peak, least, prof.peak_bytes, checkpoints=False, shards=prof.shards)


def _missed(limit: int, peak: int, *, measured: bool, why=()) -> PlanError:
    what = "measured (the larger of a sum loss's step and a mean-square loss's)" if measured else "predicted"
    return PlanError(
        (
            Diagnostic(
                "MP602",
                f"the hard budget {limit} B cannot be met by eviction: {what} peak {peak} B with every candidate "
                "evicted that may be",
                help="\n        ".join(
                    (
                        "the candidates' kept inputs and what runs outside them stay; raise the budget, write it as "
                        "`hint`, or use `checkpoint` rules (`memoplan plan --budget B` without --dtr)",
                        *why,
                    )
                ),
            ),
        )
    )
