"""Planner stage tests: budgets, greedy/optimal/sublinear planners against brute force, plans out.

What holds, and is tested here:

* optimal == brute force (all 2^n subsets) on every chain of up to 12 items; a larger budget
  never gives it more recompute time; an infeasible budget reports the true minimum peak;
* greedy_bytes: within a larger budget, a subset of the smaller budget's choice (so never more
  recompute time); MISSED only where some set would fit (and the test below shows one);
* greedy_coverage picks ceil(share * n) modules, largest saved bytes first;
* sublinear: the same result for a seed whatever the number of workers; never worse than its
  threshold search; within its budget whenever it says OK.

What does not hold, and is shown by an example here: greedy_bytes can miss a budget that
another set meets (the transient of a large module keeps every prefix over it), and the
sublinear search is a heuristic whose recompute time is not monotonic in the budget.  The
estimated peak of the optimal plan rises with the budget only where that buys less recompute.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import math
import multiprocessing
import random
import time
from fractions import Fraction

import pytest
from _profiles import n_examples  # tests/_profiles.py: the hypothesis profile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memoplan.planner import search
from memoplan.planner.search import (
    BudgetError,
    Bytes,
    Coverage,
    FractionOfPeak,
    Item,
    Preset,
    Status,
    budget_from_ast,
    describe,
    estimate,
    greedy_bytes,
    greedy_coverage,
    minimum_peak,
    optimal,
    sublinear,
    to_plan,
)
from memoplan.syntax import ast, format_plan, parse
from memoplan.syntax.blocks import SublinearConfig

SETTINGS = settings(max_examples=n_examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOL = dict(rel=1e-9, abs=1e-12)

# ---------------------------------------------------------------- strategies and brute force

seconds = st.one_of(
    st.just(0.0),
    st.integers(0, 4).map(float),  # ties
    st.floats(0, 1, allow_nan=False, allow_infinity=False),
)


@st.composite
def chains(draw, max_items: int = 12):
    scale = draw(st.sampled_from([3, 20, 1000, 2**30]))  # small scales make many ties
    n = draw(st.integers(0, max_items) | st.just(max_items))
    items = [Item(f"m{k}", draw(st.integers(0, scale)), draw(st.integers(0, scale)), draw(seconds)) for k in range(n)]
    base = draw(st.integers(0, scale))
    return items, base


def unplanned(items, base) -> int:
    return base + sum(i.saved_bytes for i in items)


def budgets(items, base):
    return st.integers(0, unplanned(items, base) + 2)


def peak_of(items, base, chosen) -> int:
    if not chosen:
        return unplanned(items, base)
    return unplanned(items, base) - sum(items[i].saving for i in chosen) + max(items[i].saved_bytes for i in chosen)


def brute_force(items, base, limit):
    """(least seconds within the limit or None, least peak of any set) over all 2^n subsets."""
    best, floor = None, None
    for r in range(len(items) + 1):
        for chosen in itertools.combinations(range(len(items)), r):
            peak = peak_of(items, base, chosen)
            floor = peak if floor is None else min(floor, peak)
            if peak <= limit:
                sec = math.fsum(items[i].forward_seconds for i in chosen)
                best = sec if best is None else min(best, sec)
    return best, floor


def check_choice(choice, items, base):
    """Every choice is honest about itself: its figures are the cost model's for its set."""
    est = estimate(items, choice.checkpointed, base_bytes=base)
    assert choice.estimated_peak == est.peak
    assert choice.recompute_seconds == est.seconds
    assert choice.names == tuple(items[i].name for i in choice.checkpointed)
    assert list(choice.checkpointed) == sorted(set(choice.checkpointed))
    assert choice.unplanned_peak == unplanned(items, base)
    assert choice.minimum_peak == minimum_peak(items, base_bytes=base)[0]
    if choice.limit is not None:
        assert choice.ok == (choice.estimated_peak <= choice.limit)
        if choice.status is Status.INFEASIBLE:
            assert choice.minimum_peak > choice.limit
        if choice.status is Status.MISSED:
            assert choice.minimum_peak <= choice.limit < choice.estimated_peak


# ---------------------------------------------------------------- cost model and budgets


def test_estimate_follows_the_documented_model():
    items = [Item("a", 100, 10, 1.0), Item("b", 50, 5, 2.0), Item("c", 30, 30, 0.5)]
    assert estimate(items, [], base_bytes=7) == search.Estimate(187, 0.0)
    # not checkpointed: c's 30; checkpointed: inputs 10 + 5; transient: max(100, 50)
    assert estimate(items, [0, 1], base_bytes=7) == search.Estimate(7 + 30 + 10 + 5 + 100, 3.0)


def test_budgets_are_typed_and_exact():
    assert FractionOfPeak(0.6).limit(1000) == 600  # 3/5, not the float just below it
    assert FractionOfPeak.percent(60) == FractionOfPeak(Fraction(3, 5))
    assert FractionOfPeak.percent(12.5).limit(1000) == 125
    assert FractionOfPeak(1).limit(999) == 999
    assert Bytes(4096).limit(10) == 4096
    for bad in (0, 0.0, 1.5, -0.1, float("nan")):
        with pytest.raises((ValueError, TypeError)):
            FractionOfPeak(bad)
    with pytest.raises(ValueError):
        Bytes(-1)
    with pytest.raises((ValueError, TypeError)):
        Bytes(True)
    with pytest.raises(ValueError):
        Coverage(0)
    assert [p.coverage.share for p in Preset] == [Fraction(1, 2), Fraction(3, 4), Fraction(1)]
    assert Coverage(0.75) == Preset.BALANCED.coverage


def test_budget_from_the_plan_statement():
    plan = parse("memplan 1\nbudget 4 GiB hint\n")
    assert budget_from_ast(plan.budget) == Bytes(4 * 1024**3)
    assert budget_from_ast(parse("memplan 1\nbudget 60%\n").budget) == FractionOfPeak(Fraction(3, 5))
    assert budget_from_ast(parse("memplan 1\nbudget 0.6\n").budget) == FractionOfPeak(Fraction(3, 5))
    assert budget_from_ast(parse("memplan 1\nbudget 1.5 KB\n").budget) == Bytes(1500)


def test_items_and_chains_are_validated():
    for bad in (
        dict(saved_bytes=-1),
        dict(input_bytes=1.5),
        dict(forward_seconds=float("inf")),
        dict(forward_seconds=-1.0),
    ):
        fields = dict(name="a", saved_bytes=1, input_bytes=0, forward_seconds=0.0) | bad
        with pytest.raises(ValueError):
            Item(**fields)
    for name in ("", "a..b", ".a", "a."):
        with pytest.raises(ValueError):
            Item(name, 1, 0, 0.0)
    with pytest.raises(ValueError, match="twice"):
        optimal([Item("a", 1, 0, 0.0), Item("a", 1, 0, 0.0)], Bytes(0))
    nested = [Item("layers.0", 1, 0, 0.0), Item("layers.0.attn", 1, 0, 0.0)]
    with pytest.raises(ValueError, match="inside"):
        sublinear(nested, Bytes(0))  # chain planners refuse nested candidates (optimal takes them)
    with pytest.raises(ValueError, match="inside"):
        greedy_coverage(nested, Preset.SPEED)
    with pytest.raises(ValueError, match="inside it"):  # a parent's bytes cover its children's
        optimal([Item("layers.0", 1, 0, 0.0), Item("layers.0.attn", 2, 0, 0.0)], Bytes(0))
    with pytest.raises(TypeError):
        optimal([Item("a", 1, 0, 0.0)], Preset.SPEED.coverage)  # optimal needs a byte budget


# ---------------------------------------------------------------- optimal


@SETTINGS
@given(st.data())
def test_optimal_equals_brute_force(data):
    items, base = data.draw(chains())
    limit = data.draw(budgets(items, base))
    best, floor = brute_force(items, base, limit)
    choice = optimal(items, Bytes(limit), base_bytes=base)
    check_choice(choice, items, base)
    assert choice.minimum_peak == floor
    if best is None:
        assert choice.status is Status.INFEASIBLE
        assert choice.estimated_peak == floor  # the set it returns reaches the true minimum
    else:
        assert choice.status is Status.OK
        assert choice.estimated_peak <= limit
        assert choice.recompute_seconds == pytest.approx(best, **TOL)
    assert choice.proven_optimal


def byte_dp(items, base, limit):
    """Least seconds within the limit by a DP over bytes saved, per transient cap (small sizes)."""
    top = unplanned(items, base)
    if top <= limit:
        return 0.0
    best = None
    for cap in sorted({i.saved_bytes for i in items if i.saving > 0}):
        need = top + cap - limit
        eligible = [i for i in items if i.saving > 0 and i.saved_bytes <= cap]
        if sum(i.saving for i in eligible) < need:
            continue
        cost = [0.0] + [math.inf] * need  # cost[b]: least seconds saving at least b bytes
        for item in eligible:
            for b in range(need, 0, -1):
                cost[b] = min(cost[b], cost[max(0, b - item.saving)] + item.forward_seconds)
        best = cost[need] if best is None else min(best, cost[need])
    return best


@settings(max_examples=n_examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_optimal_equals_a_byte_dp_on_long_chains(data):
    """Up to 150 modules with small sizes, many ties: the search against an independent exact DP."""
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    scale = rng.choice([5, 20, 60])
    shapes = [rng.randint(0, scale) for _ in range(rng.randint(1, 5))]
    kind = rng.choice(["integer", "float", "proportional", "equal"])
    items = []
    for k in range(data.draw(st.integers(10, 150))):
        s = rng.choice(shapes) if rng.random() < 0.6 else rng.randint(0, scale)
        x = rng.randint(0, s) if rng.random() < 0.8 else rng.randint(0, scale)
        t = {
            "integer": float(rng.randint(0, 4)),
            "float": rng.random(),
            "equal": 1.0,
            "proportional": max(0, s - x) * rng.uniform(0.9, 1.1),
        }[kind]
        items.append(Item(f"m{k}", s, x, t))
    base = rng.randint(0, scale)
    floor = minimum_peak(items, base_bytes=base)[0]
    limit = data.draw(st.integers(max(0, floor - 2), unplanned(items, base)))
    expected = byte_dp(items, base, limit)
    choice = optimal(items, Bytes(limit), base_bytes=base)
    check_choice(choice, items, base)
    if expected is None:
        assert choice.status is Status.INFEASIBLE
    else:
        assert choice.ok and choice.proven_optimal
        assert choice.recompute_seconds == pytest.approx(expected, **TOL)


@pytest.mark.slow
def test_optimal_search_is_bounded_and_stays_within_budget():
    """Times exactly proportional to the saving, sizes all distinct: a subset-sum problem."""
    rng = random.Random(5)
    items = []
    for k in range(300):
        s = rng.randint(1 << 20, 64 << 20)
        x = int(s * rng.uniform(0.05, 1.0))
        items.append(Item(f"m.{k}", s, x, (s - x) / 1e10))
    budget = FractionOfPeak.percent(70)
    cut = optimal(items, budget, max_states=2_000)
    assert cut == optimal(items, budget, max_states=2_000)  # deterministic: it counts states, not time
    assert cut.ok and cut.estimated_peak <= cut.limit and not cut.proven_optimal
    # on this chain it still beats both heuristics
    for planner in (greedy_bytes, lambda i, b: sublinear(i, b, SublinearConfig(num_worker=1)).choice):
        assert cut.recompute_seconds <= planner(items, budget).recompute_seconds
    assert optimal(items, budget).ok  # the default bound also returns a set within the budget


@SETTINGS
@given(st.data())
def test_minimum_peak_is_the_true_minimum(data):
    items, base = data.draw(chains())
    floor, chosen = minimum_peak(items, base_bytes=base)
    assert floor == brute_force(items, base, -1)[1]
    assert peak_of(items, base, chosen) == floor


@SETTINGS
@given(st.data())
def test_optimal_never_takes_more_time_for_a_larger_budget(data):
    items, base = data.draw(chains())
    low = data.draw(budgets(items, base))
    high = data.draw(st.integers(low, unplanned(items, base) + 2))
    a = optimal(items, Bytes(low), base_bytes=base)
    b = optimal(items, Bytes(high), base_bytes=base)
    if a.ok:
        assert b.ok
        assert b.recompute_seconds <= a.recompute_seconds * (1 + 1e-9) + 1e-12
        if b.recompute_seconds < a.recompute_seconds * (1 - 1e-9):
            # less recompute is only bought with a peak the smaller budget did not allow
            assert b.estimated_peak > low >= a.estimated_peak


def test_optimal_spends_a_larger_budget_on_less_recompute():
    """The peak follows the budget up: within every budget, higher only where it buys time."""
    items = [Item("big", 100, 0, 10.0), Item("small", 60, 0, 1.0)]  # unplanned 160
    assert optimal(items, Bytes(99)).status is Status.INFEASIBLE  # both: 160 - 160 + 100
    tight = optimal(items, Bytes(100))
    assert tight.names == ("big", "small") and tight.estimated_peak == 100
    assert optimal(items, Bytes(159)).names == ("big", "small")  # each alone is 160
    loose = optimal(items, Bytes(160))
    assert loose.names == () and loose.estimated_peak == 160 and loose.recompute_seconds == 0


def test_optimal_reports_infeasible_with_the_smallest_reachable_peak():
    items = [Item("a", 100, 90, 1.0), Item("b", 10, 0, 1.0), Item("c", 10, 0, 1.0)]
    choice = optimal(items, Bytes(50))
    assert choice.status is Status.INFEASIBLE and not choice.ok
    assert choice.minimum_peak == 110 and choice.estimated_peak == 110  # b and c: 120 - 20 + 10
    with pytest.raises(BudgetError, match="no set of checkpoints"):
        to_plan(choice, items, header={})
    assert to_plan(choice, items, header={}, allow_over_budget=True).rules  # on request only


@settings(max_examples=n_examples(60), deadline=None)
@given(st.data())
def test_optimal_on_larger_chains_beats_or_matches_the_heuristics(data):
    """Beyond brute force: never worse than greedy or sublinear, always within its budget."""
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    n = data.draw(st.integers(13, 120))
    shapes = [rng.randint(1, 1000) for _ in range(data.draw(st.integers(1, 6)))]
    items = []
    for k in range(n):
        s = rng.choice(shapes) if rng.random() < 0.7 else rng.randint(0, 1000)
        items.append(Item(f"b.{k}", s, rng.randint(0, s), rng.choice([1.0, rng.random(), s / 1000])))
    lo = minimum_peak(items)[0]
    limit = data.draw(st.integers(lo, unplanned(items, 0)))
    best = optimal(items, Bytes(limit))
    check_choice(best, items, 0)
    assert best.ok
    for other in (
        greedy_bytes(items, Bytes(limit)),
        sublinear(items, Bytes(limit), SublinearConfig(num_worker=1)).choice,
    ):
        if other.ok:
            assert best.recompute_seconds <= other.recompute_seconds * (1 + 1e-9) + 1e-12


def _transformer(blocks: int, noise: float, seed: int = 0):
    rng = random.Random(seed)
    kinds = {
        "ln1": ((16 << 20) + 65536, 16 << 20, 2.5e-5),
        "attn": (320 << 20, 16 << 20, 2.6e-4),
        "ln2": ((16 << 20) + 65536, 16 << 20, 2.5e-5),
        "mlp": (144 << 20, 16 << 20, 3.4e-4),
    }
    return [
        Item(f"blocks.{b}.{k}", s, x, t * (1 + rng.uniform(-noise, noise)))
        for b in range(blocks)
        for k, (s, x, t) in kinds.items()
    ]


@pytest.mark.parametrize("noise", [0.0, 0.03])
def test_optimal_is_fast_on_a_1000_item_chain(noise):
    items = _transformer(250, noise)
    start = time.perf_counter()
    for pct in (30, 50, 70, 90):
        choice = optimal(items, FractionOfPeak.percent(pct), base_bytes=1 << 30)
        assert choice.ok and choice.estimated_peak <= choice.limit
    assert time.perf_counter() - start < 4 * 5.0  # target 1 s each (see benchmarks/planner_speed.py)


# ---------------------------------------------------------------- greedy


@SETTINGS
@given(st.data())
def test_greedy_bytes_is_honest_and_nested_in_the_budget(data):
    items, base = data.draw(chains())
    low = data.draw(budgets(items, base))
    high = data.draw(st.integers(low, unplanned(items, base) + 2))
    a = greedy_bytes(items, Bytes(low), base_bytes=base)
    b = greedy_bytes(items, Bytes(high), base_bytes=base)
    check_choice(a, items, base)
    check_choice(b, items, base)
    if a.ok:
        assert b.ok
        assert set(b.checkpointed) <= set(a.checkpointed)
        assert b.recompute_seconds <= a.recompute_seconds
    optimum = optimal(items, Bytes(low), base_bytes=base)
    assert (a.status is Status.INFEASIBLE) == (optimum.status is Status.INFEASIBLE)
    if a.ok:
        assert optimum.recompute_seconds <= a.recompute_seconds * (1 + 1e-9) + 1e-12


def test_greedy_bytes_can_miss_a_budget_that_another_set_meets():
    """Largest saving first takes `a`, whose transient keeps every prefix over the budget."""
    items = [Item("a", 100, 90, 1.0), Item("b", 10, 0, 1.0), Item("c", 10, 0, 1.0)]
    greedy = greedy_bytes(items, Bytes(115))
    assert greedy.status is Status.MISSED and greedy.minimum_peak == 110
    assert optimal(items, Bytes(115)).names == ("b", "c")
    with pytest.raises(BudgetError, match="optimal planner would"):
        to_plan(greedy, items, header={})


@SETTINGS
@given(st.data())
def test_greedy_coverage_picks_the_share_largest_first(data):
    items, base = data.draw(chains())
    share = data.draw(st.sampled_from(list(Preset)) | st.fractions(Fraction(1, 100), 1).filter(lambda f: f > 0))
    coverage = share.coverage if isinstance(share, Preset) else Coverage(share)
    choice = greedy_coverage(items, share if isinstance(share, Preset) else coverage, base_bytes=base)
    check_choice(choice, items, base)
    assert choice.status is Status.OK and choice.limit is None
    assert len(choice.checkpointed) == math.ceil(coverage.share * len(items))
    chosen = set(choice.checkpointed)
    if chosen and len(chosen) < len(items):
        assert min(items[i].saved_bytes for i in chosen) >= max(
            items[i].saved_bytes for i in range(len(items)) if i not in chosen
        )


def test_greedy_coverage_presets():
    items = [Item(f"m{k}", size, 0, 1.0) for k, size in enumerate([5, 9, 1, 7, 3, 9, 2, 8])]
    assert greedy_coverage(items, Preset.SPEED).names == ("m1", "m3", "m5", "m7")  # 9, 9, 8, 7
    assert len(greedy_coverage(items, Preset.BALANCED).names) == 6
    assert len(greedy_coverage(items, Preset.MEMORY).names) == 8
    assert len(greedy_coverage(items[:5], Preset.SPEED).names) == 3  # ceil(2.5)


# ---------------------------------------------------------------- sublinear


@pytest.fixture(scope="module")
def process_pool():
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool


def _key(items, base, chosen, limit, lb):
    if chosen:
        peak = (
            unplanned(items, base)
            - sum(items[i].saving for i in chosen)
            + max(lb, max(items[i].saved_bytes for i in chosen))
        )
    else:
        peak = unplanned(items, base)
    return (max(0, peak - (limit or 0)), math.fsum(items[i].forward_seconds for i in chosen), peak)


@settings(max_examples=n_examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_sublinear_is_deterministic_and_independent_of_workers(process_pool, data):
    items, base = data.draw(chains(max_items=30))
    limit = data.draw(st.none() | budgets(items, base))
    budget = None if limit is None else Bytes(limit)
    config = SublinearConfig(
        thresh_nr_try=data.draw(st.integers(1, 6)),
        genetic_nr_iter=data.draw(st.integers(0, 8)),
        genetic_pool_size=data.draw(st.integers(2, 8)),
        lb_memory=data.draw(st.sampled_from([0, 0, 5, 500])),
        num_worker=1,
    )
    seed = data.draw(st.integers(0, 2**32))
    one = sublinear(items, budget, config, base_bytes=base, seed=seed)
    again = sublinear(items, budget, config, base_bytes=base, seed=seed)
    assert one == again
    for workers, pool in ((2, process_pool), (3, process_pool), (3, None)):
        config_w = dataclasses.replace(config, num_worker=workers)
        if pool is None:
            with concurrent.futures.ThreadPoolExecutor(workers) as threads:
                other = sublinear(items, budget, config_w, base_bytes=base, seed=seed, executor=threads)
        else:
            other = sublinear(items, budget, config_w, base_bytes=base, seed=seed, executor=pool)
        assert other == one

    choice, report = one.choice, one.report
    check_choice(choice, items, base)
    assert all(t >= config.lb_memory for t in report.thresholds)
    assert len(report.thresholds) <= config.thresh_nr_try
    # never worse than the threshold search, by its own fitness
    lb = config.lb_memory
    before = _key(items, base, report.threshold_checkpointed, limit, lb)
    after = _key(items, base, choice.checkpointed, limit, lb)
    assert after <= before
    assert report.improved == (after < before)
    assert report.seconds_saved == report.threshold.seconds - report.genetic.seconds


def test_sublinear_starts_its_own_pool_and_gives_the_same_answer():
    items = _transformer(30, 0.03, seed=1)
    budget = FractionOfPeak.percent(60)
    config = SublinearConfig(thresh_nr_try=4, genetic_nr_iter=5, genetic_pool_size=6, num_worker=1)
    alone = sublinear(items, budget, config, seed=3)
    pooled = sublinear(items, budget, dataclasses.replace(config, num_worker=2), seed=3)
    assert pooled == alone
    assert alone.choice.ok and alone.choice.estimated_peak <= alone.choice.limit


def test_sublinear_genetic_search_can_beat_the_thresholds():
    rng = random.Random(0)
    items = [
        Item(f"m.{k}", s, int(s * rng.uniform(0.05, 1)), rng.uniform(1e-4, 1e-2))
        for k, s in enumerate(rng.randint(1 << 20, 64 << 20) for _ in range(300))
    ]
    floor = minimum_peak(items)[0]
    budget = Bytes(floor + (unplanned(items, 0) - floor) // 10)
    plain = sublinear(items, budget, SublinearConfig(genetic_nr_iter=0, num_worker=1), seed=1)
    tuned = sublinear(items, budget, SublinearConfig(genetic_nr_iter=30, num_worker=1), seed=1)
    assert not plain.report.improved and plain.report.generations == 0
    assert tuned.report.improved and tuned.report.seconds_saved > 0
    assert tuned.choice.recompute_seconds < plain.choice.recompute_seconds
    assert tuned.report.threshold == plain.report.threshold
    assert optimal(items, budget).recompute_seconds <= tuned.choice.recompute_seconds


def test_sublinear_without_budget_minimises_memory():
    items = [Item("a", 100, 90, 1.0), Item("b", 10, 0, 1.0), Item("c", 10, 0, 1.0)]
    result = sublinear(items, None, SublinearConfig(num_worker=1))
    assert result.choice.estimated_peak == minimum_peak(items)[0] == 110
    assert result.choice.limit is None and result.choice.ok


def test_sublinear_lb_memory_floors_the_thresholds():
    items = [Item(f"m{k}", 10 * (k + 1), 0, 1.0) for k in range(5)]
    result = sublinear(items, None, SublinearConfig(lb_memory=25, num_worker=1))
    assert result.report.thresholds == (25, 30, 40, 50)  # 25 admits the modules of 10 and 20
    assert sublinear(items, None, SublinearConfig(lb_memory=0, thresh_nr_try=2, num_worker=1)).report.thresholds == (
        30,
        50,
    )


def test_sublinear_time_is_not_monotonic_in_the_budget():
    """A heuristic: found by search, kept as the documented counterexample."""
    found = _sublinear_counterexample()
    assert found is not None, "no counterexample found: update the module docstring"


def _sublinear_counterexample():
    rng = random.Random(7)
    config = SublinearConfig(thresh_nr_try=2, genetic_nr_iter=0, num_worker=1)
    for _ in range(2000):
        items = [Item(f"m{k}", rng.randint(1, 20), rng.randint(0, 20), float(rng.randint(0, 5))) for k in range(6)]
        top = unplanned(items, 0)
        results = [sublinear(items, Bytes(b), config).choice for b in range(top + 1)]
        for low, high in zip(results, results[1:]):
            if low.ok and high.ok and high.recompute_seconds > low.recompute_seconds:
                return items, low, high
    return None


# ---------------------------------------------------------------- to a plan

names = st.lists(st.text(st.characters(exclude_characters="."), min_size=1, max_size=6), min_size=1, max_size=3).map(
    ".".join
)


@SETTINGS
@given(st.data())
def test_plans_round_trip_through_the_formatter(data):
    paths = data.draw(st.lists(names, min_size=0, max_size=6, unique=True))
    # candidates are disjoint modules: drop any path that contains or is contained in another
    paths = [p for p in paths if not any(q != p and (q.startswith(p + ".") or p.startswith(q + ".")) for q in paths)]
    items = [
        Item(p, data.draw(st.integers(0, 2**40)), data.draw(st.integers(0, 2**40)), data.draw(seconds)) for p in paths
    ]
    choice = greedy_coverage(items, data.draw(st.sampled_from(list(Preset))))
    header = data.draw(st.dictionaries(st.text(max_size=12), st.text(max_size=30), max_size=4))
    plan = to_plan(choice, items, header=header | describe(choice))
    text = format_plan(plan)
    assert parse(text) == plan
    assert format_plan(parse(text)) == text
    assert [format_path(r) for r in plan.rules] == list(choice.names)
    for rule in plan.rules:
        assert rule.policies == (ast.Checkpoint(),)
        assert len(rule.comments.leading) == 1 and rule.comments.leading[0].startswith("# ")


def format_path(rule) -> str:
    return ".".join(seg.text for seg in rule.selector.include.path.segments)


def test_plan_reads_as_expected():
    mlp, ln = (144 << 20, 16 << 20, 3.4e-4), ((16 << 20) + 65536, 16 << 20, 2.5e-5)
    items = [
        Item("encoder.layers.0.ln", *ln),
        Item("encoder.layers.0.mlp", *mlp),
        Item("encoder.layers.1.ln", *ln),
        Item("encoder.layers.1.mlp", *mlp),
    ]
    choice = optimal(items, Bytes(210 << 20), base_bytes=0)
    header = {"tool": "memoplan 0.1.0", "torch": "2.13.0", "device": "cpu", "inputs": "randn(8, 1024, 1024)"}
    text = format_plan(to_plan(choice, items, header=header | describe(choice)))
    assert text == (
        "# tool: memoplan 0.1.0\n"
        "# torch: 2.13.0\n"
        "# device: cpu\n"
        "# inputs: randn(8, 1024, 1024)\n"
        "# planner: optimal\n"
        "# budget: 210.0 MiB (220200960 B)\n"
        "# cost model, peak before: 320.1 MiB (335675392 B)\n"
        "# cost model, peak after: 208.1 MiB (218234880 B)\n"
        "# recompute: 680.0 us over 2 modules (proven least)\n"
        "memplan 1\n"
        "\n"
        "# saves 128.0 MiB (144.0 MiB saved -> 16.0 MiB input) for 340.0 us of recompute\n"
        "module encoder.layers.0.mlp { checkpoint }\n"
        "\n"
        "# saves 128.0 MiB (144.0 MiB saved -> 16.0 MiB input) for 340.0 us of recompute\n"
        "module encoder.layers.1.mlp { checkpoint }\n"
    )


def test_header_values_cannot_break_the_plan():
    items = [Item("a", 10, 0, 1e-3), Item("b", 10, 0, 1e-3)]
    choice = optimal(items, Bytes(15))
    plan = to_plan(choice, items, header={"evil\nkey": "line one\nmodule x { checkpoint }\r\x00\u2028 end  "})
    text = format_plan(plan)
    assert parse(text) == plan
    assert [format_path(r) for r in parse(text).rules] == ["a", "b"]
    assert plan.header_comments.leading == ("# evil key: line one module x { checkpoint } \\u0000 end",)


def test_a_planned_chain_resolves_on_its_model():
    torch = pytest.importorskip("torch")
    import memoplan

    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU())
    )
    items = [Item("0", 1024, 1024, 1e-5), Item("1", 4096, 1024, 1e-5), Item("2", 8192, 1024, 2e-5)]
    choice = optimal(items, FractionOfPeak.percent(90))
    assert choice.ok and choice.names == ("1", "2")
    plan = parse(format_plan(to_plan(choice, items, header=describe(choice))))
    resolved = memoplan.resolve(plan, model)
    assert resolved is not None


def test_unplanned_base_counts_only_the_outermost_candidates():
    """A nested candidate's bytes are inside its parent's: B0 is not lowered by them a second time."""
    block = Item("blocks.0", saved_bytes=700, input_bytes=10, forward_seconds=1.0)
    part = Item("blocks.0.mlp", saved_bytes=300, input_bytes=10, forward_seconds=0.4)
    other = Item("blocks.1", saved_bytes=200, input_bytes=10, forward_seconds=0.5)
    assert search.unplanned_base(1000, [block, other]) == 100
    assert search.unplanned_base(1000, [block, part, other]) == 100
    # The unplanned estimate is then the measured peak, nested or not.
    assert search.estimate([block, part, other], [], base_bytes=100).peak == 1000
    assert search.unplanned_base(800, [block, other]) == 0  # candidates above the measured peak
