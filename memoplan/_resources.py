"""Package data: finds the grammar, the bundled plans and the templates in a wheel and in a source checkout.

The templates (of generated code and of the report's page) live in the package, in
``memoplan/codegen/templates/``, the same path in a wheel and in a checkout.  The grammar
and the plans are force-included under ``memoplan/_data`` in a wheel; in an editable install
or a checkout they live at the top of the repository (``grammar/``, ``plans/``), one level
above this package.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _find(wheel_path: str, source_path: str) -> Path:
    for candidate in (_PACKAGE / "_data" / wheel_path, _PACKAGE.parent / source_path):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(
        f"memoplan data not found: looked for {_PACKAGE / '_data' / wheel_path} and "
        f"{_PACKAGE.parent / source_path}; reinstall the package"
    )


@cache
def grammar_text() -> str:
    return (_find("grammar", "grammar") / "memplan.lark").read_text(encoding="utf-8")


@cache
def templates_dir() -> Path:
    """``memoplan/codegen/templates``: every Jinja template memoplan renders, in one place."""
    found = _PACKAGE / "codegen" / "templates"
    if not found.is_dir():
        raise FileNotFoundError(f"memoplan data not found: looked for {found}; reinstall the package")
    return found


@cache
def plans_dir() -> Path:
    """The bundled example plans (``plans/`` in a checkout): ``memoplan demo`` copies them out."""
    return _find("plans", "plans")


@cache
def grammar_reference() -> str:
    """``grammar/README.md``, the language reference: its tables are what the editor shows on hover."""
    return (_find("grammar", "grammar") / "README.md").read_text(encoding="utf-8")


@cache
def doc_text(path: str) -> str:
    """A documentation page by its path in the repository (``docs/security.md``, ``README.md``):
    under ``memoplan/_data`` in a wheel, where it is in a checkout (``memoplan docs``)."""
    return _find(path, path).read_text(encoding="utf-8")
