"""Smoke test of benchmarks/planner_vs_peers.py: tiny settings, JSON structure, budgets met or unreachable."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest
from _paths import ROOT

pytestmark = pytest.mark.bench

SCRIPT = ROOT / "benchmarks" / "planner_vs_peers.py"
TINY = ["--steps", "1", "--warmup", "0", "--profile-repeats", "1"]


def _run(tmp_path: Path, *argv: str) -> dict:
    bench = runpy.run_path(str(SCRIPT))
    out = tmp_path / "results.json"
    assert bench["main"]([*TINY, *argv, "--json", str(out)]) == 0
    return json.loads(out.read_text(encoding="utf-8"))


def _check_model(results: dict, name: str, budgets: list[float], compile_budgets: list[float]) -> dict:
    r = results["models"][name]
    configs = {c["name"]: c for c in r["configurations"]}
    kinds = [c["kind"] for c in r["configurations"]]
    assert kinds[0] == "unplanned" and configs["unplanned"]["ratio"] == 1.0
    assert r["unplanned_peak_bytes"] > 0 and r["candidates"]

    # Checkpointing every block is a peer, verified by memoplan.verify.
    every = [c for c in r["configurations"] if c["name"].startswith("checkpoint every block")]
    assert len(every) == 1 and every[0]["matches"] and every[0]["peak_bytes"] < r["unplanned_peak_bytes"]

    # Every memoplan hard budget is either met (measured, and the step is equivalent) or reported unreachable.
    planned = [c for c in r["configurations"] if c["kind"] == "memoplan"]
    assert [(c["mode"], c["budget_fraction"]) for c in planned] == [
        (m, b) for m in ("blocks", "nested") for b in budgets
    ]
    for c in planned:
        assert c["status"] in ("met", "unreachable"), c
        assert c["refine"] == ["narrow", "unwrap"]  # the balanced preset's levels, by default
        if c["status"] == "met":
            assert c["hard_budget_met"] and c["peak_bytes"] <= c["limit_bytes"] and c["matches"]
            # The regions of the plan as written (refinement may have moved or dropped some).
            assert c["checkpointed"] and all(isinstance(name, str) for name in c["checkpointed"])
            assert c["step_time_s"]["median"] > 0 and len(c["step_time_s"]["all"]) == 1
        else:
            assert c["minimum_estimated_peak_bytes"] > c["limit_bytes"]
            assert c["least_peak_plan"]["measured_peak_bytes"] > 0

    # torch.compile at each activation_memory_budget: a peak, a step time and a correctness check.
    compiled = [c for c in r["configurations"] if c["kind"] == "compile"]
    assert [c["activation_memory_budget"] for c in compiled] == compile_budgets
    for c in compiled:
        assert c["peak_bytes"] > 0 and isinstance(c["matches"], bool) and c["compile_seconds"] >= 0
        assert c["step_time_s"]["median"] > 0

    # One verdict per memoplan plan.
    assert [v["memoplan"] for v in r["verdicts"]] == [c["name"] for c in planned]
    for v in r["verdicts"]:
        assert v["verdict"] in ("no worse", "slower", "unreachable", "no correct peer at or below memoplan's peak")
        assert v["hard_budget"] in ("met", "unreachable")
    return configs


def test_cnn_small(tmp_path: Path) -> None:
    results = _run(tmp_path, "--models", "cnn", "--batch", "2", "--budgets", "0.9", "0.3", "--compile-budgets", "0.5")
    assert results["command"].endswith("--json " + str(tmp_path / "results.json"))
    assert list(results["models"]) == ["cnn"]
    configs = _check_model(results, "cnn", [0.9, 0.3], [0.5])
    # The meter sees inside the compiled graphs.  Metering around a compiled call instead makes
    # Dynamo skip the frame and run it eagerly: the deterministic meter would then read exactly
    # the unplanned peak, whatever the budget.
    half = configs["torch.compile, activation_memory_budget 0.5"]
    assert half["peak_bytes"] != results["models"]["cnn"]["unplanned_peak_bytes"]


def test_gpt2_small(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    argv = ["--models", "gpt2", "--gpt2-layers", "2", "--seq", "32", "--gpt2-embd", "64", "--gpt2-heads", "2"]
    argv += ["--gpt2-vocab", "128", "--batch", "2", "--budgets", "0.6", "--compile-budgets", "1.0", "--hf-every", "1"]
    results = _run(tmp_path, *argv)
    configs = _check_model(results, "gpt2", [0.6], [1.0])
    candidates = results["models"]["gpt2"]["candidates"]
    assert candidates["blocks"] == ["transformer.h.0", "transformer.h.1"]
    # Nested: the blocks and the parts inside them that save memory (the MLP's activation among them).
    assert set(candidates["blocks"]) < set(candidates["nested"]) and "transformer.h.0.mlp.act" in candidates["nested"]
    hf = configs["transformers activation checkpointing, every block"]
    assert hf["matches"] and hf["kind"] == "peer"
    # One graph (fullgraph=True) that reproduces the unplanned step: no graph break in transformers' loss.
    assert configs["torch.compile, activation_memory_budget 1"]["matches"]
