"""The syntax tools import no torch; a command that needs it, where it is missing, says how to get it (MP550).

Each case runs in a fresh interpreter (the test process has torch loaded).  ``tests/
test_hooks_install.py`` checks the same in an environment that really has no torch (slow).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _paths import ROOT

PLAN = str(ROOT / "plans" / "cnn_bn_dropout.memplan")

# Runs `memoplan ARGS...` in-process and prints its exit code and whether torch got imported.
# With BLOCK set, `import torch` fails as it does where torch is not installed.
PROBE = """\
import contextlib, io, json, os, sys
if os.environ.get("BLOCK"):
    sys.modules["torch"] = None  # import torch -> ModuleNotFoundError(name='torch')
from memoplan.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
print(json.dumps({"code": code, "torch": sys.modules.get("torch") is not None, "out": out.getvalue(), "err": err.getvalue()}))
"""


def _run(*args: str, block: bool = False) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("BLOCK", None)
    if block:
        env["BLOCK"] = "1"
    done = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("rule",),
        ("rule", "MP301"),
        ("docs", "security"),
        ("fmt", "--check", PLAN),
        ("check", "--syntax-only", PLAN),
        ("check", "--syntax-only", "--format", "json", PLAN),
    ],
    ids=["help", "rule", "rule-code", "docs", "fmt", "check-syntax-only", "check-syntax-only-json"],
)
def test_syntax_tools_import_no_torch(args) -> None:
    found = _run(*args)
    assert found["code"] == 0, found["err"]
    assert found["torch"] is False


def test_a_model_command_without_torch_is_mp540() -> None:
    found = _run("check", PLAN, block=True)
    assert found["code"] == 1
    assert "error[MP550]: `memoplan check` needs PyTorch" in found["err"], found["err"]
    assert "pip install 'memoplan[torch]'" in found["err"]
    assert "Traceback" not in found["err"]


def test_mp540_in_json_output() -> None:
    found = _run("check", "--format", "json", PLAN, block=True)
    assert found["code"] == 1
    (file,) = json.loads(found["out"])["files"]
    assert [d["code"] for d in file["diagnostics"]] == ["MP550"]


def test_torch_range_is_the_extras() -> None:
    """The range MP550 names is the `torch` extra's, and the tested torch is in it."""
    import re
    from importlib.metadata import version as installed

    from memoplan.needs_torch import TORCH_RANGE

    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'torch = ["torch{TORCH_RANGE}"]' in text
    assert text.count(f'"torch{TORCH_RANGE}"') == 2  # the extra, and the test extra
    low, high = re.fullmatch(r">=([\d.]+),<([\d.]+)", TORCH_RANGE).groups()
    version = tuple(int(p) for p in installed("torch").split("+")[0].split(".")[:2])
    assert tuple(int(p) for p in low.split(".")) <= version < tuple(int(p) for p in high.split("."))


def test_a_missing_module_of_an_installed_torch_is_not_mp540() -> None:
    from memoplan.needs_torch import is_missing_torch

    assert not is_missing_torch(ModuleNotFoundError("No module named 'torch.gone'", name="torch.gone"))
    assert not is_missing_torch(ModuleNotFoundError("No module named 'torchvision'", name="torchvision"))
