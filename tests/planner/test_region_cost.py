"""The fixed cost of a checkpoint region in the search's cost model (``memoplan.planner.profiling.regioncost``).

Each checkpointed region costs a fixed time beyond its recompute (its call, saved-tensor hooks,
the replay's setup).  With it (``Item.region_seconds``, from ``Profile.region_seconds``), of two
sets of equal peak the search takes the one with fewer regions unless the other saves more
recompute than the regions cost; with it 0 (the old model) the many small regions won.  The
search tests are deterministic: no timing.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from torch import nn

from memoplan.planner import levels
from memoplan.planner.profiling.regioncost import region_seconds
from memoplan.planner.profiling.schema import Profile
from memoplan.planner.search import Bytes, Item, estimate, optimal
from memoplan.planner.search.exact import exact
from memoplan.specs import Example

pytest.importorskip("scipy")


def _chain(cost: float) -> list[Item]:
    """``one`` (one region, 2.0 s of recompute, a transient of 50 B) or ``part_a`` + ``part_b`` (two
    regions, 1.99 s) meet the limit of 150 B with the same peak."""
    return [
        Item("one", 100, 0, 2.0, transient_bytes=50, region_seconds=cost),
        Item("part_a", 50, 0, 0.995, region_seconds=cost),
        Item("part_b", 50, 0, 0.995, region_seconds=cost),
    ]


@pytest.mark.parametrize("planner", [optimal, exact])
def test_fewer_regions_win_once_each_region_costs_its_fixed_time(planner):
    limit = Bytes(150)  # unplanned 200: save 100 beyond a transient of 50
    old = planner(_chain(0.0), limit)
    assert old.names == ("part_a", "part_b")  # the old model: 1.99 s < 2.0 s
    new = planner(_chain(0.05), limit)
    assert new.names == ("one",)  # 2.0 + 0.05 < 1.99 + 2 * 0.05
    assert new.estimated_peak == old.estimated_peak == 150
    assert math.isclose(new.recompute_seconds, 2.0 + 0.05)
    # A region cost below the recompute saved keeps the two small regions.
    assert planner(_chain(0.004), limit).names == ("part_a", "part_b")


def test_the_estimate_counts_each_region_once():
    items = _chain(0.25)
    assert math.isclose(estimate(items, [0, 1]).seconds, 2.0 + 0.995 + 2 * 0.25)


def test_region_seconds_is_validated():
    with pytest.raises(ValueError, match="region_seconds"):
        Item("a", 10, 1, 1.0, region_seconds=-1.0)
    with pytest.raises(ValueError, match="region_seconds"):
        Item("a", 10, 1, 1.0, region_seconds=math.inf)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(3)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x).square().mean()


@pytest.fixture(scope="module")
def small_profile() -> Profile:
    from memoplan.planner.profiling.profile import profile

    torch.manual_seed(0)
    return profile(_Net(), Example((torch.randn(8, 16),)), repeats=1, progress=False)


def test_the_profile_measures_it_and_keeps_it_in_json(small_profile):
    assert small_profile.region_seconds >= 0.0 and math.isfinite(small_profile.region_seconds)
    fixed = dataclasses.replace(small_profile, region_seconds=0.00125)
    assert Profile.from_json(fixed.to_json()).region_seconds == 0.00125
    older = json.loads(fixed.to_json())
    del older["region_seconds"]  # a profile written before the field: no fixed cost
    assert Profile.from_dict(older).region_seconds == 0.0


def test_every_candidate_carries_the_profiles_region_cost(small_profile):
    fixed = dataclasses.replace(small_profile, region_seconds=0.00125)
    for level in (levels.WHOLE, levels.ALL):
        items, _ = levels.candidates(fixed, level, lambda name: False, None, _Net())
        assert items and all(item.region_seconds == 0.00125 for item in items)
    unmeasured = dataclasses.replace(small_profile, region_seconds=0.0)
    items, _ = levels.candidates(unmeasured, levels.WHOLE, lambda name: False, None, _Net())
    assert all(item.region_seconds == 0.0 for item in items)


def test_the_measurement_leaves_the_random_state_alone():
    state = torch.get_rng_state()
    assert region_seconds("cpu") >= 0.0
    assert torch.equal(state, torch.get_rng_state())
    assert region_seconds("meta") == 0.0


# ---------------------------------------------------------------- what each op of a saving region costs


def test_a_saving_regions_cost_per_op_is_measured_kept_and_charged_to_every_variant(small_profile):
    """torch's selective checkpointing decides every op of a region that saves, in forward and in
    its replay: the profile measures that per op (``save_op_seconds``), keeps it in its JSON, and a
    save variant costs its recompute plus its module's ops times it; one that then spares nothing
    is not offered."""
    from memoplan.planner.search import opsave

    assert small_profile.save_op_seconds > 0.0 and math.isfinite(small_profile.save_op_seconds)
    fixed = dataclasses.replace(small_profile, save_op_seconds=4e-5)
    assert Profile.from_json(fixed.to_json()).save_op_seconds == 4e-5
    older = json.loads(fixed.to_json())
    del older["save_op_seconds"]  # written before the field: variants cost their recompute alone
    assert Profile.from_dict(older).save_op_seconds == 0.0
    use = opsave.OpUse(kept={"matmul": 100}, seconds={"matmul": 0.6}, op_seconds=1.0, op_count=50)
    plain = Item("m", 1000, 10, 1.0)
    (free,) = opsave.variants(plain, use)
    (charged,) = opsave.variants(plain, use, per_op=0.002)
    assert math.isclose(free.forward_seconds, 0.4) and math.isclose(charged.forward_seconds, 0.4 + 50 * 0.002)
    assert opsave.variants(plain, use, per_op=0.02) == []  # 1.4 s: more than the plain checkpoint


def test_the_per_op_measurement_leaves_the_random_state_alone():
    from memoplan.planner.profiling.regioncost import save_op_seconds

    state = torch.get_rng_state()
    assert save_op_seconds("cpu") >= 0.0
    assert torch.equal(state, torch.get_rng_state())
    assert save_op_seconds("meta") == 0.0
