"""The tutorial, the how-to and the Hugging Face recipe run as written: every command and code
block of a page, in order, in an empty scratch folder.

A fenced block is run by its language:

- no language (or ``sh``): one command a line, ``#`` comments dropped.  ``memoplan ...`` runs
  in this process (``memoplan.cli.main``, as the installed script does) and must exit 0; an
  installation (``pip``, ``python -m pip``, ``make``, ``npm``) is the test environment's own
  set-up and is skipped; any other line runs in a shell.
- ``python``: run as a script in the scratch folder (which is on ``sys.path``, as a script's
  own folder is); ``python file=NAME``: written to NAME, for later blocks to import.
- ``memplan file=NAME``: written to NAME, or, if an earlier step made NAME, the same text as it
  (the page shows the real file); ``memplan`` alone: must pass ``memoplan check --syntax-only``.
- ``yaml``: must parse; a pre-commit config names only hooks the repository ships.

Any other language fails the test, so that a new kind of block is given a way to run.
"""

from __future__ import annotations

import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from _paths import ROOT

from memoplan import cli

FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```\s*$", re.M | re.S)
PAGES = ["docs/tutorial.md", "docs/how-to.md", "docs/huggingface.md"]


def blocks(page: str) -> list[tuple[str, dict[str, str], str]]:
    """``(language, {key: value}, text)`` of every fenced block of ``page``, in order."""
    found = []
    for info, text in FENCE.findall((ROOT / page).read_text(encoding="utf-8")):
        words = info.split()
        language = words[0] if words else ""
        attributes = dict(word.split("=", 1) for word in words[1:])
        found.append((language, attributes, text))
    return found


def _run_command(line: str, folder: Path, capsys) -> None:
    words = shlex.split(line, comments=True)
    if not words:
        return
    if words[0] in ("pip", "pip3", "make", "npm") or words[:3] == ["python", "-m", "pip"]:
        return  # installing: the test environment is set up already
    if words[0] == "memoplan":
        code = cli.main(words[1:])
        out, err = capsys.readouterr()
        assert code == 0, f"`{line}` exited {code}\n{out}\n{err}"
    else:
        done = subprocess.run(line, shell=True, cwd=folder, capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"`{line}` exited {done.returncode}\n{done.stdout}\n{done.stderr}"


def _run_python(text: str, folder: Path, index: int) -> None:
    script = folder / f"_block_{index}.py"
    script.write_text(text, encoding="utf-8")
    runpy.run_path(str(script), run_name="__main__")


def _write_or_compare(folder: Path, name: str, text: str) -> None:
    target = folder / name
    if target.exists():
        assert target.read_text(encoding="utf-8") == text, f"the page shows {name}, but it holds other text"
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def _check_yaml(text: str) -> None:
    yaml = pytest.importorskip("yaml")
    document = yaml.safe_load(text)
    shipped = {hook["id"] for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))}
    for repo in document.get("repos", []) if isinstance(document, dict) else []:
        for hook in repo.get("hooks", []):
            assert hook["id"] in shipped, f"the page names hook {hook['id']}, which .pre-commit-hooks.yaml lacks"


def run_page(page: str, folder: Path, capsys) -> None:
    for index, (language, attributes, text) in enumerate(blocks(page)):
        if language in ("", "sh"):
            for line in text.splitlines():
                _run_command(line, folder, capsys)
        elif language == "python":
            if "file" in attributes:
                _write_or_compare(folder, attributes["file"], text)
            else:
                _run_python(text, folder, index)
        elif language == "memplan":
            if "file" in attributes:
                _write_or_compare(folder, attributes["file"], text)
            else:
                (folder / "_block.memplan").write_text(text, encoding="utf-8")
                _run_command("memoplan check --syntax-only _block.memplan", folder, capsys)
        elif language == "yaml":
            _check_yaml(text)
        else:
            pytest.fail(f"{page}: a ```{language} block: give it a way to run in tests/test_docs_run.py")


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch):
    """An empty folder as the working directory and first on ``sys.path``; the modules the page's
    blocks import from it are forgotten afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if str(tmp_path) in str(getattr(sys.modules[name], "__file__", None) or ""):
            del sys.modules[name]


def test_every_block_has_a_way_to_run() -> None:
    """Fast: every block of the pages is one this test knows how to run."""
    for page in PAGES:
        found = blocks(page)
        assert found, page
        assert {language for language, _, _ in found} <= {"", "sh", "python", "memplan", "yaml"}, page


def test_the_memplan_block_shows_the_shipped_plan() -> None:
    (text,) = [t for language, a, t in blocks("docs/tutorial.md") if a.get("file") == "my-plans/cnn_bn_dropout.memplan"]
    assert text == (ROOT / "plans" / "cnn_bn_dropout.memplan").read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.parametrize("page", ["docs/tutorial.md", "docs/how-to.md"])
def test_the_page_runs_in_order_in_an_empty_folder(page: str, scratch: Path, capsys) -> None:
    run_page(page, scratch, capsys)


@pytest.mark.slow
def test_the_hugging_face_recipe_runs_and_the_losses_are_equal(scratch: Path, capsys) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    run_page("docs/huggingface.md", scratch, capsys)  # its blocks assert the equal losses themselves
    assert "losses equal" in capsys.readouterr().out
