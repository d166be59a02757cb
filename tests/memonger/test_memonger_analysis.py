"""memonger's pure analysis: linearize, live ranges, interference, greedy and dp assignment,
verify_assignments and the lower bound, against brute force on small random cases."""

from __future__ import annotations

import itertools
import random

import pytest
from _profiles import n_examples  # tests/_profiles.py: the hypothesis profile
from hypothesis import given, settings
from hypothesis import strategies as st

from memoplan.memonger import (
    Buffer,
    LiveRange,
    assign_dp,
    assign_greedy,
    interference,
    layout,
    linearize,
    live_ranges,
    lower_bound,
    verify_assignments,
)
from memoplan.memonger.order import is_linearization

UNIT = 64


@st.composite
def dags(draw, max_steps=12):
    n = draw(st.integers(1, max_steps))
    return [sorted(set(draw(st.lists(st.integers(0, i - 1), max_size=3)))) if i else [] for i in range(n)]


@st.composite
def interval_sets(draw, max_buffers=8, max_units=4, horizon=8):
    n = draw(st.integers(0, max_buffers))
    ranges = []
    for i in range(n):
        start = draw(st.integers(0, horizon))
        end = draw(st.integers(start, horizon))
        size = draw(st.integers(1, max_units * UNIT))
        ranges.append(LiveRange(i, start, end, size))
    return ranges


@given(dags(), st.sampled_from(["topological", "longest_path"]), st.randoms(use_true_random=False))
def test_linearize_gives_a_valid_order_whatever_the_numbering(deps, ordering, rnd):
    # Renumber the steps at random so the capture order is not already topological.
    perm = list(range(len(deps)))
    rnd.shuffle(perm)
    shuffled = [[] for _ in deps]
    for step, before in enumerate(deps):
        shuffled[perm[step]] = [perm[d] for d in before]
    order = linearize(shuffled, ordering)
    assert is_linearization(order, shuffled)


@given(dags())
def test_topological_keeps_the_capture_order_when_it_is_valid(deps):
    assert linearize(deps, "topological") == tuple(range(len(deps)))


def test_longest_path_runs_the_long_branch_first():
    # 0 -> 1 -> 2 -> 3 -> 5 and 0 -> 4 -> 5: the short branch 4 waits until it is needed.
    deps = [[], [0], [1], [2], [0], [3, 4]]
    assert linearize(deps, "topological") == (0, 1, 2, 3, 4, 5)
    assert linearize(deps, "longest_path") == (0, 1, 2, 3, 4, 5)
    deps = [[], [0], [0], [2], [3], [4], [1, 5]]  # the long branch is numbered second
    assert linearize(deps, "topological") == (0, 1, 2, 3, 4, 5, 6)
    assert linearize(deps, "longest_path") == (0, 2, 3, 4, 1, 5, 6)


def test_linearize_refuses_a_cycle_and_an_unknown_ordering():
    with pytest.raises(ValueError, match="cycle"):
        linearize([[1], [0]])
    with pytest.raises(ValueError, match="ordering"):
        linearize([[]], "random")


def test_live_ranges_run_from_the_writer_to_the_last_reader_in_the_order():
    buffers = [Buffer(100, 0, (1, 3)), Buffer(50, 1, (2,)), Buffer(10, 2, ())]
    with pytest.raises(ValueError, match="read before"):
        live_ranges((0, 2, 1, 3), buffers)  # buffer 1 is written at position 2 and read at position 1
    ranges = live_ranges((0, 1, 2, 3), buffers)
    assert ranges == (LiveRange(0, 0, 3, 100), LiveRange(1, 1, 2, 50), LiveRange(2, 2, 2, 10))


@given(interval_sets(max_buffers=12))
def test_interference_is_every_overlapping_pair(ranges):
    brute = {(i, j) for i, j in itertools.combinations(range(len(ranges)), 2) if ranges[i].overlaps(ranges[j])}
    found = list(interference(ranges))
    assert len(found) == len(set(found)) and set(found) == brute


def _brute_lower_bound(ranges):
    aligned = [-(-r.size // UNIT) * UNIT for r in ranges]
    horizon = max((r.end for r in ranges), default=0)
    return max(
        (sum(a for r, a in zip(ranges, aligned) if r.start <= t <= r.end) for t in range(horizon + 1)), default=0
    )


def _brute_optimum(ranges):
    """The smallest arena over every placement on the 64-byte grid (backtracking, no heuristics)."""
    units = [-(-r.size // UNIT) for r in ranges]
    best = [sum(units)]
    offsets = [0] * len(ranges)

    def place(i, top):
        if top >= best[0]:
            return
        if i == len(ranges):
            best[0] = top
            return
        for offset in range(best[0] - units[i] + 1):
            if all(
                not ranges[i].overlaps(ranges[j]) or offset + units[i] <= offsets[j] or offsets[j] + units[j] <= offset
                for j in range(i)
            ):
                offsets[i] = offset
                place(i + 1, max(top, offset + units[i]))

    place(0, 0)
    return best[0] * UNIT


@given(interval_sets(max_buffers=12))
def test_lower_bound_is_the_most_bytes_live_at_once(ranges):
    assert lower_bound(ranges) == _brute_lower_bound(ranges)


@given(interval_sets(max_buffers=14, max_units=8, horizon=10))
def test_greedy_and_dp_assignments_are_valid_and_not_under_the_bound(ranges):
    greedy, dp = assign_greedy(ranges), assign_dp(ranges, max_steps=300)
    assert verify_assignments(ranges, greedy) == []
    assert verify_assignments(ranges, dp) == []
    assert lower_bound(ranges) <= dp.size <= greedy.size <= max(sum(-(-r.size // UNIT) * UNIT for r in ranges), 0)


@settings(max_examples=n_examples(60), deadline=None)
@given(interval_sets(max_buffers=5, max_units=3, horizon=5))
def test_dp_is_optimal_on_small_sets(ranges):
    dp = assign_dp(ranges)
    assert dp.optimal
    assert dp.size == _brute_optimum(ranges)


def test_dp_beats_greedy_where_largest_first_is_not_optimal():
    # Found by searching random interval sets for greedy > optimum (seed 2, below).
    rnd = random.Random(2)
    for _ in range(5000):
        ranges = []
        for i in range(5):
            start = rnd.randint(0, 5)
            ranges.append(LiveRange(i, start, rnd.randint(start, 5), rnd.randint(1, 3) * UNIT))
        if assign_greedy(ranges).size > _brute_optimum(ranges):
            break
    else:
        pytest.fail("no case where greedy is above the optimum")
    dp = assign_dp(ranges)
    assert dp.optimal and dp.size == _brute_optimum(ranges) < assign_greedy(ranges).size


def test_dp_stops_at_its_step_bound_with_a_valid_answer():
    rnd = random.Random(0)
    ranges = []
    for i in range(60):
        start = rnd.randint(0, 40)
        ranges.append(LiveRange(i, start, start + rnd.randint(0, 10), rnd.randint(1, 9) * UNIT))
    bounded = assign_dp(ranges, max_steps=50)
    assert bounded.steps <= 50
    assert verify_assignments(ranges, bounded) == []
    assert bounded.size <= assign_greedy(ranges).size
    assert assign_dp(ranges, max_steps=50) == bounded  # a count, not a clock: the same answer every time


def test_verify_assignments_names_every_kind_of_mistake():
    ranges = [LiveRange(0, 0, 2, 128), LiveRange(1, 1, 3, 64), LiveRange(2, 3, 4, 64)]
    assert verify_assignments(ranges, [0, 128, 0], arena_size=192) == []
    (shared,) = verify_assignments(ranges, [0, 64, 0], arena_size=192)
    assert "buffers 0 and 1 are live together (positions 1..2) and share bytes 64..128" in shared
    assert any("not a non-negative multiple" in p for p in verify_assignments(ranges, [0, 130, 0]))
    assert any("past the arena" in p for p in verify_assignments(ranges, [0, 128, 0], arena_size=150))


@given(
    dags(max_steps=15),
    st.randoms(use_true_random=False),
    st.sampled_from(["greedy", "dp"]),
    st.sampled_from(["topological", "longest_path"]),
)
def test_layout_of_a_random_graph_is_verified_and_its_figures_add_up(deps, rnd, algo, ordering):
    users = [[s for s, before in enumerate(deps) if p in before] for p in range(len(deps))]
    buffers = [Buffer(rnd.randint(1, 5000), p, tuple(users[p])) for p in range(len(deps))]
    result = layout(deps, buffers, algo=algo, ordering=ordering, max_steps=300)
    assert verify_assignments(result.ranges, result.assignment) == []
    assert result.stats.buffers == len(buffers)
    assert result.stats.baseline_bytes == sum(b.size for b in buffers)
    assert result.stats.lower_bound_bytes <= result.stats.arena_bytes == result.assignment.size
