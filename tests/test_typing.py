"""Type checkers see memoplan's public API: a literal ``__all__``, ``py.typed``, typed signatures.

A user script that loads, formats, verifies, applies and removes a plan passes ``mypy --strict``;
a script that misuses the API is rejected with memoplan's own types in the messages (so the
package is not seen as ``Any``).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _paths import ROOT, TESTS

import memoplan

FIXTURES = TESTS / "fixtures" / "typing"


def test_all_is_a_literal_list_of_the_exports():
    tree = ast.parse((ROOT / "memoplan" / "__init__.py").read_text(encoding="utf-8"))
    (value,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
    ]
    assert isinstance(value, ast.List) and all(isinstance(e, ast.Constant) for e in value.elts)
    names = [e.value for e in value.elts]
    assert sorted(names) == sorted(["__version__", *memoplan._EXPORTS])
    for name in names:
        assert getattr(memoplan, name) is not None


def test_py_typed_ships():
    assert (ROOT / "memoplan" / "py.typed").is_file()


def _mypy(script: Path, cache: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(cache), "--no-error-summary", str(script)],
        env=env,
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mypy-cache")  # shared: the second run reuses torch's analysis


@pytest.mark.slow
def test_user_script_passes_mypy_strict(cache):
    result = _mypy(FIXTURES / "user_script.py", cache)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_misuse_is_rejected_with_memoplan_types(cache):
    result = _mypy(FIXTURES / "misuse.py", cache)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any('"apply"' in line and "arg-type" in line for line in lines), result.stdout
    assert any('"Plan"' in line and "assignment" in line for line in lines), result.stdout
    assert any('"parse"' in line and "arg-type" in line for line in lines), result.stdout
    assert any('"verify"' in line and "arg-type" in line for line in lines), result.stdout
    for type_name in ("list[ExplainRow]", "ResolvedPlan", "Path", "DtrStats", "VerifyReport", "StepMemory"):
        assert any(f'"{type_name}"' in line and "assignment" in line for line in lines), (type_name, result.stdout)
    assert not any("explicitly export" in line or "not callable" in line for line in lines), result.stdout
