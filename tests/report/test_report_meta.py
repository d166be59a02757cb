"""`memoplan report` of a model built on the meta device: the page is drawn from the fake-tensor
estimate (memoplan.report.estimated), says so on top and on stderr (MP414), and keeps the
sections that need real steps as a sentence saying why they are not drawn."""

from __future__ import annotations

import copy
import json
import re
import sys
import warnings

import pytest
import torch
from _cli import run
from _paths import TESTS

pytest.importorskip("matplotlib")
pytest.importorskip("transformers")

sys.path.insert(0, str(TESTS))
import meta_models  # noqa: E402

import memoplan  # noqa: E402
from memoplan.measure import measure_step  # noqa: E402
from memoplan.planner.profiling.profile import profile  # noqa: E402

MODELS = TESTS / "meta_models.py"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))


def _plan(tmp_path, extra: str = "") -> str:
    return (
        f'memplan 1\nmodel "{MODELS}:meta"\nexample "{MODELS}:example"\n'
        f"budget 95%\nmodule model.layers.1 {{ checkpoint }}\n{extra}"
    )


@pytest.mark.slow
def test_report_of_a_meta_model_is_the_estimate_of_the_real_build(tmp_path, capsys):
    plan = tmp_path / "meta.memplan"
    plan.write_text(_plan(tmp_path))
    out = tmp_path / "r.html"
    code, _, err = run(capsys, "report", plan, "-o", out, "--json")
    assert code == 0, err
    assert "warning[MP414]" in err and "equivalence was not checked" in err and "no storage" in err
    text = out.read_text(encoding="utf-8")
    assert re.findall(r'<section id="([a-z]+)">', text) == ["plan", "memory", "saved", "sweep"]
    assert re.findall(r'<figure class="plot" id="plot-([a-z]+)">', text) == ["saved"]  # no measured timeline
    assert "ESTIMATE on fake tensors" in text and "Equivalence was NOT checked" in text
    assert "NOT CHECKED (estimated)" in text and "EQUIVALENT" not in text
    assert "The timeline is not drawn" in text and "Not drawn: the sweep" in text
    # The figures are the real build's measured bytes (the CPU's kernels: to the byte).
    real, example = meta_models.real(), meta_models.example()
    planned_real = memoplan.apply(copy.deepcopy(real), plan, warn=False)
    unplanned = measure_step(real, example).peak_bytes
    planned = measure_step(copy.deepcopy(planned_real), example).peak_bytes
    assert planned < unplanned
    assert f"peak {unplanned:,} B unplanned, {planned:,} B planned, on fake tensors" in text
    before, after = profile(real, example, repeats=1, progress=False), profile(planned_real, example, progress=False)
    rows = json.loads((tmp_path / "r.saved.json").read_text())["rows"]
    assert rows and {r["module"] for r in rows} >= {"model.layers.1", "lm_head"}
    for row in rows:
        assert row["before"] == before.subtree_saved_bytes(row["module"]), row
        assert row["after"] == after.subtree_saved_bytes(row["module"]), row
    by_module = {r["module"]: r for r in rows}
    assert by_module["model.layers.1"]["after"] < by_module["model.layers.1"]["before"]  # checkpointed


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="planning for a CUDA device this machine lacks")
def test_report_of_a_meta_model_for_a_gpu_not_here_rounds_as_the_caching_allocator(tmp_path, capsys):
    plan = tmp_path / "meta.memplan"
    plan.write_text(_plan(tmp_path, "dtr {\n    eviction_threshold = 1 MiB\n}\n"))
    out = tmp_path / "r.html"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the dtr tracker reads no fake tensor's data pointer
        code, _, err = run(capsys, "report", plan, "--device", "cuda", "-o", out, "--no-sweep")
    assert code == 0, err
    text = out.read_text(encoding="utf-8")
    assert re.findall(r'<section id="([a-z]+)">', text) == ["plan", "memory", "saved", "dtr"]  # --no-sweep
    assert "Not drawn: the dtr block" in text
    assert "cpu kernels standing in for cuda" in text and "reserved by the caching allocator" in text


def test_the_sections_that_need_real_steps_say_why_they_are_not_drawn():
    from types import SimpleNamespace

    from memoplan.report.estimated import _sections
    from memoplan.verification import EstimatedVerify

    check = EstimatedVerify("no CUDA device here", 3 * 2**20, 2**20, 0)
    resolved = SimpleNamespace(modules=(), dtr=object())
    before = SimpleNamespace(parameter_bytes=1024, reserved_bytes=0)
    plots = {"saved": {"rows": [], "total_before": 0, "total_after": 0}}
    sections = _sections(resolved, check, None, before, "cpu kernels", plots, sweep=True)
    assert [s.id for s in sections] == ["plan", "memory", "saved", "sweep", "dtr"]
    body = {s.id: "".join(s.body) for s in sections}
    assert "Not drawn: the sweep" in body["sweep"] and "no CUDA device here" in body["sweep"]
    assert "Not drawn: the dtr block" in body["dtr"] and "no CUDA device here" in body["dtr"]
    assert "reserved" not in body["memory"] and "3,145,728" in body["memory"]
