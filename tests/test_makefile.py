"""`make demo` sets up only what the demo runs; `make test` everything the tests need (CI's set-up).

Checked with make's dry run (``make -n``) in a fresh, empty virtual-environment path, so the
commands listed are those a fresh clone would run.  docs/install.md gives the measured time and
size of `make demo` on a fresh clone.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from _paths import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _dry_run(target: str, venv) -> list[str]:
    done = subprocess.run(
        ["make", "-n", target, f"VENV={venv}", "CI=false"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def test_demo_installs_only_the_demos_layer(tmp_path) -> None:
    commands = _dry_run("demo", tmp_path / "venv")
    installs = [c for c in commands if "pip install" in c and "--upgrade pip" not in c]
    assert installs == [
        f"{tmp_path / 'venv'}/bin/python -m pip install --quiet torch==2.13.0",
        f"{tmp_path / 'venv'}/bin/python -m pip install --quiet -e '.[torch,report]'",
    ], installs
    assert any("memoplan verify plans/cnn_bn_dropout.memplan" in c for c in commands)
    assert any("memoplan report plans/cnn_bn_dropout.memplan" in c for c in commands)


def test_test_installs_both_layers_then_lints_and_tests(tmp_path) -> None:
    commands = _dry_run("test", tmp_path / "venv")
    text = "\n".join(commands)
    order = [
        "pip install --quiet torch==2.13.0",
        "-e '.[torch,report]'",
        "-e '.[test,report]'",
        "transformers==5.23.0",
        "--no-deps spikingjelly==2.0.0",
        "ruff check",
        "mypy",
        "-m pytest",
    ]
    positions = [text.find(part) for part in order]
    assert all(p >= 0 for p in positions), dict(zip(order, positions))
    assert positions == sorted(positions), dict(zip(order, positions))


def test_readme_opens_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    block = [line.split("#")[0].strip() for line in lines[1:5] if line.startswith("    ")]
    assert block == ["make demo", "make test"], lines[:5]
