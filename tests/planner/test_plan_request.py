"""memoplan.planner.request: the planning options checked before any model is loaded."""

from __future__ import annotations

import dataclasses

import pytest

from memoplan.planner import search
from memoplan.planner.config import Planner
from memoplan.planner.presets import PRESETS
from memoplan.planner.request import PlanRequest, PlanRequestError
from memoplan.syntax import parse


def _refused(request: PlanRequest, preset=None) -> str:
    with pytest.raises(PlanRequestError) as error:
        if preset is None:
            request.check()
        else:
            request.check_preset(preset)
    assert isinstance(error.value, ValueError)
    return str(error.value)


def test_a_request_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        PlanRequest(budget="50%").budget = "60%"  # type: ignore[misc]


def test_a_new_plan_needs_its_sources_and_a_budget_or_preset():
    assert _refused(PlanRequest(budget="50%", sources=False)) == "give --model and --example, or a plan to complete"
    assert _refused(PlanRequest()) == "give --budget B or --preset NAME (or both)"
    PlanRequest(budget="50%").check()
    PlanRequest(preset="safe").check()


def test_names_outside_the_registries_are_refused():
    assert "no preset `fastest`" in _refused(PlanRequest(preset="fastest"))
    assert "no planner `fast`" in _refused(PlanRequest(budget="50%", planner="fast"))


def test_a_completed_plan_brings_its_budget():
    start = parse("memplan 1\nbudget 60% hint\n")
    request = PlanRequest(start=start, start_name="p.memplan", sources=False)
    request.check()
    preset = request.make_preset()
    assert (preset.budget, preset.hard) == (search.FractionOfPeak.percent(60), False)


def test_options_override_the_preset():
    preset = PlanRequest(preset="balanced", planner="greedy", hint=True).make_preset()
    assert (preset.planner, preset.budget, preset.hard) == (Planner.GREEDY, search.Preset.BALANCED, False)
    assert preset.refine == PRESETS["balanced"].refine
    preset = PlanRequest(budget="4 GiB").make_preset()
    assert (preset.budget, preset.hard) == (search.Bytes(4 * 2**30), True)


def test_sublinear_options_need_the_sublinear_planner():
    request = PlanRequest(budget="50%", sublinear_options=("--thresh-nr-try",))
    message = _refused(request, request.make_preset())
    assert message == "--thresh-nr-try set the sublinear search: add --planner sublinear"
    assert _refused(request) == message  # check() refuses it too
    ok = dataclasses.replace(request, planner="sublinear")
    ok.check_preset(ok.make_preset())


def test_a_plan_with_a_sublinear_block_plans_with_the_sublinear_search():
    start = parse("memplan 1\nbudget 50%\nsublinear { thresh_nr_try = 4 }\n")
    request = PlanRequest(start=start, start_name="s.memplan", sources=False)
    assert request.make_preset().planner is Planner.SUBLINEAR
    optimal = dataclasses.replace(request, planner="optimal")
    message = _refused(optimal, optimal.make_preset())
    assert message == "the `sublinear` block of s.memplan set the sublinear search: add --planner sublinear"


def test_completing_a_plan_refuses_refinement_and_dtr():
    start = parse("memplan 1\n")
    request = PlanRequest(preset="memory", start=start, start_name="p.memplan", sources=False)
    assert "preset memory refines by measurement" in _refused(request, request.make_preset())
    dtr = PlanRequest(budget="50%", dtr=True, start=start, start_name="p.memplan", sources=False)
    assert _refused(dtr, dtr.make_preset()) == "--dtr writes a new plan; it does not complete one"


def test_nested_needs_the_optimal_planner_and_a_byte_budget():
    for request in (
        PlanRequest(budget="checkpoint-half", nested=True),
        PlanRequest(budget="50%", planner="greedy", nested=True),
    ):
        with pytest.raises(PlanRequestError, match="--nested needs the optimal planner"):
            request.check_nested(request.make_preset())
    fine = PlanRequest(budget="50%", nested=True)
    fine.check_nested(fine.make_preset())


# ---------------------------------------------------------------- memoplan.plan, the front door


class _Untouchable(__import__("torch").nn.Module):
    def forward(self, x):  # pragma: no cover - the refusals come before any step
        raise AssertionError("the model ran")


def test_memoplan_plan_refuses_before_the_model_runs():
    import torch

    import memoplan

    with pytest.raises(memoplan.PlanRequestError, match="give --budget B or --preset NAME"):
        memoplan.plan(_Untouchable(), torch.randn(2, 4))
    with pytest.raises(ValueError, match="--nested needs the optimal planner"):
        memoplan.plan(_Untouchable(), torch.randn(2, 4), budget="50%", planner="greedy", nested=True)


@pytest.mark.slow  # profiles and plans a model (about 30 s here)
def test_memoplan_plan_returns_the_plan_and_its_figures():
    import torch

    import memoplan
    from memoplan.examples import mlp

    torch.manual_seed(0)
    model = mlp.build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = memoplan.plan(model, torch.randn(2, 512), budget="60% hint")
    assert isinstance(result, memoplan.PlanResult) and isinstance(result.plan, memoplan.Plan)
    assert not result.hard and 0 < result.measured_after and 0 < result.measured_before
    text = memoplan.format_plan(result.plan)
    assert "budget 60% hint" in text
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # the model is not changed
    memoplan.apply(model, memoplan.resolve(result.plan, model))  # the plan applies to the model
    memoplan.remove(model)
