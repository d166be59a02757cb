"""Syntax stage: the fixture files under tests/fixtures/syntax.

* ``valid/*.memplan`` are in canonical form: they parse, format to themselves, and
  the formatted text parses back to an equal tree.
* ``format/NAME.in.memplan`` formats to ``format/NAME.out.memplan`` (canonical).
* ``invalid/*.memplan`` come with ``*.expected``: one ``CODE line:column [text]`` per
  diagnostic, in order; ``text``, when given, must occur in the message or the help.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _paths import ROOT, TESTS

from memoplan.diagnostics import PlanError
from memoplan.syntax import format_plan, parse, parse_with_diagnostics

FIXTURES = TESTS / "fixtures" / "syntax"
VALID = sorted((FIXTURES / "valid").glob("*.memplan"))
FORMAT = sorted((FIXTURES / "format").glob("*.in.memplan"))
INVALID = sorted((FIXTURES / "invalid").glob("*.memplan"))


def _id(path: Path) -> str:
    return path.name.removesuffix(".memplan").removesuffix(".in")


def test_fixtures_exist() -> None:
    assert len(VALID) >= 30 and len(INVALID) >= 25 and FORMAT
    for path in INVALID:
        assert path.with_suffix(".expected").exists(), path
    for path in FORMAT:
        assert path.with_name(path.name.replace(".in.", ".out.")).exists(), path


@pytest.mark.parametrize("path", VALID, ids=_id)
def test_valid_fixture_is_canonical(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    plan, diagnostics = parse_with_diagnostics(text, str(path))
    assert plan is not None and diagnostics == [], [d.render(text) for d in diagnostics]
    assert format_plan(plan) == text
    assert parse(format_plan(plan)) == plan


@pytest.mark.parametrize("path", FORMAT, ids=_id)
def test_format_fixture(path: Path) -> None:
    expected = path.with_name(path.name.replace(".in.", ".out.")).read_text(encoding="utf-8")
    plan = parse(path.read_text(encoding="utf-8"), str(path))
    assert format_plan(plan) == expected
    assert parse(expected) == plan
    assert format_plan(parse(expected)) == expected


def _expected(path: Path) -> list[tuple[str, int, int, str]]:
    rows = []
    for line in path.with_suffix(".expected").read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        code, position, *text = line.split(None, 2)
        row, column = position.split(":")
        rows.append((code, int(row), int(column), text[0] if text else ""))
    return rows


@pytest.mark.parametrize("path", INVALID, ids=_id)
def test_invalid_fixture_diagnostics(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    _, diagnostics = parse_with_diagnostics(text, str(path))
    got = [(d.code, d.span.line, d.span.column) for d in diagnostics]
    expected = _expected(path)
    assert got == [row[:3] for row in expected]
    for diagnostic, (*_, snippet) in zip(diagnostics, expected):
        assert snippet in f"{diagnostic.message} {diagnostic.help}", (snippet, diagnostic)
        assert diagnostic.span.file == str(path)
    errors = [d for d in diagnostics if d.is_error]
    if errors:
        with pytest.raises(PlanError) as info:
            parse(text, str(path))
        assert info.value.codes == [d.code for d in diagnostics]
    else:  # warnings only: the plan is accepted
        assert parse(text, str(path)) is not None


def test_every_syntax_code_has_a_fixture() -> None:
    """Every code the syntax stage can emit (grep "MP1../"MP2.. in memoplan/syntax) is exercised."""
    import re

    syntax = ROOT / "memoplan" / "syntax"
    source = "".join(p.read_text(encoding="utf-8") for p in syntax.glob("*.py"))
    emitted = set(re.findall(r'"(MP[125]\d\d)"', source))
    covered = {row[0] for path in INVALID for row in _expected(path)}
    assert "MP107" in emitted  # load() of an unreadable file: covered in test_syntax_api.py
    assert "MP109" in emitted  # a plan over 4 MiB: no fixture of that size, covered in test_hostile_text.py
    assert emitted - covered == {"MP107", "MP109"}


def test_all_errors_of_a_file_in_one_run() -> None:
    path = FIXTURES / "invalid" / "all_errors_one_run.memplan"
    with pytest.raises(PlanError) as info:
        parse(path.read_text(encoding="utf-8"), str(path))
    codes = set(info.value.codes)
    assert len(info.value.diagnostics) == 12
    assert {"MP100", "MP101", "MP102", "MP106", "MP201", "MP203", "MP204", "MP207", "MP210", "MP501"} <= codes
