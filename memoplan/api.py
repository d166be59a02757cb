"""The public API: parse, load, format, resolve, explain, apply and remove a plan.

``apply`` is the one back end: it emits code from the templates, writes it to the
cache, imports it and calls its ``apply`` — the same code ``memoplan compile``
writes into a user's repository.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from memoplan import runtime
from memoplan.codegen import emit, import_generated
from memoplan.ir import ResolvedPlan
from memoplan.resolver import resolve
from memoplan.syntax import ast, load, parse

PlanLike = ast.Plan | ResolvedPlan | Path | str


def as_plan(plan: ast.Plan | Path | str) -> ast.Plan:
    """A parsed plan from a Plan, a path, or plan text (a ``str`` with a newline is text)."""
    if isinstance(plan, ast.Plan):
        return plan
    if isinstance(plan, str) and "\n" in plan:
        return parse(plan)
    return load(plan)


def apply(model: nn.Module, plan: PlanLike) -> nn.Module:
    """Apply ``plan`` to ``model`` in place and return it; undo with :func:`remove`.

    Nothing changes if the plan does not fit the model: every problem is raised at
    once as a :class:`memoplan.diagnostics.PlanError` before any module is touched.
    """
    resolved = plan if isinstance(plan, ResolvedPlan) else resolve(as_plan(plan), model)
    generated = import_generated(emit(resolved))
    generated.apply(model)
    return model


def remove(model: nn.Module) -> nn.Module:
    """Undo :func:`apply`: forwards, attributes and hooks are exactly as before."""
    runtime.uninstall(model)
    return model
