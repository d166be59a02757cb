"""How `memoplan plan` takes its search's trials: estimated on fake tensors by default (one real
planned step checks the written plan), every one a real step with `--method measured`, and
the measured search again when the estimated plan's check misses a hard budget."""

from __future__ import annotations

import pytest
import torch

from memoplan.cli import main
from memoplan.examples.transformer import build
from memoplan.planner.budgets import read_budget
from memoplan.planner.plan import make_plan
from memoplan.planner.profiling import estimate as estimate_module
from memoplan.planner.profiling.profile import profile
from memoplan.planner.search.refine import measure_plan
from memoplan.specs import Example

TRANSFORMER = ["--model", "memoplan.examples.transformer:build", "--example", "randint(4, 32, high=100)"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))


def _model_and_example():
    torch.manual_seed(0)
    return build(), Example((torch.randint(0, 100, (4, 32)),))


def _counting(monkeypatch, module, name: str) -> list[int]:
    calls: list[int] = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.slow
def test_default_plan_estimates_its_trials_and_checks_the_plan_with_one_real_step(tmp_path, capsys, monkeypatch):
    from memoplan.planner.search import refine

    fake = _counting(monkeypatch, estimate_module, "estimate_plan")
    real = _counting(monkeypatch, refine, "measure_step")
    out = tmp_path / "p.memplan"
    assert main(["plan", *TRANSFORMER, "--budget", "50%", "-o", str(out), "-v"]) == 0
    text = out.read_text()
    # The unplanned peak and every trial on fake tensors; one real planned step checks the plan.
    assert "# unplanned peak on fake tensors:" in text and "# planned peak on fake tensors:" in text
    assert len(real) == 1 and len(fake) >= 1
    estimated = int(text.split("# planned peak on fake tensors: ")[1].split(" B")[0])
    measured = int(text.split("# measured peak after: ")[1].split(" B")[0])
    assert estimated == measured  # the estimate is exact on the bundled transformer
    err = capsys.readouterr().err
    # the profile's real steps (-v: a line each): one timed step, no peak step
    assert "measuring the training step (1 step)" in err
    assert "profile: time 1/1 step" in err and "profile: peak step" not in err


def test_method_measured_takes_every_trial_for_real(tmp_path, monkeypatch):
    fake = _counting(monkeypatch, estimate_module, "estimate_plan")
    out = tmp_path / "p.memplan"
    assert main(["plan", *TRANSFORMER, "--budget", "50%", "--method", "measured", "-o", str(out)]) == 0
    text = out.read_text()
    assert fake == [] and "planned peak on fake tensors" not in text
    assert "# measured peak before:" in text and "# measured peak after:" in text


@pytest.mark.slow
def test_a_missed_check_searches_again_with_real_steps(capsys, monkeypatch):
    model, example = _model_and_example()
    prof = profile(model, example, repeats=1, progress=False)
    monkeypatch.setattr(estimate_module, "estimate_plan", lambda *a, **k: 1)  # an estimate far too low
    result = make_plan(model, example, read_budget("50%").amount, prof=prof, trials="estimated")
    assert "searching again with real steps" in capsys.readouterr().err
    assert result.met and measure_plan(model, example, result.plan) == result.measured_after
    assert "planned peak on fake tensors" not in "\n".join(result.plan.header_comments.leading)


def test_measured_trials_need_a_measured_profile():
    model, example = _model_and_example()
    prof = profile(model, example, repeats=1, progress=False)
    estimated = type(prof)(
        **{**{f: getattr(prof, f) for f in prof.__dataclass_fields__ if f != "_index"}, "method": "estimated"}
    )
    with pytest.raises(ValueError, match="measured trials need a measured profile"):
        make_plan(model, example, read_budget("50%").amount, prof=estimated, trials="measured")
    with pytest.raises(ValueError, match="trials must be one of"):
        make_plan(model, example, read_budget("50%").amount, prof=prof, trials="fake")
