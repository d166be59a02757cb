"""A hard budget's set settled by measured trials (memoplan.planner.search.calibrate), on synthetic chains."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memoplan.planner import search
from memoplan.planner.search import calibrate

ITEMS = [
    search.Item(f"blocks.{i}", saved, saved // 8, seconds)
    for i, (saved, seconds) in enumerate(
        [(900, 0.9), (800, 0.5), (700, 0.6), (650, 0.2), (600, 0.45), (500, 0.3), (400, 0.35), (300, 0.05)]
    )
]
BASE = 1000
UNPLANNED = BASE + sum(item.saved_bytes for item in ITEMS)


def _missed(limit, peak, minimum, least_measured=False):
    return ValueError(f"MP601: {peak} over {limit}")


def _trials(offset, log):
    """Trials whose meter reads the estimate plus ``offset(choice)``; ``log`` gets every search's
    limit (``("search", L)``) and every measured set (``("trial", names)``)."""

    def planner(items, budget, base):
        log.append(("search", budget.amount))
        return search.optimal(items, budget, base_bytes=base)

    def measure(choice):
        log.append(("trial", choice.names))
        return choice.estimated_peak + offset(choice)

    return calibrate.Trials(ITEMS, planner, BASE, measure, _missed)


@pytest.mark.parametrize("share", [0.5, 0.6, 0.7, 0.8])
def test_an_estimate_off_by_a_like_amount_for_every_set_is_settled_in_two_trials(share):
    """The first trial finds the error, the second search lands where the estimate needs to be;
    the set is the least recompute the meter allows, found with two trials."""
    log: list = []
    limit = int(UNPLANNED * share)
    first = search.optimal(ITEMS, search.Bytes(limit), base_bytes=BASE)
    choice, after = calibrate.settled(_trials(lambda c: -300, log), first, hard=True)
    trials = [entry for entry in log if entry[0] == "trial"]
    assert len(trials) <= 2 and len(set(trials)) == len(trials)
    best = search.optimal(ITEMS, search.Bytes(limit + 300), base_bytes=BASE)
    assert after <= limit and choice.recompute_seconds == best.recompute_seconds
    assert choice.limit == limit


@settings(max_examples=60, deadline=None)
@given(st.floats(0.45, 0.9), st.lists(st.integers(-400, 200), min_size=1, max_size=5))
def test_the_set_kept_always_measures_within_the_limit_and_no_set_twice(share, errors):
    """Whatever the meter reads (its error varying from set to set), a set kept within the limit
    measured within it, no set is measured twice, and no search is run twice at one limit."""
    log: list = []
    limit = int(UNPLANNED * share)
    first = search.optimal(ITEMS, search.Bytes(limit), base_bytes=BASE)
    offset = lambda c: errors[zlib.crc32("|".join(c.names).encode()) % len(errors)]  # noqa: E731  an error per set
    try:
        choice, after = calibrate.settled(_trials(offset, log), first, hard=True)
    except ValueError as missed:
        assert "MP601" in str(missed)
        return
    assert after <= limit and after == choice.estimated_peak + offset(choice)
    trials = [entry for entry in log if entry[0] == "trial"]
    searches = [entry for entry in log if entry[0] == "search"]
    assert len(set(trials)) == len(trials) and len(set(searches)) == len(searches)
    assert len(trials) <= 2 * calibrate.MAX_REFINEMENTS + 2


def test_a_search_inside_an_answered_one_is_not_run_again():
    """A set found at limit L with estimate e is what any limit from e to L finds."""
    log: list = []
    trials = _trials(lambda c: 0, log)
    first = trials.search(int(UNPLANNED * 0.6))
    found_at = calibrate._remembered(trials, (int(UNPLANNED * 0.6), first))
    assert found_at(first.estimated_peak) is first and found_at(int(UNPLANNED * 0.6)) is first
    assert len(log) == 1  # only the first search ran
    wider = found_at(int(UNPLANNED * 0.6) + 1)
    assert len(log) == 2 and wider.recompute_seconds <= first.recompute_seconds
