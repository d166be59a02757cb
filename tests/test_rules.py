"""The diagnostic registry (memoplan/rules.py): every code once, in the group of its stage,
the reference's table generated from it, and `memoplan rule CODE`."""

from __future__ import annotations

import re

import pytest
from _paths import ROOT

from memoplan.cli import main
from memoplan.rules import BEGIN, END, RULES, range_of, reference_block

CODE = re.compile(r"\bMP\d{3}\b")


def _codes_in_source() -> dict[str, list[str]]:
    """Every ``MPnnn`` written in the package's source (code, messages and docstrings) -> files."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "memoplan").rglob("*.py")):
        if path.name == "rules.py" and path.parent.name == "memoplan":
            continue
        for code in set(CODE.findall(path.read_text(encoding="utf-8"))):
            found.setdefault(code, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_code_in_the_source_is_registered():
    missing = {code: files for code, files in _codes_in_source().items() if code not in RULES}
    assert not missing, f"add these codes to memoplan/rules.py: {missing}"


def test_every_registered_code_is_used():
    unused = set(RULES) - set(_codes_in_source())
    assert not unused, f"registered but never written in the package: {sorted(unused)}"


def test_each_code_sits_in_a_group_that_its_stage_may_raise():
    for code, rule in RULES.items():
        group = range_of(code)
        assert group is not None, code
        assert rule.stage in group.stages, (code, rule.stage, group.topic)
        assert rule.summary and rule.help, code


def test_the_reference_table_is_generated_from_the_registry():
    text = (ROOT / "grammar" / "README.md").read_text(encoding="utf-8")
    begin, end = text.index(BEGIN), text.index(END) + len(END) + 1
    assert text[begin:end] == reference_block(), "regenerate it: python -m memoplan.rules"


def test_rule_prints_a_codes_explanation(capsys):
    assert main(["rule", "mp301"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("MP301 (error, raised by resolve)")
    assert "matches no module" in out and "What to do:" in out and "MP300-MP399" in out


def test_rule_without_a_code_lists_every_code(capsys):
    assert main(["rule"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == sorted(RULES)


@pytest.mark.parametrize("code", ["MP999", "MP3011", "301"])
def test_rule_of_an_unknown_code_is_a_usage_error(code, capsys):
    assert main(["rule", code]) == 2
    assert "no diagnostic code" in capsys.readouterr().err
