"""Packaging: the wheel carries the grammar and templates, and works from a fresh venv.

Builds the wheel, installs it (without dependencies) into a new virtual
environment that borrows torch, lark and jinja2 from this one through PYTHONPATH
(no .pth processing, so the editable checkout is invisible there), then runs
`memoplan check` on every plan in plans/ and `memoplan verify` on one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLANS = sorted((ROOT / "plans").glob("*.memplan"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("memoplan-*.whl")
    return wheel


@pytest.fixture(scope="module")
def fresh_env(wheel, tmp_path_factory) -> dict:
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True).create(home)
    python = home / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]  # torch, lark, jinja2 of this venv
    env["MEMOPLAN_CACHE_DIR"] = str(home / "cache")
    return {
        "python": python,
        "bin": home / "bin",
        "env": env,
        "cwd": tmp_path_factory.mktemp("cwd"),
    }


def test_wheel_contains_grammar_and_templates(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "memoplan/_data/grammar/memplan.lark" in names
    assert "memoplan/_data/templates/plan_module.py.j2" in names
    assert "memoplan/examples/cnn.py" in names


def test_installed_package_is_the_wheel(fresh_env):
    result = subprocess.run(
        [
            str(fresh_env["python"]),
            "-c",
            "import memoplan, memoplan._resources as r; print(memoplan.__file__); print(r.templates_dir())",
        ],
        env=fresh_env["env"],
        cwd=fresh_env["cwd"],
        capture_output=True,
        text=True,
        check=True,
    )
    package_file, templates = result.stdout.split("\n")[:2]
    venv_root = str(fresh_env["python"].parent.parent)
    assert package_file.startswith(venv_root)
    assert templates.startswith(venv_root) and templates.endswith("_data/templates")


@pytest.mark.parametrize("plan", PLANS, ids=[p.name for p in PLANS])
def test_every_plan_checks_from_the_wheel(fresh_env, plan):
    result = subprocess.run(
        [str(fresh_env["bin"] / "memoplan"), "check", str(plan)],
        env=fresh_env["env"],
        cwd=fresh_env["cwd"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert ": ok," in result.stdout


def test_verify_from_the_wheel(fresh_env):
    result = subprocess.run(
        [
            str(fresh_env["bin"] / "memoplan"),
            "verify",
            str(ROOT / "plans" / "cnn_bn_dropout.memplan"),
        ],
        env=fresh_env["env"],
        cwd=fresh_env["cwd"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "verdict: EQUIVALENT" in result.stdout
