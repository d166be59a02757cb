"""docs/reference/cli.md documents every command: its section, its row of exit codes, its options."""

from __future__ import annotations

import re

import pytest
from _paths import ROOT

from memoplan import cli

REFERENCE = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
COMMANDS = sorted({*cli.SUBCOMMANDS, "rule"})


def _options(command: str) -> list[str]:
    parser = cli._parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return [
        option
        for action in sub.choices[command]._actions
        for option in action.option_strings
        if option.startswith("--") and option not in ("--help", "--quiet", "--verbose")
    ]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_a_section_and_exit_codes(command):
    assert f"## `memoplan {command}`" in REFERENCE
    rows = re.findall(rf"^\| `{command}` \|(.*)\|$", REFERENCE, re.M)
    assert rows, f"no row of exit codes for {command}"
    assert len(rows[-1].split("|")) == 4  # 0, 1, 2, 3


def _section(command: str) -> str:
    start = REFERENCE.index(f"## `memoplan {command}`")
    end = REFERENCE.find("\n## ", start + 1)
    return REFERENCE[start : end if end > 0 else None]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_is_documented(command):
    section = _section(command)
    missing = [option for option in _options(command) if not re.search(rf"`{re.escape(option)}[` |]", section)]
    assert not missing, f"memoplan {command}: {missing} not in docs/reference/cli.md"
