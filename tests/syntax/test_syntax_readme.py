"""Every ```memplan block of grammar/README.md parses (one without a header gets `memplan 1`)."""

from __future__ import annotations

import re

import pytest
from _paths import ROOT

from memoplan.syntax import format_plan, parse

README = ROOT / "grammar" / "README.md"
BLOCK = re.compile(r"^([ \t]*)```memplan\n(.*?)^\1```", re.MULTILINE | re.DOTALL)


def _blocks() -> list[tuple[int, str]]:
    text = README.read_text(encoding="utf-8")
    found = []
    for match in BLOCK.finditer(text):
        indent = match.group(1)
        body = "".join(line.removeprefix(indent) for line in match.group(2).splitlines(keepends=True))
        found.append((text.count("\n", 0, match.start()) + 1, body))
    return found


def test_readme_has_plan_snippets() -> None:
    assert len(_blocks()) >= 8


@pytest.mark.parametrize("line, body", _blocks(), ids=[f"line{line}" for line, _ in _blocks()])
def test_readme_snippet_parses(line: int, body: str) -> None:
    text = body if re.match(r"\s*(#.*\n\s*)*memplan\b", body) else "memplan 1\n" + body
    plan = parse(text, f"README.md:{line}")
    assert parse(format_plan(plan)) == plan


def test_readme_documents_every_syntax_code() -> None:
    text = README.read_text(encoding="utf-8")
    syntax = ROOT / "memoplan" / "syntax"
    source = "".join(p.read_text(encoding="utf-8") for p in syntax.glob("*.py"))
    for code in sorted(set(re.findall(r'"(MP\d{3})"', source))):
        assert f"| `{code}` |" in text, code


def test_readme_documents_every_key_and_option() -> None:
    from memoplan.syntax.blocks import SCHEMA

    text = README.read_text(encoding="utf-8")
    for _, keys in SCHEMA.values():
        for key in keys:
            assert f"| `{key}` |" in text, key
    for option in ("segments", "rng", "impl", "nested", "args", "allow_nonequivalent"):
        assert f"| `{option}` |" in text, option
