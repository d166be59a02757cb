"""memoplan.planner.pipeline: ``memoplan plan`` and ``memoplan.plan`` build one PlanRequest and call
one run, so the command line and the API cannot plan differently."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

import memoplan
from memoplan.cli import main
from memoplan.examples import mlp
from memoplan.planner import pipeline
from memoplan.planner.budgets import AskedBudget, Bytes, Coverage, FractionOfPeak
from memoplan.planner.pipeline import Planned
from memoplan.syntax import ast

SOURCES = ["--model", "memoplan.examples.mlp:build", "--example", "randn(2, 512)"]


@dataclass(frozen=True)
class _Result:  # what the API returns: the result, its plan replaced by the one to write
    plan: ast.Plan
    met: bool = True
    refinement: None = None
    regions: int = 0
    measured_before: int = 1
    measured_after: int = 1


def _recording(seen: list):
    """A stand-in for pipeline.run: records the request and the rest of the call; an empty plan."""

    def run(request, model, example, **how):
        seen.append((request, how))
        plan = memoplan.parse("memplan 1\n")
        return Planned(_Result(plan), plan, SimpleNamespace(shards=1, method="measured", peak_method="measured"))

    return run


@pytest.mark.parametrize(
    "options, keywords, wanted",
    [
        (["--budget", "50% hint"], {"budget": "50% hint"}, AskedBudget(FractionOfPeak.percent(50), False)),
        (["--budget", "4 GiB", "--nested"], {"budget": "4 GiB", "nested": True}, AskedBudget(Bytes(4 * 2**30))),
        (
            ["--preset", "balanced", "--planner", "greedy", "--hint", "--method", "estimated"],
            {"preset": "balanced", "planner": "greedy", "hint": True, "method": "estimated"},
            None,
        ),
        (["--coverage", "3"], {"coverage": "3"}, AskedBudget(Coverage.of_modules(3))),
    ],
)
def test_the_command_line_and_the_api_build_one_request_and_call_one_run(
    monkeypatch, tmp_path, options, keywords, wanted
):
    seen: list = []
    monkeypatch.setattr(pipeline, "run", _recording(seen))
    assert main(["plan", *SOURCES, *options, "-o", str(tmp_path / "p.memplan")]) == 0
    result = memoplan.plan(mlp.build(), torch.randn(2, 512), **keywords)
    (cli, cli_how), (api, api_how) = seen
    assert cli == api  # every field: the knobs, the plan completed, the device
    assert cli.wanted == api.wanted == wanted  # the budget, read once, typed
    assert cli_how["step"] == api_how["step"]
    assert cli_how["folder"] == tmp_path and api_how.get("folder", ".") == "."
    assert result.plan == memoplan.parse("memplan 1\n")  # the API returns the plan the run wrote


def test_a_request_the_run_refuses_is_the_same_refusal_on_both_sides(monkeypatch, tmp_path, capsys):
    """The run's own refusals (here: a measured run given an estimated profile) are one message."""
    from memoplan.planner.request import PlanRequestError

    def estimated(*args, **kwargs):
        return SimpleNamespace(method="estimated", shards=1, peak_method="fake-tensor")

    monkeypatch.setattr("memoplan.planner.profiling.estimate.take_profile", estimated)
    message = "--method measured needs a measured profile; --profile gave an estimated one"
    assert main(["plan", *SOURCES, "--budget", "50%", "--method", "measured", "-o", str(tmp_path / "p")]) == 2
    assert f"memoplan plan: error: {message}" in capsys.readouterr().err
    with pytest.raises(PlanRequestError, match=message):
        memoplan.plan(mlp.build(), torch.randn(2, 512), budget="50%", method="measured")
    assert not (tmp_path / "p").exists()


def _sample(row) -> tuple[list[str], dict]:
    """One value of knob ``row``: its command-line options and its keyword of memoplan.plan."""
    value = {"flag": True, "choice": row.allowed()[0] if row.kind == "choice" else None}.get(row.kind)
    if row.kind == "text":
        value = "3" if row.name == "coverage" else "60% hint"
    options = [row.flag] if row.kind == "flag" else [row.flag, str(value)]
    budget = [] if row.name in ("budget", "coverage") else ["--budget", "50%"]
    return [*budget, *options], {**({} if budget == [] else {"budget": "50%"}), row.name: value}


def test_every_knob_reaches_the_run_the_same_from_both_sides(monkeypatch, tmp_path):
    """A knob added to the table (memoplan.planner.knobs.KNOBS) that the API and the request take
    arrives in the run's request alike from `memoplan plan` and from memoplan.plan."""
    from memoplan.planner.knobs import KNOBS

    rows = [row for row in KNOBS if row.api and row.request]
    assert {row.name for row in rows} >= {"budget", "coverage", "preset", "planner", "hint", "nested", "method"}
    for row in rows:
        seen: list = []
        monkeypatch.setattr(pipeline, "run", _recording(seen))
        options, keywords = _sample(row)
        assert main(["plan", *SOURCES, *options, "-o", str(tmp_path / "p.memplan")]) == 0, row.name
        memoplan.plan(mlp.build(), torch.randn(2, 512), **keywords)
        (cli, _), (api, _) = seen
        assert cli == api and getattr(cli, row.name) == keywords[row.name], row.name
