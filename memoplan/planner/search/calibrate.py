"""Planner stage: a hard budget's set of checkpoints settled by measured trials, not the estimate alone.

The cost model (:mod:`memoplan.planner.search`) estimates a set's peak; a trial measures it (one
step on a copy, or on fake tensors: :func:`memoplan.planner.search.refine.measure_plan`).  A trial costs
about a training step, a search a fraction of one.  Where the profile recorded the step's bytes
between module boundaries, a set's peak is predicted without a trial
(:mod:`memoplan.planner.search.held`): the least recompute within the predicted limit is measured
once, and again only when the prediction is off (:func:`_predicted`).  Otherwise the searches are
steered by what the trials measured (the estimate's error, mostly alike from set to set) and a
search already answered is not run again.  Helpers of :mod:`memoplan.planner.plan`, which measures and raises MP601 for them
(:class:`Trials`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from memoplan.planner import search
from memoplan.planner.search.chain import Item
from memoplan.planner.search.held import Predictor

#: Searches each way (tightening, then loosening) before a set is settled.
MAX_REFINEMENTS = 4

#: Bounds on the estimate's limit this close (a share of the limit) end the loosening: what a set
#: between them could save in recompute is worth less than the trial that would measure it.
NARROW = 1 / 128


#: Trials that check the sets the prediction chooses (:func:`_predicted`) before the trials alone
#: steer the search.
PREDICTED_TRIALS = 3


@dataclass(frozen=True)
class Trials:
    """What settling a set needs: the candidates, the search (``planner(items, budget, base)``),
    the base bytes, a trial (``measure(choice)``: the measured peak of the choice's plan),
    MP601 (``missed(limit, peak, minimum, least_measured=...)``: the exception to raise) and,
    where the profile recorded the step's bytes between module boundaries, the prediction of a
    set's measured peak without a trial (:class:`memoplan.planner.search.held.Predictor`)."""

    items: Sequence[Item]
    planner: Callable[..., search.Choice]
    base: int
    measure: Callable[[search.Choice], int]
    missed: Callable[..., Exception]
    predictor: Predictor | None = None

    def search(self, limit: int) -> search.Choice:
        return self.planner(self.items, search.Bytes(limit), self.base)


def settled(trials: Trials, choice: search.Choice, hard: bool) -> tuple[search.Choice, int]:
    """(choice, measured peak): the search's set, settled by measurement for a hard budget: by
    prediction checked by a trial where the set can be predicted (:func:`_predicted`), else by
    trials alone."""
    limit = searched = choice.limit
    if hard and limit is not None and trials.predictor is not None:
        found = _predicted(trials, choice, limit)
        if found is not None:
            return found
    if not choice.ok and hard:
        choice, searched = _least_peak_if_it_fits(trials, choice)
    after = trials.measure(choice)
    if hard and limit is not None:
        assert searched is not None, "the limit, or the one the least-peak set was found with"
        choice, after = _calibrated(trials, choice, after, limit, searched)
    return choice, after


def _calibrated(
    trials: Trials, choice: search.Choice, after: int, limit: int, searched: int
) -> tuple[search.Choice, int]:
    """(choice, measured peak) once measurements, not the estimate, have settled the set.

    The cost model is an estimate, off in either direction, and mostly by a like amount for
    every set (on a language model, the loss's temporaries it counts at every peak).  While the
    measured peak is over the hard limit, the search is repeated with the estimate's limit at
    the set's estimate less the overshoot.  While it leaves room under the limit, the search is
    repeated with the estimate's limit at the set's estimate plus that room (the limit the
    estimate needs if it is off by as much for the next set), and the wider search's set is kept
    when it costs less recompute and still measures within the limit.  A set that measures over
    it bounds the search from above; the next limit is then that set's estimate less its
    overshoot, or halfway between the bounds where that is outside them, until the bounds are
    within ``NARROW`` of the limit.  At most ``MAX_REFINEMENTS`` searches each way, each set
    measured once.
    When the estimate's limit moved, the choice keeps the user's budget and limit and says so
    in its note.  ``searched`` is the estimate's limit ``choice`` was found with; ``after`` its measured
    peak.
    """
    budget, first_reason = choice.budget, choice.reason
    peaks = {choice.checkpointed: after}
    found_at = _remembered(trials, (searched, choice))

    def measured(c: search.Choice) -> int:
        if c.checkpointed not in peaks:
            peaks[c.checkpointed] = trials.measure(c)
        return peaks[c.checkpointed]

    for _ in range(MAX_REFINEMENTS):
        if after <= limit:
            break
        tighter = max(1, min(searched, choice.estimated_peak) - (after - limit))
        retry = found_at(tighter)
        if not retry.ok:
            break
        choice, searched = retry, tighter
        after = measured(choice)
    if after > limit:
        # Tightening did not bring a measurement under the limit (the estimate can be off by
        # more than one overshoot says, e.g. a GPU's library workspaces): the least-peak set
        # is the last one to try before refusing.
        minimum = choice.minimum_peak
        choice, after = _least_peak_within(trials, limit, minimum, measured)
        searched = minimum
    low, high = searched, None  # nothing cheaper fits at or below `low`; `high`'s set measured over
    last = (choice.estimated_peak, after)  # the set measured last: its estimate and its measured peak
    for _ in range(MAX_REFINEMENTS if after <= limit else 0):
        trial = last[0] + (limit - last[1])  # the estimate's limit if the last set's error holds
        if high is not None and high - low <= limit * NARROW:
            break  # sets between the bounds estimate within a sliver of each other: no trial pays
        if high is not None and not low < trial < high:
            trial = (low + high) // 2
        if trial <= low:
            break
        retry = found_at(trial)
        if retry.ok and retry.recompute_seconds < choice.recompute_seconds:
            last = (retry.estimated_peak, measured(retry))
            if last[1] <= limit:
                choice, searched, after, low = retry, trial, last[1], trial
            else:
                high = trial
        elif high is None:
            break  # the room the measurement leaves buys nothing cheaper
        else:
            low = trial
    if searched != limit:
        note = (
            f"searched with the estimate's limit at {searched} B, where measured peaks meet the limit "
            f"{limit} B with the least recompute found"
        )
        reason = "; ".join(r for r in dict.fromkeys((first_reason, choice.reason, note)) if r)
        choice = replace(choice, budget=budget, limit=limit, reason=reason)
    return choice, after


def _remembered(trials: Trials, first: tuple[int, search.Choice]) -> Callable[[int], search.Choice]:
    """The search at an estimate's limit, remembered: the set a search at ``L`` found, whose
    estimate is ``e``, is what a search at any limit from ``e`` to ``L`` finds (the least
    recompute within ``L`` is within the smaller limit too; a proven answer only), so that
    search is not run again.  ``first``: (limit, set) found already."""
    solved = [first]

    def found_at(at: int) -> search.Choice:
        for wider, choice in solved:
            if choice.ok and choice.proven_optimal and choice.estimated_peak <= at <= wider:
                return choice
        choice = trials.search(at)
        solved.append((at, choice))
        return choice

    return found_at


def _least_peak_if_it_fits(trials: Trials, choice: search.Choice) -> tuple[search.Choice, int]:
    """The estimate says no set fits: measure the least-peak set before refusing (MP601).

    The cost model's estimates can run high (allocator rounding, gradients freed early).
    When the least-peak set measures within the limit, search again with the limit widened
    by that overshoot, and take the least-peak set itself if the wider search still fails;
    the caller's measurement then checks the budget as usual.  Returns the choice and the
    estimate's limit it was found with.
    """
    limit = choice.limit
    assert limit is not None, "a hard budget in bytes has a limit"
    least, measured = _least_peak_within(trials, limit, choice.minimum_peak, trials.measure)
    wider = limit + max(0, least.estimated_peak - measured)
    retry = trials.search(wider)
    found, searched = (retry, wider) if retry.ok else (least, choice.minimum_peak)
    note = f"the estimated least peak {least.estimated_peak} B is over the limit {limit} B, but measures {measured} B"
    return replace(found, budget=choice.budget, limit=limit, status=search.Status.OK, reason=note), searched


def _least_peak_within(trials: Trials, limit: int, minimum: int, measure) -> tuple[search.Choice, int]:
    """The least-peak set and its peak by ``measure``; MP601 with that measurement when it is over ``limit``."""
    least = search.optimal(trials.items, search.Bytes(minimum), base_bytes=trials.base)
    peak = measure(least)
    if peak > limit:
        raise trials.missed(limit, peak, minimum, least_measured=True)
    return least, peak


def _predicted(trials: Trials, choice: search.Choice, limit: int) -> tuple[search.Choice, int] | None:
    """(choice, measured peak): the least recompute whose predicted peak is within the limit
    (:func:`memoplan.planner.search.held.held_optimal`), checked by a trial; None when no predicted
    set measured within the limit.

    What the prediction cannot see (a region's own bookkeeping, say) is much the same for every
    set, so when the trial disagrees by more than a sliver of the limit, that error is taken off
    the limit the next search predicts within: over the limit, to meet it; under it, to spend the
    room on less recompute.  At most ``PREDICTED_TRIALS`` trials, each of a set not measured
    before; of the sets measured within the limit, the one with the least recompute is kept,
    under the name of the planner asked for (its note says how it was chosen).
    """
    predictor = trials.predictor
    assert predictor is not None
    best: tuple[search.Choice, int] | None = None
    tried: set[tuple[int, ...]] = set()
    offset = 0
    for _ in range(PREDICTED_TRIALS):
        found, predicted = _within_prediction(predictor, limit - offset, choice)
        if found is None or predicted is None or found.checkpointed in tried:
            break
        tried.add(found.checkpointed)
        after = trials.measure(found)
        if after <= limit and (best is None or found.recompute_seconds < best[0].recompute_seconds):
            best = (replace(found, planner=choice.planner, limit=limit), after)
        error = after - predicted
        if after <= limit and -error <= limit * NARROW:
            break  # met, and the prediction left no room worth another trial
        offset += error
    return best


def _within_prediction(
    predictor: Predictor, target: int, choice: search.Choice
) -> tuple[search.Choice | None, int | None]:
    """The prediction's least-recompute set within ``target`` and its predicted peak; (None, None)
    when none is.  The first search leaves out what save variants keep through their own backward
    (a chain's is solved in pure Python, :func:`memoplan.planner.search.held.held_optimal`); where
    that puts its set over ``target``, the search that counts it (a program) decides.  No trial is
    spent on a set the prediction already says is over."""
    for kept in (False, True):
        found = predictor.search(target, choice.budget, choice.minimum_peak, kept=kept)
        predicted = predictor.peak(found) if found is not None else None
        if found is None or predicted is None:
            return None, None
        if predicted <= target:
            return found, predicted
    return None, None
