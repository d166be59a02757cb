"""Syntax stage: a selector's specificity, which decides between rules that select one module.

Read from the selector alone (no model, no torch), so that the editor can show it for any plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from memoplan.syntax import ast


@dataclass(frozen=True, order=True)
class Specificity:
    """Larger is more specific; compared field by field."""

    literal: int
    indexed: int
    glob: int
    star: int
    class_filter: int

    def __str__(self) -> str:
        return f"({self.literal}, {self.indexed}, {self.glob}, {self.star}, {self.class_filter})"


def specificity(selector: ast.Selector) -> Specificity:
    term = selector.include
    segments = term.path.segments if term.path else ()
    return Specificity(
        literal=sum(isinstance(s, ast.Name) for s in segments),
        indexed=sum(isinstance(s, (ast.Index, ast.Slice)) for s in segments),
        glob=sum(isinstance(s, ast.Glob) for s in segments),
        star=sum(isinstance(s, ast.Star) for s in segments),
        class_filter=int(term.class_name is not None),
    )
