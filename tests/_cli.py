"""Test helper: run the command line in-process and write input files (tests/test_cli.py and
tests/test_hostile_input.py)."""

from __future__ import annotations

from pathlib import Path

from memoplan import cli

TRACEBACK = "Traceback (most recent call last)"


def run(capsys, *argv) -> tuple[int, str, str]:
    """``memoplan ARGV`` in this process: exit status, stdout, stderr; never a traceback."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert TRACEBACK not in out + err
    return code, out, err


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path
