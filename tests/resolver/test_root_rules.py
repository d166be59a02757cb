"""Rules on the model itself: ``module ""`` selects the root (a model that is an ``nn.Sequential``).

The root is the only module no other selector reaches (``**``, ``class`` and slices stop at its
children), so a chain that is the model itself, 48 x (``Linear``, ``GELU``), could get no
``segments`` before.  ``""`` alone is its path; inside a longer path it is still MP105.  The
planner writes ``module "" { checkpoint segments = k }`` for such a chain, and the plan is met,
bit-exact, at a hard 35%.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from torch import nn

import memoplan
from memoplan.diagnostics import PlanError
from memoplan.planner import search
from memoplan.planner.plan import make_plan
from memoplan.planner.profiling.profile import profile
from memoplan.planner.search.refine import measure_plan
from memoplan.resolver import explain, render_explain
from memoplan.specs import Example
from memoplan.syntax import format_plan, parse
from memoplan.verification import verify


def _chain(depth: int = 8, width: int = 32) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.GELU())])


def _plan(body: str):
    return parse("memplan 1\n" + body, "root.memplan")


def _codes(body: str, model: nn.Module) -> list[str]:
    with pytest.raises(PlanError) as info:
        memoplan.resolve(_plan(body), model)
    return [d.code for d in info.value.diagnostics]


def test_empty_path_parses_alone_and_formats_back():
    plan = _plan('module "" { checkpoint segments = 3 }\n')
    assert format_plan(plan).endswith('module "" { checkpoint segments = 3 }\n')
    with pytest.raises(PlanError) as info:
        _plan('module layers."" { keep }\n')
    assert [d.code for d in info.value.diagnostics] == ["MP105"]
    assert "alone selects the model itself" in info.value.diagnostics[0].help


@pytest.mark.slow
def test_root_segments_run_the_chain_in_regions_bit_exact():
    model, x = _chain(), torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    plan = _plan('module "" { checkpoint segments = 4 }\n')
    unplanned = measure_plan(model, Example((x,)), _plan(""))
    planned = measure_plan(model, Example((x,)), plan)
    assert planned < unplanned  # the regions free the chain's activations until backward
    report = verify(model, plan, Example((x,)))
    assert report.equivalent and report.exact, report.checks
    memoplan.apply(model, plan)
    assert "forward" in model.__dict__
    memoplan.remove(model)
    assert "forward" not in model.__dict__


def test_root_region_is_checked_like_any_region():
    model = _chain()
    assert _codes('module "" { checkpoint }\nmodule 2 { checkpoint }\n', model) == ["MP305"]
    assert _codes('module "" { checkpoint segments = 2 }\n', nn.Linear(2, 2)) == ["MP306"]
    rows = explain(_plan('module "" { checkpoint segments = 2 }\n'), model)
    assert rows[0].path == "" and rows[0].class_name == "Sequential"
    assert "inside the checkpoint region of the model itself" in render_explain(rows)


@pytest.mark.slow
def test_a_chain_that_is_the_model_is_met_at_a_hard_35_percent():
    model = _chain(48, 256)
    example = Example((torch.randn(2048, 256, generator=torch.Generator().manual_seed(1)),))
    prof = profile(model, example, repeats=1, progress=False)
    result = make_plan(model, example, search.FractionOfPeak(Fraction(35, 100)), prof=prof, progress=False)
    assert result.met and result.measured_after <= 0.35 * result.measured_before
    text = format_plan(result.plan)
    assert 'module "" { checkpoint segments = 10 }' in text or 'module "" { checkpoint split = [' in text
    assert measure_plan(model, example, parse(text, "generated.memplan")) == result.measured_after
    report = verify(model, result.plan, example)
    assert report.equivalent and report.exact, report.checks
