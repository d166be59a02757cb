"""The public API: its names are frozen, it accepts every plan form, and failure changes nothing."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import memoplan
from memoplan.examples import cnn

PLAN = "memplan 1\nmodule features.* { checkpoint }\n"


def test_public_names_are_frozen():
    assert sorted(memoplan.__all__) == [
        "Diagnostic",
        "MemoplanWarning",
        "Plan",
        "PlanError",
        "PlanRequestError",
        "PlanResult",
        "ResolvedPlan",
        "__version__",
        "apply",
        "dtr_stats",
        "estimated_verify",
        "explain",
        "format_plan",
        "load",
        "measure_step",
        "parse",
        "plan",
        "profile",
        "remove",
        "resolve",
        "verify",
        "write_module",
    ]


@pytest.mark.parametrize("form", ["text", "path", "plan", "resolved"])
def test_apply_accepts_every_plan_form(form, tmp_path):
    model = cnn.build()
    path = tmp_path / "p.memplan"
    path.write_text(PLAN)
    plan = {
        "text": PLAN,
        "path": path,
        "plan": memoplan.parse(PLAN),
        "resolved": memoplan.resolve(memoplan.parse(PLAN), model),
    }[form]
    assert memoplan.apply(model, plan) is model
    assert all("forward" in model.features[i].__dict__ for i in range(5))
    memoplan.remove(model)
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_a_plan_that_does_not_fit_changes_nothing():
    model = cnn.build()
    before = copy.deepcopy(model.state_dict())
    bad = "memplan 1\nmodule features.* { checkpoint }\nmodule classifer { checkpoint }\n"
    with pytest.raises(memoplan.PlanError) as caught:
        memoplan.apply(model, bad)
    assert caught.value.codes == ["MP301"]
    assert "nearest paths: `classifier`" in str(caught.value)
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_applying_twice_is_refused():
    model = cnn.build()
    memoplan.apply(model, PLAN)
    with pytest.raises(memoplan.PlanError) as caught:
        memoplan.apply(model, PLAN)
    assert "MP403" in caught.value.codes


def test_optimizer_built_before_apply_trains_the_same_parameters():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4), nn.GELU())
    twin = copy.deepcopy(model)
    opt_a = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(twin.parameters(), lr=0.1)
    memoplan.apply(twin, "memplan 1\nmodule [0:2] { checkpoint }\nmodule 2 { checkpoint }\n")
    x = torch.randn(5, 4)
    for _ in range(3):
        for m, opt in ((model, opt_a), (twin, opt_b)):
            opt.zero_grad()
            m(x).pow(2).sum().backward()
            opt.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p, q)


def test_write_module_takes_the_model_first_and_the_old_order_is_deprecated(tmp_path):
    model = cnn.build()
    new = memoplan.write_module(model, PLAN, tmp_path / "new.py")
    with pytest.warns(DeprecationWarning, match=r"pass the model first, memoplan.write_module\(model, plan"):
        old = memoplan.write_module(PLAN, model, tmp_path / "old.py")
    assert old.read_bytes().replace(b"old", b"new") == new.read_bytes().replace(b"old", b"new")
    with pytest.raises(TypeError, match="the model .* comes first"):
        memoplan.write_module(PLAN, PLAN, tmp_path / "neither.py")


def test_compile_is_a_deprecated_name_of_write_module(tmp_path):
    """``memoplan.compile`` (memoplan 0.1) still works for a release: the same function, with a warning."""
    with pytest.warns(DeprecationWarning, match=r"memoplan.compile is deprecated: use memoplan.write_module"):
        old_name = memoplan.compile
    assert old_name is memoplan.write_module
    assert "compile" not in memoplan.__all__ and "compile" not in dir(memoplan)
    with pytest.warns(DeprecationWarning):
        from memoplan import compile as imported  # noqa: A004  the deprecated name, on purpose
    assert imported is memoplan.write_module
