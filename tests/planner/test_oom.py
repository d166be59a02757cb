"""Models that do not fit: profile, plan and verify under an address-space limit.

A subprocess (tests/_limited.py) limits its address space (``RLIMIT_AS``) to what it uses plus
a margin between the planned and the unplanned peak of tests/oom_models.py (64 MiB unplanned,
about 20 MiB with a 40% plan).  Under that limit the unplanned step runs out of memory (the
measured profile says MP411), yet ``memoplan profile`` estimates, ``memoplan plan --budget 40%``
writes a plan checked by one real planned step, and ``memoplan verify`` says EQUIVALENT (the
equivalence proven on a smaller example).  Without the limit, the plan meets its budget.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _paths import TESTS

from memoplan.measure import measure_step
from memoplan.planner.search.refine import measure_plan
from memoplan.specs import Example
from memoplan.syntax import parse

HERE = TESTS
sys.path.insert(0, str(HERE))
import oom_models  # noqa: E402

MODEL = f"{HERE / 'oom_models.py'}:build"
EXAMPLE = f"{HERE / 'oom_models.py'}:example"
MARGIN_MIB = 45  # over the planned step's ~27 MiB of address space, under the unplanned one's ~64


def _limited(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    root = HERE.parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
        "MALLOC_MMAP_THRESHOLD_": "65536",
        "MALLOC_ARENA_MAX": "1",
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, str(HERE / "_limited.py"), str(MARGIN_MIB), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_profile_plan_verify_a_model_that_does_not_fit(tmp_path: Path) -> None:
    torch.manual_seed(0)
    unplanned = measure_step(oom_models.build(), oom_models.example()).peak_bytes
    assert unplanned > 2 * MARGIN_MIB * 2**20 * 0.6  # the model is as large as the margin assumes

    measured = _limited(
        "profile",
        "--method",
        "measured",
        "--model",
        MODEL,
        "--example",
        EXAMPLE,
        "--repeats",
        "1",
        "-o",
        "m.json",
        cwd=tmp_path,
    )
    assert measured.returncode == 1 and "error[MP411]: the profile training step ran out of memory" in measured.stderr
    assert not (tmp_path / "m.json").exists()  # nothing written half-done

    profiled = _limited(
        "profile", "--model", MODEL, "--example", EXAMPLE, "--repeats", "1", "-o", "p.json", cwd=tmp_path
    )
    assert profiled.returncode == 0, profiled.stderr
    assert "ran out of memory" in profiled.stderr and "estimating its profile instead" in profiled.stderr
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["method"] == "estimated" and data["peak_bytes"] == unplanned
    assert "method: estimated" in profiled.stdout

    planned = _limited(
        "plan", "--model", MODEL, "--example", EXAMPLE, "--budget", "40%", "-o", "fit.memplan", cwd=tmp_path
    )
    assert planned.returncode == 0, planned.stderr
    text = (tmp_path / "fit.memplan").read_text()
    assert "budget 40% hard" in text and "# unplanned peak on fake tensors:" in text

    verified = _limited("verify", "fit.memplan", cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "verdict: EQUIVALENT" in verified.stdout
    assert "estimated on fake tensors" in verified.stdout
    # A smaller batch than the full 32 (halved until its unplanned step fits what the limit leaves,
    # which depends on the address space the interpreter and its libraries take on this machine).
    smaller = re.search(r"smaller example \(args\[0\] (\d+)x64", verified.stdout)
    assert smaller and int(smaller.group(1)) < 32, verified.stdout

    # Without the limit: the written plan meets its budget, measured.
    plan = parse(text, "fit.memplan")
    peak = measure_plan(oom_models.build(), Example(oom_models.example()), plan)
    assert peak <= 0.4 * unplanned


# ---------------------------------------------------------------- the command line, no limit

from _cli import run  # noqa: E402, I001

TRANSFORMER = ("--model", "memoplan.examples.transformer:build", "--example", "memoplan.examples.transformer:example")


def test_budget_device_is_refused_on_the_cpu(capsys, tmp_path: Path) -> None:
    out = tmp_path / "p.memplan"
    code, _, err = run(capsys, "plan", *TRANSFORMER, "--budget", "device - 2GiB", "-o", out)
    assert code == 1 and "error[MP509]" in err and "needs a CUDA device" in err
    assert not out.exists()
    code, _, err = run(capsys, "plan", *TRANSFORMER, "--budget", "device minus lots", "-o", out)
    assert code == 1 and "error[MP509]" in err and "not a device budget" in err


@pytest.mark.slow
def test_written_plans_carry_their_budget_and_verify_checks_it(capsys, tmp_path: Path) -> None:
    out = tmp_path / "p.memplan"
    code, _, _ = run(capsys, "plan", *TRANSFORMER, "--budget", "3 MiB hint", "-o", out)
    assert code == 0
    assert "\nbudget 3 MiB hint\n" in out.read_text()
    code, _, _ = run(capsys, "plan", *TRANSFORMER, "--budget", "60%", "-o", out)
    assert code == 0 and "\nbudget 60% hard\n" in out.read_text()
    code, stdout, _ = run(capsys, "verify", out)
    assert code == 0 and "budget 2.00 MiB" in stdout and "met" in stdout


@pytest.mark.slow
def test_verify_proves_equivalence_on_a_given_smaller_example(capsys, tmp_path: Path) -> None:
    plan = tmp_path / "p.memplan"
    plan.write_text(
        'memplan 1\nmodel "memoplan.examples.transformer:build"\nexample "memoplan.examples.transformer:example"\n'
        "module blocks.* { checkpoint }\n",
        encoding="utf-8",
    )
    code, stdout, _ = run(
        capsys, "verify", plan, "--compare-example", "memoplan.examples.transformer:example_with_mask"
    )
    assert code == 0, stdout
    assert "peak memory, full example (args[0] 4x32 int64)" in stdout
    assert "equivalence, smaller example (args[0] 4x32 int64, kwargs['attention_mask'] 4x32 bool)" in stdout
    assert "verdict: EQUIVALENT" in stdout


def test_out_of_memory_is_its_own_diagnostic(capsys, tmp_path: Path) -> None:
    """A step that raises the allocator's error: MP411 with the bytes and the step, not MP504."""
    model = tmp_path / "hungry.py"
    model.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.l = torch.nn.Linear(4, 4)\n"
        "    def forward(self, x):\n"
        "        raise RuntimeError('DefaultCPUAllocator: can\\'t allocate memory: you tried to allocate 8388608 bytes.')\n"
        "def build():\n    return M()\n",
        encoding="utf-8",
    )
    out = tmp_path / "p.json"
    args = ("--model", f"{model}:build", "--example", "randn(2, 4)", "-o", out)
    code, _, err = run(capsys, "profile", "--method", "measured", *args)
    assert code == 1 and "error[MP411]: the profile training step ran out of memory" in err
    assert "8,388,608 B (8.00 MiB)" in err and "--method estimated" in err and "MP504" not in err
    assert not out.exists()
