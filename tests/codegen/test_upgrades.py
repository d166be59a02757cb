"""Upgrades: committed plan modules and ``write-module --check`` across memoplan releases.

A plan module names the runtime interface it was generated for (``RUNTIME_ABI``) and checks it
on import: silence when this runtime runs it, MP424 otherwise.  The header names no memoplan
release, so an upgrade that generates the same code changes no committed file, and
``write-module --check`` prints a unified diff when a file is out of date.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from _cli import run
from _paths import ROOT

from memoplan import __version__
from memoplan.diagnostics import PlanError
from memoplan.runtime import abi

GOLDEN = ROOT / "tests" / "golden" / "cnn_bn_dropout_plan.py"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))


def _import(path: Path):
    """Import a plan module from ``path`` in a fresh interpreter: (exit code, stderr)."""
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('plan_module', {str(path)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "print(module.RUNTIME_ABI)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout, done.stderr


def test_the_runtime_runs_the_interface_this_memoplan_generates() -> None:
    assert abi.ABI in abi.SUPPORTED_ABIS
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        abi.require_abi(abi.ABI, "plans/x.memplan")  # silence


@pytest.mark.parametrize("other", [abi.ABI + 1, 0, "1", None])
def test_another_interface_is_mp424_naming_both(other) -> None:
    with pytest.raises(PlanError) as info:
        abi.require_abi(other, "plans/x.memplan")
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "MP424"
    assert f"generated for runtime interface {other!r}" in diagnostic.message
    assert f"this memoplan ({__version__}) runs interface {abi.ABI}" in diagnostic.message
    assert "memoplan write-module" in diagnostic.help
    assert ("upgrade memoplan" in diagnostic.help) == (other == abi.ABI + 1)


@pytest.mark.slow
def test_a_committed_module_imports_silently_and_a_future_one_is_refused(tmp_path) -> None:
    code, out, err = _import(GOLDEN)
    assert code == 0 and out.strip() == str(abi.ABI) and err == ""
    future = tmp_path / "future_plan.py"
    text = GOLDEN.read_text(encoding="utf-8")
    assert f"RUNTIME_ABI = {abi.ABI}\n" in text
    future.write_text(text.replace(f"RUNTIME_ABI = {abi.ABI}\n", f"RUNTIME_ABI = {abi.ABI + 1}\n"), encoding="utf-8")
    code, out, err = _import(future)
    assert code == 1 and out == ""
    assert (
        "error[MP424]: the plan module for `plans/cnn_bn_dropout.memplan` was generated for runtime interface 2" in err
    )


def test_the_header_names_no_release(tmp_path) -> None:
    text = GOLDEN.read_text(encoding="utf-8")
    assert __version__ not in text.split("\nPLAN_ID", 1)[0]


def test_compile_check_prints_a_unified_diff(capsys, tmp_path) -> None:
    out = tmp_path / "plan_module.py"
    plan = ROOT / "plans" / "cnn_bn_dropout.memplan"
    code, _, err = run(capsys, "write-module", plan, "-o", out)
    assert code == 0, err
    fresh = out.read_text(encoding="utf-8")
    out.write_text(fresh.replace("PLAN_ID = ", "PLAN_ID = 'stale'  # \x1b[2J\nOLD_ID = "), encoding="utf-8")
    code, stdout, err = run(capsys, "write-module", plan, "-o", out, "--check")
    assert code == 1
    assert f"{out} is out of date; run without --check" in stdout
    assert f"--- {out}\n+++ {out} (generated now)\n" in stdout
    assert "\n-PLAN_ID = 'stale'  # \\x1b[2J\n" in stdout and "\n-OLD_ID = " in stdout
    assert "\n+PLAN_ID = " in stdout
    assert "\x1b" not in stdout
    out.write_text(fresh, encoding="utf-8")
    code, stdout, err = run(capsys, "write-module", plan, "-o", out, "--check")
    assert code == 0 and stdout.strip() == f"{out} is up to date"


def test_compile_check_of_a_missing_file_says_so(capsys, tmp_path) -> None:
    out = tmp_path / "absent.py"
    code, stdout, err = run(capsys, "write-module", ROOT / "plans" / "cnn_bn_dropout.memplan", "-o", out, "--check")
    assert code == 1 and stdout.strip() == f"{out} is missing; run without --check"
    assert not out.exists()
