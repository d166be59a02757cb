"""Smoke test of benchmarks/dtr.py: the bundled transformer at one share, tiny settings."""

from __future__ import annotations

import json
import math
import runpy

import pytest
from _paths import ROOT

pytestmark = pytest.mark.bench

SCRIPT = ROOT / "benchmarks" / "dtr.py"


def test_dtr_benchmark_measures_every_configuration(tmp_path, capsys):
    bench = runpy.run_path(str(SCRIPT))
    out = tmp_path / "dtr.json"
    argv = ["--models", "transformer", "--shares", "0.5", "--steps", "1", "--warmup", "0", "--json", str(out)]
    assert bench["main"](argv) == 0
    (result,) = json.loads(out.read_text(encoding="utf-8"))["results"]
    configs = {c["name"]: c for c in result["configs"]}
    assert set(configs) == {
        "unplanned", "dtr, nothing evicted", "checkpoint every block", "dtr 0.5", "static at dtr 0.5's peak",
        "torch.compile 0.5",
    }  # fmt: skip
    for c in configs.values():
        assert c["peak_bytes"] > 0 and math.isfinite(c["step_seconds"])
    for name in ("dtr, nothing evicted", "checkpoint every block", "dtr 0.5", "static at dtr 0.5's peak"):
        assert configs[name]["exact"], name  # memoplan.verify: bit for bit
    assert configs["dtr, nothing evicted"]["dtr"]["evictions"] == 0
    dtr = configs["dtr 0.5"]
    assert dtr["dtr"]["evictions"] > 0 and dtr["dtr"]["over_threshold"] == 0
    assert dtr["peak_bytes"] < result["unplanned_peak_bytes"]
    assert "dtr/static step time" in capsys.readouterr().out


def test_dtr_benchmark_overhead_and_per_call_modes(capsys):
    bench = runpy.run_path(str(SCRIPT))
    got = bench["per_call"](1, steps=2)
    assert 0 < got["unplanned"] < got["dtr"] and got["per_call"] > 0  # the tracker's bookkeeping costs something
    assert bench["main"](["--per-call", "1"]) == 0
    assert "us per candidate call" in capsys.readouterr().out
    assert bench["main"](["--models", "transformer", "--overhead", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "overhead (CPU time, best)" in out and "| transformer |" in out
