"""Resolve stage: what each plan-wide statement does in this context, or why it cannot act.

A plan is only worth reviewing if every line of it acts.  Module rules act through
the resolver and the runtime; the plan-wide statements (``budget`` and the config
blocks) act in particular commands.  This module is the one place that says, for
each of them, where it acts: a statement that cannot act anywhere in this version is
refused with an error at its line, and one that acts elsewhere (a budget is measured
by ``memoplan verify``, not by ``apply``) gets a note saying where.
"""

from __future__ import annotations

from memoplan.diagnostics import Diagnostic, Severity
from memoplan.syntax import ast

# Config blocks this version parses and validates but cannot carry out yet: each one is
# refused with its reason and what to write instead, never accepted and dropped.
_NOT_BUILT = {
    ast.BlockKind.DTR: (
        "MP220",
        "dynamic eviction at run time is not built in this version of memoplan",
        "remove the block; `checkpoint` rules give a fixed saving now (`memoplan plan --budget B` writes them)",
    ),
    ast.BlockKind.MEMONGER: (
        "MP221",
        "static buffer sharing is not built in this version of memoplan",
        "remove the block",
    ),
    ast.BlockKind.MEMORY: (
        "MP222",
        "allocator and gradient-buffer settings are not built in this version of memoplan",
        "remove the block",
    ),
    ast.BlockKind.SUBLINEAR: (
        "MP223",
        "the sublinear search reads its settings from the command line in this version of memoplan",
        "remove the block and run `memoplan plan --planner sublinear`",
    ),
}


def statement_effects(plan: ast.Plan) -> list[Diagnostic]:
    """Refusals (errors) for statements that cannot act, notes for those that act elsewhere."""
    found: list[Diagnostic] = []
    for statement in plan.statements:
        if isinstance(statement, ast.ConfigBlock) and statement.kind in _NOT_BUILT:
            code, why, help = _NOT_BUILT[statement.kind]
            found.append(
                Diagnostic(code, f"the `{statement.kind.value}` block cannot act: {why}", _head(statement), help)
            )
        elif isinstance(statement, ast.Budget):
            found.append(
                Diagnostic(
                    "MP224",
                    "the budget is checked by `memoplan verify`, which measures a training step against it",
                    statement.span,
                    "`memoplan.apply` has no example input to measure with, so it does not check the budget",
                    Severity.NOTE,
                )
            )
    return found


def _head(block: ast.ConfigBlock):
    """The block's first line (its keyword), so the caret marks the statement, not every key."""
    span = block.span
    if span.end_line == span.line:
        return span
    return type(span)(span.file, span.line, span.column, span.line, span.column + len(block.kind.value))
