"""`memoplan profile` and `memoplan plan`: budgets met by measurement, or refused with the reachable minimum."""

from __future__ import annotations

import pytest

import memoplan
from memoplan import specs
from memoplan.cli import main
from memoplan.planner.profile import Profile
from memoplan.syntax import parse_example_spec
from memoplan.verify import verify

TRANSFORMER = ["--model", "memoplan.examples.transformer:build", "--example", "randint(4, 32, high=100)"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))


def test_plan_meets_a_hard_budget_by_measurement_and_stays_equivalent(tmp_path, capsys):
    out = tmp_path / "plan.memplan"
    assert main(["plan", *TRANSFORMER, "--budget", "70%", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "budget met" in printed
    text = out.read_text()
    plan = memoplan.parse(text, str(out))
    assert memoplan.format_plan(plan) == text  # written through the formatter
    assert "# measured peak after:" in text and "# planner: optimal" in text
    model = specs.load_model("memoplan.examples.transformer:build")
    example = specs.make_example(parse_example_spec("randint(4, 32, high=100)"))
    report = verify(model, plan, example)
    assert report.equivalent
    assert report.planned.peak_bytes <= 0.7 * report.unplanned.peak_bytes


def test_an_impossible_hard_budget_is_refused_with_the_reachable_minimum(tmp_path, capsys):
    out = tmp_path / "plan.memplan"
    assert main(["plan", *TRANSFORMER, "--budget", "1 KiB", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "MP601" in err and "smallest peak reachable" in err
    assert not out.exists()


def test_a_hint_budget_writes_the_best_plan_and_says_it_was_missed(tmp_path, capsys):
    out = tmp_path / "plan.memplan"
    assert main(["plan", *TRANSFORMER, "--budget", "1 KiB", "--hint", "-o", str(out)]) == 0
    assert "NOT met (hint)" in capsys.readouterr().out
    memoplan.parse(out.read_text())


def test_coverage_preset_on_a_spiking_model_marks_its_neurons(tmp_path):
    out = tmp_path / "plan.memplan"
    args = ["--model", "memoplan.examples.spiking:build", "--example", "memoplan.examples.spiking:example"]
    assert main(["plan", *args, "--budget", "balanced", "-o", str(out)]) == 0
    plan = memoplan.parse(out.read_text())
    assert "module blocks.0.lif { state = functional }" in memoplan.format_plan(plan)
    memoplan.resolve(plan, specs.load_model("memoplan.examples.spiking:build"))


def test_profile_writes_versioned_json_the_planner_can_reuse(tmp_path):
    path = tmp_path / "profile.json"
    assert main(["profile", *TRANSFORMER, "-o", str(path)]) == 0
    prof = Profile.load(path)
    assert prof.peak_bytes > 0 and '"version": 1' in path.read_text()
    out = tmp_path / "plan.memplan"
    assert main(["plan", *TRANSFORMER, "--budget", "80%", "--profile", str(path), "-o", str(out)]) == 0
