"""`python -m benchmarks --quick`: every benchmark runs, every plot file is written and every
figure of the summary is a number."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest
from _paths import ROOT

pytestmark = pytest.mark.bench

pytest.importorskip("matplotlib")
pytest.importorskip("spikingjelly")  # the spiking benchmark's peer


def test_quick_benchmarks_write_every_plot_and_only_numbers(tmp_path):
    out = tmp_path / "bench"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "MEMOPLAN_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "figures.json").read_text(encoding="utf-8"))
    raw = json.loads((out / "results.json").read_text(encoding="utf-8"))
    summary = (out / "summary.md").read_text(encoding="utf-8")

    # Every suite ran and drew its plots; each plot is an SVG with drawn paths, and the summary shows it.
    assert sorted(raw["suites"]) == ["codec_bandwidth", "planner_speed", "planner_vs_peers", "spiking_memory"]
    assert sorted(results["plots"]) == sorted(
        ["planner_vs_peers_cnn.svg", "spiking_memory.svg", "codec_bandwidth.svg", "planner_speed.svg"]
    )
    for name in results["plots"]:
        svg = (out / name).read_text(encoding="utf-8")
        assert svg.startswith("<svg") and svg.count("<path") > 5, name
        assert f"]({name})" in summary
    # Every figure is a finite number, and each suite has some.
    figures = results["figures"]
    for name, value in figures.items():
        assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), name
    for suite in ("planner_vs_peers", "spiking_memory", "codec_bandwidth", "planner_speed"):
        assert any(name.startswith(suite + ".") for name in figures), suite
    # Peaks are positive bytes; the planned CNN step is below the unplanned one.
    assert figures["planner_vs_peers.cnn.unplanned.peak_bytes"] > 0
    planned = [v for k, v in figures.items() if re.match(r"planner_vs_peers\.cnn\.memoplan .*\.peak_bytes", k)]
    assert planned and all(p < figures["planner_vs_peers.cnn.unplanned.peak_bytes"] for p in planned)
    # The summary gives the command of every suite, to rerun it.
    for suite in raw["suites"].values():
        assert suite["command"] in summary
    assert "Quick run" in summary

    # Drawn again from the saved results, measuring nothing: the same summary.
    again = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--render", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "summary.md").read_text(encoding="utf-8") == summary
