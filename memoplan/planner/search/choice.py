"""A planner's result: the :class:`Choice`, its :class:`Status`, and how planners build one."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from memoplan.planner.budgets import Budget, LeastPeak, format_size
from memoplan.planner.search.chain import Chain, least_peak

__all__ = ["BudgetError", "Choice", "Status", "make_choice", "settled_choice"]


# ---------------------------------------------------------------- results


class Status(enum.Enum):
    OK = "ok"  # the estimate is within the limit (or there is no byte limit)
    MISSED = "missed"  # this heuristic found no set within the limit, but one exists
    INFEASIBLE = "infeasible"  # no set of checkpoints is within the limit


@dataclass(frozen=True)
class Choice:
    """A planner's decision and what the cost model expects of it."""

    planner: str
    budget: Budget | LeastPeak | None  # LeastPeak: the least-peak plan (`--budget least`)
    checkpointed: tuple[int, ...]  # indices into the chain, ascending
    names: tuple[str, ...]  # their module paths, in the same order
    estimated_peak: int  # bytes, for this set
    unplanned_peak: int  # bytes, with nothing checkpointed
    recompute_seconds: float
    limit: int | None  # the byte limit the budget resolved to (None: coverage or no budget)
    status: Status
    minimum_peak: int  # the smallest estimate any set of checkpoints reaches
    # True where the answer is exact for the cost model: the least recompute time within the
    # limit or, if none is, the least reachable peak (the optimal planner, search complete).
    proven_optimal: bool = False
    # Why the planner could not prove its answer least where it was asked to, e.g. the exact
    # planner's greedy fallback ("" when there is nothing to say).
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status is Status.OK


class BudgetError(ValueError):
    """A choice that does not meet its byte budget was about to become a plan."""

    def __init__(self, choice: Choice) -> None:
        self.choice = choice
        what = (
            "no set of checkpoints reaches it"
            if choice.status is Status.INFEASIBLE
            else f"planner `{choice.planner}` found no set that reaches it (the optimal planner would)"
        )
        super().__init__(
            f"budget {format_size(choice.limit or 0)} not met: {what}; the smallest reachable estimated "
            f"peak is {format_size(choice.minimum_peak)} ({choice.minimum_peak} B)"
        )


def make_choice(
    chain: Chain,
    planner: str,
    budget,
    chosen,
    limit: int | None,
    floor: int | None = None,
    proven: bool = False,
    reason: str = "",
) -> Choice:
    chosen = tuple(sorted(chosen))
    peak = chain.peak(chosen)
    if floor is None:
        floor = least_peak(chain)[0]
    if limit is None or peak <= limit:
        status = Status.OK
    else:
        status = Status.INFEASIBLE if floor > limit else Status.MISSED
    return Choice(
        planner=planner,
        budget=budget,
        checkpointed=chosen,
        names=tuple(chain.items[i].name for i in chosen),
        estimated_peak=peak,
        unplanned_peak=chain.unplanned,
        recompute_seconds=chain.seconds(chosen),
        limit=limit,
        status=status,
        minimum_peak=floor,
        proven_optimal=proven,
        reason=reason,
    )


def settled_choice(chain: Chain, planner: str, budget, limit: int) -> tuple[Choice | None, int, tuple[int, ...]]:
    """What an exact planner answers without searching, and the least reachable peak with its set.

    The choice is the empty set when nothing need be checkpointed, the least-peak set when no
    set meets ``limit`` (both proven), else None: the planner must search.
    """
    floor, floor_set = least_peak(chain)
    if chain.unplanned <= limit:
        return make_choice(chain, planner, budget, (), limit, floor, proven=True), floor, floor_set
    if floor > limit:
        return make_choice(chain, planner, budget, floor_set, limit, floor, proven=True), floor, floor_set
    return None, floor, floor_set
