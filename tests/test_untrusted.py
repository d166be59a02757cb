"""Untrusted plans: resolving runs the model's code, and says so; under ``--isolate`` (or
``MEMOPLAN_ISOLATE=1``) a crash of that code (a signal, ``os._exit``) is a diagnostic.

Every case runs ``python -m memoplan`` as a subprocess: the point is what happens to a process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _paths import ROOT

from memoplan import isolate

TRACEBACK = "Traceback (most recent call last)"

MODELS = """
import ctypes
import os
import sys

from torch import nn


def build():
    return nn.Sequential(nn.Linear(4, 4))


def exits():
    os._exit(7)


def segfaults():
    ctypes.string_at(0)


def raises():
    raise ValueError("the factory failed")


def sys_exits():
    sys.exit(3)


def aborting_example():
    os.abort()


class ExitsInForward(nn.Module):
    def forward(self, x):
        os._exit(5)


def exits_in_forward():
    return ExitsInForward()
"""


def _memoplan(*argv, cwd: Path, isolate_env: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), MEMOPLAN_CACHE_DIR=str(cwd / "cache"))
    env.pop(isolate.ENV, None)
    if isolate_env:
        env[isolate.ENV] = "1"
    return subprocess.run(
        [sys.executable, "-m", "memoplan", *map(str, argv)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _plan(folder: Path, model: str) -> Path:
    (folder / "models.py").write_text(MODELS)
    path = folder / "p.memplan"
    path.write_text(f'memplan 1\nmodel "{model}"\nmodule 0 {{ checkpoint }}\n')
    return path


@pytest.mark.slow
def test_without_isolation_an_abort_kills_memoplan_silently(tmp_path):
    """What --isolate is for: in-process, a signal leaves no diagnostic (documented)."""
    done = _memoplan("check", _plan(tmp_path, "os:abort"), cwd=tmp_path)
    assert done.returncode in (-signal.SIGABRT, 128 + signal.SIGABRT)
    assert "MP530" not in done.stderr


@pytest.mark.parametrize("how", ["flag", pytest.param("env", marks=pytest.mark.slow)])
@pytest.mark.slow
def test_an_abort_in_the_model_spec_is_mp530_at_the_model_line(how, tmp_path):
    plan = _plan(tmp_path, "os:abort")
    argv = ("check", "--isolate", plan) if how == "flag" else ("check", plan)
    done = _memoplan(*argv, cwd=tmp_path, isolate_env=how == "env")
    assert done.returncode == 1, done.stderr
    assert "p.memplan:2:1: error[MP530]" in done.stderr
    assert "killed by SIGABRT (signal 6) while loading model os:abort" in done.stderr
    assert '2 | model "os:abort"' in done.stderr and "^^^" in done.stderr
    assert TRACEBACK not in done.stderr + done.stdout


@pytest.mark.slow
def test_a_segfault_in_a_c_call_is_mp530(tmp_path):
    done = _memoplan("explain", "--isolate", _plan(tmp_path, "models.py:segfaults"), cwd=tmp_path)
    assert done.returncode == 1
    assert "error[MP530]" in done.stderr and "SIGSEGV" in done.stderr
    assert TRACEBACK not in done.stderr


@pytest.mark.slow
def test_os_exit_in_the_model_spec_is_mp531(tmp_path):
    done = _memoplan(
        "write-module", "--isolate", _plan(tmp_path, "models.py:exits"), "-o", tmp_path / "out.py", cwd=tmp_path
    )
    assert done.returncode == 1
    assert "p.memplan:2:1: error[MP531]" in done.stderr and "exit status 7" in done.stderr
    assert "os._exit()" in done.stderr
    assert not (tmp_path / "out.py").exists()


@pytest.mark.slow
def test_the_step_is_named_an_example_by_its_line_a_forward_by_the_plan(tmp_path):
    plan = _plan(tmp_path, "models.py:build")
    plan.write_text('memplan 1\nmodel "models.py:build"\nexample "models.py:aborting_example"\n')
    done = _memoplan("verify", "--isolate", plan, cwd=tmp_path)
    assert done.returncode == 1
    assert (
        "p.memplan:3:1: error[MP530]" in done.stderr
        and "while building example models.py:aborting_example" in done.stderr
    )
    plan.write_text('memplan 1\nmodel "models.py:exits_in_forward"\nexample randn(2, 4)\n')
    done = _memoplan("verify", "--isolate", plan, cwd=tmp_path)
    assert done.returncode == 1
    assert "error[MP531]" in done.stderr and "exit status 5" in done.stderr
    assert "while running one training step" in done.stderr and f"(plan {plan})" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("factory,code", [("raises", "MP504"), ("sys_exits", "MP504")])
def test_exceptions_are_still_the_childs_own_diagnostics(factory, code, tmp_path):
    done = _memoplan("check", "--isolate", _plan(tmp_path, f"models.py:{factory}"), cwd=tmp_path)
    assert done.returncode == 1
    assert f"error[{code}]" in done.stderr and "MP53" not in done.stderr
    assert done.stderr.count(f"error[{code}]") == 1  # said once, by the child


@pytest.mark.slow
def test_an_isolated_command_that_succeeds_is_unchanged(tmp_path):
    plan = _plan(tmp_path, "models.py:build")
    plain = _memoplan("check", plan, cwd=tmp_path)
    isolated = _memoplan("check", "--isolate", plan, cwd=tmp_path)
    assert plain.returncode == isolated.returncode == 0
    assert plain.stdout == isolated.stdout and "MP53" not in isolated.stderr


@pytest.mark.slow
def test_a_crash_under_format_json_is_one_document_naming_the_plan(tmp_path):
    done = _memoplan("check", "--isolate", "--format", "json", _plan(tmp_path, "os:abort"), cwd=tmp_path)
    assert done.returncode == 1
    document = json.loads(done.stdout)
    (entry,) = document["files"]
    assert entry["path"].endswith("p.memplan") and entry["status"] == "error"
    assert [d["code"] for d in entry["diagnostics"]] == ["MP530"]
    assert entry["diagnostics"][0]["span"]["line"] == 2


def test_syntax_only_is_never_isolated_and_runs_no_code(tmp_path):
    done = _memoplan("check", "--syntax-only", _plan(tmp_path, "os:abort"), cwd=tmp_path, isolate_env=True)
    assert done.returncode == 0, done.stderr
    assert "loading model" not in done.stderr


def test_help_says_that_resolving_runs_the_models_code(tmp_path):
    done = _memoplan("--help", cwd=tmp_path)
    text = " ".join(done.stdout.split())
    assert "imports and runs it" in text and "--syntax-only" in text and "--isolate" in text
    assert "not a sandbox" in text and "memoplan docs security" in text
    check = " ".join(_memoplan("check", "--help", cwd=tmp_path).stdout.split())
    assert "--isolate" in check and "Not a sandbox" in check


def test_the_child_never_isolates_itself(monkeypatch):
    class Args:
        isolate = True
        syntax_only = False

    assert isolate.requested(Args())
    monkeypatch.setenv("MEMOPLAN_ISOLATED_STATUS", "/nonexistent/status")
    assert not isolate.requested(Args())
