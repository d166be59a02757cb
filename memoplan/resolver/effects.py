"""Resolve stage: what each plan-wide statement does in this context, or why it cannot act.

A plan is only worth reviewing if every line of it acts.  Module rules act through
the resolver and the runtime; the plan-wide statements (``budget`` and the config
blocks) act in particular commands.  This module is the one place that says, for
each of them, where it acts: a statement that cannot act anywhere in this version is
refused with an error at its line, and one that acts elsewhere (a budget is measured
by ``memoplan verify``, the ``sublinear`` block sets ``memoplan plan PLAN``'s search, and
neither acts in ``apply``) gets a note saying where.
"""

from __future__ import annotations

import torch

from memoplan.diagnostics import Diagnostic, Severity
from memoplan.syntax import ast
from memoplan.syntax.blocks import MemoryConfig, config_of

# Config blocks this version parses and validates but cannot carry out yet: each one is
# refused with its reason and what to write instead, never accepted and dropped.
_NOT_BUILT: dict[ast.BlockKind, tuple[str, str, str]] = {}  # none in this version


def statement_effects(plan: ast.Plan, *, checking: bool = False) -> list[Diagnostic]:
    """Refusals (errors) for statements that cannot act, notes for those that act elsewhere.

    ``checking``: for ``memoplan check``, which also notes where the budget is measured.
    """
    found: list[Diagnostic] = []
    for statement in plan.statements:
        if isinstance(statement, ast.ConfigBlock) and statement.kind in _NOT_BUILT:
            code, why, help = _NOT_BUILT[statement.kind]
            found.append(
                Diagnostic(code, f"the `{statement.kind.value}` block cannot act: {why}", _head(statement), help)
            )
        elif isinstance(statement, ast.ConfigBlock) and statement.kind is ast.BlockKind.MEMONGER:
            found.extend(_memonger_effects(plan, statement, checking))
        elif isinstance(statement, ast.ConfigBlock) and statement.kind is ast.BlockKind.MEMORY:
            found.extend(_memory_effects(plan, statement))
        elif isinstance(statement, ast.ConfigBlock) and statement.kind is ast.BlockKind.SUBLINEAR and checking:
            found.append(
                Diagnostic(
                    "MP222",
                    "the `sublinear` block sets the search of `memoplan plan` on this plan",
                    _head(statement),
                    "`memoplan plan THIS.memplan -o OUT.memplan` completes the plan with the sublinear search; "
                    "applying the plan uses its rules",
                    Severity.NOTE,
                )
            )
        elif isinstance(statement, ast.ConfigBlock) and statement.kind is ast.BlockKind.STEP and checking:
            found.append(
                Diagnostic(
                    "MP255",
                    "the `step` block sets the training step that `memoplan plan`, `verify` and `report` run",
                    _head(statement),
                    "its loss, precision, optimizer and sharding are those commands' defaults; `apply` "
                    "changes nothing for it",
                    Severity.NOTE,
                )
            )
        elif isinstance(statement, ast.Budget) and checking:
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


def _memonger_effects(plan: ast.Plan, block: ast.ConfigBlock, checking: bool) -> list[Diagnostic]:
    """The arena is laid out for the example's shapes (MP243 without one); ``check`` says where it acts."""
    if plan.example is None:
        return [
            Diagnostic(
                "MP243",
                "the `memonger` block needs the plan's `example`: the arena is laid out for the shapes it captures",
                _head(block),
                "add an `example` statement, e.g. `example randn(8, 3, 32, 32)`",
            )
        ]
    if not checking:
        return []
    return [
        Diagnostic(
            "MP244",
            "the `memonger` block runs the whole model's inference on one preallocated arena, captured "
            "with the plan's example when the plan is applied or compiled",
            _head(block),
            "it acts in eval mode with grad disabled, on inputs shaped like the example; training and other "
            "calls run the model's own forward; `memoplan explain` prints the arena",
            Severity.NOTE,
        )
    ]


def _memory_effects(plan: ast.Plan, block: ast.ConfigBlock) -> list[Diagnostic]:
    """``static_memory_policy`` needs CUDA, and policies 2 and 4 a budget in bytes to reserve."""
    config = config_of(block)
    assert isinstance(config, MemoryConfig), block.kind
    policy = config.static_memory_policy
    entry = next((e for e in block.entries if e.key == "static_memory_policy"), None)
    if policy == 0 or entry is None:
        return []
    found = []
    budget = plan.budget
    if policy in (2, 4) and (budget is None or not isinstance(budget.amount, ast.Size)):
        found.append(
            Diagnostic(
                "MP227",
                f"`static_memory_policy = {policy}` reserves the plan's budget before the first step, "
                "but the plan has no budget in bytes",
                entry.span,
                "add a budget with a size, e.g. `budget 4 GiB` (a share of the unplanned peak is not known "
                "when the plan is applied)",
            )
        )
    if not torch.cuda.is_available():
        found.append(
            Diagnostic(
                "MP228",
                f"`static_memory_policy = {policy}` configures the CUDA caching allocator; "
                "there is no CUDA device here, so it changes nothing on this machine",
                entry.span,
                "it acts where the plan is applied in a process with CUDA",
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
