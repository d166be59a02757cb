"""Resolve stage: bind a plan to a model (selectors, precedence, legality checks, explain)."""

from memoplan.resolver.bind import resolve
from memoplan.resolver.explain import ExplainRow, explain, render_explain

__all__ = ["ExplainRow", "explain", "render_explain", "resolve"]
