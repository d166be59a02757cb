"""The AST built while Lark parses (memoplan/syntax/inline.py) is the one a parse tree gives.

The reference is the classic two-pass build: Lark builds a tree with ``propagate_positions``
and the Builder transforms it.  Both must give equal nodes, the same spans everywhere (spans
take no part in AST equality, so they are compared on their own) and the same value
diagnostics in the same order.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from _paths import TESTS
from lark import Lark
from lark.exceptions import UnexpectedInput

from memoplan._resources import grammar_text
from memoplan.syntax import lalr, parser
from memoplan.syntax.build import Builder

FIXTURES = TESTS / "fixtures"
PLANS = sorted(FIXTURES.glob("syntax/**/*.memplan")) + sorted(FIXTURES.glob("hostile/*.memplan"))


def _tree_parser() -> Lark:
    return Lark(grammar_text(), **lalr.OPTIONS)  # the language's parser's options, making a tree


TREE = _tree_parser()


def _spans(obj, found: list) -> list:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.name == "span":
                found.append(value)
            else:
                _spans(value, found)
    elif isinstance(obj, (tuple, list)):
        for value in obj:
            _spans(value, found)
    return found


def _inline_build(text: str, file: str, start: str = "start"):
    lark, _, builder = lalr.lark_parser()
    with lalr.LOCK:
        builder.file, builder.diagnostics = file, []
        node = lark.parse(text, start=start)
        return node.value, builder.diagnostics


@pytest.mark.parametrize("path", PLANS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_inline_build_equals_the_tree_build(path: Path) -> None:
    text = path.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    try:
        tree = TREE.parse(text, start="start")
    except UnexpectedInput:
        with pytest.raises(UnexpectedInput):
            _inline_build(text, str(path))
        return
    reference = Builder(str(path))
    expected = reference.transform(tree)
    built, diagnostics = _inline_build(text, str(path))
    assert built == expected
    assert _spans(built, []) == _spans(expected, [])
    assert len(_spans(built, [])) >= len(built) - 1  # every statement has a span
    assert diagnostics == reference.diagnostics


def test_inline_build_of_an_example_spec() -> None:
    text = "example randn(4, 3, 32, 32), rand(4, 8, dtype=float16), randint(4, 16, low=-5, high=100, dtype=int32)"
    reference = Builder("<example>")
    expected = reference.transform(TREE.parse(text, start="example_stmt"))
    built, diagnostics = _inline_build(text, "<example>", "example_stmt")
    assert built == expected
    assert _spans(built, []) == _spans(expected, [])
    assert diagnostics == reference.diagnostics


def test_a_failed_parse_leaves_no_value_errors_behind() -> None:
    """Methods run during a parse that then fails: their diagnostics must not leak into the next."""
    bad = "memplan 1\nbudget 4 GiB hard\nbudget 5 XiB\nmodule a {\n"
    plan, diagnostics = parser.parse_with_diagnostics(bad, "bad.memplan")
    assert plan is None and diagnostics
    plan, diagnostics = parser.parse_with_diagnostics("memplan 1\nmodule a { checkpoint }\n", "ok.memplan")
    assert plan is not None and diagnostics == []
    assert plan.statements[0].span.line == 2 and plan.statements[0].span.end_column == 24
