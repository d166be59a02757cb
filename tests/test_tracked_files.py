"""What the repository tracks works on any machine: no symbolic links, no absolute path of the machine a file was made on.

A tracked link (``editors/node_modules`` once pointed at another checkout's folder) breaks a fresh
clone: ``npm ci`` removes it with a warning, and on a machine without the target it dangles.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from _paths import ROOT

# Folders that hold one machine's users or checkouts (a scratch folder like /tmp in a documented
# command is portable; these are not).
MACHINE_PATH = re.compile(r"(?<![\w.~-])(/(home|Users|root|work|mnt|srv)/[\w.-]+|[A-Z]:\\Users\\)")


def _tracked() -> list[tuple[str, str]]:
    """(mode, path) of every file git tracks in this checkout."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an unpacked sdist): nothing is tracked")
    out = subprocess.run(["git", "ls-files", "-s", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    rows = []
    for entry in filter(None, out.split("\0")):
        meta, path = entry.split("\t", 1)
        rows.append((meta.split()[0], path))
    return rows


def test_no_tracked_symbolic_link() -> None:
    links = [path for mode, path in _tracked() if mode == "120000"]
    assert not links, f"tracked symbolic links (git rm --cached them and ignore them): {links}"


def test_gitignore_entries_match_links_too() -> None:
    """An entry with a trailing slash matches only a directory: a link of that name would be tracked."""
    lines = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert "editors/node_modules" in lines
    assert "editors/node_modules/" not in lines


def test_no_tracked_file_names_an_absolute_machine_path() -> None:
    # This machine's own folders, except a scratch checkout (CI clones into one, and documented
    # commands name such folders: a path under the temporary directory is portable).
    scratch = Path(tempfile.gettempdir()).resolve()
    mine = {ROOT, Path(sys.prefix).resolve(), Path.home()}
    here = {str(p) for p in mine if not p.is_relative_to(scratch)} - {"/", "/root"}
    found = []
    for _, path in _tracked():
        file = ROOT / path
        if not file.is_file() or file.is_symlink():
            continue
        data = file.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        text = data.decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            hit = MACHINE_PATH.search(line) or next((p for p in here if p in line), None)
            if hit:
                found.append(f"{path}:{number}: {line.strip()[:120]}")
    assert not found, "absolute paths of one machine in tracked files:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line, machine",
    [
        # written in two pieces, so that this file does not hold what it looks for
        ("/" + "home/alice/memoplan/plans/x.memplan", True),
        ('"/' + 'work/main/.venv/lib/python3.11/site-packages/torch"', True),
        ("see C:\\Users\\bob\\memoplan", True),
        ("git clone . /tmp/ci && cd /tmp/ci", False),
        ("memoplan/runtime/work/queue.py and ~/home/notes", False),
        ("<prefix>/lib/python3.11/site-packages/torch/nn/modules/module.py", False),
    ],
)
def test_the_machine_path_pattern(line: str, machine: bool) -> None:
    assert bool(MACHINE_PATH.search(line)) is machine
