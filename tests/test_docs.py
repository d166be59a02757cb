"""Every plan in the docs and in plans/ parses, and plans/ is in canonical form."""

from __future__ import annotations

import re

import pytest
from _paths import ROOT

import memoplan

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "grammar").glob("*.md"))]
SNIPPETS = [
    (f"{path.name}:{text[: m.start()].count(chr(10)) + 2}", m.group(1))
    for path in DOCS
    for text in [path.read_text(encoding="utf-8")]
    for m in re.finditer(r"```memplan\n(.*?)```", text, re.S)
]
PLANS = sorted((ROOT / "plans").glob("*.memplan"))


def test_docs_have_plan_snippets():
    assert any(name.startswith("README.md") for name, _ in SNIPPETS)


@pytest.mark.parametrize("where,text", SNIPPETS, ids=[name for name, _ in SNIPPETS])
def test_doc_snippet_parses(where, text):
    if not text.lstrip().startswith("memplan"):
        text = "memplan 1\n" + text
    memoplan.parse(text, where)


@pytest.mark.parametrize("path", PLANS, ids=[p.name for p in PLANS])
def test_plans_are_canonical(path):
    text = path.read_text(encoding="utf-8")
    assert memoplan.format_plan(memoplan.parse(text, str(path))) == text
