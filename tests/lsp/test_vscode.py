"""The VS Code extension as it is packaged: a bundle (esbuild) that loads without node_modules,
the files a VSIX needs and none it must not carry, and a headless activation that gets
diagnostics from a real `memoplan lsp`.

VS Code itself cannot be downloaded here, so ``editors/test/activate.js`` stands in for the
``vscode`` module (the parts vscode-languageclient uses), loads ``dist/extension.js``, activates
it, opens a broken plan and waits for the server's diagnostics in VS Code's diagnostic
collection.  It runs the extension as ``vsce package`` packs it (the VSIX, unpacked): no
``node_modules``, so the bundle must carry its language client.  Needs Node.js and ``make editors`` (npm ci, then the bundle); skipped without them
on a developer's machine, a failure under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from _clients import require
from _paths import ROOT

import memoplan

EDITORS = ROOT / "editors"
PACKAGE = json.loads((EDITORS / "package.json").read_text(encoding="utf-8"))
BROKEN = "memplan 1\n\nmodule blocks.* {\n    checkpointing\n}\n"


def test_manifest_for_the_marketplace():
    assert PACKAGE["main"] == "./dist/extension.js"
    assert PACKAGE["repository"]["url"].startswith("https://")
    assert PACKAGE["license"] == "Apache-2.0"
    assert (EDITORS / "LICENSE").read_text(encoding="utf-8") == (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "esbuild" in PACKAGE["devDependencies"]
    assert "--external:vscode" in PACKAGE["scripts"]["bundle"]
    assert "--minify" in PACKAGE["scripts"]["bundle"]  # the one file of code the VSIX carries, small
    # The extension's page on the marketplace and in VS Code: its README and changelog.
    readme = (EDITORS / "README.md").read_text(encoding="utf-8")
    for setting in PACKAGE["contributes"]["configuration"]["properties"]:
        assert f"`{setting}`" in readme, setting
    assert f"## {PACKAGE['version']}" in (EDITORS / "CHANGELOG.md").read_text(encoding="utf-8")
    assert PACKAGE["scripts"]["vscode:prepublish"] == "npm run bundle"


def test_vscodeignore_leaves_out_sources_modules_and_test_helpers():
    ignored = [
        line.strip()
        for line in (EDITORS / ".vscodeignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for pattern in ("node_modules/**", "test/**", "tokenize.js", "extension.js"):
        assert pattern in ignored
    assert not any(p.startswith("dist") for p in ignored)  # the bundle is what ships


@pytest.fixture(scope="module")
def bundle() -> Path:
    require(
        shutil.which("node") is not None and shutil.which("npm") is not None,
        "Node.js and npm",
        "apt-get install nodejs npm",
    )
    require(
        (EDITORS / "node_modules" / "esbuild").is_dir(),
        "the extension's npm packages",
        "`make editors` (npm ci in editors/)",
    )
    subprocess.run(["npm", "run", "--silent", "bundle"], cwd=EDITORS, check=True, capture_output=True, timeout=300)
    out = EDITORS / "dist" / "extension.js"
    text = out.read_text(encoding="utf-8")
    # minified: the language client and the extension in a few long lines (without --minify: about 800 KB)
    assert len(text) < 500_000 and text.count("\n") < len(text) / 1000, (len(text), text.count("\n"))
    # vscode-languageclient is inside the bundle; only `vscode` (VS Code's own) is left to load.
    assert 'require("vscode-languageclient' not in text
    assert 'require("vscode")' in text
    return out


@pytest.fixture(scope="module")
def vsix(bundle, tmp_path_factory) -> Path:
    """The extension packaged as VS Code's marketplace takes it (`vsce package`), unpacked: the
    files VS Code installs, and nothing else (no node_modules: the bundle must stand alone)."""
    require(
        (EDITORS / "node_modules" / ".bin" / "vsce").is_file(),
        "vsce (@vscode/vsce)",
        "`make editors` (npm ci in editors/)",
    )
    out = tmp_path_factory.mktemp("vsix")
    package = out / "memplan.vsix"
    result = subprocess.run(
        ["npm", "run", "--silent", "package", "--", "-o", str(package)],
        cwd=EDITORS,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    with zipfile.ZipFile(package) as archive:
        archive.extractall(out / "unpacked")
    return out / "unpacked" / "extension"


def test_package_holds_the_bundle_and_no_helpers(vsix):
    files = sorted(p.relative_to(vsix).as_posix() for p in vsix.rglob("*") if p.is_file())
    assert "dist/extension.js" in files and "package.json" in files
    assert any(f.startswith("LICENSE") for f in files)
    assert "memplan.tmLanguage.json" in files and "language-configuration.json" in files
    assert "readme.md" in [f.lower() for f in files] and "changelog.md" in [f.lower() for f in files]
    assert not any(f.startswith(("node_modules/", "test/")) or f in ("tokenize.js", "extension.js") for f in files), (
        files
    )


def _activate(plan: Path, *extra: str) -> dict:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(Path(memoplan.__file__).parents[1]), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        ["node", str(EDITORS / "test" / "activate.js"), str(plan), *extra],
        cwd=plan.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no report (exit {result.returncode}): {result.stdout[-2000:]}{result.stderr[-2000:]}"
    seen = json.loads(lines[-1])
    assert result.returncode == 0, seen
    return seen


def _check(seen: dict, plan: Path) -> None:
    assert seen["activated"]
    assert seen["uri"] == plan.as_uri()
    assert [(d["code"], d["line"], d["character"]) for d in seen["diagnostics"]] == [("MP102", 3, 4)]
    assert seen["diagnostics"][0]["severity"] == 0  # vscode.DiagnosticSeverity.Error
    assert "did you mean `checkpoint`" in seen["diagnostics"][0]["message"]


@pytest.mark.slow
def test_packaged_extension_activates_with_the_selected_interpreter(vsix, tmp_path):
    plan = tmp_path / "broken.memplan"
    plan.write_text(BROKEN, encoding="utf-8")
    seen = _activate(plan, "--python", sys.executable, "--extension", str(vsix))
    _check(seen, plan)
    assert (
        f"starting {sys.executable} -m memoplan lsp (from the Python extension's selected interpreter)"
        in seen["commandFrom"]
    )


@pytest.mark.slow
def test_packaged_extension_activates_from_path(vsix, tmp_path):
    plan = tmp_path / "broken.memplan"
    plan.write_text(BROKEN, encoding="utf-8")
    seen = _activate(plan, "--extension", str(vsix))
    _check(seen, plan)
    assert "starting memoplan lsp (from PATH)" in seen["commandFrom"]
