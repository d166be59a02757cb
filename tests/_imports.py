"""Test helper: the modules a Python source file imports, for the layering tests."""

from __future__ import annotations

import ast
from pathlib import Path


def imported_modules(path: Path) -> list[str]:
    """Every module named by an ``import`` or ``from ... import`` anywhere in ``path`` (lazy ones too)."""
    names = []
    for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
    return names
