"""``memoplan verify`` with a ``memonger`` block: the arena's inference against eager (outputs bit for
bit, peak, allocations) in the report and its JSON, and no profiler lines on stderr."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _paths import ROOT
from torch import nn

import memoplan
from memoplan.memonger.quiet import is_profiler_line, profiler_quiet
from memoplan.specs import Example
from memoplan.verification import arena_check, render_arena, verify

MODELS = """
from torch import nn


def build():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))
"""

PLAN = 'memplan 1\nmodel "models.py:build"\nexample randn(8, 16)\nmemonger { algo = greedy; ordering = topological; peak_slack = 10 }\n'


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))


def _build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))


def _plan(tmp_path: Path) -> Path:
    (tmp_path / "models.py").write_text(MODELS)
    path = tmp_path / "arena.memplan"
    path.write_text(PLAN)
    return path


def test_verify_runs_the_arena_against_eager(tmp_path):
    plan = memoplan.load(_plan(tmp_path))
    model = _build()
    report = verify(model, plan, Example((torch.randn(8, 16),), {}))
    check = report.arena
    assert check is not None and check.ran and check.equal and report.equivalent
    assert check.outputs.compared == 1
    assert check.arena_bytes > 0  # the arena holds buffers: the block did something to compare
    assert check.arena_allocations.count < check.eager_allocations.count
    line = render_arena(check)
    assert line.startswith("memonger arena") and "outputs equal bit for bit" in line
    assert f"allocations {check.arena_allocations.count} " in line


def test_verify_without_a_memonger_block_has_no_arena_check(tmp_path):
    report = verify(_build(), "memplan 1\nmodule 0 { checkpoint }\n", Example((torch.randn(8, 16),), {}))
    assert report.arena is None


def test_an_arena_that_differs_or_does_not_run_is_not_equivalent(tmp_path):
    plan = memoplan.load(_plan(tmp_path))
    example = Example((torch.randn(8, 16),), {})
    reference = _build().eval()
    planned = memoplan.apply(copy.deepcopy(reference), plan)
    other = copy.deepcopy(reference)
    with torch.no_grad():
        other[0].weight.add_(1)  # another model's outputs: the comparison must see it
    check = arena_check(other, planned, example, torch.device("cpu"))
    assert check.ran and not check.equal and "DIFFERENT" in render_arena(check)
    check = arena_check(reference, copy.deepcopy(reference), example, torch.device("cpu"))  # no arena at all
    assert not check.ran and not check.equal and "DID NOT RUN" in render_arena(check)


def _cli(*argv, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "memoplan", *map(str, argv)], cwd=cwd, env=env, capture_output=True, timeout=300
    )


@pytest.mark.slow
def test_memoplan_verify_prints_the_arena_line_and_no_profiler_noise(tmp_path):
    plan = _plan(tmp_path)
    done = _cli("verify", plan, cwd=tmp_path)
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, out + err
    (line,) = [line for line in out.splitlines() if line.startswith("memonger arena")]
    assert "outputs equal bit for bit" in line and "peak" in line and "allocations" in line
    assert "verdict: EQUIVALENT" in out
    assert "USDT" not in err and "profiler_start" not in err, err
    done = _cli("verify", plan, "--format", "json", cwd=tmp_path)
    assert "USDT" not in done.stderr.decode()
    document = json.loads(done.stdout)
    (entry,) = document["files"] if "files" in document else [document]
    details = json.dumps(entry)
    assert '"memonger"' in details and '"ran": true' in details


def test_profiler_lines_are_held_back_and_everything_else_passed_on(capfd):
    from memoplan.memonger.probe import allocated_inside

    def fn():
        os.write(2, b"the user's own line\n")
        return torch.randn(64, 64)

    allocated_inside(fn, torch.device("cpu"))
    with profiler_quiet():
        os.write(2, b"USDT:2026-01-01 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\nkept\n")
    err = capfd.readouterr().err
    assert "USDT" not in err
    assert "the user's own line" in err and "kept" in err
    assert is_profiler_line(b"USDT:x SyncActivityProfilerHandler.cpp:59] profiler_stop\n")
    assert not is_profiler_line(b"USDT is a word\n")
