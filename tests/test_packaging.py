"""Packaging, as a pip user meets it: the wheel and the sdist, installed into a fresh environment.

Builds the sdist and, from it, the wheel (``python -m build``, as a distribution recipe does);
creates a new virtual environment, installs torch 2.13.0 (the tested release) and then the wheel
with its ``torch``, ``lsp`` and ``report`` extras (no editable install, nothing borrowed from this
environment); then, from a folder outside the checkout, runs ``check`` on every bundled plan,
``verify``, ``compile`` and an import of the compiled module, ``report``, ``demo``, and a
language-server session (initialize, diagnostics for a syntax error).  The sdist must carry the
tests, the docs and the licence; both pass ``twine check --strict`` (ready to publish).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest
from _lsp import Session
from _paths import ROOT, TESTS

PLANS = sorted((ROOT / "plans").glob("*.memplan"))
TORCH = "torch==2.13.0"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def wheel(dist) -> Path:
    (found,) = dist.glob("memoplan-*.whl")
    return found


@pytest.fixture(scope="module")
def sdist(dist) -> Path:
    (found,) = dist.glob("memoplan-*.tar.gz")
    return found


def _pip(python: Path, *args: str) -> None:
    result = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *args], capture_output=True, text=True)
    assert result.returncode == 0, (
        f"pip install {' '.join(args)} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    )


@pytest.fixture(scope="module")
def fresh_env(wheel, tmp_path_factory) -> dict:
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True, clear=True).create(home)
    python = home / "bin" / "python"
    _pip(python, TORCH)  # first: the CPU build from this machine's index; the `torch` extra's range keeps it
    _pip(python, f"memoplan[torch,lsp,report] @ {wheel.as_uri()}")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{home / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["XDG_CACHE_HOME"] = str(home / "cache")
    env.pop("MEMOPLAN_CACHE_DIR", None)
    cwd = tmp_path_factory.mktemp("elsewhere")
    return {"python": python, "bin": home / "bin", "env": env, "cwd": cwd, "home": home}


def _run(fresh_env, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(fresh_env["bin"] / "memoplan"), *args],
        env=fresh_env["env"],
        cwd=fresh_env["cwd"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_wheel_contents(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for name in (
        "memoplan/_data/grammar/memplan.lark",
        "memoplan/codegen/templates/plan_module.py.j2",
        "memoplan/codegen/templates/calls/region.py.j2",
        "memoplan/codegen/templates/report/page.html.j2",
        "memoplan/_data/plans/cnn_bn_dropout.memplan",
        "memoplan/examples/cnn.py",
        "memoplan/py.typed",
    ):
        assert name in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    from memoplan.doc_pages import TOPICS

    missing = sorted({t.path for t in TOPICS.values()} - {n.removeprefix("memoplan/_data/") for n in names})
    assert not missing, f"`memoplan docs` pages not in the wheel (pyproject.toml's force-include): {missing}"
    assert not any(n.startswith("tests/") for n in names)


def test_sdist_carries_tests_docs_and_licence(sdist):
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for name in (
        "LICENSE",
        "README.md",
        "pyproject.toml",
        "tests/test_packaging.py",
        "tests/conftest.py",
        "grammar/memplan.lark",
        "memoplan/codegen/templates/plan_module.py.j2",
        "plans/cnn_bn_dropout.memplan",
    ):
        assert name in names, name
    assert any(n.startswith("docs/") and n.endswith(".md") for n in names)
    assert not any("node_modules" in n or "__pycache__" in n for n in names)


def test_sdist_and_wheel_pass_twine_check(dist):
    """Ready to publish: twine's checks (the readme renders, the metadata is complete) pass strictly."""
    files = sorted(str(p) for p in dist.iterdir())
    assert len(files) == 2, files
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *files], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2, result.stdout


def test_wheel_metadata_is_complete(wheel):
    """What an index page shows: summary, readme, licence, classifiers, project links; torch an extra."""
    from email.parser import Parser

    (name,) = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA")]
    meta = Parser().parsestr(zipfile.ZipFile(wheel).read(name).decode("utf-8"))
    assert meta["Summary"] and meta["License-Expression"] == "Apache-2.0"
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().startswith("# memoplan")
    classifiers = meta.get_all("Classifier")
    assert "Programming Language :: Python :: 3.10" in classifiers and "Typing :: Typed" in classifiers
    assert any(c.startswith("Development Status ::") for c in classifiers)
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Documentation", "Source", "Changelog", "Issues"} <= set(urls), urls
    assert all(u.startswith("https://") for u in urls.values()), urls
    requires = meta.get_all("Requires-Dist")
    plain = [r for r in requires if "extra ==" not in r]
    assert not any(r.startswith("torch") for r in plain), plain  # the syntax tools need no torch
    from memoplan.needs_torch import TORCH_RANGE

    wanted = ",".join(sorted(TORCH_RANGE.split(",")))
    torch_extra = [r.split(";")[0] for r in requires if r.startswith("torch") and "extra == 'torch'" in r]
    assert [",".join(sorted(r.removeprefix("torch").split(","))) for r in torch_extra] == [wanted], requires


def test_installed_package_is_the_wheel(fresh_env):
    result = subprocess.run(
        [
            str(fresh_env["python"]),
            "-c",
            "import memoplan, torch, memoplan._resources as r; print(memoplan.__file__); print(r.templates_dir()); print(torch.__version__)",
        ],
        env=fresh_env["env"],
        cwd=fresh_env["cwd"],
        capture_output=True,
        text=True,
        check=True,
    )
    package_file, templates, torch_version = result.stdout.split("\n")[:3]
    venv_root = str(fresh_env["home"])
    assert package_file.startswith(venv_root) and "site-packages" in package_file
    assert templates.startswith(venv_root) and templates.endswith("memoplan/codegen/templates")
    assert torch_version.startswith("2.13.0")


def test_every_plan_checks_from_the_wheel(fresh_env):
    """One `memoplan check` of every bundled plan (one process: torch is imported once)."""
    result = _run(fresh_env, "check", *map(str, PLANS))
    assert result.returncode == 0, result.stderr
    for plan in PLANS:
        assert f"{plan}: ok," in result.stdout, (plan, result.stdout)


def test_verify_from_the_wheel(fresh_env):
    result = _run(fresh_env, "verify", str(ROOT / "plans" / "cnn_bn_dropout.memplan"))
    assert result.returncode == 0, result.stderr
    assert "verdict: EQUIVALENT" in result.stdout


def test_compile_and_import_from_the_wheel(fresh_env):
    out = fresh_env["cwd"] / "cnn_plan.py"
    result = _run(fresh_env, "write-module", str(ROOT / "plans" / "cnn_bn_dropout.memplan"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    script = (
        "import torch, cnn_plan\n"
        "from memoplan.examples.cnn import build\n"
        "model = build()\n"
        "cnn_plan.apply(model)\n"
        "model(torch.randn(2, 3, 32, 32)).sum().backward()\n"
        "cnn_plan.remove(model)\n"
        "print('imported', cnn_plan.__file__)\n"
    )
    result = subprocess.run(
        [str(fresh_env["python"]), "-c", script],
        env=fresh_env["env"],
        cwd=fresh_env["cwd"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "imported" in result.stdout and str(fresh_env["cwd"]) in result.stdout


def test_report_from_the_wheel(fresh_env):
    out = fresh_env["cwd"] / "report.html"
    result = _run(fresh_env, "report", str(ROOT / "plans" / "cnn_bn_dropout.memplan"), "--no-sweep", "-o", str(out))
    assert result.returncode == 0, result.stderr
    html = out.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") or html.lower().startswith("<!doctype html>")
    assert "<svg" in html


def test_demo_from_the_wheel(fresh_env):
    where = fresh_env["cwd"] / "demo"
    result = _run(fresh_env, "demo", str(where))
    assert result.returncode == 0, result.stderr
    assert (where / "cnn_bn_dropout.memplan").is_file()


def test_docs_from_the_wheel(fresh_env):
    """Every topic prints from the installed wheel, outside any checkout."""
    from memoplan.doc_pages import TOPICS

    for topic in TOPICS:
        result = _run(fresh_env, "docs", topic)
        assert result.returncode == 0 and result.stdout.startswith("#"), (topic, result.stderr)
    assert "--isolate" in _run(fresh_env, "docs", "security").stdout


def test_language_server_from_the_wheel(fresh_env):
    server = shutil.which("memoplan", path=str(fresh_env["bin"]))
    assert server is not None
    session = Session(command=[server, "lsp"], cwd=fresh_env["cwd"], env=fresh_env["env"])
    try:
        assert session.initialized.server_info.name == "memoplan"
        uri = (fresh_env["cwd"] / "broken.memplan").as_uri()
        after = session.open(uri, "memplan 1\n\nmodule blocks.* {\n  checkpoint\n")
        diagnostics = session.diagnostics(uri, after)
        assert diagnostics and diagnostics[0].code.startswith("MP1")
    finally:
        assert session.stop() == 0


def test_user_script_type_checks_against_the_wheel(fresh_env, tmp_path):
    """`mypy --strict` on a user script sees the installed wheel's types (py.typed, __all__)."""
    pytest.importorskip("mypy", reason="mypy is in the test extra")
    script = TESTS / "fixtures" / "typing" / "user_script.py"
    env = {k: v for k, v in fresh_env["env"].items() if k != "MYPYPATH"}

    def mypy(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "mypy", "--strict", "--python-executable", str(fresh_env["python"])]
        command += ["--cache-dir", str(tmp_path / "cache"), "--no-error-summary", *args]
        return subprocess.run(command, env=env, cwd=fresh_env["cwd"], capture_output=True, text=True, timeout=900)

    result = mypy(str(script))
    assert result.returncode == 0, result.stdout + result.stderr
    reveal = tmp_path / "reveal.py"
    reveal.write_text("import memoplan\nreveal_type(memoplan.apply)\n", encoding="utf-8")
    result = mypy("-v", str(reveal))
    assert "torch.nn.modules.module.Module" in result.stdout, result.stdout[-2000:]
    found = [line for line in result.stderr.splitlines() if "memoplan/__init__.py" in line]
    assert found and all(str(fresh_env["home"]) in line for line in found), found[:3]
