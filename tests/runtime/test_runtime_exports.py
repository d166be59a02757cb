"""``memoplan.runtime`` exports what generated plan modules call, and what a user of such a module
reads (documented in docs/reference/api.md): nothing more, and nothing generated code needs less."""

from __future__ import annotations

import importlib
import importlib.util
import re
import warnings

import pytest
from _paths import ROOT

import memoplan.runtime
import memoplan.runtime.arena

# A plan module's templates: the module and its calls (kernels/ are runtime, report/ a page, not a plan module).
TEMPLATE_DIR = ROOT / "memoplan" / "codegen" / "templates"
TEMPLATES = sorted([*TEMPLATE_DIR.glob("*.j2"), *(TEMPLATE_DIR / "calls").glob("*.j2")])
GOLDENS = sorted((ROOT / "tests" / "golden").glob("*.py"))
EMITTERS = sorted((ROOT / "memoplan" / "codegen").glob("*.py"))  # the calls emit writes as text
API_DOC = ROOT / "docs" / "reference" / "api.md"


def _imports(text: str) -> set[str]:
    """The names of ``from memoplan.runtime import a, b as c`` lines."""
    names = set()
    for match in re.finditer(r"^\s*from memoplan\.runtime import ([\w ,]+)$", text, re.M):
        names |= {part.split(" as ")[0].strip() for part in match.group(1).split(",")}
    return names


def _generated() -> tuple[set[str], set[str], set[str]]:
    """(``_rt.X`` names, ``from memoplan.runtime import X`` names, ``_arena.X`` names) that
    generated plan modules use: in the templates, the goldens and the calls emit writes."""
    rt, imported, arena = set(), set(), set()
    for path in TEMPLATES + GOLDENS + EMITTERS:
        text = path.read_text(encoding="utf-8")
        rt |= set(re.findall(r"\b_rt\.([A-Za-z_]\w*)", text))
        arena |= set(re.findall(r"\b_arena\.([A-Za-z_]\w*)", text))
        if path.suffix == ".j2" or path in GOLDENS:
            imported |= _imports(text)
    return rt, imported, arena


def test_generated_code_reaches_the_runtime_through_one_alias():
    template = (TEMPLATE_DIR / "plan_module.py.j2").read_text(encoding="utf-8")
    assert "from memoplan import runtime as _rt\n" in template
    assert "from memoplan.runtime import arena as _arena\n" in template


def test_everything_generated_code_calls_is_exported():
    rt, imported, arena = _generated()
    # the scan found what every plan module calls (so an empty match cannot pass)
    assert {"require_abi", "Target", "install", "uninstall", "run_checkpointed", "run_planned"} <= rt
    assert not rt - set(memoplan.runtime.__all__), "generated code calls names memoplan.runtime does not export"
    for name in imported:  # a submodule (``arena``) or an exported name
        module = importlib.util.find_spec(f"memoplan.runtime.{name}")
        assert module is not None or name in memoplan.runtime.__all__, name
    assert arena and arena <= set(memoplan.runtime.arena.__all__), arena - set(memoplan.runtime.arena.__all__)


def test_every_export_is_called_by_generated_code_or_documented():
    rt, imported, _ = _generated()
    doc = API_DOC.read_text(encoding="utf-8")
    for name in memoplan.runtime.__all__:
        assert hasattr(memoplan.runtime, name), name
        assert name in rt | imported or f"`memoplan.runtime.{name}" in doc, (
            f"memoplan.runtime exports {name}, which generated code never calls and "
            "docs/reference/api.md does not document"
        )


def test_all_is_a_sorted_literal_without_duplicates():
    assert memoplan.runtime.__all__ == sorted(set(memoplan.runtime.__all__))


@pytest.mark.parametrize("name", sorted(memoplan.runtime._MOVED))
def test_names_no_longer_exported_still_resolve_with_a_deprecation_warning(name):
    assert name not in memoplan.runtime.__all__ and name not in vars(memoplan.runtime)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(memoplan.runtime, name)
    assert value is getattr(importlib.import_module(memoplan.runtime._MOVED[name]), name)
    assert [w.category for w in caught] == [DeprecationWarning], caught
    assert memoplan.runtime._MOVED[name] in str(caught[0].message)
    with pytest.raises(AttributeError):
        memoplan.runtime.no_such_name  # noqa: B018
