"""Smoke test of benchmarks/startup.py: two cheap cases once, and its JSON (the script measures, asserts nothing)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _paths import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.bench]


def test_startup_benchmark_runs(tmp_path) -> None:
    out = tmp_path / "startup.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "startup.py"),
            "--repeats",
            "1",
            "--json",
            str(out),
            "--only",
            "rule MP301",
            "check --syntax-only",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(out.read_text(encoding="utf-8"))
    assert set(found["results"]) == {"rule MP301", "check --syntax-only"}
    assert all(row["cpu_s"] > 0 and row["runs"] == 1 for row in found["results"].values())
    assert found["check_over_torch_and_model"] is None
