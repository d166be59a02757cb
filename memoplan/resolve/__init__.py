"""Resolve stage: bind a plan to a model (selectors, precedence, legality checks, explain)."""

from memoplan.resolve.explain import ExplainRow, explain, render_explain
from memoplan.resolve.resolver import resolve

__all__ = ["ExplainRow", "explain", "render_explain", "resolve"]
