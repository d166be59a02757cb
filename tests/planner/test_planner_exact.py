"""Exact planner for nested candidates (``memoplan.planner.search.exact``): the MILP against brute force.

What holds, and is tested here:

* on random forests of up to 12 candidates (module paths nested up to any depth), ``exact`` ==
  brute force over every legal set (at most one candidate on any root-to-leaf path): the least
  recompute time, with a peak within the limit; an impossible budget is INFEASIBLE with the
  true least peak, as ``optimal`` reports it;
* on chains (no nesting) it agrees with the chain planner ``optimal``;
* a larger budget never gives it more recompute time;
* ``optimal`` hands nested candidates to it; ``greedy_bytes``, ``estimate`` and
  ``minimum_peak`` read nested candidates with the same cost model;
* without scipy, at a time limit too short to find a set, with byte counts too large for
  floats, or when the solver's set fails the exact model: a set within the budget (greedy, or
  the least-peak set where greedy misses), flagged not proven least, with its reason.

The brute force computes the peak from each candidate's *own* bytes (the bytes not inside a
nested candidate), independently of the ``saved - input`` form the planners use.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import pytest
from _profiles import n_examples  # tests/_profiles.py: the hypothesis profile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("scipy")

from memoplan.planner.search import (  # noqa: E402
    BudgetError,
    Bytes,
    FractionOfPeak,
    Item,
    Status,
    describe,
    estimate,
    greedy_bytes,
    minimum_peak,
    optimal,
    to_plan,
)
from memoplan.planner.search import exact as exact_module  # noqa: E402
from memoplan.planner.search.chain import Chain  # noqa: E402
from memoplan.planner.search.exact import exact  # noqa: E402
from memoplan.planner.search.forest import forest_search  # noqa: E402

SETTINGS = settings(
    max_examples=n_examples(120), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
TOL = dict(rel=1e-9, abs=1e-12)

seconds = st.one_of(
    st.just(0.0),
    st.integers(0, 4).map(float),  # ties
    st.floats(0, 1, allow_nan=False, allow_infinity=False),
)


# ---------------------------------------------------------------- forests and brute force


@dataclass(frozen=True)
class Forest:
    items: list[Item]
    own: list[int]  # each candidate's bytes outside the candidates nested in it
    base: int


@st.composite
def forests(draw, max_items: int = 12) -> Forest:
    """Candidates nested by module path; listed in a random order (children may come first)."""
    scale = draw(st.sampled_from([3, 20, 1000, 2**30]))  # small scales make many ties
    n = draw(st.integers(0, max_items) | st.just(max_items))
    parents = [draw(st.integers(-1, k - 1)) for k in range(n)]  # -1: a root
    names: list[str] = []
    for k, p in enumerate(parents):
        names.append(f"m{k}" if p < 0 else f"{names[p]}.m{k}")
    own = [draw(st.integers(0, scale)) for _ in range(n)]
    subtree = list(own)
    for k in reversed(range(n)):  # children have larger numbers than their parents
        if parents[k] >= 0:
            subtree[parents[k]] += subtree[k]
    order = draw(st.permutations(range(n)))
    items = [Item(names[k], subtree[k], draw(st.integers(0, scale)), draw(seconds)) for k in order]
    return Forest(items, [own[k] for k in order], draw(st.integers(0, scale)))


@st.composite
def chains(draw, max_items: int = 12) -> Forest:
    scale = draw(st.sampled_from([3, 20, 1000, 2**30]))
    n = draw(st.integers(0, max_items) | st.just(max_items))
    items = [Item(f"m{k}", draw(st.integers(0, scale)), draw(st.integers(0, scale)), draw(seconds)) for k in range(n)]
    return Forest(items, [i.saved_bytes for i in items], draw(st.integers(0, scale)))


def inside(forest: Forest, k: int, c: int) -> bool:
    """Candidate k is candidate c or nested in it."""
    a, b = forest.items[k].name, forest.items[c].name
    return a == b or a.startswith(b + ".")


def unplanned(forest: Forest) -> int:
    return forest.base + sum(forest.own)


def peak_of(forest: Forest, chosen) -> int:
    """Own bytes not inside a checkpoint, the checkpoints' inputs, and the largest region once more."""
    n = len(forest.items)
    live = sum(forest.own[k] for k in range(n) if not any(inside(forest, k, c) for c in chosen))
    inputs = sum(forest.items[c].input_bytes for c in chosen)
    transient = max((forest.items[c].saved_bytes for c in chosen), default=0)
    return forest.base + live + inputs + transient


def legal_sets(forest: Forest):
    """Every set with at most one candidate on any root-to-leaf path."""
    n = len(forest.items)

    def grow(k: int, chosen: list[int]):
        if k == n:
            yield tuple(chosen)
            return
        yield from grow(k + 1, chosen)
        if not any(inside(forest, k, c) or inside(forest, c, k) for c in chosen):
            yield from grow(k + 1, chosen + [k])

    return grow(0, [])


def brute_force(forest: Forest, limit: int):
    """(least seconds within the limit or None, least peak of any legal set)."""
    best, floor = None, None
    for chosen in legal_sets(forest):
        peak = peak_of(forest, chosen)
        floor = peak if floor is None else min(floor, peak)
        if peak <= limit:
            sec = math.fsum(forest.items[c].forward_seconds for c in chosen)
            best = sec if best is None else min(best, sec)
    return best, floor


def budgets(forest: Forest):
    return st.integers(0, unplanned(forest) + 2)


def check_choice(choice, forest: Forest) -> None:
    """The choice's figures are the brute force's for its set, and its set is legal."""
    chosen = choice.checkpointed
    assert list(chosen) == sorted(set(chosen))
    assert not any(a != b and inside(forest, a, b) for a in chosen for b in chosen)
    assert choice.estimated_peak == peak_of(forest, chosen)
    assert choice.estimated_peak == estimate(forest.items, chosen, base_bytes=forest.base).peak
    assert choice.recompute_seconds == math.fsum(forest.items[c].forward_seconds for c in chosen)
    assert choice.names == tuple(forest.items[c].name for c in chosen)
    assert choice.unplanned_peak == unplanned(forest)
    assert choice.ok == (choice.estimated_peak <= choice.limit)


# ---------------------------------------------------------------- exact == brute force


@SETTINGS
@given(st.data())
def test_exact_equals_brute_force_on_forests(data):
    forest = data.draw(forests())
    limit = data.draw(budgets(forest))
    best, floor = brute_force(forest, limit)
    choice = exact(forest.items, Bytes(limit), base_bytes=forest.base)
    check_choice(choice, forest)
    assert choice.minimum_peak == floor == minimum_peak(forest.items, base_bytes=forest.base)[0]
    assert choice.proven_optimal and choice.reason == ""
    if best is None:
        assert choice.status is Status.INFEASIBLE
        assert choice.estimated_peak == floor  # the set it returns reaches the true minimum
    else:
        assert choice.status is Status.OK
        assert choice.recompute_seconds == pytest.approx(best, **TOL)


@SETTINGS
@given(st.data())
def test_exact_agrees_with_the_chain_planner(data):
    forest = data.draw(chains())
    budget = Bytes(data.draw(budgets(forest)))
    milp = exact(forest.items, budget, base_bytes=forest.base)
    dp = optimal(forest.items, budget, base_bytes=forest.base)
    check_choice(milp, forest)
    assert milp.proven_optimal and dp.proven_optimal
    assert (milp.status, milp.minimum_peak) == (dp.status, dp.minimum_peak)
    if milp.ok:
        assert milp.recompute_seconds == pytest.approx(dp.recompute_seconds, **TOL)


@SETTINGS
@given(st.data())
def test_a_larger_budget_never_costs_more_recompute(data):
    forest = data.draw(forests())
    low, high = sorted(data.draw(st.lists(budgets(forest), min_size=2, max_size=2)))
    a = exact(forest.items, Bytes(low), base_bytes=forest.base)
    b = exact(forest.items, Bytes(high), base_bytes=forest.base)
    if a.ok:
        assert b.ok
        assert b.recompute_seconds <= a.recompute_seconds + abs(a.recompute_seconds) * 1e-9


def test_an_impossible_budget_is_reported_like_optimal():
    items = [Item("a", 100, 10, 1.0), Item("a.b", 60, 5, 0.3), Item("a.c", 30, 3, 0.2), Item("d", 50, 5, 0.5)]
    # unplanned: 100 (a holds a.b and a.c) + 50; least peak: a.b, a.c and d, 150 - 55 - 27 - 45 + 60
    choice = exact(items, Bytes(80))
    assert choice.status is Status.INFEASIBLE and choice.proven_optimal
    assert (choice.unplanned_peak, choice.minimum_peak, choice.estimated_peak) == (150, 83, 83)
    assert choice.names == ("a.b", "a.c", "d")
    with pytest.raises(BudgetError, match="no set of checkpoints reaches it"):
        to_plan(choice, items, header={})
    fits = exact(items, Bytes(130))
    assert fits.ok and fits.names == ("a.b", "a.c") and fits.estimated_peak == 128


# ---------------------------------------------------------------- the rest of the planner stage


def test_optimal_hands_nested_candidates_to_exact():
    items = [Item("blocks.0", 900, 100, 4.0), Item("blocks.0.attn", 500, 100, 1.0), Item("blocks.0.mlp", 300, 100, 1.0)]
    for limit in range(0, 1000, 50):
        a = optimal(items, Bytes(limit))
        assert a == exact(items, Bytes(limit))
        assert a.planner == "exact"


@SETTINGS
@given(st.data())
def test_greedy_bytes_on_forests_is_legal_and_nested_in_the_budget(data):
    forest = data.draw(forests())
    low, high = sorted(data.draw(st.lists(budgets(forest), min_size=2, max_size=2)))
    a = greedy_bytes(forest.items, Bytes(low), base_bytes=forest.base)
    b = greedy_bytes(forest.items, Bytes(high), base_bytes=forest.base)
    check_choice(a, forest)
    check_choice(b, forest)
    if a.ok and b.ok:
        assert set(b.checkpointed) <= set(a.checkpointed)


def test_nested_inputs_are_validated():
    with pytest.raises(ValueError, match="inside it"):  # a parent's saved bytes hold its children's
        exact([Item("a", 10, 0, 1.0), Item("a.b", 6, 0, 1.0), Item("a.c", 6, 0, 1.0)], Bytes(0))
    with pytest.raises(ValueError, match="one is inside the other"):
        estimate([Item("a", 10, 0, 1.0), Item("a.b", 6, 0, 1.0)], [0, 1])
    with pytest.raises(ValueError, match="time_limit"):
        exact([Item("a", 10, 0, 1.0)], Bytes(0), time_limit=0)


def test_a_nested_plan_resolves_on_its_model():
    torch = pytest.importorskip("torch")
    import memoplan

    def block():
        return torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU())

    model = torch.nn.Sequential(block(), block(), torch.nn.Linear(32, 32))
    items = []
    for k in "01":  # a block holds its Linear and its GELU
        items += [Item(k, 6000, 1000, 3e-5), Item(f"{k}.0", 2000, 1000, 1e-5), Item(f"{k}.1", 4000, 4000, 2e-5)]
    items.append(Item("2", 4096, 4096, 1e-5))
    # unplanned 6000 + 6000 + 4096 = 16096; both blocks: 16096 - 2 * 5000 + 6000
    choice = exact(items, FractionOfPeak.percent(76))  # 12232 B
    assert choice.ok and choice.proven_optimal and choice.names == ("0", "1") and choice.estimated_peak == 12096
    assert memoplan.resolve(to_plan(choice, items, header=describe(choice)), model) is not None


# ---------------------------------------------------------------- fallbacks


def assert_fallback(choice, forest: Forest, limit: int, words: str) -> None:
    """A fallback answer: legal, honest, within the limit whenever some set is, never proven."""
    assert len(forest.items) <= 12  # for the brute force
    check_choice(choice, forest)
    best, floor = brute_force(forest, limit)
    assert choice.minimum_peak == floor
    if unplanned(forest) <= limit or best is None:  # answered before any solver runs
        assert choice.proven_optimal and choice.reason == ""
        return
    assert choice.ok and not choice.proven_optimal
    assert words in choice.reason and "not proven least" in choice.reason
    assert describe(choice)["note"] == choice.reason
    assert choice.recompute_seconds >= best - abs(best) * 1e-9


@settings(SETTINGS, max_examples=n_examples(60))
@given(st.data())
def test_without_scipy_a_greedy_set_within_the_budget(data):
    forest = data.draw(forests())
    limit = data.draw(budgets(forest))
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "scipy.optimize", None)  # `import scipy.optimize` now fails
        choice = exact(forest.items, Bytes(limit), base_bytes=forest.base)
    assert_fallback(choice, forest, limit, "scipy is not installed")
    if not choice.proven_optimal:
        assert choice.planner == "greedy"


def test_where_greedy_misses_the_fallback_is_the_least_peak_set(monkeypatch):
    # Greedy takes `big` first (largest saving), whose transient keeps every prefix at 160 or more.
    items = [Item("big", 100, 60, 1.0), Item("b", 30, 0, 1.0), Item("c", 30, 0, 1.0)]
    forest = Forest(items, [100, 30, 30], 0)
    assert greedy_bytes(items, Bytes(140)).status is Status.MISSED
    monkeypatch.setitem(sys.modules, "scipy.optimize", None)
    choice = exact(items, Bytes(140))
    assert choice.names == ("b", "c") and choice.estimated_peak == 130
    assert_fallback(choice, forest, 140, "scipy is not installed")


def nested_forest(n: int) -> Forest:
    """A fixed forest of ``n`` candidates, three levels deep."""
    items, own = [], []
    for k in range(0, n, 3):
        sizes = [(k * 37) % 101 + 50, (k * 53) % 89 + 20, (k * 71) % 97 + 20]
        items += [
            Item(f"b{k}", sum(sizes), 10, 3e-3),
            Item(f"b{k}.attn", sizes[1], 5 + k % 7, 1e-3 + k * 1e-5),
            Item(f"b{k}.mlp", sizes[2], 5 + k % 5, 1e-3 + k * 2e-5),
        ]
        own += sizes
    return Forest(items[:n], own[:n], 0)


def test_a_tiny_time_limit_falls_back_to_greedy():
    forest = nested_forest(12)
    limit = (unplanned(forest) + minimum_peak(forest.items)[0]) // 2
    choice = exact(forest.items, Bytes(limit), time_limit=1e-9)
    assert_fallback(choice, forest, limit, "time limit")


@pytest.mark.parametrize("status", [0, 1])
def test_the_solver_set_is_checked_and_a_timed_out_one_is_kept_if_better(monkeypatch, status):
    import scipy.optimize

    real = scipy.optimize.milp
    forest = nested_forest(12)
    limit = (unplanned(forest) + minimum_peak(forest.items)[0]) // 2

    def timed_out(*args, **kwargs):  # the proven answer, reported as if the time limit cut it
        result = real(*args, **kwargs)
        result.status = 1
        return result

    def illegal(*args, **kwargs):  # "proven", but every candidate at once: not a legal set
        result = real(*args, **kwargs)
        result.x[:] = 1
        result.status = status
        return result

    monkeypatch.setattr(scipy.optimize, "milp", timed_out)
    kept = exact(forest.items, Bytes(limit))
    assert_fallback(kept, forest, limit, "time limit")
    assert kept.recompute_seconds <= greedy_bytes(forest.items, Bytes(limit)).recompute_seconds
    assert kept.recompute_seconds == pytest.approx(brute_force(forest, limit)[0], **TOL)
    assert kept.planner == "exact" and "best set it found" in kept.reason

    monkeypatch.setattr(scipy.optimize, "milp", illegal)
    checked = exact(forest.items, Bytes(limit))
    words = "numerical trouble" if status == 0 else "time limit"
    assert_fallback(checked, forest, limit, words)
    assert checked.planner == "greedy"


def test_byte_counts_beyond_exact_floats_fall_back():
    big = 2**60
    items = [Item("a", 3 * big, big, 1.0), Item("a.b", big, 1, 0.5), Item("c", 2 * big, 0, 0.25)]
    forest = Forest(items, [2 * big, big, 2 * big], 0)
    limit = 4 * big
    choice = exact(items, Bytes(limit))
    assert_fallback(choice, forest, limit, "2**53")
    assert exact_module.DEFAULT_TIME_LIMIT > 0


def test_a_subnormal_recompute_time_keeps_the_objective_finite():
    """Found by hypothesis: 1e6 / 2.2e-311 is inf, and scipy's milp refuses an infinite objective."""
    items = [Item(f"m{i}", saved_bytes=1, input_bytes=0, forward_seconds=0.0) for i in range(2)]
    items.append(Item("m2", saved_bytes=1, input_bytes=0, forward_seconds=2.225073858507e-311))
    milp = exact(items, Bytes(1), base_bytes=0)
    dp = optimal(items, Bytes(1), base_bytes=0)
    assert (milp.status, milp.minimum_peak) == (dp.status, dp.minimum_peak)
    assert milp.recompute_seconds == dp.recompute_seconds


# ---------------------------------------------------------------- the trees' frontiers (forest_search)


@SETTINGS
@given(st.data())
def test_forest_search_equals_brute_force_on_forests(data):
    forest = data.draw(forests())
    limit = data.draw(budgets(forest))
    best, floor = brute_force(forest, limit)
    chain = Chain(forest.items, forest.base, nested_ok=True)
    if chain.unplanned <= limit or floor > limit:
        return  # settled without a search (the empty set, or none within the limit): optimal never asks
    chosen = forest_search(chain, limit)
    assert chosen is not None and best is not None
    assert list(chosen) == sorted(set(chosen))
    assert not any(a != b and inside(forest, a, b) for a in chosen for b in chosen)
    assert peak_of(forest, chosen) <= limit
    assert math.fsum(forest.items[c].forward_seconds for c in chosen) == pytest.approx(best, **TOL)
    # optimal answers with it, and says what the mixed-integer program says
    choice, milp = (f(forest.items, Bytes(limit), base_bytes=forest.base) for f in (optimal, exact))
    assert choice.checkpointed == chosen and choice.proven_optimal and choice.planner == "exact"
    assert (choice.status, choice.minimum_peak) == (milp.status, milp.minimum_peak)
    assert choice.recompute_seconds == pytest.approx(milp.recompute_seconds, **TOL)


def test_forest_search_agrees_with_the_solver_on_blocks_with_variants():
    """Blocks whose save variants nest as a path above the plain block, parts inside (as the planner builds them)."""
    items = []
    for b in range(6):
        items.append(Item(f"h.{b}", 2900 + 7 * b, 100, 4.0 + b * 1e-3))
        items += [Item(f"h.{b}", 2900 + 7 * b, 900 + 50 * v, 3.0 - v * 0.7, save=(f"s{v}",)) for v in range(3)]
        items += [Item(f"h.{b}.attn", 900, 100 + b, 1.0 + b * 1e-3), Item(f"h.{b}.mlp", 1800, 300, 1.5 - b * 1e-3)]
        items.append(Item(f"h.{b}.mlp", 1800, 700, 0.6, save=("mm",)))
    unplanned = Chain(items, 500, nested_ok=True).unplanned
    for limit in range(unplanned // 4, unplanned, unplanned // 23):
        choice, milp = (f(items, Bytes(limit), base_bytes=500) for f in (optimal, exact))
        assert (choice.status, choice.minimum_peak) == (milp.status, milp.minimum_peak)
        assert choice.proven_optimal and milp.proven_optimal
        assert choice.recompute_seconds == pytest.approx(milp.recompute_seconds, **TOL)


def test_forest_search_past_its_bound_hands_over_to_the_solver(monkeypatch):
    forest = nested_forest(12)
    chain = Chain(forest.items, 0, nested_ok=True)
    limit = chain.unplanned * 2 // 3
    assert forest_search(chain, limit) is not None
    assert forest_search(chain, limit, max_options=3) is None
    asked = []
    optimal_module = sys.modules["memoplan.planner.search.optimal"]  # the package's `optimal` is the function
    monkeypatch.setattr(optimal_module, "forest_search", lambda *a: asked.append(a) and None)
    choice = optimal(forest.items, Bytes(limit))
    assert asked and choice == exact(forest.items, Bytes(limit))
